"""Snapshots, fork and trajectories against a real ``warren serve``."""
import unittest
import uuid

try:
    from . import _support
except ImportError:
    import _support

import warren

SRV = None  # type: _support.WarrenServer
C = None  # type: warren.Client


def setUpModule():
    global SRV, C
    SRV = _support.acquire_server()
    C = warren.Client(SRV.url, token=SRV.token, timeout=60)


def tearDownModule():
    try:
        C.close()
    finally:
        _support.release_server()


class SnapshotTest(unittest.TestCase):
    def test_snapshot_restore_fork(self):
        with C.create("busybox") as sb:
            sb.run("mkdir -p /work && echo one > /work/a", check=True)
            snap = sb.snapshot(name="py")
            self.assertTrue(snap.id.startswith("snap-"))
            self.assertEqual(snap.image, "busybox")
            self.assertEqual(len(snap.layers), 1)
            with C.create(snapshot=snap.id) as r:
                self.assertEqual(r.run("cat /work/a").stdout, "one\n")
            kids = sb.fork(2)
            try:
                self.assertEqual(len(kids), 2)
                for k in kids:
                    self.assertEqual(k.run("cat /work/a").stdout, "one\n")
            finally:
                for k in kids:
                    k.stop()
        with self.assertRaises(warren.NotFound):
            C.create(snapshot="snap-nosuch")

    def test_delete_snapshot(self):
        with C.create("busybox") as sb:
            snap = sb.snapshot()
            with C.create(snapshot=snap.id):
                with self.assertRaises(warren.Conflict):
                    C.delete_snapshot(snap.id)
        C.delete_snapshot(snap.id)
        with self.assertRaises(warren.NotFound):
            C.delete_snapshot(snap.id)


class StorageTest(unittest.TestCase):
    def test_list_and_delete(self):
        name = "py-rm/" + uuid.uuid4().hex[:8]
        with C.create("busybox", trajectory=name, trajectory_ttl=3600) as sb:
            sb.run("echo hi > /f", check=True)
            snap = sb.snapshot(name="listed")
            self.assertIn(snap.id, [s.id for s in C.list_snapshots()])
            self.assertEqual([s.id for s in C.list_snapshots(sandbox=sb.id)], [snap.id])
            mine = [t for t in C.list_trajectories() if t["name"] == name]
            self.assertEqual(len(mine), 1)
            self.assertGreater(mine[0]["bytes"], 0)
            self.assertIn("expires_at", mine[0])
            with self.assertRaises(warren.Conflict):
                C.delete_trajectory(name)  # its sandbox still records it
        C.delete_trajectory(name)
        with self.assertRaises(warren.NotFound):
            C.trajectory(name)
        C.delete_snapshot(snap.id)


class TrajectoryTest(unittest.TestCase):
    def test_record_resume_diverge(self):
        name = "py/" + uuid.uuid4().hex[:8]
        with C.create("busybox", trajectory=name) as sb:
            for i in range(3):
                r = sb.run("echo x >> /counter; wc -l < /counter")
                self.assertEqual(r.step, i + 1)
                self.assertFalse(r.replayed)
            t = C.trajectory(name)
            self.assertEqual(t.id, name)
            self.assertEqual([s["step"] for s in t.steps], [1, 2, 3])
            again = C.resume(name)
            self.assertEqual(again.id, sb.id)
            for i in range(3):
                r = again.run("echo x >> /counter; wc -l < /counter")
                self.assertTrue(r.replayed)
                self.assertEqual(r.stdout.strip(), str(i + 1))
            r = again.run("echo x >> /counter; wc -l < /counter")
            self.assertFalse(r.replayed)
            self.assertEqual(r.stdout.strip(), "4")
            C.resume(name)
            with self.assertRaises(warren.Conflict) as cm:
                again.run("echo other")
            self.assertEqual(cm.exception.divergence["step"], 1)
        with self.assertRaises(warren.NotFound):
            C.resume("py/nosuch-" + uuid.uuid4().hex[:6])

    def test_replay_reports_nondeterministic_steps(self):
        name = "py/" + uuid.uuid4().hex[:8]
        with C.create("busybox", trajectory=name) as sb:
            sb.files.write("/a", b"one\n")
            sb.run("cat /a")
            sb.run("cat /proc/sys/kernel/random/uuid")
        rep = C.replay_trajectory(name)
        self.assertEqual(rep.steps, 3)
        self.assertFalse(rep.deterministic)
        self.assertEqual([(d["step"], d["fields"]) for d in rep.differences], [(3, ["stdout"])])

    def test_commands_and_stats(self):
        with C.create("busybox", memory_mb=64) as sb:
            sb.run("echo hi")
            sb.run("exit 3")
            cmds = sb.commands()
            self.assertEqual([(c["cmd"], c["exit_code"]) for c in cmds], [("echo hi", 0), ("exit 3", 3)])
            st = sb.stats()
            self.assertEqual((st["id"], st["memory_mb"], st["commands"]), (sb.id, 64, 2))
            self.assertGreater(st["memory_bytes"], 0)

    def test_replay_masks_hide_noise(self):
        name = "py/" + uuid.uuid4().hex[:8]
        with C.create("busybox", trajectory=name) as sb:
            sb.run("echo Ran 2 tests in 0.$(tr -dc 0-9 </proc/sys/kernel/random/uuid)s")
        self.assertFalse(C.replay_trajectory(name).deterministic)
        rep = C.replay_trajectory(name, masks=[r"in [0-9.]+s"], ignore=["duration_ms"])
        self.assertTrue(rep.deterministic, rep.differences)
        with self.assertRaises(warren.BadRequest):
            C.replay_trajectory(name, masks=["(unclosed"])

    def test_branch_follows_new_sandbox(self):
        name = "py/" + uuid.uuid4().hex[:8]
        with C.create("busybox", trajectory=name) as sb:
            for i in range(2):
                sb.run("echo x >> /counter")
            again = C.resume(name, branch=True)
            again.run("echo x >> /counter")
            r = again.run("echo y >> /counter; cat /counter")
            self.assertEqual(r.trajectory, name + "~2")
            self.assertEqual(r.stdout, "x\ny\n")
            try:
                self.assertNotEqual(again.id, sb.id)
                self.assertEqual(again.id, r.sandbox)
                self.assertEqual(again.run("wc -l < /counter").stdout.strip(), "2")
                self.assertEqual(sb.run("wc -l < /counter").stdout.strip(), "2")
            finally:
                again.stop()


if __name__ == "__main__":
    unittest.main()
