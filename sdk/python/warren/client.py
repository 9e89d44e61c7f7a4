"""The blocking client: :class:`Client`, :class:`Sandbox` handles, sessions,
files and background commands. Thread safe: one client may be shared by many
threads (connections are pooled and reused)."""

import concurrent.futures
import socket
import ssl
import time
from typing import (Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence,
                    Union, overload)

from . import _core
from ._core import Command, Config, Duration, Number, Req, json_req, sandbox_path
from ._http_sync import SyncTransport
from ._tar import PathLike, pack_dir, unpack
from ._ws import Terminal, WebSocket, terminal_query
from .errors import (ConnectionFailed, Conflict, NotFound, SandboxFailed, Timeout, Unavailable,
                     WarrenError)
from .models import (CommandStatus, ExecResult, FileInfo, Image, Layer, Node, Pool, SandboxInfo,
                     ReplayReport, Snapshot, Trajectory)

try:  # Python 3.8+: typing.Literal
    from typing import Literal
except ImportError:  # pragma: no cover
    Literal = None  # type: ignore

__all__ = ["Client", "Sandbox", "Session", "Files", "BackgroundCommand", "Pools"]

OutputCallback = Callable[[str], Any]


class Client:
    """A connection to a warren server.

    Args:
        url: base URL, e.g. ``"http://127.0.0.1:7070"``. Default: ``$WARREN_URL``,
            else ``http://127.0.0.1:7070``.
        token: API token sent as ``Authorization: Bearer``. Default: ``$WARREN_TOKEN``.
        timeout: socket timeout in seconds for ordinary requests (commands get
            their own timeout plus a margin).
        max_retries: how many times a request is retried after HTTP 429/503 or a
            connection error (with exponential backoff and jitter, honouring
            ``Retry-After``). Requests that are not idempotent are retried after
            a connection error only when the server cannot have seen them.
        backoff, max_backoff: first and largest delay between retries, seconds.
        pool_size: how many idle keep-alive connections are kept for reuse.
        ssl_context: for ``https`` URLs.

    Use it as a context manager, or call :meth:`close`, to close pooled connections.
    """

    def __init__(self, url: Optional[str] = None, token: Optional[str] = None, *,
                 timeout: float = 60.0, max_retries: int = 5, backoff: float = 0.1,
                 max_backoff: float = 2.0, pool_size: int = 32,
                 ssl_context: Optional[ssl.SSLContext] = None,
                 user_agent: Optional[str] = None) -> None:
        self._cfg = Config.build(url, token, timeout, max_retries, backoff, max_backoff,
                                 user_agent)
        self._t = SyncTransport(self._cfg, pool_size, ssl_context)
        self._ssl = ssl_context
        self.pools = Pools(self)

    @property
    def url(self) -> str:
        return self._cfg.url

    def close(self) -> None:
        """Close pooled connections (the client may still be used afterwards)."""
        self._t.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return "Client(%r)" % self._cfg.url

    # ---- low level ---------------------------------------------------------------------

    def _json(self, req: Req) -> Any:
        return self._t.request(req).json()

    def request(self, method: str, path: str, *, json: Any = None,
                params: Optional[Mapping[str, Any]] = None, body: Optional[bytes] = None,
                headers: Optional[Mapping[str, str]] = None,
                timeout: Optional[float] = None) -> Any:
        """Send any API request (with auth, retries and error mapping) and return
        the decoded JSON answer (raw bytes if the answer is not JSON)."""
        p = [(k, str(v)) for k, v in (params or {}).items()]
        if body is not None:
            req = Req(method.upper(), path, params=p, body=body, headers=dict(headers or {}),
                      timeout=timeout)
        else:
            req = json_req(method.upper(), path, json, params=p, headers=dict(headers or {}),
                           timeout=timeout)
        resp = self._t.request(req)
        if "json" in (resp.headers.get("Content-Type") or "json"):
            return resp.json()
        return resp.body

    # ---- server ------------------------------------------------------------------------

    def health(self) -> Dict[str, Any]:
        """``GET /healthz`` (no auth); returns e.g. ``{"status": "ok"}``."""
        return self._json(Req("GET", "/healthz", auth=False))

    def images(self) -> List[Image]:
        """Images known to the image store."""
        return [Image.from_json(d) for d in
                _core.items_from(self._json(Req("GET", "/v1/images")), "images")]

    def nodes(self) -> List[Node]:
        """The fleet's nodes."""
        return [Node.from_json(d) for d in
                _core.items_from(self._json(Req("GET", "/v1/nodes")), "nodes")]

    # ---- network rules -----------------------------------------------------------------

    def put_network_rule(self, name: str, *, hosts: Optional[Sequence[str]] = None,
                         cidrs: Optional[Sequence[str]] = None, ports: Optional[Sequence[int]] = None,
                         protocols: Optional[Sequence[str]] = None) -> Dict[str, Any]:
        """Create or replace a named network rule (root admins only): every
        running sandbox naming it gets the change within a second."""
        return dict(self._json(_core.network_rule_req(name, hosts, cidrs, ports, protocols)))

    def network_rules(self) -> List[Dict[str, Any]]:
        """The cluster's named network rules."""
        return list(self._json(Req("GET", "/v1/network-rules"))["rules"])

    def network_rule(self, name: str) -> Dict[str, Any]:
        """One named network rule."""
        return dict(self._json(Req("GET", "/v1/network-rules/" + _core.quote(name, safe=""))))

    def delete_network_rule(self, name: str) -> Dict[str, Any]:
        """Delete a named network rule (root admins only)."""
        return dict(self._json(Req("DELETE", "/v1/network-rules/" + _core.quote(name, safe=""))))

    # ---- layers ------------------------------------------------------------------------

    def create_layer(self, name: str, *, tar: Optional[bytes] = None,
                     directory: Optional[PathLike] = None, from_sandbox: Optional[str] = None,
                     version: Optional[int] = None) -> Layer:
        """Create a version of the named layer from a layer tarball (bytes, plain
        or gzip), a local ``directory``, or the changes of sandbox ``from_sandbox``
        (an environment builder's result). Without ``version``: the next one."""
        if directory is not None:
            if tar is not None:
                raise ValueError("warren: give one of tar= and directory=")
            tar, _ = pack_dir(directory)
        return Layer.from_json(self._json(_core.create_layer_req(
            name, tar=tar, from_sandbox=from_sandbox, version=version)))

    def layers(self, name: Optional[str] = None) -> List[Layer]:
        """Every version of every named layer (or of ``name``)."""
        return [Layer.from_json(d) for d in
                _core.items_from(self._json(_core.layers_req(name)), "layers")]

    def layer(self, ref: str) -> Layer:
        """A layer version: ``name`` (the latest) or ``name@version``."""
        return Layer.from_json(self._json(Req("GET", _core.layer_path(ref))))

    def delete_layer(self, ref: str) -> List[Layer]:
        """Delete ``name@version`` or every version of ``name``; returns what went."""
        return [Layer.from_json(d) for d in
                _core.items_from(self._json(Req("DELETE", _core.layer_path(ref))), "layers")]

    def delete_snapshot(self, snapshot_id: str) -> None:
        """Remove a snapshot and its layer. One still in use (a live sandbox
        restored from it, a later snapshot chained on it, a trajectory's start
        or latest checkpoint) raises :class:`Conflict`."""
        self._json(Req("DELETE", "/v1/snapshots/" + _core.q(snapshot_id)))

    def list_snapshots(self, sandbox: Optional[str] = None) -> List[Snapshot]:
        """The snapshots of the token's project and the projects below it
        (one sandbox's with ``sandbox``), newest first."""
        params = [("sandbox", sandbox)] if sandbox else []
        return [Snapshot.from_json(d) for d in
                _core.items_from(self._json(Req("GET", "/v1/snapshots", params=params)), "snapshots")]

    def list_trajectories(self) -> List[Dict[str, Any]]:
        """The trajectories of the token's project and the projects below it:
        ``name``, ``project``, ``sandbox``, ``bytes`` (log and inputs),
        ``created_at``, ``expires_at`` (with a ``trajectory_ttl``)."""
        return list(_core.items_from(self._json(Req("GET", "/v1/trajectories")), "trajectories"))

    def delete_trajectory(self, trajectory: str, *, project: Optional[str] = None) -> None:
        """Delete a trajectory: its log, the inputs it kept and its record, freeing
        their bytes from the project's storage quota. One a live sandbox still
        records, or that a branch shares its log with, raises :class:`Conflict`."""
        params = [("project", project)] if project else []
        self._json(Req("DELETE", _core.trajectory_path(trajectory), params=params))

    def gc_layers(self) -> Dict[str, Any]:
        """Remove layers no image, named layer or sandbox uses."""
        return self._json(Req("POST", "/v1/layers:gc"))

    def pull_image(self, ref: str, name: Optional[str] = None) -> Image:
        """Pull ``ref`` from its OCI registry into the store (as ``name``)."""
        return Image.from_json(self._json(_core.pull_req(ref, name)))

    def import_image(self, name: str, archive: Union[bytes, PathLike]) -> Image:
        """Upload an image archive (OCI archive, docker-save archive or root
        filesystem tarball, plain or gzip; bytes or a file path) as ``name``.
        Needs a root token (the image catalog is shared)."""
        if not isinstance(archive, (bytes, bytearray)):
            with open(archive, "rb") as f:
                archive = f.read()
        return Image.from_json(self._json(_core.import_image_req(name, bytes(archive))))

    def import_disk(self, name: str, path: PathLike, fmt: Optional[str] = None) -> Image:
        """Upload a VM disk image file (qcow2 or raw: ``fmt``, else by its
        name) as ``name``, for sandboxes of tier ``"vm"``: they boot its own
        bootloader, kernel and init. The server refuses a corrupt image or
        one with a backing file (``BadRequest``). Needs a root token."""
        fmt = _core.disk_format(str(path), fmt)
        with open(path, "rb") as f:
            disk = f.read()
        return Image.from_json(self._json(_core.import_disk_req(name, disk, fmt)))

    def commit_image(self, name: str, *, base: Optional[str] = None,
                     layers: Optional[List[str]] = None,
                     config: Optional[Dict[str, Any]] = None) -> Image:
        """Store ``name`` as ``base``'s layers with the named ``layers``
        (``name@version``, bottom first) above them; ``config`` (``env``,
        ``working_dir``, ``user``, ``cmd``, ``entrypoint``, ``labels``,
        ``exposed_ports``) over ``base``'s. Needs a root token."""
        return Image.from_json(self._json(_core.commit_image_req(name, base, layers, config)))
    # ---- cluster: events, projects, tokens ----------------------------------------------

    def events(self, after: int = 0, limit: Optional[int] = None,
               wait: Optional[float] = None) -> Dict[str, Any]:
        """Cluster events after sequence ``after`` (``{"events": [...], "next": n}``);
        pass ``next`` as the following call's ``after``."""
        return self._json(_core.events_req(after, limit, wait))

    def follow_events(self, after: int = 0, *, limit: Optional[int] = None,
                      reconnect: bool = True) -> Iterator[Dict[str, Any]]:
        """Yield cluster events as they happen (``GET /v1/events?follow=1``), oldest
        first, starting after sequence ``after``; stops after ``limit`` events when
        given, otherwise runs until the caller stops iterating. A broken connection
        or a restarted apiserver is resumed after the last event yielded (with
        ``reconnect``, the default), so each event is seen once and in order."""
        f = _core.EventFollower(after, limit)
        while not f.done:
            try:
                with self._t.open(_core.follow_req(f.after)) as s:
                    for line in s.lines():
                        ev = f.feed(line)
                        if ev is not None:
                            yield ev
                            if f.done:
                                return
            except (ConnectionFailed, Timeout, Unavailable):
                if not reconnect:
                    raise
            else:
                if not reconnect:
                    return
            time.sleep(f.backoff())

    def create_project(self, name: str, *, parent: Optional[str] = None,
                       quota: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
        """Create a subproject (default under the token's project). ``quota`` may set
        ``sandboxes``, ``cpu``, ``memory_mb``, ``storage_bytes`` and the per-sandbox
        network rates ``egress_rate_mbit`` and ``ingress_rate_mbit`` and ``max_conns``; it can never
        exceed the parent's."""
        return self._json(json_req("POST", "/v1/projects", _core.project_body(name, parent, quota)))

    def projects(self) -> List[Dict[str, Any]]:
        """Projects this token reaches, with their usage."""
        return list(self._json(Req("GET", "/v1/projects")).get("projects") or [])

    def project(self, project_id: str) -> Dict[str, Any]:
        return self._json(Req("GET", _core.project_path(project_id)))

    def update_project(self, project_id: str, quota: Mapping[str, Any]) -> Dict[str, Any]:
        """Set a project's quota (needs the admin role in a project above it)."""
        return self._json(json_req("PATCH", _core.project_path(project_id), {"quota": dict(quota)}))

    def delete_project(self, project_id: str) -> None:
        self._t.request(Req("DELETE", _core.project_path(project_id)))

    def create_token(self, principal: str, *, project: Optional[str] = None,
                     role: Optional[str] = None,
                     expires_in: Optional[Duration] = None) -> Dict[str, Any]:
        """Issue a token; its secret (``["token"]``) is shown only in this answer."""
        return self._json(json_req("POST", "/v1/tokens",
                                   _core.token_body(principal, project, role, expires_in)))

    def tokens(self) -> List[Dict[str, Any]]:
        """Tokens this token manages (never their secrets)."""
        return list(self._json(Req("GET", "/v1/tokens")).get("tokens") or [])

    def revoke_token(self, token_id: str) -> None:
        self._t.request(Req("DELETE", _core.token_path(token_id)))

    def create_batch(self, count: int, *, ids_only: bool = False, **spec: Any) -> Dict[str, Any]:
        """Create ``count`` sandboxes of one spec in one call (``POST /v1/sandboxes:batch``).
        Returns ``{"created", "ids", "sandboxes", "failed", "errors"}``."""
        return self._json(json_req("POST", "/v1/sandboxes:batch",
                                   _core.batch_body(count, ids_only, spec)))

    # ---- sandboxes ---------------------------------------------------------------------

    def create(self, image: Optional[str] = None, *, tier: Optional[str] = None,
               layers: Optional[Sequence[Any]] = None, cpu: Optional[Number] = None,
               memory_mb: Optional[int] = None, disk_mb: Optional[int] = None,
               pids: Optional[int] = None, ttl: Optional[Duration] = None,
               idle_timeout: Optional[Duration] = None, env: Optional[Mapping[str, str]] = None,
               labels: Optional[Mapping[str, str]] = None, priority: Optional[Any] = None,
               trajectory: Optional[str] = None, user: Optional[str] = None,
               hostname: Optional[str] = None, network: Optional[Any] = None,
               idempotency_key: Optional[str] = None, wait: bool = True,
               wait_timeout: float = 300.0, **extra: Any) -> "Sandbox":
        """Create a sandbox and return its handle.

        ``ttl`` and ``idle_timeout`` are seconds (or ``timedelta``). Keyword
        arguments the SDK does not know are sent as-is in the JSON body (e.g.
        ``pool=`` or ``snapshot=`` on servers that support them).

        The request carries an ``Idempotency-Key`` (``idempotency_key`` or a
        random one), reused by every retry, so a retried create never makes a
        second sandbox. With ``wait`` (default), a sandbox still ``creating`` is
        polled until it runs; a ``failed`` one raises :class:`SandboxFailed`.
        """
        body = _core.create_body(tier=tier, image=image, layers=layers, cpu=cpu,
                                 memory_mb=memory_mb, disk_mb=disk_mb, pids=pids, ttl=ttl,
                                 idle_timeout=idle_timeout, env=env, labels=labels,
                                 priority=priority, trajectory=trajectory, user=user,
                                 hostname=hostname, network=network, extra=extra)
        info = SandboxInfo.from_json(self._json(_core.create_req(body, idempotency_key)))
        sb = Sandbox(self, info)
        if wait:
            sb.wait_running(wait_timeout)
        return sb

    def terminal(self, sandbox_id: str, cmd: Optional[Command] = None, *,
                 cols: Optional[int] = None, rows: Optional[int] = None, tty: bool = True,
                 user: Optional[str] = None, cwd: Optional[str] = None,
                 env: Optional[Mapping[str, str]] = None,
                 timeout: Optional[Duration] = None) -> Terminal:
        """Open an interactive terminal in a sandbox (``GET /v1/sandboxes/{id}/pty``,
        a WebSocket): ``cmd`` (a shell string or argv; default the sandbox's
        shell) on a terminal of ``cols`` x ``rows`` (default 80x24). With
        ``tty=False`` the command runs without a terminal and its stdin is fed
        live. Errors before the upgrade raise as for any call (``NotFound``,
        ``BadRequest``...). See :class:`Terminal`."""
        path = sandbox_path(sandbox_id, "pty") + "?" + terminal_query(
            cmd, cols, rows, tty, user, cwd, env, _core.seconds(timeout))
        ws = WebSocket.connect(self._cfg, path, ssl_context=self._ssl)
        return Terminal(ws, tty=tty)

    def get(self, sandbox_id: str) -> "Sandbox":
        """A handle on an existing sandbox (raises :class:`NotFound`)."""
        return Sandbox(self, SandboxInfo.from_json(self._json(Req("GET",
                                                                  sandbox_path(sandbox_id)))))

    def sandbox(self, sandbox_id: str) -> "Sandbox":
        """A handle on a sandbox by id, without asking the server (no I/O)."""
        return Sandbox(self, SandboxInfo(id=sandbox_id))

    def list(self, labels: Optional[Mapping[str, str]] = None,
             state: Optional[str] = None) -> List["Sandbox"]:
        """Sandboxes visible to this token, filtered by all ``labels`` and by ``state``."""
        doc = self._json(_core.list_req(labels, state))
        return [Sandbox(self, SandboxInfo.from_json(d)) for d in _core.sandboxes_from(doc)]

    def create_many(self, n: int, *, max_workers: int = 16, **spec: Any) -> List["Sandbox"]:
        """Create ``n`` sandboxes with the same ``spec`` (the arguments of
        :meth:`create`) concurrently. If any create fails, the ones that were
        created are stopped and the first error is raised."""
        if n <= 0:
            return []
        spec.pop("idempotency_key", None)
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(n, max_workers))) as ex:
            futs = [ex.submit(self.create, **spec) for _ in range(n)]
            concurrent.futures.wait(futs)
        made = [f.result() for f in futs if f.exception() is None]
        errs = [f.exception() for f in futs if f.exception() is not None]
        if errs:
            for sb in made:
                try:
                    sb.stop()
                except WarrenError:
                    pass
            raise errs[0]  # type: ignore[misc]
        return made

    def run_many(self, sandboxes: Iterable[Union["Sandbox", str]], cmd: Command, *,
                 max_workers: int = 16, return_exceptions: bool = False,
                 **kwargs: Any) -> List[Any]:
        """Run ``cmd`` in every sandbox concurrently; results in the same order.

        ``kwargs`` are those of :meth:`Sandbox.run`. With ``return_exceptions``
        an error is returned in its slot instead of raised.
        """
        sbs = [self.sandbox(s) if isinstance(s, str) else s for s in sandboxes]
        if not sbs:
            return []
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(len(sbs),
                                                                          max_workers))) as ex:
            futs = [ex.submit(sb.run, cmd, **kwargs) for sb in sbs]
            concurrent.futures.wait(futs)
        out: List[Any] = []
        for f in futs:
            e = f.exception()
            if e is not None and not return_exceptions:
                raise e
            out.append(e if e is not None else f.result())
        return out

    def pause_matching(self, label: Optional[str] = None,
                       labels: Optional[Mapping[str, str]] = None) -> Dict[str, Any]:
        """Pause every sandbox whose labels match (``POST /v1/sandboxes:pause``), e.g.
        ``pause_matching("job=J")``. Returns ``{"sandboxes": [...], "errors": {...}}``."""
        body = _core.drop_none({"label": label, "labels": dict(labels) if labels else None})
        return self._json(json_req("POST", "/v1/sandboxes:pause", body))

    def resume_matching(self, label: Optional[str] = None,
                        labels: Optional[Mapping[str, str]] = None) -> Dict[str, Any]:
        """Resume every paused sandbox whose labels match (``POST /v1/sandboxes:resume``)."""
        body = _core.drop_none({"label": label, "labels": dict(labels) if labels else None})
        return self._json(json_req("POST", "/v1/sandboxes:resume", body))

    # ---- later features (404 until the server offers them) -----------------------------

    def fncall(self, cmd: Command, *, image: Optional[str] = None,
               timeout: Optional[Duration] = None, env: Optional[Mapping[str, str]] = None,
               stdin: Optional[Union[str, bytes]] = None,
               files: Optional[Mapping[str, Union[str, bytes]]] = None,
               cpu: Optional[Number] = None, memory_mb: Optional[int] = None,
               **extra: Any) -> ExecResult:
        """Run a stateless task in a pre-warmed sandbox (``POST /v1/fncall``).

        ``files`` maps absolute paths to contents written before the command runs.
        """
        body = _core.fncall_body(cmd, image=image, timeout=timeout, env=env, stdin=stdin,
                                 files=files, cpu=cpu, memory_mb=memory_mb, extra=extra)
        req = json_req("POST", "/v1/fncall", body,
                       timeout=_core.exec_read_timeout(self._cfg, timeout))
        return ExecResult.from_json(self._json(req))

    def trajectory(self, trajectory_id: str, path: Optional[str] = None, *,
                   project: Optional[str] = None) -> Trajectory:
        """Every recorded step of a trajectory, in order (``GET /v1/trajectories/{id}``,
        page by page). ``path`` keeps only the steps whose file operations changed
        that path (provenance). Names are unique per project: ``project`` reads
        the trajectory of a project below the token's (default: the token's own)."""
        steps: List[Dict[str, Any]] = []
        after = 0
        while True:
            params = [("after", str(after))] + ([("path", path)] if path else [])
            if project:
                params.append(("project", project))
            doc = self._json(Req("GET", _core.trajectory_path(trajectory_id), params=params))
            t = Trajectory.from_json(doc)
            steps.extend(t.steps)
            nxt = doc.get("next") if isinstance(doc, dict) else None
            if not nxt:
                t.steps = steps
                return t
            after = int(nxt)

    def trajectory_audit_summary(self, trajectory_id: str, *,
                                 project: Optional[str] = None) -> Dict[str, Any]:
        """Per step of a trajectory, its audit records counted by kind, and how many a
        policy rule matched (``GET /v1/trajectories/{id}/audit/summary``): ``summary``
        and ``dropped``. Kept with the trajectory: works after its sandbox is gone."""
        params = [("audit", "summary")] + ([("project", project)] if project else [])
        return dict(self._json(Req("GET", _core.trajectory_path(trajectory_id), params=params)))

    def replay_trajectory(self, trajectory: str, *, keep: bool = False, project: Optional[str] = None,
                          masks: Optional[Sequence[str]] = None,
                          ignore: Optional[Sequence[str]] = None,
                          timeout: Optional[Duration] = 3600) -> ReplayReport:
        """Re-execute a trajectory's log in a fresh sandbox from its original state
        and report every step whose outcome differs (a determinism check;
        ``POST /v1/trajectories:replay``). ``keep`` leaves that sandbox running.
        ``masks`` are regular expressions (RE2) whose matches in stdout and stderr
        are not compared (timings: ``r"in [0-9.]+s"``); ``ignore`` names outcome
        fields not to compare (``exit_code``, ``stdout``, ``stderr``, ``timed_out``,
        ``signal``, ``file``, ``error``, ``duration_ms``)."""
        body: Dict[str, Any] = {"trajectory": trajectory}
        if keep:
            body["keep"] = True
        if project:
            body["project"] = project
        if masks:
            body["masks"] = list(masks)
        if ignore:
            body["ignore"] = list(ignore)
        return ReplayReport.from_json(self._json(json_req(
            "POST", "/v1/trajectories:replay", body, timeout=_core.seconds(timeout))))

    def resume(self, trajectory: str, *, branch: bool = False) -> "Sandbox":
        """Re-attach to a trajectory after a restart. Re-issue the operations from
        the beginning: while they equal the logged ones the cached results come
        back (``replayed=True``) and nothing runs; then the sandbox continues live.
        A lost sandbox is rebuilt from its last checkpoint. A different operation
        raises :class:`Conflict` with ``divergence`` set."""
        body = {"trajectory": trajectory, "resume": True}
        if branch:
            body["branch"] = True
        return Sandbox(self, SandboxInfo.from_json(self._json(json_req("POST", "/v1/sandboxes",
                                                                       body))))


class Pools:
    """Warm pools (``/v1/pools``): ``client.pools.create(...)``, ``list()``, ``get()``, ``delete()``."""

    def __init__(self, client: Client) -> None:
        self._c = client

    def create(self, name: str, *, image: Optional[str] = None, size: Optional[int] = None,
               tier: Optional[str] = None, **spec: Any) -> Pool:
        body = _core.drop_none({"name": name, "image": image, "size": size, "tier": tier})
        body.update(_core.drop_none(spec))
        return Pool.from_json(self._c._json(json_req("POST", "/v1/pools", body)))

    def list(self) -> List[Pool]:
        return [Pool.from_json(d) for d in
                _core.items_from(self._c._json(Req("GET", "/v1/pools")), "pools")]

    def get(self, name: str) -> Pool:
        return Pool.from_json(self._c._json(Req("GET", "/v1/pools/" + _core.q(name))))

    def delete(self, name: str) -> None:
        self._c._t.request(Req("DELETE", "/v1/pools/" + _core.q(name)))


class Sandbox:
    """A handle on one sandbox. Cheap: holds the client and the last known
    :class:`SandboxInfo` (``info``; :meth:`refresh` re-reads it).

    As a context manager it stops the sandbox on exit::

        with client.create(image="busybox") as sb:
            print(sb.run("echo hi").stdout)
    """

    def __init__(self, client: Client, info: SandboxInfo) -> None:
        self.client = client
        self.info = info
        self._files: Optional[Files] = None

    # -- attributes
    @property
    def id(self) -> str:
        return self.info.id

    @property
    def state(self) -> str:
        return self.info.state

    @property
    def labels(self) -> Dict[str, str]:
        return self.info.labels

    @property
    def node(self) -> str:
        return self.info.node

    @property
    def image(self) -> str:
        return self.info.image

    @property
    def tier(self) -> str:
        return self.info.tier

    def __repr__(self) -> str:
        return "Sandbox(id=%r, state=%r)" % (self.info.id, self.info.state)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sandbox) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.stop()
        except (NotFound, Conflict):
            pass

    def _path(self, *rest: str) -> str:
        return sandbox_path(self.id, *rest)

    def _set(self, doc: Any) -> "Sandbox":
        if isinstance(doc, dict) and doc.get("id"):
            self.info = SandboxInfo.from_json(doc)
        return self

    # -- lifecycle
    def terminal(self, cmd: Optional[Command] = None, **kw: Any) -> Terminal:
        """An interactive terminal in this sandbox; see :meth:`Client.terminal`."""
        return self.client.terminal(self.id, cmd, **kw)

    def refresh(self) -> "Sandbox":
        """Re-read the sandbox's state from the server."""
        return self._set(self.client._json(Req("GET", self._path())))

    def wait_running(self, timeout: float = 300.0) -> "Sandbox":
        """Poll until the sandbox leaves ``creating``; raise :class:`SandboxFailed` if it failed."""
        deadline = time.monotonic() + timeout
        delay = 0.02
        while self.info.state == "creating":
            if time.monotonic() > deadline:
                raise Timeout("warren: sandbox %s still creating after %.0fs" % (self.id, timeout))
            time.sleep(delay)
            delay = min(delay * 2, 0.5)
            self.refresh()
        if self.info.state == "failed":
            raise SandboxFailed(self.info.reason or "sandbox failed", code="sandbox_failed",
                                sandbox_id=self.id)
        return self

    def stop(self) -> "Sandbox":
        """Stop and delete the sandbox (``DELETE /v1/sandboxes/{id}``)."""
        return self._set(self.client._json(Req("DELETE", self._path())))

    def pause(self) -> "Sandbox":
        """Freeze the sandbox's processes (``POST .../pause``)."""
        return self._set(self.client._json(json_req("POST", self._path("pause"))))

    def resume(self, *, prefetch: bool = True) -> "Sandbox":
        """Thaw a paused sandbox (``POST .../resume``) and read its swapped-out
        memory back ahead of use; ``prefetch=False`` leaves that to page faults."""
        body = None if prefetch else {"prefetch": False}
        return self._set(self.client._json(json_req("POST", self._path("resume"), body)))

    def commands(self) -> List[Dict[str, Any]]:
        """The sandbox's recent commands, oldest first (``GET .../commands``): each a
        dict with ``started_at``, ``cmd`` or ``argv``, ``exit_code`` (absent in the
        background), ``timed_out``, ``signal``, ``duration_ms``."""
        return list(self.client._json(json_req("GET", self._path("commands")))["commands"])

    def stats(self) -> Dict[str, Any]:
        """What the sandbox uses now (``GET .../stats``): ``cpu_seconds``,
        ``memory_bytes``, its limits ``cpu`` and ``memory_mb``, ``commands``."""
        return dict(self.client._json(json_req("GET", self._path("stats"))))

    def network(self) -> Dict[str, Any]:
        """The sandbox's network (``GET .../network``): ``enabled``,
        ``address``, ``gateway``, ``egress`` and the refusals so far,
        ``denied`` and ``denied_by`` (by reason)."""
        return dict(self.client._json(json_req("GET", self._path("network"))))

    def screenshot(self) -> bytes:
        """The screen of a ``tier="vm"``, ``display=True`` sandbox, as PNG bytes."""
        return self.client._t.request(Req("GET", self._path("screenshot"), accept="image/png")).body

    def display_input(self, type: str, **fields: Any) -> None:
        """One keyboard or mouse event for the screen: ``display_input("text",
        text="ls\\n")``, ``display_input("key", key="ctrl-alt-delete")`` or
        ``display_input("click", x=10, y=20)``."""
        self.client._t.request(json_req("POST", self._path("display", "input"), dict(fields, type=type)))

    def set_network(self, egress: List[str]) -> Dict[str, Any]:
        """Replace the egress list (``PUT .../network``): new connections
        obey it on return; open ones to destinations taken off are cut."""
        return dict(self.client._json(json_req("PUT", self._path("network"),
                                               {"egress": list(egress)})))

    def network_denials(self) -> List[Dict[str, Any]]:
        """What the sandbox's network refused, oldest first (``GET
        .../network/denials``): ``time``, ``step``, ``destination``,
        ``protocol`` (dns for refused names), ``reason``, ``count``."""
        return list(self.client._json(json_req("GET", self._path("network/denials")))["denials"])

    # -- ports
    def url(self, port: int) -> str:
        """The URL of ``port`` inside the sandbox through the API (its root;
        append a path). Requests need the client's token, which the sandbox's
        server never sees; see :meth:`expose` for a URL without one."""
        return self.client.url + _core.port_path(self.id, port) + "/"

    def expose(self, port: int) -> Dict[str, Any]:
        """Make ``port`` public: the answer's ``url`` reaches it without a token
        (a new one each call, the earlier revoked) until :meth:`unexpose`."""
        return dict(self.client._json(json_req("POST", _core.port_path(self.id, port),
                                               {"public": True})))

    def unexpose(self, port: int) -> Dict[str, Any]:
        """Revoke ``port``'s public URL."""
        return dict(self.client._json(json_req("DELETE", _core.port_path(self.id, port))))

    def connect_port(self, port: int, timeout: Optional[float] = None) -> socket.socket:
        """A raw TCP stream to ``port`` inside the sandbox, as a connected
        socket (an HTTP upgrade through the API; ``shutdown(SHUT_WR)`` is passed
        on as a half close). Raises :class:`BadGateway` when nothing listens."""
        cfg = self.client._cfg
        sock = socket.create_connection((cfg.host, cfg.port), timeout=timeout or cfg.timeout)
        try:
            if cfg.scheme == "https":
                ctx = self.client._t._pool._ssl or ssl.create_default_context()
                sock = ctx.wrap_socket(sock, server_hostname=cfg.host)
            sock.sendall(_core.port_upgrade_request(cfg, self.id, port))
            head = b""
            while not head.endswith(b"\r\n\r\n"):  # byte by byte: nothing after it is read
                b = sock.recv(1)
                if not b:
                    raise ConnectionFailed("warren: the API closed the connection before answering")
                head += b
                if len(head) > 65536:
                    raise ConnectionFailed("warren: answer head too long")
            body = b""
            n = _core.content_length(head)
            while len(body) < n:
                b = sock.recv(n - len(body))
                if not b:
                    break
                body += b
            _core.port_upgrade_answer(head, body)
            sock.settimeout(None)
            return sock
        except BaseException:
            sock.close()
            raise

    def audit(self, step: Optional[int] = None, kind: Optional[str] = None,
              summary: bool = False) -> Dict[str, Any]:
        """What the sandbox's processes did, from its node's kernel (``GET .../audit``):
        ``records`` oldest first (each with ``time``, ``step``, ``kind``: exec, refused,
        signal, file, connect, limit or denied, ``pid``, ``ppid``, ``uid``, and what happened:
        ``path``/``argv``, ``signal``/``outcome``, ``syscall``, ``op``/``to``, ``dest``,
        ``reason``), ``dropped``, ``telemetry``. ``step`` and ``kind`` filter; ``summary=True``
        answers ``summary`` (per step, counts by kind) instead of the records."""
        params = [(k, str(v)) for k, v in (("step", step), ("kind", kind)) if v is not None]
        if summary:
            params.append(("summary", "1"))
        return dict(self.client._json(json_req("GET", self._path("audit"), params=params)))

    def snapshot(self, name: Optional[str] = None, **extra: Any) -> Snapshot:
        """Snapshot the sandbox's filesystem (``POST .../snapshots``)."""
        body = _core.drop_none({"name": name})
        body.update(_core.drop_none(extra))
        return Snapshot.from_json(self.client._json(json_req("POST", self._path("snapshots"),
                                                             body)))

    def fork(self, n: int = 1, **extra: Any) -> List["Sandbox"]:
        """``n`` new sandboxes from this sandbox's exact state (``POST .../fork``)."""
        body: Dict[str, Any] = {"count": n}
        body.update(_core.drop_none(extra))
        doc = self.client._json(json_req("POST", self._path("fork"), body))
        return [Sandbox(self.client, SandboxInfo.from_json(d)) for d in _core.sandboxes_from(doc)]

    # -- commands
    @overload
    def run(self, cmd: Command, *, timeout: Optional[Duration] = ..., session: Optional[str] = ...,
            env: Optional[Mapping[str, str]] = ..., cwd: Optional[str] = ...,
            stdin: Optional[Union[str, bytes]] = ..., user: Optional[str] = ...,
            output_cap: Optional[int] = ..., on_stdout: Optional[OutputCallback] = ...,
            on_stderr: Optional[OutputCallback] = ..., background: "Literal[False]" = ...,
            check: bool = ..., **extra: Any) -> ExecResult: ...

    @overload
    def run(self, cmd: Command, *, timeout: Optional[Duration] = ..., session: Optional[str] = ...,
            env: Optional[Mapping[str, str]] = ..., cwd: Optional[str] = ...,
            stdin: Optional[Union[str, bytes]] = ..., user: Optional[str] = ...,
            output_cap: Optional[int] = ..., on_stdout: Optional[OutputCallback] = ...,
            on_stderr: Optional[OutputCallback] = ..., background: "Literal[True]",
            check: bool = ..., **extra: Any) -> "BackgroundCommand": ...

    def run(self, cmd: Command, *, timeout: Optional[Duration] = None,
            session: Optional[str] = None, env: Optional[Mapping[str, str]] = None,
            cwd: Optional[str] = None, stdin: Optional[Union[str, bytes]] = None,
            user: Optional[str] = None, output_cap: Optional[int] = None,
            on_stdout: Optional[OutputCallback] = None,
            on_stderr: Optional[OutputCallback] = None, background: bool = False,
            check: bool = False, **extra: Any) -> Any:
        """Run a command and return its :class:`ExecResult`.

        ``cmd`` is a shell string (run by the session's shell) or an argv list.
        ``timeout`` (seconds) kills the command when it runs longer; the result
        then has ``timed_out=True``. ``session`` names a persistent shell (cwd,
        exported variables survive between commands). ``on_stdout`` /
        ``on_stderr`` receive output as it arrives (the result still carries all
        of it). ``check=True`` raises :class:`CommandFailed` on a non-zero exit.
        ``background=True`` returns a :class:`BackgroundCommand` at once.
        """
        body = _core.exec_body(cmd, session=session, env=env, cwd=cwd, stdin=stdin, user=user,
                               timeout=timeout, output_cap=output_cap, background=background,
                               extra=extra)
        read_timeout = _core.exec_read_timeout(self.client._cfg, timeout)
        if background:
            if on_stdout or on_stderr:
                raise ValueError("warren: output callbacks need a foreground command")
            doc = self.client._json(_core.exec_req(self.id, body, False, read_timeout))
            cid = (doc.get("command_id") or doc.get("id")) if isinstance(doc, dict) else None
            if not cid:
                raise WarrenError("warren: server did not return a command id")
            return BackgroundCommand(self, cid)
        if on_stdout is None and on_stderr is None:
            res = ExecResult.from_json(self.client._json(
                _core.exec_req(self.id, body, False, read_timeout)))
        else:
            res = self._run_stream(body, read_timeout, on_stdout, on_stderr)
        if res.sandbox and res.sandbox != self.id:
            self.info = self.client.get(res.sandbox).info  # a branch: continue there
        return res.check() if check else res

    def _run_stream(self, body: Dict[str, Any], read_timeout: float,
                    on_stdout: Optional[OutputCallback],
                    on_stderr: Optional[OutputCallback]) -> ExecResult:
        with self.client._t.open(_core.exec_req(self.id, body, True, read_timeout)) as s:
            ctype = (s.headers.get("Content-Type") or "").lower()
            if "ndjson" not in ctype:  # the server answered plain JSON
                res = ExecResult.from_json(_core.decode_json(s.read()))
                if on_stdout and res.stdout:
                    on_stdout(res.stdout)
                if on_stderr and res.stderr:
                    on_stderr(res.stderr)
                return res
            dec = _core.ExecStream()
            for line in s.lines():
                ev = dec.feed(line)
                if ev is None:
                    continue
                cb = on_stdout if ev[0] == "stdout" else on_stderr
                if cb is not None:
                    cb(ev[1])
            return dec.finish()

    def command(self, command_id: str) -> "BackgroundCommand":
        """A handle on a background command by id."""
        return BackgroundCommand(self, command_id)

    def session(self, name: Optional[str] = None) -> "Session":
        """A named persistent shell in this sandbox (a fresh name if omitted)."""
        return Session(self, name or _core.new_idempotency_key().replace("warren-py-", "s-")[:14])

    @property
    def files(self) -> "Files":
        """File operations in this sandbox."""
        if self._files is None:
            self._files = Files(self)
        return self._files


class Session:
    """A persistent shell in a sandbox: working directory and exported
    variables survive between :meth:`run` calls."""

    def __init__(self, sandbox: Sandbox, name: str) -> None:
        self.sandbox = sandbox
        self.name = name

    def __repr__(self) -> str:
        return "Session(%r, sandbox=%r)" % (self.name, self.sandbox.id)

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def run(self, cmd: Command, **kwargs: Any) -> Any:
        """:meth:`Sandbox.run` in this session."""
        kwargs["session"] = self.name
        return self.sandbox.run(cmd, **kwargs)

    @property
    def files(self) -> "Files":
        return self.sandbox.files


class BackgroundCommand:
    """A command started with ``run(..., background=True)``."""

    def __init__(self, sandbox: Sandbox, command_id: str) -> None:
        self.sandbox = sandbox
        self.id = command_id
        self.status: Optional[CommandStatus] = None

    def __repr__(self) -> str:
        return "BackgroundCommand(%r, sandbox=%r)" % (self.id, self.sandbox.id)

    def _path(self, *rest: str) -> str:
        return self.sandbox._path("commands", _core.q(self.id), *rest)

    def _set(self, doc: Any) -> CommandStatus:
        self.status = CommandStatus.from_json(doc if isinstance(doc, dict) else {})
        if not self.status.id:
            self.status.id = self.id
        return self.status

    def refresh(self) -> CommandStatus:
        """The command's current state, without waiting."""
        return self._set(self.sandbox.client._json(Req("GET", self._path())))

    @property
    def running(self) -> bool:
        """Whether the command still ran when last looked at (refreshes first)."""
        return self.refresh().running

    def wait(self, timeout: Optional[float] = None) -> ExecResult:
        """Block until the command ends and return its result; raise
        :class:`Timeout` if ``timeout`` seconds pass first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        cfg = self.sandbox.client._cfg
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise Timeout("warren: command %s still running after %.1fs" % (self.id, timeout))
            rt = max(cfg.timeout, 630.0) if left is None else max(0.1, left)
            try:
                st = self._set(self.sandbox.client._json(
                    Req("GET", self._path(), params=[("wait", "1")], timeout=rt)))
            except Timeout:
                continue  # the long poll ran out; the deadline check above decides
            if not st.running:
                return st.result()

    def kill(self, signal: int = 9) -> CommandStatus:
        """Send ``signal`` (default SIGKILL) to the command."""
        return self._set(self.sandbox.client._json(json_req("POST", self._path("kill"),
                                                            {"signal": signal})))


class Files:
    """File operations inside a sandbox (paths are absolute, in the sandbox's root)."""

    def __init__(self, sandbox: Sandbox) -> None:
        self.sandbox = sandbox

    def _c(self) -> Client:
        return self.sandbox.client

    def _fpath(self) -> str:
        return self.sandbox._path("files")

    def read(self, path: str) -> bytes:
        """The contents of a file."""
        return self._c()._t.request(Req("GET", self._fpath(), params=_core.file_params(path),
                                        accept="application/octet-stream")).body

    def read_text(self, path: str, encoding: str = "utf-8") -> str:
        return self.read(path).decode(encoding)

    def write(self, path: str, data: Union[bytes, bytearray, memoryview, str],
              mode: Optional[int] = None) -> FileInfo:
        """Create or replace a file atomically (missing parent directories are created);
        ``mode`` like ``0o755`` (default 0o644)."""
        if isinstance(data, str):
            data = data.encode("utf-8")
        req = Req("PUT", self._fpath(), params=_core.file_params(path, mode=_core.mode_str(mode)),
                  body=bytes(data), content_type="application/octet-stream")
        return FileInfo.from_json(self._c()._t.request(req).json())

    def list(self, path: str = "/") -> List[FileInfo]:
        """The entries of a directory."""
        doc = self._c()._json(Req("GET", self._fpath(), params=_core.file_params(path, list=True)))
        return [FileInfo.from_json(d) for d in _core.items_from(doc, "files")]

    def stat(self, path: str) -> FileInfo:
        """Information about one file (raises :class:`NotFound`)."""
        return FileInfo.from_json(self._c()._json(
            Req("GET", self._fpath(), params=_core.file_params(path, stat=True))))

    def exists(self, path: str) -> bool:
        try:
            self.stat(path)
            return True
        except NotFound:
            return False

    def remove(self, path: str, recursive: bool = False) -> None:
        """Delete a file, or a directory tree with ``recursive=True``."""
        self._c()._t.request(Req("DELETE", self._fpath(),
                                 params=_core.file_params(path, recursive=recursive)))

    def mkdir(self, path: str, mode: Optional[int] = None, parents: bool = True) -> FileInfo:
        """Create a directory (and its parents, by default)."""
        body = _core.drop_none({"path": path, "mode": mode, "parents": parents})
        return FileInfo.from_json(self._c()._json(
            json_req("POST", self.sandbox._path("files", "mkdir"), body)))

    def rename(self, src: str, dst: str) -> None:
        """Move ``src`` to ``dst``."""
        self._c()._t.request(json_req("POST", self.sandbox._path("files", "rename"),
                                      {"from": src, "to": dst}))

    def upload_tar(self, remote_dir: str, tar: bytes) -> int:
        """Extract a tar archive into ``remote_dir``; returns the server's count of
        extracted entries."""
        req = Req("PUT", self.sandbox._path("archive"), params=_core.file_params(remote_dir),
                  body=tar, content_type="application/x-tar",
                  timeout=max(self._c()._cfg.timeout, 300.0))
        doc = self._c()._t.request(req).json()
        return int(doc.get("files", 0)) if isinstance(doc, dict) else 0

    def download_tar(self, remote_dir: str) -> bytes:
        """``remote_dir`` as an uncompressed tar archive."""
        return self._c()._t.request(Req("GET", self.sandbox._path("archive"),
                                        params=_core.file_params(remote_dir),
                                        accept="application/x-tar",
                                        timeout=max(self._c()._cfg.timeout, 300.0))).body

    def upload_dir(self, local_dir: PathLike, remote_dir: str) -> int:
        """Copy a local directory tree into ``remote_dir`` (created if needed).
        Returns the number of entries the server extracted (files and directories)."""
        tar, _ = pack_dir(local_dir)
        return self.upload_tar(remote_dir, tar)

    def download_dir(self, remote_dir: str, local_dir: PathLike) -> int:
        """Copy ``remote_dir`` into a local directory (created if needed).
        Returns the number of regular files written."""
        return unpack(self.download_tar(remote_dir), local_dir)
