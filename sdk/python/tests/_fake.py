"""A scriptable HTTP/1.1 server (http.server in a thread) for unit tests of
the SDK's own transport logic: retries, idempotency keys, keep-alive reuse,
NDJSON parsing and error mapping. It is not a fake of warren's behaviour;
the real-server suites cover that."""

import json
import socket
import struct
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Dict, List, Optional
from urllib.parse import parse_qsl, urlsplit


class Seen:
    """One request as the server saw it."""

    def __init__(self, method: str, path: str, query: List, headers: Dict[str, str], body: bytes,
                 peer: Any) -> None:
        self.method = method
        self.path = path
        self.query = query
        self.headers = headers
        self.body = body
        self.peer = peer

    def json(self) -> Any:
        return json.loads(self.body or b"{}")


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: "FakeServer"

    def log_message(self, *a: Any) -> None:  # quiet
        pass

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _handle(self) -> None:
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else b""
        u = urlsplit(self.path)
        seen = Seen(self.command, u.path, parse_qsl(u.query, keep_blank_values=True),
                    {k.lower(): v for k, v in self.headers.items()}, body, self.client_address)
        with self.server.lock:
            self.server.seen.append(seen)
            idx = len(self.server.seen) - 1
        self.server.route(self, seen, idx)

    do_GET = do_POST = do_PUT = do_DELETE = _handle

    # -- answers
    def send_json(self, status: int, obj: Any, headers: Optional[Dict[str, str]] = None,
                  close_after: bool = False) -> None:
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()
        if close_after:  # close without announcing it: a stale keep-alive connection
            self.close_connection = True

    def send_error_json(self, status: int, code: str, message: str,
                        headers: Optional[Dict[str, str]] = None) -> None:
        self.send_json(status, {"error": {"code": code, "message": message}}, headers)

    def send_raw(self, status: int, data: bytes, ctype: str = "application/octet-stream") -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def send_chunked(self, status: int, ctype: str, pieces: List[bytes],
                     delay: float = 0.0) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for p in pieces:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(p), p))
            self.wfile.flush()
            if delay:
                time.sleep(delay)
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def reset(self) -> None:
        """Drop the connection with a TCP reset and no answer."""
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.close_connection = True
        self.connection.close()

    def hang_up(self) -> None:
        """Close the connection without an answer (EOF)."""
        self.close_connection = True
        self.connection.shutdown(socket.SHUT_RDWR)


Route = Callable[[Handler, Seen, int], None]


class FakeServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 1024

    def __init__(self, route: Route, port: int = 0) -> None:
        super().__init__(("127.0.0.1", port), Handler)
        self.route = route
        self.lock = threading.Lock()
        self.seen: List[Seen] = []
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)
        self._thread.start()

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # clients that hang up on purpose (timeouts, cancellations) are expected

    @property
    def url(self) -> str:
        return "http://127.0.0.1:%d" % self.server_address[1]

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
        self._thread.join(5)

    def peers(self) -> set:
        return {s.peer for s in self.seen}


SANDBOX = {"id": "sb-n1-abc", "state": "running", "node": "n1", "tier": "container",
           "image": "busybox", "cpu": 1, "memory_mb": 512, "disk_mb": 1024, "pids": 1024,
           "labels": {"a": "b"}, "ttl": 0, "idle_timeout": 0,
           "created_at": "2024-05-01T10:00:00.123456789Z", "last_active_at": "0001-01-01T00:00:00Z"}
