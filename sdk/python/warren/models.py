"""Plain data returned by the SDK (decoded from the REST API's JSON).

Every model keeps the JSON it was built from in ``raw``, so fields the server
adds later are reachable before the SDK learns their names.
"""

import datetime as _dt
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from .errors import CommandFailed

__all__ = [
    "SandboxInfo",
    "ExecResult",
    "CommandStatus",
    "FileInfo",
    "Image",
    "Node",
    "Snapshot",
    "Pool",
    "Trajectory",
    "parse_time",
]

_TIME_RE = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?"
    r"(Z|z|[+-]\d{2}:?\d{2})?$")


def parse_time(value: Any) -> Optional[_dt.datetime]:
    """Parse an RFC 3339 timestamp as Go writes it (nanoseconds, ``Z``) into an
    aware :class:`datetime.datetime`; ``None`` for missing, zero or bad values."""
    if not isinstance(value, str) or not value:
        return None
    m = _TIME_RE.match(value.strip())
    if not m:
        return None
    y, mo, d, h, mi, s, frac, tz = m.groups()
    if y == "0001":  # Go's zero time
        return None
    micro = int((frac or "0")[:6].ljust(6, "0"))
    if tz in (None, "Z", "z"):
        tzinfo = _dt.timezone.utc
    else:
        sign = -1 if tz[0] == "-" else 1
        digits = tz[1:].replace(":", "")
        tzinfo = _dt.timezone(sign * _dt.timedelta(hours=int(digits[:2]), minutes=int(digits[2:])))
    try:
        return _dt.datetime(int(y), int(mo), int(d), int(h), int(mi), int(s), micro, tzinfo=tzinfo)
    except ValueError:
        return None


def _s(d: Dict[str, Any], k: str, default: str = "") -> str:
    v = d.get(k)
    return v if isinstance(v, str) else default


def _i(d: Dict[str, Any], k: str, default: int = 0) -> int:
    v = d.get(k)
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, (int, float)):
        return int(v)
    return default


def _f(d: Dict[str, Any], k: str, default: float = 0.0) -> float:
    v = d.get(k)
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    return default


def _oi(d: Dict[str, Any], k: str) -> Optional[int]:
    v = d.get(k)
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return int(v)
    return None


@dataclass
class SandboxInfo:
    """The server's view of one sandbox (``GET /v1/sandboxes/{id}``)."""

    id: str
    state: str = ""
    node: str = ""
    tier: str = ""
    image: str = ""
    cpu: float = 0.0
    memory_mb: int = 0
    disk_mb: int = 0
    pids: int = 0
    labels: Dict[str, str] = field(default_factory=dict)
    user: str = ""
    ttl: int = 0
    idle_timeout: int = 0
    created_at: Optional[_dt.datetime] = None
    expires_at: Optional[_dt.datetime] = None
    last_active_at: Optional[_dt.datetime] = None
    reason: str = ""
    priority: str = ""
    idle_timeout_action: str = ""
    paused_at: Optional[_dt.datetime] = None
    pool: str = ""
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "SandboxInfo":
        labels = d.get("labels")
        return cls(
            id=_s(d, "id"), state=_s(d, "state"), node=_s(d, "node"), tier=_s(d, "tier"),
            image=_s(d, "image"), cpu=_f(d, "cpu"), memory_mb=_i(d, "memory_mb"),
            disk_mb=_i(d, "disk_mb"), pids=_i(d, "pids"),
            labels=dict(labels) if isinstance(labels, dict) else {},
            user=_s(d, "user"), ttl=_i(d, "ttl"), idle_timeout=_i(d, "idle_timeout"),
            created_at=parse_time(d.get("created_at")),
            expires_at=parse_time(d.get("expires_at")),
            last_active_at=parse_time(d.get("last_active_at")),
            reason=_s(d, "reason"), priority=_s(d, "priority"),
            idle_timeout_action=_s(d, "idle_timeout_action"),
            paused_at=parse_time(d.get("paused_at")), pool=_s(d, "pool"), raw=d)


@dataclass
class ExecResult:
    """The outcome of a command.

    Attributes:
        exit_code: the exit status (``-1`` or a shell-style ``128+n`` when killed,
            as the server reports it).
        stdout, stderr: the captured output (decoded as UTF-8).
        truncated: output exceeded the cap and was cut.
        timed_out: the command was killed because it ran past ``timeout``.
        signal: the signal that ended the command, if any.
        duration: wall time in seconds (``duration_ms`` / 1000).
        command_id: set for background commands.
        step: the trajectory step that recorded this command, when the server
            records trajectories (``None`` otherwise).
        replayed: the result came from the trajectory log; nothing ran.
        sandbox, trajectory: set when this command branched a trajectory
            resumed with ``branch=True``: it ran on this new sandbox, which
            records this new trajectory (the :class:`Sandbox` that ran it
            switches to it).
        oom_killed: the kernel's OOM killer ended the command (the
            sandbox's memory limit); the exit code is then 137.
        killed_by: what ended a command that did not exit by itself:
            ``"oom"``, ``"timeout"`` or ``"signal"`` (``""`` otherwise).
        pids_limited: the sandbox's pids limit refused a fork or thread
            while the command ran.
        disk_full: the command failed with the sandbox's disk quota
            (``disk_mb``) used up.
    """

    exit_code: int = 0
    stdout: str = ""
    stderr: str = ""
    truncated: bool = False
    timed_out: bool = False
    signal: str = ""
    duration: float = 0.0
    command_id: str = ""
    step: Optional[int] = None
    replayed: bool = False
    sandbox: str = ""
    trajectory: str = ""
    oom_killed: bool = False
    killed_by: str = ""
    pids_limited: bool = False
    disk_full: bool = False
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, d: Dict[str, Any], stdout: Optional[str] = None,
                  stderr: Optional[str] = None) -> "ExecResult":
        return cls(
            exit_code=_i(d, "exit_code", -1 if "exit_code" not in d else 0),
            stdout=stdout if stdout is not None else _s(d, "stdout"),
            stderr=stderr if stderr is not None else _s(d, "stderr"),
            truncated=bool(d.get("truncated")), timed_out=bool(d.get("timed_out")),
            signal=_s(d, "signal"), duration=_f(d, "duration_ms") / 1000.0,
            command_id=_s(d, "command_id") or _s(d, "id"), step=_oi(d, "step"),
            replayed=bool(d.get("replayed")), sandbox=_s(d, "sandbox"),
            trajectory=_s(d, "trajectory"), oom_killed=bool(d.get("oom_killed")),
            killed_by=_s(d, "killed_by"), pids_limited=bool(d.get("pids_limited")),
            disk_full=bool(d.get("disk_full")), raw=d)

    @property
    def ok(self) -> bool:
        """True when the command exited 0 and did not time out."""
        return self.exit_code == 0 and not self.timed_out

    @property
    def duration_ms(self) -> float:
        return self.duration * 1000.0

    @property
    def output(self) -> str:
        """stdout followed by stderr."""
        return self.stdout + self.stderr

    def check(self) -> "ExecResult":
        """Return self if :attr:`ok`, else raise :class:`~warren.CommandFailed`."""
        if not self.ok:
            why = "exited with %d" % self.exit_code
            if self.timed_out:
                why = "timed out"
            elif self.oom_killed:
                why = "was killed by the OOM killer (out of the sandbox's memory)"
            tail = (self.stderr or self.stdout)[-500:]
            raise CommandFailed("command %s%s" % (why, (": " + tail) if tail else ""), self)
        return self


@dataclass
class CommandStatus:
    """The state of a background command (``GET .../commands/{id}``)."""

    id: str
    running: bool = False
    exit_code: Optional[int] = None
    stdout: str = ""
    stderr: str = ""
    truncated: bool = False
    timed_out: bool = False
    signal: str = ""
    duration: float = 0.0
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "CommandStatus":
        return cls(id=_s(d, "id"), running=bool(d.get("running")), exit_code=_oi(d, "exit_code"),
                   stdout=_s(d, "stdout"), stderr=_s(d, "stderr"),
                   truncated=bool(d.get("truncated")), timed_out=bool(d.get("timed_out")),
                   signal=_s(d, "signal"), duration=_f(d, "duration_ms") / 1000.0, raw=d)

    def result(self) -> ExecResult:
        """This status as an :class:`ExecResult` (exit_code -1 while running)."""
        return ExecResult(exit_code=-1 if self.exit_code is None else self.exit_code,
                          stdout=self.stdout, stderr=self.stderr, truncated=self.truncated,
                          timed_out=self.timed_out, signal=self.signal, duration=self.duration,
                          command_id=self.id, step=_oi(self.raw, "step"), raw=self.raw)


@dataclass
class FileInfo:
    """One file in a sandbox. ``mode`` holds the permission bits (e.g. ``0o644``)."""

    name: str
    path: str = ""
    size: int = 0
    mode: int = 0
    type: str = ""  # file, dir, symlink, other
    mod_time: Optional[_dt.datetime] = None
    target: str = ""
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "FileInfo":
        return cls(name=_s(d, "name"), path=_s(d, "path"), size=_i(d, "size"), mode=_i(d, "mode"),
                   type=_s(d, "type"), mod_time=parse_time(d.get("mod_time")),
                   target=_s(d, "target"), raw=d)

    @property
    def is_dir(self) -> bool:
        return self.type == "dir"

    @property
    def is_file(self) -> bool:
        return self.type == "file"

    @property
    def is_symlink(self) -> bool:
        return self.type == "symlink"


@dataclass
class Image:
    """An image known to the node's image store."""

    name: str
    digest: str = ""
    layers: List[str] = field(default_factory=list)
    size: int = 0
    created_at: Optional[_dt.datetime] = None
    #: ``env``, ``working_dir``, ``user`` (its sandboxes' defaults) and what a
    #: Dockerfile recorded; empty when the image has none.
    config: Dict[str, Any] = field(default_factory=dict)
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "Image":
        layers = d.get("layers")
        config = d.get("config")
        return cls(name=_s(d, "name"), digest=_s(d, "digest"),
                   layers=[str(x) for x in layers] if isinstance(layers, list) else [],
                   size=_i(d, "size"), created_at=parse_time(d.get("created_at")),
                   config=config if isinstance(config, dict) else {}, raw=d)


@dataclass
class Layer:
    """One version of a named layer (a workspace, a toolkit)."""

    name: str
    version: int = 0
    digest: str = ""
    size: int = 0
    entries: int = 0
    stored_size: int = 0
    source: str = ""
    created_at: Optional[_dt.datetime] = None
    project: str = ""  # the owner; "" = the shared catalog (made by a root token)
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def ref(self) -> str:
        """``name@version``, the reference to use in ``create(layers=[...])``."""
        return "%s@%d" % (self.name, self.version)

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "Layer":
        return cls(name=_s(d, "name"), version=_i(d, "version"), digest=_s(d, "digest"),
                   size=_i(d, "size"), entries=_i(d, "entries"), stored_size=_i(d, "stored_size"),
                   source=_s(d, "source"), created_at=parse_time(d.get("created_at")),
                   project=_s(d, "project"), raw=d)


@dataclass
class Node:
    """One edge node as the fleet watcher sees it."""

    name: str
    state: str = ""
    cpu_capacity: float = 0.0
    memory_mb: int = 0
    cpu_requested: float = 0.0
    memory_requested_mb: int = 0
    sandboxes: int = 0
    tiers: List[str] = field(default_factory=list)
    last_heartbeat: Optional[_dt.datetime] = None
    cpu_used: float = 0.0
    memory_used_mb: int = 0
    memory_available_mb: int = 0
    swap_total_mb: int = 0
    swap_used_mb: int = 0
    memory_pressure: float = 0.0
    #: disk (``disk_mb``) the node admits: what its scratch filesystem can really hold
    #: × ``disk_overcommit``; ``disk_requested_mb`` its live sandboxes hold;
    #: ``disk_available_mb`` free there now
    disk_mb: int = 0
    disk_requested_mb: int = 0
    disk_available_mb: int = 0
    disk_overcommit: float = 0.0
    sandboxes_by_state: Dict[str, int] = field(default_factory=dict)
    sandboxes_by_priority: Dict[str, int] = field(default_factory=dict)
    pools: List[Dict[str, Any]] = field(default_factory=list)
    features: Dict[str, Any] = field(default_factory=dict)  # booleans, and sandbox_root (userns or host-root)
    #: containers of deleted sandboxes reused for new ones: ``waiting``, ``kept``,
    #: ``reused``, ``refused`` (docs/architecture.md, "Recycled containers")
    recycling: Dict[str, int] = field(default_factory=dict)
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "Node":
        tiers = d.get("tiers")

        def _m(k: str) -> Dict[str, Any]:
            v = d.get(k)
            return dict(v) if isinstance(v, dict) else {}

        pools = d.get("pools")
        return cls(name=_s(d, "name"), state=_s(d, "state"), cpu_capacity=_f(d, "cpu_capacity"),
                   memory_mb=_i(d, "memory_mb"), cpu_requested=_f(d, "cpu_requested"),
                   memory_requested_mb=_i(d, "memory_requested_mb"), sandboxes=_i(d, "sandboxes"),
                   tiers=[str(t) for t in tiers] if isinstance(tiers, list) else [],
                   last_heartbeat=parse_time(d.get("last_heartbeat")),
                   cpu_used=_f(d, "cpu_used"), memory_used_mb=_i(d, "memory_used_mb"),
                   memory_available_mb=_i(d, "memory_available_mb"),
                   swap_total_mb=_i(d, "swap_total_mb"), swap_used_mb=_i(d, "swap_used_mb"),
                   memory_pressure=_f(d, "memory_pressure"),
                   disk_mb=_i(d, "disk_mb"), disk_requested_mb=_i(d, "disk_requested_mb"),
                   disk_available_mb=_i(d, "disk_available_mb"), disk_overcommit=_f(d, "disk_overcommit"),
                   sandboxes_by_state=_m("sandboxes_by_state"),
                   sandboxes_by_priority=_m("sandboxes_by_priority"),
                   pools=[p for p in pools if isinstance(p, dict)] if isinstance(pools, list) else [],
                   features=_m("features"), recycling=_m("recycling"), raw=d)


@dataclass
class Snapshot:
    """A snapshot of a sandbox's filesystem (``POST .../snapshots``): only the
    filesystem, not process memory. Restore with ``client.create(snapshot=id)``."""

    id: str
    name: str = ""
    sandbox_id: str = ""
    size: int = 0
    created_at: Optional[_dt.datetime] = None
    image: str = ""
    layers: List[Any] = field(default_factory=list)
    diff: str = ""
    parent: str = ""
    step: Optional[int] = None
    project: str = ""  # the sandbox's project, which owns the snapshot
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "Snapshot":
        layers = d.get("layers")
        return cls(id=_s(d, "id"), name=_s(d, "name"),
                   sandbox_id=_s(d, "sandbox_id") or _s(d, "sandbox"), size=_i(d, "size"),
                   created_at=parse_time(d.get("created_at")), image=_s(d, "image"),
                   layers=list(layers) if isinstance(layers, list) else [], diff=_s(d, "diff"),
                   parent=_s(d, "parent"), step=_oi(d, "step"), project=_s(d, "project"), raw=d)


@dataclass
class Pool:
    """A warm pool of pre-created sandboxes (``/v1/pools``)."""

    name: str
    image: str = ""
    tier: str = ""
    size: int = 0
    ready: int = 0
    creating: int = 0
    claimed: int = 0
    cpu: float = 0.0
    memory_mb: int = 0
    priority: str = ""
    error: str = ""
    project: str = ""  # the owner: members serve sandboxes of it and below
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "Pool":
        return cls(name=_s(d, "name") or _s(d, "id"), image=_s(d, "image"), tier=_s(d, "tier"),
                   size=_i(d, "size"), ready=_i(d, "ready"), creating=_i(d, "creating"),
                   claimed=_i(d, "claimed"), cpu=_f(d, "cpu"), memory_mb=_i(d, "memory_mb"),
                   priority=_s(d, "priority"), error=_s(d, "error"), project=_s(d, "project"), raw=d)


@dataclass
class Trajectory:
    """The recorded, ordered operations of a trajectory (``/v1/trajectories/{id}``)."""

    id: str
    steps: List[Dict[str, Any]] = field(default_factory=list)
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    sandbox_id: str = ""

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "Trajectory":
        steps = d.get("steps", d.get("events"))
        return cls(id=_s(d, "trajectory") or _s(d, "id"),
                   steps=list(steps) if isinstance(steps, list) else [], raw=d,
                   sandbox_id=_s(d, "sandbox"))


@dataclass
class ReplayReport:
    """The answer of a trajectory replay (``POST /v1/trajectories:replay``): the
    log re-executed in a fresh sandbox from the original state.

    Attributes:
        steps: how many steps ran again.
        deterministic: no step's outcome differs from the log.
        differences: one dict per differing step: ``step``, ``op``, ``fields``
            (exit_code, stdout, stderr, timed_out, signal, file, error),
            ``logged`` and ``got`` (the step with the logged / new result).
        sandbox_id: where it ran (removed afterwards unless ``keep``).
    """

    trajectory: str
    steps: int = 0
    deterministic: bool = True
    differences: List[Dict[str, Any]] = field(default_factory=list)
    sandbox_id: str = ""
    duration: float = 0.0
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "ReplayReport":
        diffs = d.get("differences")
        return cls(trajectory=_s(d, "trajectory"), steps=_i(d, "steps", 0),
                   deterministic=bool(d.get("deterministic")),
                   differences=[x for x in diffs if isinstance(x, dict)] if isinstance(diffs, list) else [],
                   sandbox_id=_s(d, "sandbox"), duration=_f(d, "duration_ms") / 1000.0, raw=d)
