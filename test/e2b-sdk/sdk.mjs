// Drives warren's E2B front with the official `e2b` SDK, unchanged (the
// version pinned in package.json). Run by test/e2e/e2b_sdk_test.go with
// E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY pointing at warren, and
// E2B_TEMPLATE naming the image. Each check prints one line "ok NAME" or
// "FAIL NAME: why"; the exit status is non-zero when any check failed.
import { Sandbox, CommandExitError, FileNotFoundError, SandboxError } from 'e2b'
import { readFileSync } from 'node:fs'
import http from 'node:http'

const template = process.env.E2B_TEMPLATE || 'busybox'
let failed = 0

function check(name, ok, detail) {
  if (ok) {
    console.log(`ok ${name}`)
  } else {
    failed++
    console.log(`FAIL ${name}: ${detail === undefined ? '' : typeof detail === 'string' ? detail : JSON.stringify(detail)}`)
  }
}

// step runs one part of the scenario; an exception fails that part only.
async function step(name, fn) {
  try {
    await fn()
  } catch (e) {
    failed++
    console.log(`FAIL ${name}: threw ${e?.constructor?.name}: ${e?.message}`)
  }
}

const sbx = await Sandbox.create(template, { timeoutMs: 120_000, metadata: { suite: 'e2b-sdk' }, envs: { SBX: 'sandbox' } })
check('create', typeof sbx.sandboxId === 'string' && sbx.sandboxId.length > 0, sbx.sandboxId)

await step('commands.run', async () => {
  const chunks = []
  const r = await sbx.commands.run('echo hi $SBX $FOO; echo oops >&2', { envs: { FOO: 'bar' }, onStdout: (d) => chunks.push(d) })
  check('commands.run exit code', r.exitCode === 0, r)
  check('commands.run stdout', r.stdout === 'hi sandbox bar\n', r.stdout)
  check('commands.run stderr', r.stderr === 'oops\n', r.stderr)
  check('commands.run onStdout', chunks.join('') === 'hi sandbox bar\n', chunks)
  const cwd = await sbx.commands.run('pwd', { cwd: '/tmp' })
  check('commands.run cwd', cwd.stdout === '/tmp\n', cwd.stdout)
})

await step('commands.run live output', async () => {
  // onStdout sees the first line while the command still sleeps.
  const t0 = Date.now()
  let firstAt = -1
  const r = await sbx.commands.run('echo first; sleep 2; echo second', {
    onStdout: (d) => { if (firstAt < 0 && d.includes('first')) firstAt = Date.now() - t0 },
  })
  const total = Date.now() - t0
  check('live output: result', r.stdout === 'first\nsecond\n', r.stdout)
  check('live output: first line before the end', firstAt >= 0 && total - firstAt >= 1500, { firstAt, total })
})

await step('commands.run failing', async () => {
  try {
    await sbx.commands.run('echo bad >&2; exit 3')
    check('CommandExitError', false, 'no error thrown')
  } catch (e) {
    check('CommandExitError', e instanceof CommandExitError, `${e?.constructor?.name}: ${e?.message}`)
    check('CommandExitError exit code', e.exitCode === 3, e.exitCode)
    check('CommandExitError stderr', e.stderr === 'bad\n', e.stderr)
  }
})

await step('background + kill', async () => {
  const h = await sbx.commands.run('sleep 600', { background: true })
  check('background pid', typeof h.pid === 'number' && h.pid > 0, h.pid)
  const listed = await sbx.commands.list()
  check('commands.list', listed.some((p) => p.pid === h.pid), listed)
  const conn = await sbx.commands.connect(h.pid)
  check('commands.connect', conn.pid === h.pid, conn.pid)
  check('handle.kill', (await h.kill()) === true, 'kill answered false')
  try {
    await conn.wait()
    check('connected wait', false, 'wait resolved')
  } catch (e) {
    check('connected wait', e instanceof CommandExitError && e.exitCode === -1, `${e?.constructor?.name}: ${e?.message}`)
  }
  // The process is gone from the sandbox, not only from the stream.
  let left = ''
  for (let i = 0; i < 50; i++) {
    left = (await sbx.commands.run('ps -o pid,args | grep "[s]leep 600" || true')).stdout
    if (left === '') break
    await new Promise((r) => setTimeout(r, 100))
  }
  check('killed process is gone', left === '', left)
  try {
    await h.wait()
    check('killed wait', false, 'wait resolved')
  } catch (e) {
    check('killed wait', e instanceof CommandExitError && e.exitCode !== 0, `${e?.constructor?.name}: ${e?.message}`)
  }
  check('kill an ended process', (await sbx.commands.kill(h.pid)) === false, 'answered true')
})

await step('files', async () => {
  const w = await sbx.files.write('/tmp/e2b/dir/a.txt', 'hello')
  check('files.write one', w.path === '/tmp/e2b/dir/a.txt' && w.name === 'a.txt', w)
  const many = await sbx.files.write([
    { path: '/tmp/e2b/many/b.txt', data: 'bee' },
    { path: '/tmp/e2b/many/sub/c.txt', data: new TextEncoder().encode('sea') },
  ])
  check('files.write many', Array.isArray(many) && many.length === 2 && many[1].path === '/tmp/e2b/many/sub/c.txt', many)
  check('files.read', (await sbx.files.read('/tmp/e2b/dir/a.txt')) === 'hello', 'content differs')
  const bytes = await sbx.files.read('/tmp/e2b/many/sub/c.txt', { format: 'bytes' })
  check('files.read bytes', new TextDecoder().decode(bytes) === 'sea', bytes)
  await sbx.files.write('/tmp/e2b/gz.txt', 'zipped', { gzip: true })
  check('files.write gzip', (await sbx.files.read('/tmp/e2b/gz.txt', { gzip: true })) === 'zipped', 'content differs')
  await sbx.files.write('/tmp/e2b/oct.txt', 'octets', { useOctetStream: true })
  check('files.write octet-stream', (await sbx.files.read('/tmp/e2b/oct.txt')) === 'octets', 'content differs')
  const big = new Uint8Array(3 << 20)
  for (let i = 0; i < big.length; i++) big[i] = (i * 7) % 256
  await sbx.files.write('/tmp/e2b/big.bin', new Blob([big]))
  const rs = await sbx.files.read('/tmp/e2b/big.bin', { format: 'stream' })
  let n = 0, same = true
  for await (const chunk of rs) {
    for (let i = 0; i < chunk.length; i++) if (chunk[i] !== big[n + i]) same = false
    n += chunk.length
  }
  check('files 3 MiB blob write, stream read', n === big.length && same, { n, same })
  const rel = await sbx.files.write('rel.txt', 'relative')
  check('files.write relative', rel.path.endsWith('/rel.txt') && rel.path.startsWith('/'), rel)
  check('files.read relative', (await sbx.files.read('rel.txt')) === 'relative', 'content differs')
  const list = await sbx.files.list('/tmp/e2b/many')
  const names = list.map((e) => e.name).sort()
  check('files.list', names.join(',') === 'b.txt,sub', names)
  const b = list.find((e) => e.name === 'b.txt')
  check('files.list entry', b && b.type === 'file' && b.size === 3 && b.path === '/tmp/e2b/many/b.txt', b)
  check('files.exists', (await sbx.files.exists('/tmp/e2b/dir/a.txt')) === true, 'false')
  check('files.exists missing', (await sbx.files.exists('/tmp/e2b/nope')) === false, 'true')
  check('files.makeDir', (await sbx.files.makeDir('/tmp/e2b/newdir/x')) === true, 'false')
  check('files.makeDir existing', (await sbx.files.makeDir('/tmp/e2b/newdir/x')) === false, 'true')
  const info = await sbx.files.getInfo('/tmp/e2b/newdir/x')
  check('files.getInfo dir', info.type === 'dir', info)
  const mv = await sbx.files.rename('/tmp/e2b/dir/a.txt', '/tmp/e2b/dir/moved.txt')
  check('files.rename', mv.path === '/tmp/e2b/dir/moved.txt', mv)
  check('files.rename source gone', (await sbx.files.exists('/tmp/e2b/dir/a.txt')) === false, 'still there')
  check('files.read renamed', (await sbx.files.read('/tmp/e2b/dir/moved.txt')) === 'hello', 'content differs')
  await sbx.files.remove('/tmp/e2b/many')
  check('files.remove', (await sbx.files.exists('/tmp/e2b/many')) === false, 'still there')
  try {
    await sbx.files.read('/tmp/e2b/missing.txt')
    check('FileNotFoundError', false, 'read a missing file')
  } catch (e) {
    check('FileNotFoundError', e instanceof FileNotFoundError, `${e?.constructor?.name}: ${e?.message}`)
  }
  // A command sees what files wrote.
  const cat = await sbx.commands.run('cat /tmp/e2b/dir/moved.txt')
  check('command reads a written file', cat.stdout === 'hello', cat.stdout)
})

await step('signed URLs', async () => {
  // Links without headers: the signature authorises them.
  const down = await sbx.downloadUrl('/tmp/e2b/dir/moved.txt')
  check('downloadUrl signed', /signature=v1_/.test(down), down)
  let r = await fetch(down)
  check('downloadUrl fetch', r.status === 200 && (await r.text()) === 'hello', r.status)
  const tampered = new URL(down)
  tampered.searchParams.set('path', '/etc/passwd')
  r = await fetch(tampered)
  check('downloadUrl other path refused', r.status === 401 && (await r.json()).code === 401, r.status)
  const up = await sbx.uploadUrl('/tmp/e2b/uploaded.txt', { useSignatureExpiration: 60 })
  const form = new FormData()
  form.append('file', new Blob(['via link']), '/tmp/e2b/uploaded.txt')
  r = await fetch(up, { method: 'POST', body: form })
  check('uploadUrl fetch', r.status === 200, `${r.status} ${await r.text()}`)
  check('uploadUrl wrote', (await sbx.files.read('/tmp/e2b/uploaded.txt')) === 'via link', 'content differs')
  r = await fetch(await sbx.downloadUrl('/tmp/e2b/dir/moved.txt', { useSignatureExpiration: -10 }))
  check('expired link refused', r.status === 401, r.status)
  r = await fetch(up.replace('signature=v1_', 'signature=v1_x'), { method: 'POST', body: form })
  check('bad signature refused', r.status === 401, r.status)
})

await step('watchDir', async () => {
  await sbx.files.makeDir('/tmp/w/sub')
  const events = []
  const w = await sbx.files.watchDir('/tmp/w', (ev) => events.push(ev), { recursive: true })
  const waitFor = async (what, pred) => {
    for (let i = 0; i < 100 && !events.some(pred); i++) await new Promise((r) => setTimeout(r, 100))
    check(what, events.some(pred), events)
  }
  await sbx.files.write('/tmp/w/a.txt', 'one')
  await waitFor('watchDir create', (e) => e.name === 'a.txt' && e.type === 'create')
  await sbx.commands.run('echo more >> /tmp/w/a.txt; echo deep > /tmp/w/sub/d.txt')
  await waitFor('watchDir write', (e) => e.name === 'a.txt' && e.type === 'write')
  await waitFor('watchDir recursive', (e) => e.name === 'sub/d.txt' && e.type === 'create')
  await sbx.files.remove('/tmp/w/a.txt')
  await waitFor('watchDir remove', (e) => e.name === 'a.txt' && e.type === 'remove')
  await w.stop()
  try {
    await sbx.files.watchDir('/tmp/no-such-dir', () => {})
    check('watchDir missing dir', false, 'watching')
  } catch (e) {
    check('watchDir missing dir', e instanceof FileNotFoundError || /not.found/i.test(e.message), `${e?.constructor?.name}: ${e?.message}`)
  }
})

const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

await step('stdin', async () => {
  // A command started with stdin: true reads what sendStdin sends, and
  // sees its end at closeStdin.
  const h = await sbx.commands.run('read a; echo got:$a; cat; echo end', { background: true, stdin: true })
  await sbx.commands.sendStdin(h.pid, 'first\n')
  await h.sendStdin('more\n')
  await h.closeStdin()
  const r = await h.wait()
  check('stdin echoed', r.stdout === 'got:first\nmore\nend\n' && r.exitCode === 0, r)
  const h2 = await sbx.commands.run('read n; echo err >&2; exit $n', { background: true, stdin: true })
  await h2.sendStdin('7\n')
  try {
    await h2.wait()
    check('stdin exit code', false, 'wait resolved')
  } catch (e) {
    check('stdin exit code', e instanceof CommandExitError && e.exitCode === 7 && e.stderr === 'err\n', `${e?.constructor?.name}: ${e?.message} ${e?.stderr}`)
  }
  // Without stdin a command that reads it sees it empty (never a hang),
  // and sendStdin to it is refused.
  const cat = await sbx.commands.run('cat; echo done', { timeoutMs: 20_000 })
  check('stdin off is empty', cat.stdout === 'done\n', cat.stdout)
  const h3 = await sbx.commands.run('sleep 30', { background: true })
  try {
    await sbx.commands.sendStdin(h3.pid, 'input')
    check('sendStdin without stdin', false, 'accepted')
  } catch (e) {
    check('sendStdin without stdin', e instanceof SandboxError && /stdin/.test(e.message), `${e?.constructor?.name}: ${e?.message}`)
  }
  await h3.kill()
})

await step('pty', async () => {
  const enc = (s) => new TextEncoder().encode(s)
  const dec = new TextDecoder()
  let out = ''
  const t = await sbx.pty.create({ cols: 80, rows: 24, onData: (d) => { out += dec.decode(d, { stream: true }) } })
  check('pty pid', typeof t.pid === 'number' && t.pid > 0, t.pid)
  const waitOut = async (what, re) => {
    for (let i = 0; i < 150 && !re.test(out); i++) await sleep(100)
    check(what, re.test(out), out.slice(-400))
  }
  // The loop reads with head, not the shell's read builtin: busybox ash's
  // read ends when SIGWINCH interrupts it (and its line editor asks the
  // terminal for the cursor position, ESC[6n, at each prompt; bash does
  // neither).
  await sbx.pty.sendInput(t.pid, enc("stty size; tty; exec sh -c 'while head -n1 | grep -qv stop; do stty size; done; exit 5'\n"))
  await waitOut('pty stty size', /24 80\r?\n/)
  await waitOut('pty is a terminal', /\/dev\/pts\//)
  await sbx.pty.resize(t.pid, { cols: 100, rows: 30 })
  out = ''
  // Each empty line makes the loop print the size. Under load the first
  // one was once lost (an empty answer after 15 s, cause not found: the
  // exec'd loop may not have been reading yet): send one a second.
  for (let i = 0; i < 15 && !/30 100\r?\n/.test(out); i++) {
    await sbx.pty.sendInput(t.pid, enc('\n'))
    for (let j = 0; j < 10 && !/30 100\r?\n/.test(out); j++) await sleep(100)
  }
  check('pty resize', /30 100\r?\n/.test(out), out.slice(-400))
  check('pty listed', (await sbx.commands.list()).some((p) => p.pid === t.pid), 'not listed')
  await sbx.pty.sendInput(t.pid, enc('stop\n'))
  try {
    await t.wait()
    check('pty exit code', false, 'wait resolved')
  } catch (e) {
    check('pty exit code', e instanceof CommandExitError && e.exitCode === 5, `${e?.constructor?.name}: ${e?.message}`)
  }
  const t2 = await sbx.pty.create({ cols: 80, rows: 24, onData: () => {} })
  check('pty kill', (await sbx.pty.kill(t2.pid)) === true, 'answered false')
  try {
    await t2.wait()
    check('pty killed wait', false, 'wait resolved')
  } catch (e) {
    check('pty killed wait', e instanceof CommandExitError && e.exitCode === -1, `${e?.constructor?.name}: ${e?.message}`)
  }
  check('pty kill ended', (await sbx.pty.kill(t2.pid)) === false, 'answered true')
})

await step('getHost', async () => {
  // A server in the sandbox is reached at sbx.getHost(port):
  // "<port>-<sandboxID>.<E2B_DOMAIN>", served by warren's E2B listener
  // (in a deployment, wildcard DNS points *.<domain> at it; here the
  // request goes to the listener with that Host).
  const bin = process.env.E2B_PORTSRV
  if (!bin) {
    check('getHost', false, 'E2B_PORTSRV (the portsrv test server) is not set')
    return
  }
  await sbx.files.write('/tmp/portsrv', new Blob([readFileSync(bin)]))
  await sbx.commands.run('chmod 755 /tmp/portsrv')
  const srv = await sbx.commands.run('/tmp/portsrv http 8000', { background: true, timeoutMs: 0 })
  const host = sbx.getHost(8000)
  check('getHost shape', host === `8000-${sbx.sandboxId}.${process.env.E2B_DOMAIN}`, host)
  const api = new URL(process.env.E2B_API_URL)
  const get = (host, path) => new Promise((resolve, reject) => {
    const req = http.request({ host: api.hostname, port: api.port, path, headers: { host, 'x-test': 'yes' } }, (res) => {
      let body = ''
      res.on('data', (d) => { body += d })
      res.on('end', () => resolve({ status: res.statusCode, body, type: res.headers['content-type'] }))
    })
    req.on('error', reject)
    req.end()
  })
  let r
  for (let i = 0; i < 100; i++) {
    r = await get(host, '/info?q=1')
    if (r.status === 200) break
    await sleep(100)
  }
  let info = {}
  try { info = JSON.parse(r.body) } catch {}
  check('getHost proxied', r.status === 200 && info.uri === '/info?q=1' && info.x === 'yes' && info.host === host && info.authorization === '', r)
  r = await get(sbx.getHost(8001), '/')
  let body = {}
  try { body = JSON.parse(r.body) } catch {}
  check('getHost closed port', r.status === 502 && body.code === 502 && /8001/.test(body.message), r)
  r = await get(`8000-nosuchsandbox.${process.env.E2B_DOMAIN}`, '/')
  try { body = JSON.parse(r.body) } catch { body = {} }
  check('getHost unknown sandbox', (r.status === 404 || r.status === 401) && body.code === r.status, r)
  await srv.kill()
  // network.allowPublicTraffic false: the host needs the sandbox's
  // trafficAccessToken in e2b-traffic-access-token.
  const priv = await Sandbox.create(template, { timeoutMs: 60_000, network: { allowPublicTraffic: false } })
  try {
    check('trafficAccessToken', typeof priv.trafficAccessToken === 'string' && priv.trafficAccessToken.length > 0, priv.trafficAccessToken)
    r = await get(priv.getHost(8000), '/')
    try { body = JSON.parse(r.body) } catch { body = {} }
    check('private host without token', r.status === 401 && body.code === 401, r)
    r = await new Promise((resolve, reject) => {
      const req = http.request({ host: api.hostname, port: api.port, path: '/', headers: { host: priv.getHost(8000), 'e2b-traffic-access-token': priv.trafficAccessToken } }, (res) => {
        res.resume()
        res.on('end', () => resolve({ status: res.statusCode }))
      })
      req.on('error', reject)
      req.end()
    })
    check('private host with token', r.status === 502, r) // authorised; nothing listens on 8000 there
  } finally {
    await priv.kill()
  }
})

await step('info, list, timeout', async () => {
  const info = await sbx.getInfo()
  check('getInfo', info.sandboxId === sbx.sandboxId && info.state === 'running' && info.metadata.suite === 'e2b-sdk', info)
  const page = await Sandbox.list({ query: { metadata: { suite: 'e2b-sdk' } } }).nextItems()
  check('Sandbox.list', page.some((s) => s.sandboxId === sbx.sandboxId), page)
  await sbx.setTimeout(600_000)
  const after = await sbx.getInfo()
  const left = after.endAt.getTime() - Date.now()
  check('setTimeout', left > 590_000 && left <= 601_000, left)
  check('isRunning', (await sbx.isRunning()) === true, 'false')
  const metrics = await sbx.getMetrics()
  check('getMetrics', metrics.length > 0 && metrics[0].memUsed > 0 && metrics[0].cpuCount >= 1, metrics)
})

await step('connect', async () => {
  const again = await Sandbox.connect(sbx.sandboxId)
  const r = await again.commands.run('cat /tmp/e2b/dir/moved.txt')
  check('connect', again.sandboxId === sbx.sandboxId && r.stdout === 'hello', r)
})

await step('pause and resume', async () => {
  check('pause', (await sbx.pause()) === true, 'false')
  check('paused state', (await sbx.getInfo()).state === 'paused', 'not paused')
  const resumed = await Sandbox.connect(sbx.sandboxId)
  check('resumed state', (await resumed.getInfo()).state === 'running', 'not running')
  const r = await resumed.commands.run('cat /tmp/e2b/dir/moved.txt')
  check('resumed keeps files', r.stdout === 'hello', r.stdout)
})

await step('kill twice', async () => {
  check('kill', (await sbx.kill()) === true, 'false')
  check('kill twice', (await sbx.kill()) === false, 'true')
  check('Sandbox.kill unknown', (await Sandbox.kill(sbx.sandboxId)) === false, 'true')
})

await step('unknown template', async () => {
  try {
    const s = await Sandbox.create('no-such-template-xyz')
    await s.kill()
    check('unknown template', false, 'created')
  } catch (e) {
    check('unknown template', e instanceof SandboxError && /not found/i.test(e.message), `${e?.constructor?.name}: ${e?.message}`)
  }
})

console.log(failed ? `${failed} checks failed` : 'all checks passed')
process.exit(failed ? 1 : 0)
