"""Blocking HTTP/1.1 transport over http.client: a keep-alive connection pool
shared by all threads, bounded retries with backoff."""

import http.client
import os
import select
import socket
import ssl
import threading
import time
from typing import Iterator, List, Optional, Tuple

from ._core import RETRY_STATUSES, Config, Req, decode_json
from .errors import ConnectionFailed, Timeout, WarrenError, error_from_body

_STALE_ERRORS = (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError,
                 ConnectionAbortedError)


class Response:
    """A fully read answer."""

    __slots__ = ("status", "headers", "body")

    def __init__(self, status: int, headers: http.client.HTTPMessage, body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    def json(self):  # type: ignore[no-untyped-def]
        return decode_json(self.body)


class _Retry(Exception):
    def __init__(self, error: WarrenError, retry: bool, retry_after: Optional[str] = None) -> None:
        super().__init__(str(error))
        self.error = error
        self.retry = retry
        self.retry_after = retry_after


def _readable(sock: Optional[socket.socket]) -> bool:
    """True if an idle socket has something to read: EOF from a server that
    closed the keep-alive connection, or junk. Either way it is unusable."""
    if sock is None:
        return True
    try:
        if hasattr(select, "poll"):
            p = select.poll()
            p.register(sock, select.POLLIN | select.POLLERR | select.POLLHUP)
            return bool(p.poll(0))
        r, _, _ = select.select([sock], [], [], 0)
        return bool(r)
    except (OSError, ValueError):
        return True


class _Pool:
    def __init__(self, cfg: Config, maxsize: int, ssl_context: Optional[ssl.SSLContext]) -> None:
        self._cfg = cfg
        self._maxsize = max(1, maxsize)
        self._ssl = ssl_context
        self._idle: List[http.client.HTTPConnection] = []
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._closed = False

    def _new(self) -> http.client.HTTPConnection:
        if self._cfg.scheme == "https":
            ctx = self._ssl or ssl.create_default_context()
            return http.client.HTTPSConnection(self._cfg.host, self._cfg.port,
                                               timeout=self._cfg.timeout, context=ctx)
        return http.client.HTTPConnection(self._cfg.host, self._cfg.port, timeout=self._cfg.timeout)

    def get(self) -> Tuple[http.client.HTTPConnection, bool]:
        with self._lock:
            if self._pid != os.getpid():  # forked: never share sockets with the parent
                self._idle = []
                self._pid = os.getpid()
            while self._idle:
                conn = self._idle.pop()
                if _readable(conn.sock):
                    conn.close()
                    continue
                return conn, True
        return self._new(), False

    def put(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            if not self._closed and self._pid == os.getpid() and len(self._idle) < self._maxsize:
                self._idle.append(conn)
                return
        conn.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
            self._closed = True
        for c in idle:
            c.close()

    def reopen(self) -> None:
        with self._lock:
            self._closed = False


class Stream:
    """A streaming answer; iterate :meth:`lines` or :meth:`chunks`, then :meth:`close`."""

    def __init__(self, pool: _Pool, conn: http.client.HTTPConnection,
                 resp: http.client.HTTPResponse) -> None:
        self._pool = pool
        self._conn = conn
        self.resp = resp
        self.status = resp.status
        self.headers = resp.headers

    def lines(self) -> Iterator[bytes]:
        try:
            while True:
                line = self.resp.readline()
                if not line:
                    return
                yield line
        except socket.timeout as e:
            raise Timeout("warren: timed out reading the stream: %s" % e) from None
        except (OSError, http.client.HTTPException) as e:
            raise ConnectionFailed("warren: stream broken: %s" % e) from None

    def read(self) -> bytes:
        try:
            return self.resp.read()
        except socket.timeout as e:
            raise Timeout("warren: timed out reading the answer: %s" % e) from None
        except (OSError, http.client.HTTPException) as e:
            raise ConnectionFailed("warren: answer broken: %s" % e) from None

    def close(self) -> None:
        if self.resp.isclosed() and not self.resp.will_close:
            self._pool.put(self._conn)
        else:
            self._conn.close()

    def __enter__(self) -> "Stream":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SyncTransport:
    def __init__(self, cfg: Config, pool_size: int = 32,
                 ssl_context: Optional[ssl.SSLContext] = None) -> None:
        self.cfg = cfg
        self._pool = _Pool(cfg, pool_size, ssl_context)

    def close(self) -> None:
        self._pool.close()

    def request(self, req: Req) -> Response:
        """Send with retries; return a read answer or raise a typed error."""
        s = self.open(req)
        try:
            body = s.read()
        finally:
            s.close()
        return Response(s.status, s.headers, body)

    def open(self, req: Req) -> Stream:
        """Send with retries; return the answer unread (2xx only)."""
        self._pool.reopen()
        attempt = 0
        while True:
            try:
                return self._attempt(req)
            except _Retry as r:
                if not r.retry or attempt >= self.cfg.max_retries:
                    raise r.error from None
                time.sleep(self.cfg.backoff_delay(attempt, r.retry_after))
                attempt += 1

    def _attempt(self, req: Req) -> Stream:
        cfg = self.cfg
        conn, reused = self._pool.get()
        try:
            if conn.sock is None:
                conn.connect()
        except socket.timeout as e:
            conn.close()
            raise _Retry(ConnectionFailed("warren: connect to %s timed out: %s" % (cfg.url, e)),
                         retry=True)
        except OSError as e:
            conn.close()
            raise _Retry(ConnectionFailed("warren: cannot connect to %s: %s" % (cfg.url, e)),
                         retry=True)
        assert conn.sock is not None
        conn.sock.settimeout(req.timeout or cfg.timeout)
        try:
            conn.putrequest(req.method, req.target(cfg), skip_host=True, skip_accept_encoding=True)
            for k, v in req.header_list(cfg):
                conn.putheader(k, v)
            conn.endheaders(req.body)
            resp = conn.getresponse()
        except socket.timeout as e:
            conn.close()
            raise _Retry(Timeout("warren: %s %s: no answer within %.1fs (%s)" % (
                req.method, req.path, req.timeout or cfg.timeout, e)), retry=False)
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            retry = req.replayable or (reused and isinstance(e, _STALE_ERRORS))
            raise _Retry(ConnectionFailed("warren: %s %s: %s" % (
                req.method, req.path, e or type(e).__name__)), retry=retry)
        stream = Stream(self._pool, conn, resp)
        if 200 <= resp.status < 300:
            return stream
        try:
            body = stream.read()
        except WarrenError as e:
            stream.close()
            raise _Retry(e, retry=req.replayable)
        stream.close()
        err = error_from_body(resp.status, body, resp.reason)
        raise _Retry(err, retry=resp.status in RETRY_STATUSES,
                     retry_after=resp.getheader("Retry-After"))
