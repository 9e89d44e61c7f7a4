"""The asyncio client against a real ``warren serve`` (started by this module),
including 500 concurrent operations from one event loop."""

import asyncio
import os
import shutil
import tempfile
import threading
import time
import unittest
import uuid

try:  # run as the package "tests" (discover -t) or as top-level modules (discover -s)
    from . import _support
except ImportError:
    import _support

import warren

SRV = None  # type: _support.WarrenServer
RUN = "pya-" + uuid.uuid4().hex[:8]
LABELS = {"suite": RUN}


def setUpModule():
    global SRV
    SRV = _support.acquire_server()


def tearDownModule():
    try:
        with warren.Client(SRV.url, token=SRV.token) as c:
            for sb in c.list(labels=LABELS):
                if sb.state != "stopped":
                    try:
                        sb.stop()
                    except warren.WarrenError:
                        pass
    finally:
        _support.release_server()


def client(**kw):
    return warren.AsyncClient(SRV.url, token=SRV.token, **kw)


class AsyncTest(unittest.TestCase):
    def run_async(self, coro, timeout=120):
        return asyncio.run(asyncio.wait_for(coro, timeout))

    def test_lifecycle_exec_files_sessions(self):
        async def main():
            async with client() as c:
                self.assertEqual((await c.health())["status"], "ok")
                self.assertTrue(await c.nodes())
                self.assertTrue(await c.images())
                async with c.create(image=_support.IMAGE, labels=LABELS, memory_mb=128) as sb:
                    self.assertEqual(sb.state, "running")
                    self.assertEqual((await c.get(sb.id)).id, sb.id)
                    self.assertIn(sb.id, [s.id for s in await c.list(labels=LABELS,
                                                                     state="running")])
                    r = await sb.run("echo out; echo err >&2; exit 5")
                    self.assertEqual((r.stdout, r.stderr, r.exit_code), ("out\n", "err\n", 5))
                    r = await sb.run(["printf", "%s-%s", "a", "b"])
                    self.assertEqual(r.stdout, "a-b")
                    r = await sb.run("sleep 20", timeout=0.5)
                    self.assertTrue(r.timed_out)

                    # streaming with sync and async callbacks
                    got = []

                    async def on_err(s):
                        await asyncio.sleep(0)
                        got.append(("e", s))
                    r = await sb.run("for i in 1 2; do echo $i; echo x$i >&2; sleep 0.2; done",
                                     on_stdout=lambda s: got.append(("o", s)), on_stderr=on_err)
                    self.assertEqual("".join(s for k, s in got if k == "o"), "1\n2\n")
                    self.assertEqual("".join(s for k, s in got if k == "e"), "x1\nx2\n")
                    self.assertEqual(r.stdout, "1\n2\n")

                    # sessions
                    s = sb.session("main")
                    await s.run("cd /tmp; export K=v")
                    self.assertEqual((await s.run('echo "$(pwd) $K"')).stdout, "/tmp v\n")

                    # files
                    f = sb.files
                    await f.mkdir("/data/in")
                    info = await f.write("/data/in/x.bin", b"\x00\xff" * 1000, mode=0o600)
                    self.assertEqual(info.size, 2000)
                    self.assertEqual(await f.read("/data/in/x.bin"), b"\x00\xff" * 1000)
                    self.assertEqual((await f.stat("/data/in/x.bin")).mode & 0o777, 0o600)
                    self.assertEqual([e.name for e in await f.list("/data/in")], ["x.bin"])
                    await f.rename("/data/in/x.bin", "/data/y.bin")
                    self.assertFalse(await f.exists("/data/in/x.bin"))
                    self.assertEqual(await f.read_text("/data/y.bin", "latin-1"),
                                     "\x00\xff" * 1000)
                    await f.remove("/data", recursive=True)
                    self.assertFalse(await f.exists("/data"))
                    with self.assertRaises(warren.NotFound):
                        await f.read("/data/y.bin")

                    # background
                    cmd = await sb.run("sleep 0.3; echo bg", background=True)
                    self.assertIsInstance(cmd, warren.AsyncBackgroundCommand)
                    r = await cmd.wait(timeout=30)
                    self.assertEqual((r.exit_code, r.stdout), (0, "bg\n"))
                    cmd = await sb.run("sleep 60", background=True)
                    await cmd.kill()
                    self.assertNotEqual((await cmd.wait(timeout=10)).exit_code, 0)
                self.assertEqual(sb.state, "stopped")
        self.run_async(main())

    def test_dirs(self):
        src = tempfile.mkdtemp()
        dst = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, src)
        self.addCleanup(shutil.rmtree, dst)
        os.makedirs(os.path.join(src, "a", "b"))
        for i in range(10):
            with open(os.path.join(src, "a", "b", "f%d" % i), "w") as fh:
                fh.write("file %d\n" % i)

        async def main():
            async with client() as c:
                sb = await c.create(image=_support.IMAGE, labels=LABELS)
                try:
                    self.assertIn(await sb.files.upload_dir(src, "/up"), (10, 12))
                    r = await sb.run("cat /up/a/b/f7")
                    self.assertEqual(r.stdout, "file 7\n")
                    self.assertEqual(await sb.files.download_dir("/up", dst), 10)
                finally:
                    await sb.stop()
        self.run_async(main())
        with open(os.path.join(dst, "a", "b", "f3")) as fh:
            self.assertEqual(fh.read(), "file 3\n")

    def test_errors(self):
        async def main():
            async with warren.AsyncClient(SRV.url, token="nope", max_retries=0) as bad:
                with self.assertRaises(warren.Unauthorized):
                    await bad.list()
            async with client() as c:
                with self.assertRaises(warren.NotFound) as cm:
                    await c.get("sb-%s-missing" % (await c.nodes())[0].name)
                self.assertTrue(cm.exception.message)
                with self.assertRaises(warren.BadRequest):
                    await c.create(image=_support.IMAGE, memory_mb=-1, labels=LABELS)
                with self.assertRaises(warren.CommandFailed):
                    async with c.create(image=_support.IMAGE, labels=LABELS) as sb:
                        await sb.run("false", check=True)
        self.run_async(main())

    def test_network_rules_and_denials(self):
        async def main():
            async with client() as c:
                name = "pya-rule-" + RUN[4:]
                rule = await c.put_network_rule(name, hosts=["*.example.test"], ports=[443], protocols=["tcp"])
                self.assertEqual(rule["version"], 1)
                try:
                    self.assertIn(name, [r["name"] for r in await c.network_rules()])
                    self.assertEqual((await c.network_rule(name))["hosts"], ["*.example.test"])
                    async with c.create(image=_support.IMAGE, labels=LABELS, network=[name]) as sb:
                        await sb.run("nslookup other.test || true")
                        seen = [(d["protocol"], d["destination"]) for d in await sb.network_denials()]
                        self.assertIn(("dns", "other.test"), seen)
                finally:
                    await c.delete_network_rule(name)
                with self.assertRaises(warren.NotFound):
                    await c.network_rule(name)
        self.run_async(main())

    def test_trajectory_branch_replay_snapshot_delete(self):
        name = "pya/" + uuid.uuid4().hex[:8]

        async def main():
            async with client() as c:
                async with c.create(image=_support.IMAGE, labels=LABELS, trajectory=name) as sb:
                    await sb.run("echo x >> /counter")
                    await sb.run("cat /proc/sys/kernel/random/uuid")
                    again = await c.resume(name, branch=True)
                    r = await again.run("echo x >> /counter")
                    self.assertTrue(r.replayed)
                    r = await again.run("echo y >> /counter; cat /counter")
                    self.assertEqual((r.trajectory, r.stdout), (name + "~2", "x\ny\n"))
                    self.assertEqual(again.id, r.sandbox)
                    await again.stop()
                    snap = await sb.snapshot()
                rep = await c.replay_trajectory(name)
                self.assertEqual((rep.steps, rep.deterministic), (2, False))
                self.assertEqual([d["step"] for d in rep.differences], [2])
                await c.delete_snapshot(snap.id)
                with self.assertRaises(warren.NotFound):
                    await c.delete_snapshot(snap.id)
        self.run_async(main())

    def test_idempotent_create(self):
        labels = dict(LABELS, case="idem")
        key = "atest-" + uuid.uuid4().hex

        async def main():
            async with client() as c:
                sbs = await asyncio.gather(*(c.create(image=_support.IMAGE, labels=labels,
                                                      idempotency_key=key) for _ in range(3)))
                self.assertEqual(len({s.id for s in sbs}), 1)
                self.assertEqual(len(await c.list(labels=labels)), 1)
                await sbs[0].stop()
        self.run_async(main())

    def test_500_concurrent_operations(self):
        """500 concurrent commands and file writes over 10 sandboxes from one loop,
        with no thread per operation."""
        n_sb, per_sb = 10, 50
        labels = dict(LABELS, case="c500")

        async def main():
            async with client(timeout=120) as c:
                sbs = await c.create_many(n_sb, image=_support.IMAGE, labels=labels,
                                          memory_mb=64)
                try:
                    self.assertEqual(len({s.id for s in sbs}), n_sb)
                    threads_before = threading.active_count()

                    async def op(i):
                        sb = sbs[i % n_sb]
                        if i % 5 == 0:
                            await sb.files.write("/tmp/f%d" % i, b"%d" % i)
                            return (await sb.files.read("/tmp/f%d" % i)).decode()
                        return (await sb.run("echo %d" % i)).stdout.strip()

                    t0 = time.monotonic()
                    outs = await asyncio.gather(*(op(i) for i in range(n_sb * per_sb)))
                    elapsed = time.monotonic() - t0
                    self.assertEqual(outs, [str(i) for i in range(n_sb * per_sb)])
                    self.assertLessEqual(threading.active_count(), threads_before)
                    rs = await c.run_many(sbs, "echo many")
                    self.assertEqual({r.stdout for r in rs}, {"many\n"})
                    print("\n500 concurrent operations in %.2fs" % elapsed)
                finally:
                    await asyncio.gather(*(s.stop() for s in sbs), return_exceptions=True)
        self.run_async(main(), timeout=300)


if __name__ == "__main__":
    unittest.main()


class AsyncProjectsTokensBatchEvents(unittest.TestCase):
    """The async client's project, token, batch and event helpers, against the
    real server (the mirror of test_client.TestProjectsTokensBatch)."""

    run_async = AsyncTest.run_async

    def test_projects_tokens_batch_events(self):
        async def main():
            name = "pya" + uuid.uuid4().hex[:8]
            async with client() as c:
                p = await c.create_project(name, quota={"sandboxes": 2})
                self.assertEqual(p["id"], name)
                self.assertEqual((await c.project(name))["id"], name)
                with self.assertRaises(warren.WarrenError) as cm:
                    await c.create_project("sub", parent=name, quota={"sandboxes": 3})
                self.assertEqual(cm.exception.status, 403)
                sub = await c.create_project("sub", parent=name, quota={"sandboxes": 1})
                self.assertEqual(sub["id"], name + ".sub")
                upd = await c.update_project(sub["id"], {"sandboxes": 2})
                self.assertEqual(upd["quota"]["sandboxes"], 2)
                await c.delete_project(sub["id"])
                with self.assertRaises(warren.NotFound):
                    await c.project(sub["id"])
                tok = await c.create_token("pya-agent", project=name, role="member",
                                           expires_in=3600)
                self.assertTrue(tok["token"].startswith("wrn_"))
                listed = await c.tokens()
                self.assertIn(tok["id"], [t["id"] for t in listed])
                self.assertTrue(all("token" not in t for t in listed))
                async with warren.AsyncClient(SRV.url, token=tok["token"],
                                              max_retries=0) as member:
                    res = await member.create_batch(2, image=_support.IMAGE, cpu=0.1,
                                                    memory_mb=32, labels=LABELS)
                    self.assertEqual(res["created"], 2)
                    with self.assertRaises(warren.WarrenError) as cm:
                        await member.create(image=_support.IMAGE, cpu=0.1, memory_mb=32,
                                            labels=LABELS)
                    self.assertEqual(cm.exception.status, 403)
                    self.assertEqual({s.id for s in await member.list()}, set(res["ids"]))
                    for sid in res["ids"]:
                        await member.sandbox(sid).stop()
                    await c.revoke_token(tok["id"])
                    with self.assertRaises(warren.WarrenError) as cm:
                        await member.list()
                    self.assertEqual(cm.exception.status, 401)
                self.assertIn("events", await c.events(limit=10, wait=0.1))
                self.assertEqual([x["id"] for x in await c.projects() if x["id"] == name],
                                 [name])
        self.run_async(main())
