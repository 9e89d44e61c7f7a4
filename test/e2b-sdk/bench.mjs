// Times the official e2b SDK against warren's E2B front (warren bench
// --figures e2b runs it with E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY and
// E2B_TEMPLATE set; BENCH_CREATES, BENCH_RUNS, BENCH_FILES size it).
// Prints one JSON object: the samples of each operation, in milliseconds.
import { Sandbox } from 'e2b'

const template = process.env.E2B_TEMPLATE || 'busybox'
const creates = Number(process.env.BENCH_CREATES || 30)
const runs = Number(process.env.BENCH_RUNS || 200)
const filesN = Number(process.env.BENCH_FILES || 20)
const now = () => performance.now()
const out = { create: [], run: [], files: [] }

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
  const mib = new Uint8Array(1 << 20)
  for (let i = 0; i < mib.length; i++) mib[i] = i % 251
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
console.log(JSON.stringify(out))
