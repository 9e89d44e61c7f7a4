"""A minimal WebSocket client (RFC 6455) on the standard library, and the
:class:`Terminal` built on it (``GET /v1/sandboxes/{id}/pty``).

Only what a terminal needs: the opening handshake (with its
``Sec-WebSocket-Accept`` check), masked client frames, fragmented messages,
ping/pong and the closing handshake; no extensions. Reads happen in the
caller's thread, so a terminal whose output is not read stops its program's
output, as a real terminal does (flow control); writes may come from
another thread.
"""

import base64
import hashlib
import json
import os
import socket
import ssl
import struct
import threading
import time
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple, Union

from ._core import Config
from .errors import ConnectionFailed, WarrenError, error_for, error_from_body
from .models import ExecResult

__all__ = ["Terminal", "WebSocket", "WebSocketClosed"]

_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

OP_CONT, OP_TEXT, OP_BINARY, OP_CLOSE, OP_PING, OP_PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA

MAX_MESSAGE = 16 << 20
INPUT_MESSAGE = 64 << 10


class WebSocketClosed(WarrenError):
    """The WebSocket closed (``close_code`` says how, when the peer said)."""

    def __init__(self, message: str, close_code: Optional[int] = None) -> None:
        super().__init__(message)
        self.close_code = close_code


def accept_key(key: str) -> str:
    """The ``Sec-WebSocket-Accept`` a server must answer for ``key``."""
    return base64.b64encode(hashlib.sha1(key.encode("ascii") + _GUID).digest()).decode("ascii")


def encode_frame(opcode: int, payload: bytes, mask: Optional[bytes] = None, fin: bool = True) -> bytes:
    """One client frame: FIN, opcode, the mask bit and key, the masked payload."""
    if mask is None:
        mask = os.urandom(4)
    n = len(payload)
    head = bytearray([(0x80 if fin else 0) | opcode])
    if n < 126:
        head.append(0x80 | n)
    elif n < 1 << 16:
        head.append(0x80 | 126)
        head += struct.pack("!H", n)
    else:
        head.append(0x80 | 127)
        head += struct.pack("!Q", n)
    head += mask
    return bytes(head) + _mask(payload, mask)


def _mask(payload: bytes, mask: bytes) -> bytes:
    if not payload:
        return b""
    # XOR with the repeated key, as one big integer operation.
    n = len(payload)
    key = (mask * (n // 4 + 1))[:n]
    return (int.from_bytes(payload, "big") ^ int.from_bytes(key, "big")).to_bytes(n, "big")


class WebSocket:
    """A client WebSocket over one socket."""

    def __init__(self, sock: socket.socket, buffered: bytes = b"") -> None:
        self._sock = sock
        self._buf = bytearray(buffered)
        self._wlock = threading.Lock()
        self._frag_op = 0
        self._frag = bytearray()
        self.closed = False
        self.close_code: Optional[int] = None
        self.close_reason = ""

    @classmethod
    def connect(cls, cfg: Config, path: str, headers: Optional[Mapping[str, str]] = None,
                timeout: Optional[float] = None,
                ssl_context: Optional[ssl.SSLContext] = None) -> "WebSocket":
        """Open a WebSocket to ``path`` (with its query) on cfg's server. An
        answer other than 101 raises the API error it carries."""
        timeout = cfg.timeout if timeout is None else timeout
        try:
            sock = socket.create_connection((cfg.host, cfg.port), timeout=timeout)
        except OSError as e:
            raise ConnectionFailed("warren: connect to %s: %s" % (cfg.url, e)) from e
        try:
            if cfg.scheme == "https":
                ctx = ssl_context or ssl.create_default_context()
                sock = ctx.wrap_socket(sock, server_hostname=cfg.host)
            key = base64.b64encode(os.urandom(16)).decode("ascii")
            lines = ["GET %s%s HTTP/1.1" % (cfg.base_path, path),
                     "Host: %s" % cfg.host_header,
                     "Upgrade: websocket", "Connection: Upgrade",
                     "Sec-WebSocket-Key: " + key, "Sec-WebSocket-Version: 13",
                     "User-Agent: " + cfg.user_agent]
            if cfg.token:
                lines.append("Authorization: Bearer " + cfg.token)
            for k, v in (headers or {}).items():
                lines.append("%s: %s" % (k, v))
            sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
            status, hdrs, rest = _read_head(sock)
            if status != 101:
                raise error_from_body(status, _read_body(sock, hdrs, rest))
            if hdrs.get("upgrade", "").lower() != "websocket" or \
                    hdrs.get("sec-websocket-accept") != accept_key(key):
                raise WarrenError("warren: the server's WebSocket handshake is wrong")
            sock.settimeout(None)
            return cls(sock, rest)
        except BaseException:
            sock.close()
            raise

    # ---- sending ------------------------------------------------------------------------

    def send(self, opcode: int, payload: bytes) -> None:
        frame = encode_frame(opcode, payload)
        with self._wlock:
            if self.closed and opcode != OP_CLOSE:
                raise WebSocketClosed("warren: the WebSocket is closed", self.close_code)
            try:
                self._sock.sendall(frame)
            except OSError as e:
                raise WebSocketClosed("warren: WebSocket write: %s" % e) from e

    def send_binary(self, data: bytes) -> None:
        self.send(OP_BINARY, data)

    def send_text(self, text: str) -> None:
        self.send(OP_TEXT, text.encode("utf-8"))

    # ---- receiving ----------------------------------------------------------------------

    def _fill(self, n: int, deadline: Optional[float]) -> None:
        while len(self._buf) < n:
            if deadline is None:
                self._sock.settimeout(None)
            else:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise socket.timeout("timed out")
                self._sock.settimeout(left)
            chunk = self._sock.recv(max(65536, n - len(self._buf)))
            if not chunk:
                raise WebSocketClosed("warren: the WebSocket connection ended", self.close_code)
            self._buf += chunk

    def _frame(self, deadline: Optional[float]) -> Tuple[bool, int, bytes]:
        """One whole frame; nothing is consumed until it all arrived (so a
        timeout leaves the stream intact)."""
        self._fill(2, deadline)
        b0, b1 = self._buf[0], self._buf[1]
        n, at = b1 & 0x7F, 2
        if n == 126:
            self._fill(4, deadline)
            n, at = struct.unpack("!H", self._buf[2:4])[0], 4
        elif n == 127:
            self._fill(10, deadline)
            n, at = struct.unpack("!Q", self._buf[2:10])[0], 10
        if n > MAX_MESSAGE:
            raise WarrenError("warren: WebSocket frame of %d bytes" % n)
        masked = b1 & 0x80
        key = b""
        if masked:  # servers must not mask; take it anyway
            self._fill(at + 4, deadline)
            key = bytes(self._buf[at:at + 4])
            at += 4
        self._fill(at + n, deadline)
        payload = bytes(self._buf[at:at + n])
        del self._buf[:at + n]
        if masked:
            payload = _mask(payload, key)
        return bool(b0 & 0x80), b0 & 0x0F, payload

    def recv(self, timeout: Optional[float] = None) -> Tuple[int, bytes]:
        """The next message, ``(OP_TEXT or OP_BINARY, payload)``. Answers pings;
        a close frame is answered and raises :class:`WebSocketClosed`.
        ``timeout`` (seconds) raises ``socket.timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            fin, op, payload = self._frame(deadline)
            if op == OP_PING:
                self.send(OP_PONG, payload)
                continue
            if op == OP_PONG:
                continue
            if op == OP_CLOSE:
                code = struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else 1005
                self.close_code, self.close_reason = code, payload[2:].decode("utf-8", "replace")
                try:
                    self.send(OP_CLOSE, payload[:2])
                except WarrenError:
                    pass
                self.closed = True
                raise WebSocketClosed("warren: WebSocket closed (%d %s)" % (code, self.close_reason), code)
            if op == OP_CONT:
                self._frag += payload
            else:
                self._frag_op, self._frag = op, bytearray(payload)
            if len(self._frag) > MAX_MESSAGE:
                raise WarrenError("warren: WebSocket message too large")
            if fin:
                msg, self._frag = bytes(self._frag), bytearray()
                return self._frag_op, msg

    def close(self, code: int = 1000, reason: str = "") -> None:
        """Send a close frame (once) and close the socket."""
        if not self.closed:
            self.closed = True
            try:
                with self._wlock:
                    self._sock.sendall(encode_frame(OP_CLOSE, struct.pack("!H", code) + reason.encode()))
            except OSError:
                pass
        try:
            self._sock.close()
        except OSError:
            pass


def _read_head(sock: socket.socket) -> Tuple[int, Dict[str, str], bytes]:
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(4096)
        if not chunk:
            raise ConnectionFailed("warren: the server closed the connection during the WebSocket handshake")
        buf += chunk
        if len(buf) > 64 << 10:
            raise WarrenError("warren: the WebSocket handshake's answer is too long")
    head, rest = buf.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    try:
        status = int(parts[1])
    except (IndexError, ValueError):
        raise WarrenError("warren: bad HTTP status line %r" % lines[0])
    hdrs: Dict[str, str] = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        hdrs[k.strip().lower()] = v.strip()
    return status, hdrs, rest


def _read_body(sock: socket.socket, hdrs: Mapping[str, str], rest: bytes) -> bytes:
    try:
        n = int(hdrs.get("content-length", "-1"))
    except ValueError:
        n = -1
    body = rest
    while (n < 0 or len(body) < n) and len(body) < 64 << 10:
        try:
            chunk = sock.recv(65536)
        except OSError:
            break
        if not chunk:
            break
        body += chunk
    return body if n < 0 else body[:n]


class Terminal:
    """An interactive terminal (or a command with live stdin) in a sandbox.

    Made by :meth:`Sandbox.terminal`. ``write`` sends keystrokes, ``read``
    returns the next piece of output (``b""`` once the command ended),
    ``expect`` reads until a text appears, ``resize``, ``signal`` and
    ``close_input`` control it, and ``wait`` reads to the end and returns its
    :class:`ExecResult` (``exit_code``). ``close`` (or leaving a ``with``
    block) kills the command if it still runs. Without a terminal
    (``tty=False``) ``read`` returns stdout and keeps stderr in ``stderr``.
    """

    def __init__(self, ws: WebSocket, tty: bool = True) -> None:
        self._ws = ws
        self.tty = tty
        self.output = bytearray()  # everything read so far (stdout)
        self.stderr = bytearray()
        self.result: Optional[ExecResult] = None
        self._error: Optional[WarrenError] = None

    def __enter__(self) -> "Terminal":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- input --------------------------------------------------------------------------

    def write(self, data: Union[bytes, str]) -> None:
        """Send input: bytes as they are, text as UTF-8."""
        if isinstance(data, str):
            data = data.encode("utf-8")
        for i in range(0, len(data), INPUT_MESSAGE):  # the server takes 1 MiB a message
            self._ws.send_binary(bytes(data[i:i + INPUT_MESSAGE]))

    def _control(self, msg: Dict[str, Any]) -> None:
        self._ws.send_text(json.dumps(msg))

    def resize(self, cols: int, rows: int) -> None:
        """Change the terminal's size (the program gets SIGWINCH)."""
        self._control({"type": "resize", "cols": int(cols), "rows": int(rows)})

    def signal(self, sig: int) -> None:
        """Send a signal to the command's process group."""
        self._control({"type": "signal", "signal": int(sig)})

    def close_input(self) -> None:
        """End the command's input (a terminal gets its EOF character, ^D)."""
        self._control({"type": "eof"})

    # ---- output -------------------------------------------------------------------------

    @property
    def done(self) -> bool:
        return self.result is not None or self._error is not None

    def read(self, timeout: Optional[float] = None) -> bytes:
        """The next piece of output; ``b""`` once the command ended.
        ``timeout`` (seconds) raises :class:`warren.Timeout` when nothing came."""
        while not self.done:
            try:
                op, payload = self._ws.recv(timeout)
            except socket.timeout:
                raise error_for("timeout", "warren: no terminal output in %ss" % timeout, 504)
            except WebSocketClosed as e:
                self._error = e
                raise
            if op == OP_BINARY:
                if not self.tty:
                    if not payload:
                        continue
                    if payload[0] == 2:
                        self.stderr += payload[1:]
                        continue
                    payload = payload[1:]
                self.output += payload
                if payload:
                    return payload
                continue
            try:
                msg = json.loads(payload.decode("utf-8"))
            except ValueError:
                continue
            if msg.get("type") == "exit":
                res = msg.get("result") or {"exit_code": msg.get("code", -1)}
                self.result = ExecResult.from_json(
                    res, stdout=self.output.decode("utf-8", "replace"),
                    stderr=self.stderr.decode("utf-8", "replace"))
                self._ws.close()
            elif msg.get("type") == "error":
                err = msg.get("error") or {}
                self._error = error_for(err.get("code"), str(err.get("message") or "terminal failed"), 0)
                self._ws.close()
                raise self._error
        if self._error is not None:
            raise self._error
        return b""

    def expect(self, text: Union[str, bytes], timeout: float = 30.0) -> bytes:
        """Read until ``text`` appears in the output after the last ``expect``
        (or the start); returns the output read so far."""
        want = text.encode("utf-8") if isinstance(text, str) else text
        start = getattr(self, "_mark", 0)
        deadline = time.monotonic() + timeout
        while True:
            i = bytes(self.output).find(want, start)
            if i >= 0:
                self._mark = i + len(want)
                return bytes(self.output)
            left = deadline - time.monotonic()
            if left <= 0 or self.done:
                raise error_for("timeout", "warren: %r not in the terminal's output: %r" % (
                    want, bytes(self.output[-500:])), 504)
            self.read(timeout=left)

    def wait(self, timeout: Optional[float] = None) -> ExecResult:
        """Read to the command's end; its result (``exit_code``)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.done:
            left = None if deadline is None else max(deadline - time.monotonic(), 0.001)
            self.read(timeout=left)
        if self._error is not None:
            raise self._error
        assert self.result is not None
        return self.result

    def close(self) -> None:
        """End the terminal: the command is killed if it still runs."""
        self._ws.close()


def terminal_query(cmd: Union[None, str, Sequence[str]], cols: Optional[int], rows: Optional[int],
                   tty: bool, user: Optional[str], cwd: Optional[str],
                   env: Optional[Mapping[str, str]], timeout: Optional[float]) -> str:
    """The query string of a terminal request."""
    import urllib.parse

    q = []
    if isinstance(cmd, str):
        q.append(("cmd", cmd))
    elif cmd:
        q += [("argv", a) for a in cmd]
    if tty:
        if cols is not None:
            q.append(("cols", str(int(cols))))
        if rows is not None:
            q.append(("rows", str(int(rows))))
    else:
        q.append(("tty", "false"))
    if user:
        q.append(("user", user))
    if cwd:
        q.append(("cwd", cwd))
    for k, v in (env or {}).items():
        q.append(("env", "%s=%s" % (k, v)))
    if timeout:
        q.append(("timeout", repr(float(timeout))))
    return urllib.parse.urlencode(q)


# ---- asyncio ---------------------------------------------------------------------------


class AsyncWebSocket:
    """The asyncio twin of :class:`WebSocket` (asyncio streams)."""

    def __init__(self, reader: Any, writer: Any) -> None:
        self._r = reader
        self._w = writer
        self._frag_op = 0
        self._frag = bytearray()
        self.closed = False
        self.close_code: Optional[int] = None
        self.close_reason = ""

    @classmethod
    async def connect(cls, cfg: Config, path: str, timeout: Optional[float] = None,
                      ssl_context: Optional[ssl.SSLContext] = None) -> "AsyncWebSocket":
        import asyncio

        timeout = cfg.timeout if timeout is None else timeout
        ctx = None
        if cfg.scheme == "https":
            ctx = ssl_context or ssl.create_default_context()
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(cfg.host, cfg.port, ssl=ctx, limit=MAX_MESSAGE + 16),
                timeout)
        except (OSError, asyncio.TimeoutError) as e:
            raise ConnectionFailed("warren: connect to %s: %s" % (cfg.url, e)) from e
        try:
            key = base64.b64encode(os.urandom(16)).decode("ascii")
            lines = ["GET %s%s HTTP/1.1" % (cfg.base_path, path), "Host: %s" % cfg.host_header,
                     "Upgrade: websocket", "Connection: Upgrade",
                     "Sec-WebSocket-Key: " + key, "Sec-WebSocket-Version: 13",
                     "User-Agent: " + cfg.user_agent]
            if cfg.token:
                lines.append("Authorization: Bearer " + cfg.token)
            writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
            await writer.drain()
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
            status, hdrs, _ = _parse_head(head)
            if status != 101:
                n = int(hdrs.get("content-length", "0") or 0)
                body = await asyncio.wait_for(reader.read(min(n, 64 << 10)), timeout) if n else b""
                raise error_from_body(status, body)
            if hdrs.get("upgrade", "").lower() != "websocket" or \
                    hdrs.get("sec-websocket-accept") != accept_key(key):
                raise WarrenError("warren: the server's WebSocket handshake is wrong")
            return cls(reader, writer)
        except BaseException:
            writer.close()
            raise

    async def send(self, opcode: int, payload: bytes) -> None:
        if self.closed and opcode != OP_CLOSE:
            raise WebSocketClosed("warren: the WebSocket is closed", self.close_code)
        try:
            self._w.write(encode_frame(opcode, payload))
            await self._w.drain()
        except OSError as e:
            raise WebSocketClosed("warren: WebSocket write: %s" % e) from e

    async def _frame(self) -> Tuple[bool, int, bytes]:
        import asyncio

        try:
            b0, b1 = await self._r.readexactly(2)
            n = b1 & 0x7F
            if n == 126:
                n = struct.unpack("!H", await self._r.readexactly(2))[0]
            elif n == 127:
                n = struct.unpack("!Q", await self._r.readexactly(8))[0]
            if n > MAX_MESSAGE:
                raise WarrenError("warren: WebSocket frame of %d bytes" % n)
            key = await self._r.readexactly(4) if b1 & 0x80 else b""
            payload = await self._r.readexactly(n)
        except asyncio.IncompleteReadError:
            raise WebSocketClosed("warren: the WebSocket connection ended", self.close_code)
        if key:
            payload = _mask(payload, key)
        return bool(b0 & 0x80), b0 & 0x0F, payload

    async def recv(self) -> Tuple[int, bytes]:
        while True:
            fin, op, payload = await self._frame()
            if op == OP_PING:
                await self.send(OP_PONG, payload)
                continue
            if op == OP_PONG:
                continue
            if op == OP_CLOSE:
                code = struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else 1005
                self.close_code, self.close_reason = code, payload[2:].decode("utf-8", "replace")
                try:
                    await self.send(OP_CLOSE, payload[:2])
                except WarrenError:
                    pass
                self.closed = True
                raise WebSocketClosed("warren: WebSocket closed (%d %s)" % (code, self.close_reason), code)
            if op == OP_CONT:
                self._frag += payload
            else:
                self._frag_op, self._frag = op, bytearray(payload)
            if len(self._frag) > MAX_MESSAGE:
                raise WarrenError("warren: WebSocket message too large")
            if fin:
                msg, self._frag = bytes(self._frag), bytearray()
                return self._frag_op, msg

    async def close(self, code: int = 1000) -> None:
        if not self.closed:
            self.closed = True
            try:
                self._w.write(encode_frame(OP_CLOSE, struct.pack("!H", code)))
                await self._w.drain()
            except (OSError, RuntimeError):
                pass
        self._w.close()


def _parse_head(buf: bytes) -> Tuple[int, Dict[str, str], bytes]:
    head, _, rest = buf.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    try:
        status = int(parts[1])
    except (IndexError, ValueError):
        raise WarrenError("warren: bad HTTP status line %r" % lines[0])
    hdrs: Dict[str, str] = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        hdrs[k.strip().lower()] = v.strip()
    return status, hdrs, rest


class AsyncTerminal:
    """The asyncio twin of :class:`Terminal` (made by
    :meth:`AsyncSandbox.terminal`): ``await write()``, ``await read()``,
    ``await expect()``, ``await resize()``, ``await signal()``,
    ``await close_input()``, ``await wait()``, ``await close()``."""

    def __init__(self, ws: AsyncWebSocket, tty: bool = True) -> None:
        self._ws = ws
        self.tty = tty
        self.output = bytearray()
        self.stderr = bytearray()
        self.result: Optional[ExecResult] = None
        self._error: Optional[WarrenError] = None
        self._mark = 0

    async def __aenter__(self) -> "AsyncTerminal":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def done(self) -> bool:
        return self.result is not None or self._error is not None

    async def write(self, data: Union[bytes, str]) -> None:
        if isinstance(data, str):
            data = data.encode("utf-8")
        for i in range(0, len(data), INPUT_MESSAGE):
            await self._ws.send(OP_BINARY, bytes(data[i:i + INPUT_MESSAGE]))

    async def _control(self, msg: Dict[str, Any]) -> None:
        await self._ws.send(OP_TEXT, json.dumps(msg).encode("utf-8"))

    async def resize(self, cols: int, rows: int) -> None:
        await self._control({"type": "resize", "cols": int(cols), "rows": int(rows)})

    async def signal(self, sig: int) -> None:
        await self._control({"type": "signal", "signal": int(sig)})

    async def close_input(self) -> None:
        await self._control({"type": "eof"})

    async def read(self, timeout: Optional[float] = None) -> bytes:
        """The next piece of output; ``b""`` once the command ended."""
        import asyncio

        while not self.done:
            try:
                op, payload = await asyncio.wait_for(self._ws.recv(), timeout)
            except asyncio.TimeoutError:
                raise error_for("timeout", "warren: no terminal output in %ss" % timeout, 504)
            except WebSocketClosed as e:
                self._error = e
                raise
            data = self._take(op, payload)
            if data:
                return data
        if self._error is not None:
            raise self._error
        return b""

    def _take(self, op: int, payload: bytes) -> bytes:
        if op == OP_BINARY:
            if not self.tty:
                if not payload:
                    return b""
                if payload[0] == 2:
                    self.stderr += payload[1:]
                    return b""
                payload = payload[1:]
            self.output += payload
            return payload
        try:
            msg = json.loads(payload.decode("utf-8"))
        except ValueError:
            return b""
        if msg.get("type") == "exit":
            res = msg.get("result") or {"exit_code": msg.get("code", -1)}
            self.result = ExecResult.from_json(res, stdout=self.output.decode("utf-8", "replace"),
                                               stderr=self.stderr.decode("utf-8", "replace"))
        elif msg.get("type") == "error":
            err = msg.get("error") or {}
            self._error = error_for(err.get("code"), str(err.get("message") or "terminal failed"), 0)
        return b""

    async def expect(self, text: Union[str, bytes], timeout: float = 30.0) -> bytes:
        want = text.encode("utf-8") if isinstance(text, str) else text
        deadline = time.monotonic() + timeout
        while True:
            i = bytes(self.output).find(want, self._mark)
            if i >= 0:
                self._mark = i + len(want)
                return bytes(self.output)
            left = deadline - time.monotonic()
            if left <= 0 or self.done:
                raise error_for("timeout", "warren: %r not in the terminal's output: %r" % (
                    want, bytes(self.output[-500:])), 504)
            await self.read(timeout=left)

    async def wait(self, timeout: Optional[float] = None) -> ExecResult:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.done:
            left = None if deadline is None else max(deadline - time.monotonic(), 0.001)
            await self.read(timeout=left)
        await self._ws.close()
        if self._error is not None:
            raise self._error
        assert self.result is not None
        return self.result

    async def close(self) -> None:
        await self._ws.close()
