"""A small asyncio HTTP/1.1 client: keep-alive connection pool with a bound
on open connections, Content-Length and chunked bodies, streaming, one timer
per request for timeouts (no thread and no extra task per operation)."""

import asyncio
import ssl
from typing import AsyncIterator, Dict, List, Optional, Tuple

from ._core import RETRY_STATUSES, Config, Req, decode_json
from .errors import ConnectionFailed, Timeout, WarrenError, error_from_body

_READ = 1 << 16


class _Stale(Exception):
    """The server closed a connection before sending any byte of an answer."""


class _Retry(Exception):
    def __init__(self, error: WarrenError, retry: bool, retry_after: Optional[str] = None) -> None:
        super().__init__(str(error))
        self.error = error
        self.retry = retry
        self.retry_after = retry_after


class _Conn:
    __slots__ = ("reader", "writer", "timed_out", "_timer", "_loop")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 loop: asyncio.AbstractEventLoop) -> None:
        self.reader = reader
        self.writer = writer
        self.timed_out = False
        self._timer: Optional[asyncio.TimerHandle] = None
        self._loop = loop

    def dead(self) -> bool:
        return self.reader.at_eof() or self.writer.is_closing() or self.reader.exception() is not None

    def arm(self, timeout: float) -> None:
        self.disarm()
        self._timer = self._loop.call_later(timeout, self._expire)

    def disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expire(self) -> None:
        self.timed_out = True
        self._timer = None
        try:
            self.writer.transport.abort()
        except Exception:  # pragma: no cover - transport already gone
            pass

    def close(self) -> None:
        self.disarm()
        try:
            self.writer.close()
        except Exception:  # pragma: no cover
            pass


class Response:
    __slots__ = ("status", "headers", "body")

    def __init__(self, status: int, headers: Dict[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    def json(self):  # type: ignore[no-untyped-def]
        return decode_json(self.body)


class AStream:
    """A streaming answer. Iterate :meth:`lines` or :meth:`chunks`; always :meth:`aclose`."""

    def __init__(self, transport: "AsyncTransport", conn: _Conn, status: int,
                 headers: Dict[str, str], keep_alive: bool, read_timeout: float, head: bool) -> None:
        self._t = transport
        self._conn = conn
        self.status = status
        self.headers = headers
        self._keep = keep_alive
        self._timeout = read_timeout
        self._done = False
        self._released = False
        te = headers.get("transfer-encoding", "").lower()
        self._chunked = "chunked" in te
        cl = headers.get("content-length")
        self._remaining: Optional[int] = int(cl) if cl and cl.isdigit() else None
        if head or status in (204, 304) or (100 <= status < 200):
            self._chunked, self._remaining = False, 0
        if not self._chunked and self._remaining is None:
            self._keep = False  # body ends at EOF

    async def _readline(self) -> bytes:
        line = await self._conn.reader.readline()
        if not line.endswith(b"\n"):
            raise self._broken("connection closed in a chunked body")
        return line

    def _broken(self, what: str) -> WarrenError:
        if self._conn.timed_out:
            return Timeout("warren: no data from the server within %.1fs" % self._timeout)
        return ConnectionFailed("warren: %s" % what)

    async def chunks(self) -> AsyncIterator[bytes]:
        r = self._conn.reader
        try:
            while not self._done:
                self._conn.arm(self._timeout)
                if self._chunked:
                    size_line = await self._readline()
                    try:
                        size = int(size_line.split(b";", 1)[0].strip(), 16)
                    except ValueError:
                        raise ConnectionFailed("warren: bad chunk header %r" % size_line[:40])
                    if size == 0:
                        while (await self._readline()) not in (b"\r\n", b"\n"):
                            pass
                        self._done = True
                        break
                    try:
                        data = await r.readexactly(size)
                    except asyncio.IncompleteReadError:
                        raise self._broken("connection closed in a chunk")
                    await self._readline()
                    self._conn.disarm()
                    yield data
                elif self._remaining is not None:
                    if self._remaining == 0:
                        self._done = True
                        break
                    data = await r.read(min(_READ, self._remaining))
                    if not data:
                        raise self._broken("connection closed %d bytes before the end of the body"
                                           % self._remaining)
                    self._remaining -= len(data)
                    self._conn.disarm()
                    yield data
                else:
                    data = await r.read(_READ)
                    if not data:
                        if self._conn.timed_out:
                            raise self._broken("")
                        self._done = True
                        break
                    self._conn.disarm()
                    yield data
        except (OSError, asyncio.IncompleteReadError) as e:
            raise self._broken("stream broken: %s" % e) from None
        finally:
            self._conn.disarm()

    async def lines(self) -> AsyncIterator[bytes]:
        buf = b""
        async for data in self.chunks():
            buf += data
            while True:
                i = buf.find(b"\n")
                if i < 0:
                    break
                line, buf = buf[:i + 1], buf[i + 1:]
                yield line
        if buf:
            yield buf

    async def read(self) -> bytes:
        parts: List[bytes] = []
        async for data in self.chunks():
            parts.append(data)
        return b"".join(parts)

    async def aclose(self) -> None:
        if self._released:
            return
        self._released = True
        self._t._release(self._conn, self._done and self._keep)


class AsyncTransport:
    def __init__(self, cfg: Config, max_connections: int = 512,
                 ssl_context: Optional[ssl.SSLContext] = None) -> None:
        self.cfg = cfg
        self._max = max(1, max_connections)
        self._ssl = ssl_context
        self._idle: List[_Conn] = []
        self._sem: Optional[asyncio.Semaphore] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None

    def _bind(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._sem is None:
            for c in self._idle:  # connections of another (finished) loop
                try:
                    c.writer.transport.abort()
                except Exception:
                    pass
            self._idle = []
            self._loop = loop
            self._sem = asyncio.Semaphore(self._max)
        return self._sem

    async def aclose(self) -> None:
        idle, self._idle = self._idle, []
        for c in idle:
            c.close()
        for c in idle:
            try:
                await asyncio.wait_for(c.writer.wait_closed(), 1.0)
            except Exception:
                pass

    async def _acquire(self) -> Tuple[_Conn, bool]:
        sem = self._bind()
        await sem.acquire()
        try:
            while self._idle:
                c = self._idle.pop()
                if c.dead():
                    c.close()
                    continue
                return c, True
            ctx = None
            if self.cfg.scheme == "https":
                ctx = self._ssl or ssl.create_default_context()
            loop = asyncio.get_running_loop()
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(self.cfg.host, self.cfg.port, ssl=ctx, limit=1 << 20),
                    self.cfg.timeout)
            except asyncio.TimeoutError:
                raise _Retry(ConnectionFailed("warren: connect to %s timed out" % self.cfg.url),
                             retry=True) from None
            except OSError as e:
                raise _Retry(ConnectionFailed("warren: cannot connect to %s: %s" % (
                    self.cfg.url, e)), retry=True) from None
            return _Conn(reader, writer, loop), False
        except BaseException:
            sem.release()
            raise

    def _release(self, conn: _Conn, reusable: bool) -> None:
        conn.disarm()
        if reusable and not conn.dead() and self._loop is conn._loop:
            self._idle.append(conn)
        else:
            conn.close()
        if self._sem is not None and self._loop is conn._loop:
            self._sem.release()

    async def request(self, req: Req) -> Response:
        s = await self.open(req)
        try:
            body = await s.read()
        except WarrenError:
            await s.aclose()
            raise
        await s.aclose()
        return Response(s.status, s.headers, body)

    async def open(self, req: Req) -> AStream:
        attempt = 0
        while True:
            try:
                return await self._attempt(req)
            except _Retry as r:
                if not r.retry or attempt >= self.cfg.max_retries:
                    raise r.error from None
                await asyncio.sleep(self.cfg.backoff_delay(attempt, r.retry_after))
                attempt += 1

    async def _attempt(self, req: Req) -> AStream:
        cfg = self.cfg
        conn, reused = await self._acquire()
        timeout = req.timeout or cfg.timeout
        ok = False
        try:
            head = "%s %s HTTP/1.1\r\n" % (req.method, req.target(cfg))
            head += "".join("%s: %s\r\n" % kv for kv in req.header_list(cfg)) + "\r\n"
            conn.arm(timeout)
            try:
                data = head.encode("latin-1")
                if req.body and len(req.body) <= _READ:
                    conn.writer.write(data + req.body)  # one segment for small requests
                else:
                    conn.writer.write(data)
                    if req.body:
                        conn.writer.write(req.body)
                await conn.writer.drain()
                status, headers, keep = await self._read_head(conn)
            except _Stale:
                if conn.timed_out:
                    raise _Retry(Timeout("warren: %s %s: no answer within %.1fs" % (
                        req.method, req.path, timeout)), retry=False) from None
                raise _Retry(ConnectionFailed("warren: %s %s: server closed the connection" % (
                    req.method, req.path)), retry=reused or req.replayable) from None
            except (OSError, asyncio.IncompleteReadError, ValueError) as e:
                if conn.timed_out:
                    raise _Retry(Timeout("warren: %s %s: no answer within %.1fs" % (
                        req.method, req.path, timeout)), retry=False) from None
                stale = reused and isinstance(e, (ConnectionResetError, BrokenPipeError))
                raise _Retry(ConnectionFailed("warren: %s %s: %s" % (
                    req.method, req.path, e or type(e).__name__)),
                    retry=req.replayable or stale) from None
            stream = AStream(self, conn, status, headers, keep, timeout, req.method == "HEAD")
            ok = True
        finally:
            if not ok:
                self._release(conn, False)
        if 200 <= status < 300:
            return stream
        try:
            body = await stream.read()
        except WarrenError as e:
            await stream.aclose()
            raise _Retry(e, retry=req.replayable) from None
        await stream.aclose()
        err = error_from_body(status, body)
        raise _Retry(err, retry=status in RETRY_STATUSES, retry_after=headers.get("retry-after"))

    @staticmethod
    async def _read_head(conn: _Conn) -> Tuple[int, Dict[str, str], bool]:
        r = conn.reader
        first = True
        while True:
            line = await r.readline()
            if not line:
                if first:
                    raise _Stale()
                raise ConnectionResetError("connection closed in the answer's header")
            first = False
            parts = line.decode("latin-1").rstrip("\r\n").split(" ", 2)
            if len(parts) < 2 or not parts[0].startswith("HTTP/"):
                raise ValueError("bad status line %r" % line[:80])
            version, status = parts[0], int(parts[1])
            headers: Dict[str, str] = {}
            while True:
                h = await r.readline()
                if not h:
                    raise ConnectionResetError("connection closed in the answer's header")
                if h in (b"\r\n", b"\n"):
                    break
                k, _, v = h.decode("latin-1").partition(":")
                k = k.strip().lower()
                v = v.strip()
                headers[k] = headers[k] + ", " + v if k in headers else v
            if 100 <= status < 200 and status != 101:
                continue  # 100 Continue and friends
            conn_hdr = headers.get("connection", "").lower()
            if version == "HTTP/1.0":
                keep = "keep-alive" in conn_hdr
            else:
                keep = "close" not in conn_hdr
            return status, headers, keep
