"""Terminals (GET /v1/sandboxes/{id}/pty) through the SDK's own WebSocket
client, against a real ``warren serve``; and the frame codec on its own."""

import socket
import struct
import threading
import time
import unittest
import uuid

try:  # run as the package "tests" (discover -t) or as top-level modules (discover -s)
    from . import _support
except ImportError:
    import _support

import warren
from warren import _ws

SRV = None  # type: _support.WarrenServer
C = None  # type: warren.Client
LABELS = {"suite": "py-term-" + uuid.uuid4().hex[:8]}


def setUpModule():
    global SRV, C
    SRV = _support.acquire_server()
    C = warren.Client(SRV.url, token=SRV.token, timeout=60)


def tearDownModule():
    try:
        for sb in C.list(labels=LABELS):
            if sb.state != "stopped":
                try:
                    sb.stop()
                except warren.WarrenError:
                    pass
        C.close()
    finally:
        _support.release_server()


class FrameCodec(unittest.TestCase):
    def test_accept_key(self):
        # RFC 6455 section 1.3's example.
        self.assertEqual(_ws.accept_key("dGhlIHNhbXBsZSBub25jZQ=="), "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=")

    def test_masked_frames(self):
        a, b = socket.socketpair()
        try:
            ws = _ws.WebSocket(b)
            for n in (0, 5, 125, 126, 65535, 65536, 200000):
                payload = bytes(i % 251 for i in range(n))
                frame = _ws.encode_frame(_ws.OP_BINARY, payload, mask=b"\x01\x02\x03\x04")
                self.assertEqual(frame[0], 0x82)
                self.assertTrue(frame[1] & 0x80, "client frames are masked")
                # A server frame is the same without the mask: feed one back.
                head = bytearray([0x82])
                if n < 126:
                    head.append(n)
                elif n < 65536:
                    head += bytes([126]) + struct.pack("!H", n)
                else:
                    head += bytes([127]) + struct.pack("!Q", n)
                t = threading.Thread(target=a.sendall, args=(bytes(head) + payload,))
                t.start()
                op, got = ws.recv(timeout=10)
                t.join()
                self.assertEqual((op, got), (_ws.OP_BINARY, payload))
                # Unmasking the client frame gives the payload back.
                at = len(frame) - n - 4
                key = frame[at:at + 4]
                self.assertEqual(_ws._mask(frame[at + 4:], key), payload)
            # Fragments and a ping in between.
            a.sendall(b"\x01\x03abc" + b"\x89\x00" + b"\x80\x03def")
            self.assertEqual(ws.recv(timeout=10), (_ws.OP_TEXT, b"abcdef"))
            pong = a.recv(100)
            self.assertEqual(pong[0], 0x8A)
        finally:
            a.close()
            b.close()


class TerminalTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.sb = C.create(image=_support.IMAGE, labels=LABELS)

    @classmethod
    def tearDownClass(cls):
        cls.sb.stop()

    def test_vi_resize_exit(self):
        with self.sb.terminal(["vi", "/tmp/py.txt"], cols=80, rows=24) as t:
            t.expect("/tmp/py.txt")
            self.assertIn(b"\x1b[", bytes(t.output))
            t.write("ipython was here")
            t.expect("python was here")
            t.write(b"\x1b")
            time.sleep(0.3)
            t.write(":wq\r")
            self.assertEqual(t.wait(timeout=30).exit_code, 0)
        self.assertEqual(self.sb.run("cat /tmp/py.txt").stdout, "python was here\n")

        with self.sb.terminal("stty size; read x; stty size; exit 6", cols=100, rows=30) as t:
            t.expect("30 100")
            t.resize(120, 40)
            t.write("\r")
            t.expect("40 120")
            self.assertEqual(t.wait(timeout=30).exit_code, 6)

    def test_shell_and_stdin(self):
        with self.sb.terminal() as t:  # the sandbox's shell
            t.write("echo $((20+22))z\r")
            t.expect("42z")
            t.close_input()
            self.assertEqual(t.wait(timeout=30).exit_code, 0)
        with self.sb.terminal(["sh", "-c", "cat; echo bye >&2; exit 2"], tty=False) as t:
            t.write("no terminal\n")
            t.expect("no terminal\n")
            t.close_input()
            r = t.wait(timeout=30)
            self.assertEqual((r.exit_code, r.stdout, r.stderr), (2, "no terminal\n", "bye\n"))

    def test_big_input(self):
        with self.sb.terminal(["wc", "-c"], tty=False) as t:
            t.write(b"x" * (1536 << 10))  # more than the server's 1 MiB a message
            t.close_input()
            r = t.wait(timeout=60)
            self.assertEqual((r.exit_code, r.stdout.strip()), (0, str(1536 << 10)))

    def test_disconnect_kills(self):
        t = self.sb.terminal("echo $$ > /tmp/py.pid; echo ready; sleep 1000")
        t.expect("ready")
        pid = self.sb.run("cat /tmp/py.pid").stdout.strip()
        t.close()
        deadline = time.monotonic() + 1.0
        while self.sb.run("kill -0 %s" % pid).exit_code == 0:
            self.assertLess(time.monotonic(), deadline, "the command outlived its terminal by 1s")
            time.sleep(0.02)

    def test_bad_input(self):
        with self.assertRaises(warren.WarrenError) as cm:
            self.sb.terminal("true", cols=0, rows=24)
        self.assertIn(cm.exception.status, (400, 422))
        with self.assertRaises(warren.WarrenError) as cm:
            self.sb.terminal("true", rows=100000)
        self.assertIn(cm.exception.status, (400, 422))
        with self.assertRaises(warren.NotFound):
            C.terminal("sb-nonode-nothere", "true")


if __name__ == "__main__":
    unittest.main()


class AsyncTerminalTest(unittest.TestCase):
    def test_async_terminal(self):
        import asyncio

        async def main():
            ac = warren.AsyncClient(SRV.url, token=SRV.token, timeout=60)
            try:
                sb = await ac.create(image=_support.IMAGE, labels=LABELS)
                try:
                    async with await sb.terminal("stty size; read x; echo got:$x; exit 4", cols=90, rows=20) as t:
                        await t.expect("20 90")
                        await t.resize(91, 21)
                        await t.write("async\r")
                        await t.expect("got:async")
                        r = await t.wait(timeout=30)
                        self.assertEqual(r.exit_code, 4)
                    async with await sb.terminal(["sh", "-c", "cat; echo e >&2"], tty=False) as t:
                        await t.write("piped\n")
                        await t.close_input()
                        r = await t.wait(timeout=30)
                        self.assertEqual((r.exit_code, r.stdout, r.stderr), (0, "piped\n", "e\n"))
                    with self.assertRaises(warren.WarrenError):
                        await sb.terminal("true", cols=0)
                finally:
                    await sb.stop()
            finally:
                await ac.aclose()

        asyncio.run(main())
