"""Retries against a real ``warren serve`` that is briefly unavailable: the
server is stopped (SIGTERM) and started again on the same port and data dir
while the client keeps working."""

import asyncio
import threading
import time
import unittest
import uuid

try:  # run as the package "tests" (discover -t) or as top-level modules (discover -s)
    from . import _support
except ImportError:
    import _support

import warren


class RestartTest(unittest.TestCase):
    def setUp(self):
        self.srv = _support.WarrenServer()
        self.addCleanup(self.srv.cleanup)
        self.srv.start()

    def restart_later(self, delay):
        errors = []

        def go():
            time.sleep(delay)
            try:
                self.srv.start()
            except Exception as e:  # pragma: no cover - reported by the test
                errors.append(e)
        t = threading.Thread(target=go)
        t.start()
        return t, errors

    def test_sync_client_rides_through_restart(self):
        c = warren.Client(self.srv.url, token=self.srv.token, max_retries=30, backoff=0.05,
                          max_backoff=0.5)
        self.addCleanup(c.close)
        labels = {"suite": "retry-" + uuid.uuid4().hex[:6]}
        self.assertEqual(c.list(labels=labels), [])  # leaves a pooled keep-alive connection
        self.srv.stop()
        t, errors = self.restart_later(1.0)
        try:
            t0 = time.monotonic()
            self.assertEqual(c.list(labels=labels), [])  # refused, then retried until back
            self.assertGreater(time.monotonic() - t0, 0.5)
        finally:
            t.join()
        self.assertEqual(errors, [])
        sb = c.create(image=_support.IMAGE, labels=labels)
        try:
            self.assertEqual(sb.run("echo up").stdout, "up\n")
        finally:
            sb.stop()

    def test_create_retry_is_idempotent_across_restart(self):
        c = warren.Client(self.srv.url, token=self.srv.token, max_retries=30, backoff=0.05,
                          max_backoff=0.5)
        self.addCleanup(c.close)
        labels = {"suite": "retryidem-" + uuid.uuid4().hex[:6]}
        key = "restart-" + uuid.uuid4().hex
        a = c.create(image=_support.IMAGE, labels=labels, idempotency_key=key)
        self.srv.stop()
        t, errors = self.restart_later(0.5)
        try:
            b = c.create(image=_support.IMAGE, labels=labels, idempotency_key=key)
        finally:
            t.join()
        self.assertEqual(errors, [])
        self.assertEqual(a.id, b.id)
        self.assertEqual(len(c.list(labels=labels)), 1)
        try:
            c.get(a.id).stop()
        except warren.NotFound:
            pass

    def test_async_client_rides_through_restart(self):
        async def main():
            async with warren.AsyncClient(self.srv.url, token=self.srv.token, max_retries=30,
                                          backoff=0.05, max_backoff=0.5) as c:
                await c.nodes()
                self.srv.stop()
                t, errors = self.restart_later(1.0)
                try:
                    nodes = await asyncio.gather(*(c.nodes() for _ in range(20)))
                finally:
                    await asyncio.get_running_loop().run_in_executor(None, t.join)
                self.assertEqual(errors, [])
                self.assertTrue(all(n for n in nodes))
        asyncio.run(asyncio.wait_for(main(), 120))

    def test_gives_up_when_server_stays_down(self):
        c = warren.Client(self.srv.url, token=self.srv.token, max_retries=3, backoff=0.05,
                          max_backoff=0.1)
        self.addCleanup(c.close)
        self.srv.stop()
        with self.assertRaises(warren.ConnectionFailed):
            c.list()


if __name__ == "__main__":
    unittest.main()
