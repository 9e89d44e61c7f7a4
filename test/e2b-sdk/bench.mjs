// Times the official e2b SDK against warren's E2B front (warren bench
// --figures e2b runs it with E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY and
// E2B_TEMPLATE set; BENCH_CREATES, BENCH_RUNS, BENCH_FILES size it).
// With WARREN_URL and WARREN_TOKEN it also times the same operations as
// plain fetch calls to warren's native API from this node process (the
// client runtime's own floor, to tell the front's cost from node's).
// Prints one JSON object: the samples of each operation, in milliseconds.
import { Sandbox } from 'e2b'

const template = process.env.E2B_TEMPLATE || 'busybox'
const creates = Number(process.env.BENCH_CREATES || 30)
const runs = Number(process.env.BENCH_RUNS || 200)
const filesN = Number(process.env.BENCH_FILES || 20)
const now = () => performance.now()
const out = { create: [], run: [], files: [], nodeCreate: [], nodeRun: [], nodeFiles: [] }
const mib = new Uint8Array(1 << 20)
for (let i = 0; i < mib.length; i++) mib[i] = i % 251

// Sandbox.create, each killed untimed.
for (let i = 0; i < creates; i++) {
  const t0 = now()
  const s = await Sandbox.create(template, { timeoutMs: 300_000 })
  out.create.push(now() - t0)
  await s.kill()
}

const sbx = await Sandbox.create(template, { timeoutMs: 600_000 })
try {
  for (let i = 0; i < 5; i++) await sbx.commands.run('true') // warm up
  for (let i = 0; i < runs; i++) {
    const t0 = now()
    await sbx.commands.run('true')
    out.run.push(now() - t0)
  }
  for (let i = 0; i < filesN; i++) {
    const t0 = now()
    await sbx.files.write('/tmp/bench.bin', mib)
    const back = await sbx.files.read('/tmp/bench.bin', { format: 'bytes' })
    out.files.push(now() - t0)
    if (back.length !== mib.length) throw new Error(`read ${back.length} bytes, wrote ${mib.length}`)
  }
} finally {
  await sbx.kill()
}
// The same through warren's native API with plain fetch.
const api = process.env.WARREN_URL
if (api) {
  const auth = { Authorization: `Bearer ${process.env.WARREN_TOKEN}` }
  const call = async (method, path, body, json = true) => {
    const r = await fetch(api + path, { method, headers: { ...auth, ...(json ? { 'Content-Type': 'application/json' } : {}) }, body })
    if (r.status >= 300) throw new Error(`${method} ${path}: ${r.status} ${await r.text()}`)
    return r
  }
  for (let i = 0; i < creates; i++) {
    const t0 = now()
    const sb = await (await call('POST', '/v1/sandboxes', JSON.stringify({ image: template, ttl: 300 }))).json()
    out.nodeCreate.push(now() - t0)
    await call('DELETE', `/v1/sandboxes/${sb.id}`)
  }
  const sb = await (await call('POST', '/v1/sandboxes', JSON.stringify({ image: template, ttl: 600 }))).json()
  try {
    for (let i = 0; i < 5 + runs; i++) {
      const t0 = now()
      await (await call('POST', `/v1/sandboxes/${sb.id}/exec`, '{"cmd":"true"}')).json()
      if (i >= 5) out.nodeRun.push(now() - t0)
    }
    const f = `/v1/sandboxes/${sb.id}/files?path=%2Ftmp%2Fbench.bin`
    for (let i = 0; i < filesN; i++) {
      const t0 = now()
      await (await call('PUT', f, mib, false)).arrayBuffer()
      const back = await (await call('GET', f)).arrayBuffer()
      out.nodeFiles.push(now() - t0)
      if (back.byteLength !== mib.length) throw new Error(`read ${back.byteLength} bytes`)
    }
  } finally {
    await call('DELETE', `/v1/sandboxes/${sb.id}`)
  }
}
console.log(JSON.stringify(out))
