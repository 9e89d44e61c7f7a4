"""I/O-free parts shared by the sync and asyncio clients: configuration,
request descriptions, retry policy, the NDJSON exec-stream decoder and the
body builders of every operation."""

import datetime as _dt
import json
import os
import random
import urllib.parse
import uuid
from urllib.parse import quote
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from ._version import __version__
from .errors import WarrenError, error_for
from .models import ExecResult

DEFAULT_URL = "http://127.0.0.1:7070"
RETRY_STATUSES = frozenset((429, 503))
IDEMPOTENT_METHODS = frozenset(("GET", "HEAD", "PUT", "DELETE", "OPTIONS"))
NDJSON = "application/x-ndjson"

Number = Union[int, float]
Duration = Union[int, float, _dt.timedelta]
Command = Union[str, Sequence[str]]


def seconds(v: Optional[Duration]) -> Optional[float]:
    """Seconds as a float from a number or a timedelta (None stays None)."""
    if v is None:
        return None
    if isinstance(v, _dt.timedelta):
        return v.total_seconds()
    return float(v)


def whole_seconds(v: Optional[Duration]) -> Optional[int]:
    s = seconds(v)
    return None if s is None else int(round(s))


@dataclass
class Config:
    """Connection settings shared by :class:`~warren.Client` and :class:`~warren.AsyncClient`."""

    url: str
    token: Optional[str]
    timeout: float
    max_retries: int
    backoff: float
    max_backoff: float
    user_agent: str
    scheme: str = "http"
    host: str = "127.0.0.1"
    port: int = 7070
    base_path: str = ""

    @classmethod
    def build(cls, url: Optional[str], token: Optional[str], timeout: float, max_retries: int,
              backoff: float, max_backoff: float, user_agent: Optional[str]) -> "Config":
        url = url or os.environ.get("WARREN_URL") or DEFAULT_URL
        if "://" not in url:
            url = "http://" + url
        if token is None:
            token = os.environ.get("WARREN_TOKEN") or None
        u = urllib.parse.urlsplit(url)
        if u.scheme not in ("http", "https"):
            raise ValueError("warren: unsupported URL scheme %r (want http or https)" % u.scheme)
        if not u.hostname:
            raise ValueError("warren: URL %r has no host" % url)
        port = u.port or (443 if u.scheme == "https" else 80)
        if max_retries < 0:
            raise ValueError("warren: max_retries must be >= 0")
        return cls(url=url.rstrip("/"), token=token, timeout=float(timeout),
                   max_retries=int(max_retries), backoff=float(backoff),
                   max_backoff=float(max_backoff),
                   user_agent=user_agent or ("warren-python/" + __version__),
                   scheme=u.scheme, host=u.hostname, port=port,
                   base_path=u.path.rstrip("/"))

    @property
    def host_header(self) -> str:
        default = 443 if self.scheme == "https" else 80
        host = "[%s]" % self.host if ":" in self.host else self.host
        return host if self.port == default else "%s:%d" % (host, self.port)

    def backoff_delay(self, attempt: int, retry_after: Optional[str] = None) -> float:
        """Delay before retry number ``attempt`` (0-based): exponential with
        full jitter, or the server's ``Retry-After`` seconds, capped."""
        if retry_after:
            try:
                return max(0.0, min(float(retry_after), self.max_backoff))
            except ValueError:
                pass
        cap = min(self.max_backoff, self.backoff * (2 ** attempt))
        return cap / 2 + random.uniform(0, cap / 2)


@dataclass
class Req:
    """One HTTP request, described without doing I/O."""

    method: str
    path: str
    params: Sequence[Tuple[str, str]] = ()
    body: Optional[bytes] = None
    content_type: Optional[str] = None
    accept: str = "application/json"
    headers: Dict[str, str] = field(default_factory=dict)
    timeout: Optional[float] = None  # read timeout override (seconds)
    auth: bool = True

    @property
    def replayable(self) -> bool:
        """True if sending this request twice has the effect of sending it once."""
        return self.method in IDEMPOTENT_METHODS or "Idempotency-Key" in self.headers

    def target(self, cfg: Config) -> str:
        t = cfg.base_path + self.path
        if self.params:
            t += "?" + urllib.parse.urlencode(list(self.params), safe="/=")
        return t

    def header_list(self, cfg: Config) -> List[Tuple[str, str]]:
        h = [("Host", cfg.host_header), ("User-Agent", cfg.user_agent), ("Accept", self.accept)]
        if self.auth and cfg.token:
            h.append(("Authorization", "Bearer " + cfg.token))
        if self.body is not None:
            h.append(("Content-Type", self.content_type or "application/octet-stream"))
            h.append(("Content-Length", str(len(self.body))))
        elif self.method in ("POST", "PUT", "PATCH"):
            h.append(("Content-Length", "0"))
        h.extend(self.headers.items())
        return h


def json_req(method: str, path: str, body: Any = None, params: Sequence[Tuple[str, str]] = (),
             **kw: Any) -> Req:
    data = None if body is None else json.dumps(body, separators=(",", ":")).encode("utf-8")
    return Req(method, path, params=params, body=data,
               content_type="application/json" if data is not None else None, **kw)


def decode_json(body: bytes) -> Any:
    if not body:
        return {}
    try:
        return json.loads(body.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise WarrenError("warren: server sent invalid JSON: %s" % e) from None


def q(segment: str) -> str:
    """Quote one path segment (a sandbox id, a command id)."""
    if not segment:
        raise ValueError("warren: empty id")
    return urllib.parse.quote(segment, safe="")


def trajectory_path(name: str) -> str:
    """The path of a trajectory (its slashes stay: they are part of the name)."""
    if not name:
        raise ValueError("warren: empty trajectory")
    return "/v1/trajectories/" + urllib.parse.quote(name, safe="/")


def sandbox_path(sandbox_id: str, *rest: str) -> str:
    return "/v1/sandboxes/" + q(sandbox_id) + "".join("/" + r for r in rest)


def drop_none(d: Mapping[str, Any]) -> Dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


def new_idempotency_key() -> str:
    return "warren-py-" + uuid.uuid4().hex


# ---- request builders ------------------------------------------------------------------


def create_body(*, tier: Optional[str], image: Optional[str], layers: Optional[Sequence[Any]],
                cpu: Optional[Number], memory_mb: Optional[int], disk_mb: Optional[int],
                pids: Optional[int], ttl: Optional[Duration], idle_timeout: Optional[Duration],
                env: Optional[Mapping[str, str]], labels: Optional[Mapping[str, str]],
                priority: Optional[Any], trajectory: Optional[str], user: Optional[str],
                hostname: Optional[str], network: Optional[Any],
                extra: Mapping[str, Any]) -> Dict[str, Any]:
    body = drop_none({
        "tier": tier, "image": image, "layers": list(layers) if layers is not None else None,
        "cpu": cpu, "memory_mb": memory_mb, "disk_mb": disk_mb, "pids": pids,
        "ttl": whole_seconds(ttl), "idle_timeout": whole_seconds(idle_timeout),
        "env": dict(env) if env is not None else None,
        "labels": dict(labels) if labels is not None else None,
        "priority": priority, "trajectory": trajectory, "user": user, "hostname": hostname,
    })
    body.update(network_fields(network))
    body.update(drop_none(extra))
    return body


def network_fields(network: Any) -> Dict[str, Any]:
    """The create body's network: a dict of booleans is DSec's shape
    (``{"pypi": True, "npm": False}``: network_rules), "internet" or a
    list of entries is the egress list, a dict with "egress" (and
    optionally "group", the network group, and "egress_rate_mbit" /
    "ingress_rate_mbit", the rates in Mbit/s, and "max_conns", within the
    project's quota)
    is sent as is."""
    if network is None:
        return {}
    if isinstance(network, str):
        return {"network": {"egress": network}}
    if isinstance(network, (list, tuple)):
        return {"network": {"egress": list(network)}}
    if isinstance(network, Mapping) and network and all(isinstance(v, bool) for v in network.values()):
        return {"network_rules": dict(network)}
    return {"network": network}


def network_rule_req(name: str, hosts: Optional[Sequence[str]], cidrs: Optional[Sequence[str]],
                     ports: Optional[Sequence[int]], protocols: Optional[Sequence[str]]) -> Req:
    return json_req("PUT", "/v1/network-rules/" + quote(name, safe=""), {
        "hosts": list(hosts or []), "cidrs": list(cidrs or []),
        "ports": list(ports or []), "protocols": list(protocols or [])})


def create_req(body: Dict[str, Any], idempotency_key: Optional[str]) -> Req:
    return json_req("POST", "/v1/sandboxes", body,
                    headers={"Idempotency-Key": idempotency_key or new_idempotency_key()})


def list_req(labels: Optional[Mapping[str, str]], state: Optional[str]) -> Req:
    params: List[Tuple[str, str]] = []
    for k, v in (labels or {}).items():
        params.append(("label", "%s=%s" % (k, v)))
    if state:
        params.append(("state", state))
    return Req("GET", "/v1/sandboxes", params=params)


def exec_body(cmd: Command, *, session: Optional[str], env: Optional[Mapping[str, str]],
              cwd: Optional[str], stdin: Optional[Union[str, bytes]], user: Optional[str],
              timeout: Optional[Duration], output_cap: Optional[int], background: bool,
              extra: Mapping[str, Any]) -> Dict[str, Any]:
    body: Dict[str, Any] = {}
    if isinstance(cmd, str):
        body["cmd"] = cmd
    else:
        argv = [str(a) for a in cmd]
        if not argv:
            raise ValueError("warren: empty argv")
        body["argv"] = argv
    if isinstance(stdin, bytes):
        stdin = stdin.decode("utf-8")
    body.update(drop_none({
        "session": session, "env": dict(env) if env is not None else None, "cwd": cwd,
        "stdin": stdin, "user": user, "timeout": seconds(timeout), "output_cap": output_cap,
    }))
    if background:
        body["background"] = True
    body.update(drop_none(extra))
    return body


def exec_req(sandbox_id: str, body: Dict[str, Any], stream: bool, read_timeout: float) -> Req:
    return json_req("POST", sandbox_path(sandbox_id, "exec"), body,
                    accept=NDJSON if stream else "application/json", timeout=read_timeout)


def exec_read_timeout(cfg: Config, timeout: Optional[Duration]) -> float:
    """How long to wait for an exec answer: the command's own timeout (the
    server's default is 600 s) plus a margin."""
    t = seconds(timeout)
    return max(cfg.timeout, (t if t and t > 0 else 600.0) + 30.0)


def file_params(path: str, **extra: Any) -> List[Tuple[str, str]]:
    if not path:
        raise ValueError("warren: empty path")
    p = [("path", path)]
    for k, v in extra.items():
        if v is None or v is False:
            continue
        p.append((k, "1" if v is True else str(v)))
    return p


def mode_str(mode: Optional[int]) -> Optional[str]:
    return None if mode is None else "0%o" % mode


class ExecStream:
    """Decoder of an NDJSON exec stream: accumulates output and finds the end.

    ``feed(line)`` returns ``("stdout"|"stderr", text)`` for output events and
    ``None`` otherwise; after the exit event :attr:`result` is set. An error
    event raises the matching typed error.
    """

    def __init__(self) -> None:
        self._out: List[str] = []
        self._err: List[str] = []
        self.result: Optional[ExecResult] = None

    def feed(self, line: bytes) -> Optional[Tuple[str, str]]:
        line = line.strip()
        if not line:
            return None
        try:
            ev = json.loads(line.decode("utf-8"))
        except (ValueError, UnicodeDecodeError) as e:
            raise WarrenError("warren: bad NDJSON line from server: %s" % e) from None
        if not isinstance(ev, dict):
            return None
        err = ev.get("error")
        if isinstance(err, dict):
            raise error_for(err.get("code"), str(err.get("message") or "exec failed"))
        if isinstance(ev.get("stdout"), str):
            self._out.append(ev["stdout"])
            return ("stdout", ev["stdout"])
        if isinstance(ev.get("stderr"), str):
            self._err.append(ev["stderr"])
            return ("stderr", ev["stderr"])
        if "exit_code" in ev:
            self.result = ExecResult.from_json(ev, stdout="".join(self._out),
                                               stderr="".join(self._err))
        return None

    def finish(self) -> ExecResult:
        if self.result is None:
            raise WarrenError("warren: exec stream ended without an exit status")
        return self.result


def sandboxes_from(doc: Any) -> List[Dict[str, Any]]:
    """The list of sandbox objects in a list/fork answer (``{"sandboxes": [...]}`` or ``[...]``)."""
    if isinstance(doc, dict):
        doc = doc.get("sandboxes", doc.get("items", []))
    return [d for d in doc if isinstance(d, dict)] if isinstance(doc, list) else []


def items_from(doc: Any, key: str) -> List[Dict[str, Any]]:
    if isinstance(doc, dict):
        doc = doc.get(key, [])
    return [d for d in doc if isinstance(d, dict)] if isinstance(doc, list) else []


def fncall_body(cmd: Command, *, image: Optional[str], timeout: Optional[Duration],
                env: Optional[Mapping[str, str]], stdin: Optional[Union[str, bytes]],
                files: Optional[Mapping[str, Union[str, bytes]]], cpu: Optional[Number],
                memory_mb: Optional[int], extra: Mapping[str, Any]) -> Dict[str, Any]:
    body = exec_body(cmd, session=None, env=env, cwd=None, stdin=stdin, user=None,
                     timeout=timeout, output_cap=None, background=False, extra={})
    if files is not None:
        import base64
        enc: Dict[str, str] = {}
        for p, data in files.items():
            b = data.encode("utf-8") if isinstance(data, str) else bytes(data)
            enc[p] = base64.b64encode(b).decode("ascii")
        body["files"] = enc
    body.update(drop_none({"image": image, "cpu": cpu, "memory_mb": memory_mb}))
    body.update(drop_none(extra))
    return body


# ---- layers and images ---------------------------------------------------------------------

def layer_path(ref: str) -> str:
    """``/v1/layers/<ref>`` with each path segment escaped (slashes stay)."""
    return "/v1/layers/" + "/".join(urllib.parse.quote(p, safe="@") for p in ref.split("/"))


def create_layer_req(name: str, *, tar: Optional[bytes], from_sandbox: Optional[str],
                     version: Optional[int]) -> Req:
    if (tar is None) == (from_sandbox is None):
        raise ValueError("warren: give exactly one of tar= and from_sandbox=")
    if from_sandbox is not None:
        return json_req("POST", "/v1/layers", drop_none(
            {"name": name, "version": version, "from_sandbox": from_sandbox}), timeout=3600.0)
    params = [("name", name)]
    if version:
        params.append(("version", str(version)))
    return Req("POST", "/v1/layers", params=params, body=tar, content_type="application/x-tar",
               timeout=3600.0)


def layers_req(name: Optional[str]) -> Req:
    return Req("GET", "/v1/layers", params=[("name", name)] if name else [])


def pull_req(ref: str, name: Optional[str]) -> Req:
    return json_req("POST", "/v1/images", drop_none({"ref": ref, "name": name}), timeout=3600.0)


def import_image_req(name: str, archive: bytes) -> Req:
    return Req("POST", "/v1/images:import", params=[("name", name)], body=archive,
               content_type="application/x-tar", timeout=3600.0)


def import_disk_req(name: str, disk: bytes, fmt: str) -> Req:
    return Req("POST", "/v1/images:import", params=[("name", name), ("disk", fmt)], body=disk,
               content_type="application/octet-stream", timeout=3600.0)


def disk_format(path: str, fmt: Optional[str]) -> str:
    """A VM disk image's format: ``fmt``, else by the file's name."""
    if fmt:
        return fmt
    low = str(path).lower()
    if low.endswith(".qcow2"):
        return "qcow2"
    if low.endswith(".raw") or low.endswith(".img"):
        return "raw"
    raise ValueError("the disk image's format must be qcow2 or raw: name it .qcow2, .raw or .img, or pass fmt")


def commit_image_req(name: str, base: Optional[str], layers: Optional[List[str]],
                     config: Optional[Dict[str, Any]]) -> Req:
    return json_req("POST", "/v1/images:commit", drop_none(
        {"name": name, "base": base, "layers": list(layers) if layers else None, "config": config}))


# ---- events, projects, tokens (shared by the sync and async clients) -------------------

#: How long a followed event stream may be silent before the client reconnects;
#: the server sends a keepalive line every 15 s.
EVENTS_READ_TIMEOUT = 45.0


def events_req(after: int, limit: Optional[int], wait: Optional[float]) -> Req:
    params: List[Tuple[str, str]] = []
    if after:
        params.append(("after", str(int(after))))
    if limit:
        params.append(("limit", str(int(limit))))
    if wait:
        params.append(("wait", str(float(wait))))
    return Req("GET", "/v1/events", params=params,
               timeout=(float(wait) + 30.0) if wait else None)


def follow_req(after: int) -> Req:
    params = [("follow", "1")]
    if after:
        params.append(("after", str(int(after))))
    return Req("GET", "/v1/events", params=params, accept=NDJSON, timeout=EVENTS_READ_TIMEOUT)


class EventFollower:
    """The state of a followed event stream: the last sequence number seen
    (a reconnect resumes after it, so no event is delivered twice) and how
    many events were delivered. ``feed(line)`` returns an event or None."""

    def __init__(self, after: int, limit: Optional[int]) -> None:
        self.after = int(after or 0)
        self.limit = int(limit) if limit else 0
        self.count = 0
        self.delay = 0.2

    @property
    def done(self) -> bool:
        return self.limit > 0 and self.count >= self.limit

    def feed(self, line: bytes) -> Optional[Dict[str, Any]]:
        line = line.strip()
        if not line:
            return None  # keepalive
        ev = decode_json(line)
        seq = int(ev.get("seq") or 0)
        if seq and seq <= self.after:
            return None
        self.after = max(self.after, seq)
        self.count += 1
        self.delay = 0.2
        return ev

    def backoff(self) -> float:
        """Seconds to wait before the next reconnect (doubling, at most 5)."""
        d = self.delay
        self.delay = min(self.delay * 2, 5.0)
        return d * (0.5 + random.random() / 2)


def project_path(project_id: str) -> str:
    return "/v1/projects/" + urllib.parse.quote(project_id, safe="")


def token_path(token_id: str) -> str:
    return "/v1/tokens/" + urllib.parse.quote(token_id, safe="")


def project_body(name: str, parent: Optional[str],
                 quota: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    body: Dict[str, Any] = {"name": name, "quota": dict(quota or {})}
    if parent:
        body["parent"] = parent
    return body


def token_body(principal: str, project: Optional[str], role: Optional[str],
               expires_in: Optional[Duration]) -> Dict[str, Any]:
    body: Dict[str, Any] = {"principal": principal}
    if project:
        body["project"] = project
    if role:
        body["role"] = role
    if expires_in is not None:
        body["expires_in"] = whole_seconds(expires_in)
    return body


def batch_body(count: int, ids_only: bool, spec: Dict[str, Any]) -> Dict[str, Any]:
    body: Dict[str, Any] = {"count": int(count), "spec": spec}
    if ids_only:
        body["ids_only"] = True
    return body


# ---- ports -----------------------------------------------------------------------------


def port_path(sandbox_id: str, port: int) -> str:
    if not isinstance(port, int) or not 1 <= port <= 65535:
        raise ValueError("warren: port %r is not a port number (1-65535)" % (port,))
    return sandbox_path(sandbox_id, "ports", str(port))


def port_upgrade_request(cfg: "Config", sandbox_id: str, port: int) -> bytes:
    """The HTTP/1.1 request that turns a connection into a raw TCP stream to
    ``port`` of the sandbox (``GET .../ports/{port}?raw=1``, Upgrade: tcp)."""
    lines = ["GET %s%s?raw=1 HTTP/1.1" % (cfg.base_path, port_path(sandbox_id, port)),
             "Host: " + cfg.host_header, "Connection: Upgrade", "Upgrade: tcp",
             "User-Agent: " + cfg.user_agent]
    if cfg.token:
        lines.append("Authorization: Bearer " + cfg.token)
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def port_upgrade_answer(head: bytes, body: bytes) -> None:
    """Check the answer's head (up to its blank line): 101, or the error."""
    from .errors import error_from_body
    first = head.split(b"\r\n", 1)[0].decode("latin-1")
    parts = first.split(" ", 2)
    status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
    if status != 101:
        raise error_from_body(status, body, parts[2] if len(parts) > 2 else "")


def content_length(head: bytes) -> int:
    for line in head.split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        if k.strip().lower() == b"content-length":
            try:
                return min(int(v.strip()), 1 << 16)
            except ValueError:
                return 0
    return 0
