"""Test support: puts the SDK on sys.path and runs a real ``warren serve``.

The server is ``bin/warren`` of the repository (built with ``make build`` when
missing), started with its own data dir and a free loopback port, and stopped
with SIGTERM. Nothing here skips: if the server cannot start, tests fail.
"""

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Optional

HERE = Path(__file__).resolve().parent
SDK = HERE.parent
REPO = SDK.parent.parent
if str(SDK) not in sys.path:
    sys.path.insert(0, str(SDK))

BINARY = Path(os.environ.get("WARREN_BIN", str(REPO / "bin" / "warren")))
IMAGE = os.environ.get("WARREN_TEST_IMAGE", "busybox")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_build_error: Optional[str] = None


def ensure_binary() -> Path:
    """The warren binary; runs ``make build`` in the repo root (once per
    process) if it is missing."""
    global _build_error
    if not BINARY.exists():
        if _build_error is None:
            r = subprocess.run(["make", "build"], cwd=str(REPO), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, timeout=900)
            if r.returncode != 0 or not BINARY.exists():
                _build_error = r.stdout.decode(errors="replace")[-4000:]
        if not BINARY.exists():
            raise RuntimeError("warren binary %s missing and `make build` failed:\n%s" % (
                BINARY, _build_error))
    return BINARY


class WarrenServer:
    """A real ``warren serve`` on 127.0.0.1 with a private data dir."""

    def __init__(self) -> None:
        self.data_dir = tempfile.mkdtemp(prefix="warren-pytest-")
        self.port = free_port()
        self.url = "http://127.0.0.1:%d" % self.port
        self.proc: Optional[subprocess.Popen] = None
        self.token = ""
        self._log_path = self.data_dir.rstrip(os.sep) + ".log"
        self._log = None

    def start(self, timeout: float = 60.0) -> "WarrenServer":
        binary = ensure_binary()
        self._log = open(self._log_path, "ab")
        self.proc = subprocess.Popen(
            [str(binary), "serve", "--data-dir", self.data_dir,
             "--listen", "127.0.0.1:%d" % self.port],
            cwd=str(REPO), stdout=self._log, stderr=subprocess.STDOUT,
            start_new_session=True)
        deadline = time.monotonic() + timeout
        token_file = os.path.join(self.data_dir, "admin-token")
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("warren serve exited with %s:\n%s" % (
                    self.proc.returncode, self.log_tail()))
            if os.path.exists(token_file) and self._healthy():
                with open(token_file) as f:
                    self.token = f.read().strip()
                if self.token:
                    return self
            time.sleep(0.05)
        self.stop()
        raise RuntimeError("warren serve did not become healthy in %.0fs:\n%s" % (
            timeout, self.log_tail()))

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/healthz", timeout=1) as r:
                return r.status == 200
        except Exception:
            return False

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM and wait (SIGKILL only if it does not exit in ``timeout``)."""
        p = self.proc
        self.proc = None
        if p is not None and p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)
        if self._log is not None:
            self._log.close()
            self._log = None

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.data_dir, ignore_errors=True)
        try:
            os.unlink(self._log_path)
        except OSError:
            pass

    def log_tail(self, n: int = 4000) -> str:
        try:
            with open(self._log_path, "rb") as f:
                return f.read()[-n:].decode(errors="replace")
        except OSError:
            return ""


_shared: Optional[WarrenServer] = None
_users = 0


def acquire_server() -> WarrenServer:
    """One server shared by the test modules of a run (reference counted)."""
    global _shared, _users
    if _shared is None:
        s = WarrenServer()
        try:
            s.start()
        except BaseException:
            s.cleanup()
            raise
        _shared = s
    _users += 1
    return _shared


def release_server() -> None:
    global _shared, _users
    _users -= 1
    if _users <= 0 and _shared is not None:
        _shared.cleanup()
        _shared = None
