"""Unit tests of the SDK's own HTTP logic (sync and asyncio) against a small
scriptable HTTP server: retries on 503/429/connection resets, idempotency-key
reuse, keep-alive reuse, NDJSON streaming, error mapping, timeouts."""

import asyncio
import io
import json
import os
import tarfile
import tempfile
import threading
import time
import unittest

try:  # run as the package "tests" (discover -t) or as top-level modules (discover -s)
    from . import _support
    from ._fake import SANDBOX, FakeServer
except ImportError:
    import _support
    from _fake import SANDBOX, FakeServer

import warren
from warren._tar import pack_dir, unpack
from warren.models import parse_time


def fast(url, **kw):
    kw.setdefault("backoff", 0.01)
    kw.setdefault("max_backoff", 0.05)
    return warren.Client(url, token="tok", **kw)


def afast(url, **kw):
    kw.setdefault("backoff", 0.01)
    kw.setdefault("max_backoff", 0.05)
    return warren.AsyncClient(url, token="tok", **kw)


class FakeCase(unittest.TestCase):
    route = None

    def serve(self, route):
        srv = FakeServer(route)
        self.addCleanup(srv.stop)
        return srv


def flaky_create(fail_with, failures=2):
    def route(h, seen, idx):
        if idx < failures:
            if fail_with == "reset":
                h.reset()
            elif fail_with == "hangup":
                h.hang_up()
            elif fail_with == 429:
                h.send_error_json(429, "too_many_requests", "slow down", {"Retry-After": "0"})
            else:
                h.send_error_json(503, "unavailable", "node starting")
            return
        h.send_json(201, SANDBOX)
    return route


def event_stream_route(h, seen, idx):
    """Follow answers for the event tests: the first stream breaks after two
    events, the reconnect (after=2) repeats event 2, then a keepalive, 3, 4."""
    assert seen.path == "/v1/events" and ("follow", "1") in seen.query
    assert seen.headers["accept"] == "application/x-ndjson"
    ev = lambda n: json.dumps({"seq": n, "type": "node.down", "node": "n%d" % n}).encode() + b"\n"
    if idx == 0:
        h.send_chunked(200, "application/x-ndjson", [ev(1), ev(2)[:10], ev(2)[10:]])
    elif idx == 1:
        h.send_error_json(503, "unavailable", "apiserver restarting", {"Retry-After": "0"})
    else:
        h.send_chunked(200, "application/x-ndjson", [ev(2), b"\n", ev(3) + ev(4)], delay=0.01)


class SyncTransportTest(FakeCase):
    def test_retries_503_with_same_idempotency_key(self):
        srv = self.serve(flaky_create(503))
        with fast(srv.url) as c:
            sb = c.create(image="busybox", labels={"a": "b"}, ttl=60)
        self.assertEqual(sb.id, "sb-n1-abc")
        self.assertEqual(len(srv.seen), 3)
        keys = {s.headers.get("idempotency-key") for s in srv.seen}
        self.assertEqual(len(keys), 1)
        self.assertTrue(next(iter(keys)))
        self.assertEqual(srv.seen[0].json(),
                         {"image": "busybox", "labels": {"a": "b"}, "ttl": 60})
        self.assertEqual(srv.seen[0].headers["authorization"], "Bearer tok")

    def test_two_creates_use_different_keys(self):
        srv = self.serve(lambda h, s, i: h.send_json(201, SANDBOX))
        with fast(srv.url) as c:
            c.create(image="busybox")
            c.create(image="busybox")
            c.create(image="busybox", idempotency_key="mine")
        keys = [s.headers["idempotency-key"] for s in srv.seen]
        self.assertEqual(len(set(keys)), 3)
        self.assertEqual(keys[2], "mine")

    def test_retries_429_then_gives_up_typed(self):
        srv = self.serve(flaky_create(429, failures=100))
        with fast(srv.url, max_retries=3) as c:
            with self.assertRaises(warren.QuotaExceeded) as cm:
                c.create(image="busybox")
        self.assertEqual(cm.exception.message, "slow down")
        self.assertEqual(cm.exception.status, 429)
        self.assertEqual(len(srv.seen), 4)

    def test_503_exhausted_is_unavailable(self):
        srv = self.serve(flaky_create(503, failures=100))
        with fast(srv.url, max_retries=2) as c:
            with self.assertRaises(warren.Unavailable) as cm:
                c.list()
        self.assertIsInstance(cm.exception, warren.ServerError)
        self.assertEqual(cm.exception.message, "node starting")
        self.assertEqual(len(srv.seen), 3)

    def test_retries_connection_reset_for_create(self):
        for mode in ("reset", "hangup"):
            srv = self.serve(flaky_create(mode))
            with fast(srv.url) as c:
                self.assertEqual(c.create(image="busybox").id, "sb-n1-abc")
            self.assertEqual(len(srv.seen), 3, mode)
            self.assertEqual(len({s.headers["idempotency-key"] for s in srv.seen}), 1)

    def test_exec_not_replayed_after_reset_on_fresh_connection(self):
        def route(h, seen, idx):
            if seen.path.endswith("/exec"):
                h.reset()
            else:
                h.send_json(200, SANDBOX)
        srv = self.serve(route)
        with fast(srv.url) as c:
            sb = c.sandbox("sb-n1-abc")
            with self.assertRaises(warren.ConnectionFailed):
                sb.run("echo once")
        self.assertEqual(sum(1 for s in srv.seen if s.path.endswith("/exec")), 1)

    def test_stale_keepalive_connection_is_replaced(self):
        # The server closes every connection right after answering, without
        # saying so: the pooled connection is dead by the next request.
        def route(h, seen, idx):
            if seen.path.endswith("/exec"):
                h.send_json(200, {"exit_code": 0, "stdout": "hi\n", "stderr": "",
                                  "truncated": False, "duration_ms": 1.5}, close_after=True)
            else:
                h.send_json(200, SANDBOX, close_after=True)
        srv = self.serve(route)
        with fast(srv.url) as c:
            sb = c.get("sb-n1-abc")
            time.sleep(0.05)
            for _ in range(3):
                self.assertEqual(sb.run("echo hi").stdout, "hi\n")
                time.sleep(0.02)
        self.assertEqual(sum(1 for s in srv.seen if s.path.endswith("/exec")), 3)

    def test_keepalive_reuses_one_connection(self):
        srv = self.serve(lambda h, s, i: h.send_json(200, SANDBOX))
        with fast(srv.url) as c:
            for _ in range(20):
                c.get("sb-n1-abc")
        self.assertEqual(len(srv.seen), 20)
        self.assertEqual(len(srv.peers()), 1)

    def test_connection_refused_retries_then_fails(self):
        port = _support.free_port()
        c = fast("http://127.0.0.1:%d" % port, max_retries=2)
        t0 = time.monotonic()
        with self.assertRaises(warren.ConnectionFailed):
            c.list()
        self.assertLess(time.monotonic() - t0, 2)

    def test_server_comes_back(self):
        port = _support.free_port()
        srv_box = []

        def start_later():
            time.sleep(0.4)
            srv_box.append(FakeServer(lambda h, seen, i: h.send_json(
                200, {"sandboxes": [SANDBOX]}), port=port))

        th = threading.Thread(target=start_later)
        th.start()
        try:
            with warren.Client("http://127.0.0.1:%d" % port, token="t", max_retries=10,
                               backoff=0.05, max_backoff=0.2) as c:
                sbs = c.list()
            self.assertEqual([s.id for s in sbs], ["sb-n1-abc"])
        finally:
            th.join()
            for s in srv_box:
                s.stop()

    def test_error_mapping(self):
        cases = [
            (400, "bad_request", warren.BadRequest), (401, "unauthorized", warren.Unauthorized),
            (403, "forbidden", warren.Forbidden), (404, "not_found", warren.NotFound),
            (409, "conflict", warren.Conflict), (413, "too_large", warren.TooLarge),
            (422, "invalid", warren.BadRequest), (429, "too_many_requests", warren.QuotaExceeded),
            (403, "quota_exceeded", warren.QuotaExceeded), (500, "internal", warren.ServerError),
            (503, "unavailable", warren.Unavailable), (504, "timeout", warren.Timeout),
            (418, "teapot", warren.BadRequest), (502, "", warren.Unavailable),
        ]
        box = {}
        srv = self.serve(lambda h, s, i: h.send_error_json(box["status"], box["code"],
                                                           "msg %d" % box["status"]))
        with fast(srv.url, max_retries=0) as c:
            for status, code, cls in cases:
                box.update(status=status, code=code)
                with self.assertRaises(cls, msg=code) as cm:
                    c.get("sb-x")
                self.assertEqual(cm.exception.status, status)
                self.assertEqual(cm.exception.message, "msg %d" % status)
                if code:
                    self.assertEqual(cm.exception.code, code)
                self.assertIn("msg", str(cm.exception))

    def test_503_reason(self):
        srv = self.serve(lambda h, s, i: h.send_json(503, {"error": {
            "code": "unavailable", "reason": "cpu",
            "message": "no node can take this sandbox now: not enough cpu"}}))
        with fast(srv.url, max_retries=0) as c:
            with self.assertRaises(warren.Unavailable) as cm:
                c.create(image="busybox")
        self.assertEqual(cm.exception.reason, "cpu")
        self.assertIn("not enough cpu", str(cm.exception))

    def test_non_json_error_body(self):
        srv = self.serve(lambda h, s, i: h.send_raw(404, b"404 page not found\n", "text/plain"))
        with fast(srv.url) as c:
            with self.assertRaises(warren.NotFound) as cm:
                c.get("sb-x").snapshot()
        self.assertEqual(cm.exception.message, "404 page not found")

    def test_follow_events_resumes(self):
        srv = self.serve(event_stream_route)
        with fast(srv.url) as c:
            got = list(c.follow_events(limit=3))
        self.assertEqual([e["seq"] for e in got], [1, 2, 3])
        self.assertNotIn("after", dict(srv.seen[0].query))
        self.assertEqual(dict(srv.seen[-1].query).get("after"), "2")
        with fast(srv.url) as c:  # without reconnect the first stream's end ends it
            srv.seen.clear()
            self.assertEqual(len(list(c.follow_events(after=0, reconnect=False))), 2)

    def test_ndjson_stream_callbacks(self):
        events = [{"stdout": "a"}, {"stderr": "E1"}, {"stdout": "b\n"}, {"stderr": "E2"},
                  {"exit_code": 3, "truncated": True, "timed_out": False, "duration_ms": 1500}]

        def route(h, seen, idx):
            if seen.method == "GET":
                return h.send_json(200, SANDBOX)
            assert seen.headers["accept"] == "application/x-ndjson"
            lines = [json.dumps(e).encode() + b"\n" for e in events]
            # split one line across chunks and put two lines in one chunk
            pieces = [lines[0][:3], lines[0][3:] + lines[1], lines[2], lines[3] + lines[4]]
            h.send_chunked(200, "application/x-ndjson", pieces, delay=0.01)

        srv = self.serve(route)
        out, err = [], []
        with fast(srv.url) as c:
            r = c.sandbox("sb-n1-abc").run("x", on_stdout=out.append, on_stderr=err.append,
                                           timeout=5)
            self.assertEqual(srv.seen[0].json(), {"cmd": "x", "timeout": 5.0})
            # the connection is reusable after a fully read stream
            c.get("sb-n1-abc")
        self.assertEqual(out, ["a", "b\n"])
        self.assertEqual(err, ["E1", "E2"])
        self.assertEqual((r.exit_code, r.stdout, r.stderr, r.truncated), (3, "ab\n", "E1E2", True))
        self.assertAlmostEqual(r.duration, 1.5)
        self.assertFalse(r.ok)
        with self.assertRaises(warren.CommandFailed):
            r.check()
        self.assertEqual(len(srv.peers()), 1)

    def test_ndjson_error_event(self):
        def route(h, seen, idx):
            h.send_chunked(200, "application/x-ndjson", [
                b'{"stdout":"x"}\n', b'{"error":{"code":"conflict","message":"sandbox stopped"}}\n'])
        srv = self.serve(route)
        with fast(srv.url) as c:
            with self.assertRaises(warren.Conflict) as cm:
                c.sandbox("sb-1").run("x", on_stdout=lambda s: None)
        self.assertEqual(cm.exception.message, "sandbox stopped")

    def test_ndjson_truncated_stream(self):
        srv = self.serve(lambda h, s, i: h.send_chunked(200, "application/x-ndjson",
                                                         [b'{"stdout":"x"}\n']))
        with fast(srv.url) as c:
            with self.assertRaises(warren.WarrenError):
                c.sandbox("sb-1").run("x", on_stdout=lambda s: None)

    def test_argv_env_background_and_wait(self):
        calls = {"n": 0}

        def route(h, seen, idx):
            if seen.path.endswith("/exec"):
                h.send_json(202, {"exit_code": 0, "stdout": "", "stderr": "", "truncated": False,
                                  "duration_ms": 0, "command_id": "c-1"})
            elif seen.path.endswith("/kill"):
                h.send_json(200, {"id": "c-1", "running": False, "exit_code": 137,
                                  "signal": "killed", "stdout": "", "stderr": "",
                                  "truncated": False, "duration_ms": 5})
            else:
                calls["n"] += 1
                done = calls["n"] >= 3
                st = {"id": "c-1", "running": not done, "stdout": "out", "stderr": "",
                      "truncated": False, "duration_ms": 20}
                if done:
                    st["exit_code"] = 0
                h.send_json(200, st)
        srv = self.serve(route)
        with fast(srv.url) as c:
            sb = c.sandbox("sb-1")
            cmd = sb.run(["sleep", 1], background=True, env={"A": "1"}, cwd="/tmp")
            self.assertIsInstance(cmd, warren.BackgroundCommand)
            self.assertEqual(cmd.id, "c-1")
            self.assertEqual(srv.seen[0].json(), {"argv": ["sleep", "1"], "env": {"A": "1"},
                                                  "cwd": "/tmp", "background": True})
            r = cmd.wait(timeout=5)
            self.assertEqual((r.exit_code, r.stdout, r.command_id), (0, "out", "c-1"))
            self.assertIn(("wait", "1"), srv.seen[-1].query)
            st = cmd.kill(signal=15)
            self.assertEqual(srv.seen[-1].json(), {"signal": 15})
            self.assertEqual(st.exit_code, 137)

    def test_files_wire_format(self):
        def route(h, seen, idx):
            q = dict(seen.query)
            if seen.method == "PUT" and seen.path.endswith("/files"):
                h.send_json(200, {"name": "a", "path": q["path"], "size": len(seen.body),
                                  "mode": int(q.get("mode", "0644"), 8), "type": "file",
                                  "mod_time": "2024-01-02T03:04:05Z"})
            elif seen.method == "GET" and "list" in q:
                h.send_json(200, {"files": [{"name": "a", "path": "/w/a", "type": "file"},
                                            {"name": "d", "path": "/w/d", "type": "dir"}]})
            elif seen.method == "GET" and "stat" in q:
                if q["path"] == "/nope":
                    h.send_error_json(404, "not_found", "no such file")
                else:
                    h.send_json(200, {"name": "a", "path": q["path"], "type": "file", "size": 3})
            elif seen.method == "GET":
                h.send_raw(200, b"\x00\x01binary")
            elif seen.method == "DELETE":
                h.send_response(204)
                h.end_headers()
            elif seen.path.endswith("/mkdir"):
                h.send_json(200, {"name": "d", "path": seen.json()["path"], "type": "dir"})
            elif seen.path.endswith("/rename"):
                h.send_response(204)
                h.end_headers()
        srv = self.serve(route)
        with fast(srv.url) as c:
            f = c.sandbox("sb-1").files
            fi = f.write("/w/a", "héllo", mode=0o755)
            self.assertEqual((fi.path, fi.size, fi.mode), ("/w/a", 6, 0o755))
            self.assertEqual(srv.seen[-1].query, [("path", "/w/a"), ("mode", "0755")])
            self.assertEqual(srv.seen[-1].body, "héllo".encode())
            self.assertEqual(f.read("/w/a"), b"\x00\x01binary")
            self.assertEqual([x.name for x in f.list("/w")], ["a", "d"])
            self.assertTrue(f.list("/w")[1].is_dir)
            self.assertTrue(f.exists("/w/a"))
            self.assertFalse(f.exists("/nope"))
            f.remove("/w", recursive=True)
            self.assertEqual(srv.seen[-1].query, [("path", "/w"), ("recursive", "1")])
            self.assertEqual(f.mkdir("/w/d", mode=0o700).path, "/w/d")
            self.assertEqual(srv.seen[-1].json(), {"path": "/w/d", "mode": 0o700, "parents": True})
            f.rename("/w/a", "/w/b")
            self.assertEqual(srv.seen[-1].json(), {"from": "/w/a", "to": "/w/b"})
            self.assertEqual(len(srv.peers()), 1)

    def test_list_filters(self):
        srv = self.serve(lambda h, s, i: h.send_json(200, {"sandboxes": [SANDBOX, SANDBOX]}))
        with fast(srv.url) as c:
            sbs = c.list(labels={"job": "x=1", "b": "2"}, state="running")
        self.assertEqual(len(sbs), 2)
        self.assertEqual(srv.seen[0].query, [("label", "job=x=1"), ("label", "b=2"),
                                             ("state", "running")])
        self.assertEqual(sbs[0].info.created_at.microsecond, 123456)
        self.assertIsNone(sbs[0].info.last_active_at)

    def test_create_waits_while_creating_and_raises_failed(self):
        states = iter(["creating", "creating", "failed"])

        def route(h, seen, idx):
            d = dict(SANDBOX, state=next(states))
            if d["state"] == "failed":
                d["reason"] = "rootfs: no space"
            h.send_json(201 if seen.method == "POST" else 200, d)
        srv = self.serve(route)
        with fast(srv.url) as c:
            with self.assertRaises(warren.SandboxFailed) as cm:
                c.create(image="busybox")
        self.assertEqual(cm.exception.message, "rootfs: no space")
        self.assertEqual(cm.exception.sandbox_id, "sb-n1-abc")

    def test_socket_timeout_is_typed(self):
        def route(h, seen, idx):
            time.sleep(0.6)
            h.send_json(200, SANDBOX)
        srv = self.serve(route)
        with fast(srv.url, timeout=0.2) as c:
            with self.assertRaises(warren.Timeout):
                c.sandbox("sb-1").refresh()

    def test_context_manager_stops(self):
        srv = self.serve(lambda h, s, i: h.send_json(201 if s.method == "POST" else 200,
                                                     dict(SANDBOX, state="stopped")
                                                     if s.method == "DELETE" else SANDBOX))
        with fast(srv.url) as c:
            with c.create(image="busybox") as sb:
                pass
        self.assertEqual(sb.state, "stopped")
        self.assertEqual([s.method for s in srv.seen], ["POST", "DELETE"])

    def test_env_defaults(self):
        old = dict(os.environ)
        try:
            os.environ["WARREN_URL"] = "http://example.invalid:1234/base/"
            os.environ["WARREN_TOKEN"] = "envtok"
            c = warren.Client()
            self.assertEqual(c.url, "http://example.invalid:1234/base")
            self.assertEqual(c._cfg.token, "envtok")
            self.assertEqual(c._cfg.base_path, "/base")
        finally:
            os.environ.clear()
            os.environ.update(old)


class AsyncTransportTest(FakeCase):
    def run_async(self, coro):
        return asyncio.run(coro)

    def test_retries_and_idempotency(self):
        srv = self.serve(flaky_create(503))

        async def main():
            async with afast(srv.url) as c:
                return await c.create(image="busybox")
        self.assertEqual(self.run_async(main()).id, "sb-n1-abc")
        self.assertEqual(len(srv.seen), 3)
        self.assertEqual(len({s.headers["idempotency-key"] for s in srv.seen}), 1)

    def test_retries_reset_and_hangup(self):
        for mode in ("reset", "hangup"):
            srv = self.serve(flaky_create(mode))

            async def main():
                async with afast(srv.url) as c:
                    return await c.create(image="busybox")
            self.assertEqual(self.run_async(main()).id, "sb-n1-abc")
            self.assertEqual(len(srv.seen), 3)

    def test_exec_not_replayed_on_fresh_connection(self):
        srv = self.serve(lambda h, s, i: h.reset())

        async def main():
            async with afast(srv.url) as c:
                await c.sandbox("sb-1").run("echo once")
        with self.assertRaises(warren.ConnectionFailed):
            self.run_async(main())
        self.assertEqual(len(srv.seen), 1)

    def test_stale_connection(self):
        srv = self.serve(lambda h, s, i: h.send_json(200, {"exit_code": 0, "stdout": "ok"},
                                                     close_after=True))

        async def main():
            async with afast(srv.url) as c:
                sb = c.sandbox("sb-1")
                outs = []
                for _ in range(3):
                    outs.append((await sb.run("x")).stdout)
                    await asyncio.sleep(0.02)
                return outs
        self.assertEqual(self.run_async(main()), ["ok"] * 3)
        self.assertEqual(len(srv.seen), 3)

    def test_error_mapping_and_exhausted(self):
        srv = self.serve(lambda h, s, i: h.send_error_json(429, "too_many_requests", "quota: 10"))

        async def main():
            async with afast(srv.url, max_retries=2) as c:
                await c.get("sb-x")
        with self.assertRaises(warren.QuotaExceeded) as cm:
            self.run_async(main())
        self.assertEqual(cm.exception.message, "quota: 10")
        self.assertEqual(len(srv.seen), 3)

    def test_follow_events_async_resumes(self):
        srv = self.serve(event_stream_route)

        async def main():
            async with afast(srv.url) as c:
                return [e async for e in c.follow_events(after=0, limit=4)]
        got = self.run_async(main())
        self.assertEqual([e["seq"] for e in got], [1, 2, 3, 4])
        self.assertEqual(dict(srv.seen[-1].query).get("after"), "2")

    def test_ndjson_async_callbacks(self):
        def route(h, seen, idx):
            if seen.method == "GET":
                return h.send_json(200, SANDBOX)
            h.send_chunked(200, "application/x-ndjson", [
                b'{"stdout":"a"}\n{"std', b'err":"e"}\n', b'{"stdout":"b"}\n',
                b'{"exit_code":0,"truncated":false,"duration_ms":2}\n'], delay=0.01)
        srv = self.serve(route)
        got = []

        async def on_err(s):
            await asyncio.sleep(0)
            got.append(("err", s))

        async def main():
            async with afast(srv.url) as c:
                r = await c.sandbox("sb-1").run("x", on_stdout=lambda s: got.append(("out", s)),
                                                on_stderr=on_err)
                await c.get("sb-1")  # connection reused after the stream
                return r
        r = self.run_async(main())
        self.assertEqual(got, [("out", "a"), ("err", "e"), ("out", "b")])
        self.assertEqual((r.stdout, r.stderr, r.exit_code), ("ab", "e", 0))
        self.assertEqual(len(srv.peers()), 1)

    def test_keepalive_and_1000_concurrent(self):
        srv = self.serve(lambda h, s, i: h.send_json(200, {"exit_code": 0,
                                                           "stdout": s.json()["cmd"]}))

        async def main():
            async with afast(srv.url, max_connections=64) as c:
                sb = c.sandbox("sb-1")
                rs = await asyncio.gather(*(sb.run("echo %d" % i) for i in range(1000)))
                return [r.stdout for r in rs]
        t0 = time.monotonic()
        outs = self.run_async(main())
        self.assertEqual(outs, ["echo %d" % i for i in range(1000)])
        self.assertLessEqual(len(srv.peers()), 64)
        self.assertLess(time.monotonic() - t0, 30)

    def test_cancellation_releases_connections(self):
        def route(h, seen, idx):
            if seen.path.endswith("/exec"):
                time.sleep(0.3)
                return h.send_json(200, {"exit_code": 0, "stdout": "slow"})
            h.send_json(200, SANDBOX)
        srv = self.serve(route)

        async def main():
            async with afast(srv.url, max_connections=4) as c:
                sb = c.sandbox("sb-1")
                tasks = [asyncio.ensure_future(sb.run("x")) for _ in range(20)]
                await asyncio.sleep(0.1)
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                # every slot came back: 4 more requests go through at once
                got = await asyncio.wait_for(asyncio.gather(*(c.get("sb-1") for _ in range(8))),
                                             5)
                return len(got)
        self.assertEqual(self.run_async(main()), 8)

    def test_timeout_typed(self):
        def route(h, seen, idx):
            time.sleep(0.6)
            h.send_json(200, SANDBOX)
        srv = self.serve(route)

        async def main():
            async with afast(srv.url, timeout=0.2) as c:
                await c.get("sb-1")
        with self.assertRaises(warren.Timeout):
            self.run_async(main())

    def test_context_managers(self):
        srv = self.serve(lambda h, s, i: h.send_json(201 if s.method == "POST" else 200,
                                                     dict(SANDBOX, state="stopped")
                                                     if s.method == "DELETE" else SANDBOX))

        async def main():
            async with afast(srv.url) as c:
                async with c.create(image="busybox") as sb:
                    self.assertEqual(sb.state, "running")
                return sb
        self.assertEqual(self.run_async(main()).state, "stopped")

    def test_files_and_archive(self):
        store = {}

        def route(h, seen, idx):
            q = dict(seen.query)
            if seen.path.endswith("/archive") and seen.method == "PUT":
                store["tar"] = seen.body
                n = sum(1 for m in tarfile.open(fileobj=io.BytesIO(seen.body)) if m.isreg())
                h.send_json(200, {"files": n})
            elif seen.path.endswith("/archive"):
                h.send_chunked(200, "application/x-tar",
                               [store["tar"][i:i + 1000] for i in range(0, len(store["tar"]),
                                                                          1000)])
            elif seen.method == "PUT":
                store[q["path"]] = seen.body
                h.send_json(200, {"name": "x", "path": q["path"], "size": len(seen.body)})
            else:
                h.send_raw(200, store[q["path"]])
        srv = self.serve(route)
        src = tempfile.mkdtemp()
        dst = tempfile.mkdtemp()
        self.addCleanup(__import__("shutil").rmtree, src)
        self.addCleanup(__import__("shutil").rmtree, dst)
        os.makedirs(os.path.join(src, "sub", "deep"))
        with open(os.path.join(src, "a.txt"), "w") as f:
            f.write("A")
        with open(os.path.join(src, "sub", "deep", "b.bin"), "wb") as f:
            f.write(os.urandom(5000))

        async def main():
            async with afast(srv.url) as c:
                f = c.sandbox("sb-1").files
                await f.write("/p", b"data" * 100000)
                data = await f.read("/p")
                n = await f.upload_dir(src, "/work")
                m = await f.download_dir("/work", dst)
                return data, n, m
        data, n, m = self.run_async(main())
        self.assertEqual(data, b"data" * 100000)
        self.assertEqual((n, m), (2, 2))
        with open(os.path.join(dst, "sub", "deep", "b.bin"), "rb") as a, \
                open(os.path.join(src, "sub", "deep", "b.bin"), "rb") as b:
            self.assertEqual(a.read(), b.read())


class HelpersTest(unittest.TestCase):
    def test_version_matches_pyproject(self):
        with open(os.path.join(str(_support.SDK), "pyproject.toml")) as f:
            self.assertIn('version = "%s"' % warren.__version__, f.read())

    def test_build_backend_builds_a_wheel(self):
        import importlib.util
        import zipfile
        spec = importlib.util.spec_from_file_location(
            "warren_build", os.path.join(str(_support.SDK), "_pep517", "warren_build.py"))
        wb = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(wb)
        d = tempfile.mkdtemp()
        self.addCleanup(__import__("shutil").rmtree, d)
        name = wb.build_wheel(d)
        with zipfile.ZipFile(os.path.join(d, name)) as z:
            names = z.namelist()
        self.assertIn("warren/py.typed", names)
        self.assertIn("warren/aio.py", names)
        self.assertTrue(any(n.endswith(".dist-info/RECORD") for n in names))
        self.assertTrue(wb.build_sdist(d).endswith(".tar.gz"))

    def test_public_api(self):
        for name in warren.__all__:
            self.assertTrue(hasattr(warren, name), name)
        self.assertTrue(os.path.exists(os.path.join(os.path.dirname(warren.__file__), "py.typed")))

    def test_parse_time(self):
        t = parse_time("2024-05-01T10:00:00.123456789+02:00")
        self.assertEqual((t.hour, t.microsecond, t.utcoffset().total_seconds()),
                         (10, 123456, 7200))
        self.assertIsNone(parse_time("0001-01-01T00:00:00Z"))
        self.assertIsNone(parse_time("garbage"))

    def test_unpack_refuses_escape(self):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tf:
            for name in ("../evil", "/abs", "ok.txt"):
                ti = tarfile.TarInfo(name)
                ti.size = 1
                tf.addfile(ti, io.BytesIO(b"x"))
            ti = tarfile.TarInfo("link")
            ti.type = tarfile.SYMTYPE
            ti.linkname = "/etc/passwd"
            tf.addfile(ti)
        d = tempfile.mkdtemp()
        self.addCleanup(__import__("shutil").rmtree, d)
        self.assertEqual(unpack(buf.getvalue(), os.path.join(d, "out")), 1)
        self.assertEqual(sorted(os.listdir(os.path.join(d, "out"))), ["ok.txt"])
        self.assertFalse(os.path.exists(os.path.join(d, "evil")))

    def test_pack_dir_keeps_dotfiles_and_modes(self):
        d = tempfile.mkdtemp()
        self.addCleanup(__import__("shutil").rmtree, d)
        with open(os.path.join(d, ".hidden"), "w") as f:
            f.write("h")
        os.chmod(os.path.join(d, ".hidden"), 0o751)
        data, n = pack_dir(d)
        self.assertEqual(n, 1)
        out = tempfile.mkdtemp()
        self.addCleanup(__import__("shutil").rmtree, out)
        self.assertEqual(unpack(data, out), 1)
        self.assertEqual(os.stat(os.path.join(out, ".hidden")).st_mode & 0o777, 0o751)


if __name__ == "__main__":
    unittest.main()


class AuditTest(FakeCase):
    AUDIT = {"records": [{"time": "2026-12-01T15:34:32Z", "step": 2, "kind": "exec", "pid": 7,
                          "ppid": 6, "uid": 0, "path": "/bin/true", "argv": ["/bin/true"]}],
             "dropped": 0, "telemetry": True}

    def route(self, h, seen, idx):
        assert seen.method == "GET" and seen.path == "/v1/sandboxes/sb-n1-abc/audit", seen.path
        h.send_json(200, self.AUDIT)

    def test_audit_sync_and_async(self):
        srv = self.serve(self.route)
        sb = fast(srv.url).sandbox("sb-n1-abc")
        got = sb.audit(step=2, kind="exec")
        self.assertEqual(got["records"][0]["argv"], ["/bin/true"])
        self.assertEqual(srv.seen[-1].query, [("step", "2"), ("kind", "exec")])
        sb.audit()
        self.assertEqual(srv.seen[-1].query, [])
        sb.audit(summary=True)
        self.assertEqual(srv.seen[-1].query, [("summary", "1")])

        async def go():
            async with afast(srv.url) as c:
                return await c.sandbox("sb-n1-abc").audit(step=0)
        got = asyncio.run(go())
        self.assertTrue(got["telemetry"])
        self.assertEqual(srv.seen[-1].query, [("step", "0")])
