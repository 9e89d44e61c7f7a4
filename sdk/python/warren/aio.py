"""The asyncio client: the same surface as :mod:`warren.client`, with
coroutines. One :class:`AsyncClient` serves thousands of concurrent operations
from one event loop over a bounded pool of keep-alive connections; no thread
is used per operation."""

import asyncio
import inspect
import ssl
import time
from typing import (Any, AsyncIterator, Awaitable, Callable, Dict, Generator, Iterable, List,
                    Mapping, Optional, Sequence, Tuple, TypeVar, Union)

from . import _core
from ._core import Command, Config, Duration, Number, Req, json_req, sandbox_path
from ._http_async import AsyncTransport
from ._tar import PathLike, pack_dir, unpack
from ._ws import AsyncTerminal, AsyncWebSocket, terminal_query
from .errors import (ConnectionFailed, Conflict, NotFound, SandboxFailed, Timeout, Unavailable,
                     WarrenError)
from .models import (CommandStatus, ExecResult, FileInfo, Image, Layer, Node, Pool, SandboxInfo,
                     ReplayReport, Snapshot, Trajectory)

__all__ = ["AsyncClient", "AsyncSandbox", "AsyncSession", "AsyncFiles", "AsyncBackgroundCommand",
           "AsyncPools"]

OutputCallback = Callable[[str], Any]  # may return an awaitable
T = TypeVar("T")


async def _call(cb: Optional[OutputCallback], text: str) -> None:
    if cb is None:
        return
    r = cb(text)
    if inspect.isawaitable(r):
        await r


async def _bounded(aws: Sequence[Callable[[], Awaitable[T]]], limit: Optional[int],
                   return_exceptions: bool) -> List[Any]:
    sem = asyncio.Semaphore(limit) if limit else None

    async def one(f: Callable[[], Awaitable[T]]) -> T:
        if sem is None:
            return await f()
        async with sem:
            return await f()

    return await asyncio.gather(*(one(f) for f in aws), return_exceptions=return_exceptions)


class AsyncClient:
    """The asyncio twin of :class:`warren.Client` (same arguments).

    ``max_connections`` bounds the open connections (default 512); more
    concurrent operations than that simply wait for a free connection.
    Use ``async with AsyncClient() as c:`` or ``await c.aclose()``.
    """

    def __init__(self, url: Optional[str] = None, token: Optional[str] = None, *,
                 timeout: float = 60.0, max_retries: int = 5, backoff: float = 0.1,
                 max_backoff: float = 2.0, max_connections: int = 512,
                 ssl_context: Optional[ssl.SSLContext] = None,
                 user_agent: Optional[str] = None) -> None:
        self._cfg = Config.build(url, token, timeout, max_retries, backoff, max_backoff,
                                 user_agent)
        self._t = AsyncTransport(self._cfg, max_connections, ssl_context)
        self._ssl = ssl_context
        self.pools = AsyncPools(self)

    @property
    def url(self) -> str:
        return self._cfg.url

    async def aclose(self) -> None:
        """Close pooled connections."""
        await self._t.aclose()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return "AsyncClient(%r)" % self._cfg.url

    async def _json(self, req: Req) -> Any:
        return (await self._t.request(req)).json()

    async def request(self, method: str, path: str, *, json: Any = None,
                      params: Optional[Mapping[str, Any]] = None, body: Optional[bytes] = None,
                      headers: Optional[Mapping[str, str]] = None,
                      timeout: Optional[float] = None) -> Any:
        """Send any API request; see :meth:`warren.Client.request`."""
        p = [(k, str(v)) for k, v in (params or {}).items()]
        if body is not None:
            req = Req(method.upper(), path, params=p, body=body, headers=dict(headers or {}),
                      timeout=timeout)
        else:
            req = json_req(method.upper(), path, json, params=p, headers=dict(headers or {}),
                           timeout=timeout)
        resp = await self._t.request(req)
        if "json" in (resp.headers.get("content-type") or "json"):
            return resp.json()
        return resp.body

    async def health(self) -> Dict[str, Any]:
        return await self._json(Req("GET", "/healthz", auth=False))

    async def images(self) -> List[Image]:
        doc = await self._json(Req("GET", "/v1/images"))
        return [Image.from_json(d) for d in _core.items_from(doc, "images")]

    async def nodes(self) -> List[Node]:
        doc = await self._json(Req("GET", "/v1/nodes"))
        return [Node.from_json(d) for d in _core.items_from(doc, "nodes")]

    async def put_network_rule(self, name: str, *, hosts: Optional[Sequence[str]] = None,
                               cidrs: Optional[Sequence[str]] = None, ports: Optional[Sequence[int]] = None,
                               protocols: Optional[Sequence[str]] = None) -> Dict[str, Any]:
        """Create or replace a named network rule (see Client.put_network_rule)."""
        return dict(await self._json(_core.network_rule_req(name, hosts, cidrs, ports, protocols)))

    async def network_rules(self) -> List[Dict[str, Any]]:
        """The cluster's named network rules."""
        return list((await self._json(Req("GET", "/v1/network-rules")))["rules"])

    async def network_rule(self, name: str) -> Dict[str, Any]:
        """One named network rule."""
        return dict(await self._json(Req("GET", "/v1/network-rules/" + _core.quote(name, safe=""))))

    async def delete_network_rule(self, name: str) -> Dict[str, Any]:
        """Delete a named network rule (root admins only)."""
        return dict(await self._json(Req("DELETE", "/v1/network-rules/" + _core.quote(name, safe=""))))

    async def create_layer(self, name: str, *, tar: Optional[bytes] = None,
                           directory: Optional[PathLike] = None,
                           from_sandbox: Optional[str] = None,
                           version: Optional[int] = None) -> Layer:
        if directory is not None:
            if tar is not None:
                raise ValueError("warren: give one of tar= and directory=")
            tar, _ = pack_dir(directory)
        return Layer.from_json(await self._json(_core.create_layer_req(
            name, tar=tar, from_sandbox=from_sandbox, version=version)))

    async def layers(self, name: Optional[str] = None) -> List[Layer]:
        doc = await self._json(_core.layers_req(name))
        return [Layer.from_json(d) for d in _core.items_from(doc, "layers")]

    async def layer(self, ref: str) -> Layer:
        return Layer.from_json(await self._json(Req("GET", _core.layer_path(ref))))

    async def delete_layer(self, ref: str) -> List[Layer]:
        doc = await self._json(Req("DELETE", _core.layer_path(ref)))
        return [Layer.from_json(d) for d in _core.items_from(doc, "layers")]

    async def delete_snapshot(self, snapshot_id: str) -> None:
        """Remove a snapshot and its layer (see Client.delete_snapshot)."""
        await self._json(Req("DELETE", "/v1/snapshots/" + _core.q(snapshot_id)))

    async def list_snapshots(self, sandbox: Optional[str] = None) -> List[Snapshot]:
        """See Client.list_snapshots."""
        params = [("sandbox", sandbox)] if sandbox else []
        doc = await self._json(Req("GET", "/v1/snapshots", params=params))
        return [Snapshot.from_json(d) for d in _core.items_from(doc, "snapshots")]

    async def list_trajectories(self) -> List[Dict[str, Any]]:
        """See Client.list_trajectories."""
        return list(_core.items_from(await self._json(Req("GET", "/v1/trajectories")), "trajectories"))

    async def delete_trajectory(self, trajectory: str, *, project: Optional[str] = None) -> None:
        """See Client.delete_trajectory."""
        params = [("project", project)] if project else []
        await self._json(Req("DELETE", _core.trajectory_path(trajectory), params=params))

    async def gc_layers(self) -> Dict[str, Any]:
        return await self._json(Req("POST", "/v1/layers:gc"))

    async def pull_image(self, ref: str, name: Optional[str] = None) -> Image:
        return Image.from_json(await self._json(_core.pull_req(ref, name)))

    async def import_image(self, name: str, archive: Union[bytes, PathLike]) -> Image:
        if not isinstance(archive, (bytes, bytearray)):
            with open(archive, "rb") as f:
                archive = f.read()
        return Image.from_json(await self._json(_core.import_image_req(name, bytes(archive))))

    async def import_disk(self, name: str, path: PathLike, fmt: Optional[str] = None) -> Image:
        fmt = _core.disk_format(str(path), fmt)
        with open(path, "rb") as f:
            disk = f.read()
        return Image.from_json(await self._json(_core.import_disk_req(name, disk, fmt)))

    async def commit_image(self, name: str, *, base: Optional[str] = None,
                           layers: Optional[List[str]] = None,
                           config: Optional[Dict[str, Any]] = None) -> Image:
        return Image.from_json(await self._json(_core.commit_image_req(name, base, layers, config)))

    # ---- cluster: events, projects, tokens ----------------------------------------------

    async def events(self, after: int = 0, limit: Optional[int] = None,
                     wait: Optional[float] = None) -> Dict[str, Any]:
        """Cluster events after sequence ``after`` (``{"events": [...], "next": n}``);
        pass ``next`` as the following call's ``after``."""
        return await self._json(_core.events_req(after, limit, wait))

    async def follow_events(self, after: int = 0, *, limit: Optional[int] = None,
                            reconnect: bool = True) -> AsyncIterator[Dict[str, Any]]:
        """Yield cluster events as they happen; see :meth:`warren.Client.follow_events`.
        Use as ``async for ev in client.follow_events(): ...``."""
        f = _core.EventFollower(after, limit)
        while not f.done:
            s = None
            try:
                s = await self._t.open(_core.follow_req(f.after))
                async for line in s.lines():
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
            finally:
                if s is not None:
                    await s.aclose()
            await asyncio.sleep(f.backoff())

    async def create_project(self, name: str, *, parent: Optional[str] = None,
                             quota: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
        """Create a subproject (default under the token's project); see
        :meth:`warren.Client.create_project`."""
        return await self._json(json_req("POST", "/v1/projects",
                                         _core.project_body(name, parent, quota)))

    async def projects(self) -> List[Dict[str, Any]]:
        """Projects this token reaches, with their usage."""
        return list((await self._json(Req("GET", "/v1/projects"))).get("projects") or [])

    async def project(self, project_id: str) -> Dict[str, Any]:
        return await self._json(Req("GET", _core.project_path(project_id)))

    async def update_project(self, project_id: str, quota: Mapping[str, Any]) -> Dict[str, Any]:
        """Set a project's quota (needs the admin role in a project above it)."""
        return await self._json(json_req("PATCH", _core.project_path(project_id),
                                         {"quota": dict(quota)}))

    async def delete_project(self, project_id: str) -> None:
        await self._t.request(Req("DELETE", _core.project_path(project_id)))

    async def create_token(self, principal: str, *, project: Optional[str] = None,
                           role: Optional[str] = None,
                           expires_in: Optional[Duration] = None) -> Dict[str, Any]:
        """Issue a token; its secret (``["token"]``) is shown only in this answer."""
        return await self._json(json_req("POST", "/v1/tokens",
                                         _core.token_body(principal, project, role, expires_in)))

    async def tokens(self) -> List[Dict[str, Any]]:
        """Tokens this token manages (never their secrets)."""
        return list((await self._json(Req("GET", "/v1/tokens"))).get("tokens") or [])

    async def revoke_token(self, token_id: str) -> None:
        await self._t.request(Req("DELETE", _core.token_path(token_id)))

    async def create_batch(self, count: int, *, ids_only: bool = False,
                           **spec: Any) -> Dict[str, Any]:
        """Create ``count`` sandboxes of one spec in one call (``POST /v1/sandboxes:batch``)."""
        return await self._json(json_req("POST", "/v1/sandboxes:batch",
                                         _core.batch_body(count, ids_only, spec)))

    def create(self, image: Optional[str] = None, *, tier: Optional[str] = None,
               layers: Optional[Sequence[Any]] = None, cpu: Optional[Number] = None,
               memory_mb: Optional[int] = None, disk_mb: Optional[int] = None,
               pids: Optional[int] = None, ttl: Optional[Duration] = None,
               idle_timeout: Optional[Duration] = None, env: Optional[Mapping[str, str]] = None,
               labels: Optional[Mapping[str, str]] = None, priority: Optional[Any] = None,
               trajectory: Optional[str] = None, user: Optional[str] = None,
               hostname: Optional[str] = None, network: Optional[Any] = None,
               idempotency_key: Optional[str] = None, wait: bool = True,
               wait_timeout: float = 300.0, **extra: Any) -> "_Creating":
        """Create a sandbox; see :meth:`warren.Client.create`.

        Await it (``sb = await client.create(...)``) or use it directly as an
        async context manager that stops the sandbox on exit
        (``async with client.create(...) as sb:``).
        """
        body = _core.create_body(tier=tier, image=image, layers=layers, cpu=cpu,
                                 memory_mb=memory_mb, disk_mb=disk_mb, pids=pids, ttl=ttl,
                                 idle_timeout=idle_timeout, env=env, labels=labels,
                                 priority=priority, trajectory=trajectory, user=user,
                                 hostname=hostname, network=network, extra=extra)
        return _Creating(self._create(body, idempotency_key, wait, wait_timeout))

    async def _create(self, body: Dict[str, Any], key: Optional[str], wait: bool,
                      wait_timeout: float) -> "AsyncSandbox":
        info = SandboxInfo.from_json(await self._json(_core.create_req(body, key)))
        sb = AsyncSandbox(self, info)
        if wait:
            await sb.wait_running(wait_timeout)
        return sb

    async def terminal(self, sandbox_id: str, cmd: Optional[Command] = None, *,
                       cols: Optional[int] = None, rows: Optional[int] = None, tty: bool = True,
                       user: Optional[str] = None, cwd: Optional[str] = None,
                       env: Optional[Mapping[str, str]] = None,
                       timeout: Optional[Duration] = None) -> AsyncTerminal:
        """An interactive terminal in a sandbox; see :meth:`warren.Client.terminal`."""
        path = sandbox_path(sandbox_id, "pty") + "?" + terminal_query(
            cmd, cols, rows, tty, user, cwd, env, _core.seconds(timeout))
        ws = await AsyncWebSocket.connect(self._cfg, path, ssl_context=self._ssl)
        return AsyncTerminal(ws, tty=tty)

    async def get(self, sandbox_id: str) -> "AsyncSandbox":
        doc = await self._json(Req("GET", sandbox_path(sandbox_id)))
        return AsyncSandbox(self, SandboxInfo.from_json(doc))

    def sandbox(self, sandbox_id: str) -> "AsyncSandbox":
        """A handle by id without asking the server (no I/O)."""
        return AsyncSandbox(self, SandboxInfo(id=sandbox_id))

    async def list(self, labels: Optional[Mapping[str, str]] = None,
                   state: Optional[str] = None) -> List["AsyncSandbox"]:
        doc = await self._json(_core.list_req(labels, state))
        return [AsyncSandbox(self, SandboxInfo.from_json(d)) for d in _core.sandboxes_from(doc)]

    async def create_many(self, n: int, *, concurrency: Optional[int] = 64,
                          **spec: Any) -> List["AsyncSandbox"]:
        """Create ``n`` sandboxes concurrently (at most ``concurrency`` at a time).
        If any fails, the others are stopped and the first error is raised."""
        if n <= 0:
            return []
        spec.pop("idempotency_key", None)
        res = await _bounded([lambda: self.create(**spec) for _ in range(n)], concurrency, True)
        made = [r for r in res if isinstance(r, AsyncSandbox)]
        errs = [r for r in res if isinstance(r, BaseException)]
        if errs:
            await asyncio.gather(*(sb.stop() for sb in made), return_exceptions=True)
            raise errs[0]
        return made

    async def run_many(self, sandboxes: Iterable[Union["AsyncSandbox", str]], cmd: Command, *,
                       concurrency: Optional[int] = None, return_exceptions: bool = False,
                       **kwargs: Any) -> List[Any]:
        """Run ``cmd`` in every sandbox concurrently; results in order."""
        sbs = [self.sandbox(s) if isinstance(s, str) else s for s in sandboxes]
        return await _bounded([(lambda sb=sb: sb.run(cmd, **kwargs)) for sb in sbs],
                              concurrency, return_exceptions)

    async def pause_matching(self, label: Optional[str] = None,
                             labels: Optional[Mapping[str, str]] = None) -> Dict[str, Any]:
        """Pause every sandbox whose labels match (``POST /v1/sandboxes:pause``)."""
        body = _core.drop_none({"label": label, "labels": dict(labels) if labels else None})
        return await self._json(json_req("POST", "/v1/sandboxes:pause", body))

    async def resume_matching(self, label: Optional[str] = None,
                              labels: Optional[Mapping[str, str]] = None) -> Dict[str, Any]:
        """Resume every paused sandbox whose labels match (``POST /v1/sandboxes:resume``)."""
        body = _core.drop_none({"label": label, "labels": dict(labels) if labels else None})
        return await self._json(json_req("POST", "/v1/sandboxes:resume", body))

    async def fncall(self, cmd: Command, *, image: Optional[str] = None,
                     timeout: Optional[Duration] = None, env: Optional[Mapping[str, str]] = None,
                     stdin: Optional[Union[str, bytes]] = None,
                     files: Optional[Mapping[str, Union[str, bytes]]] = None,
                     cpu: Optional[Number] = None, memory_mb: Optional[int] = None,
                     **extra: Any) -> ExecResult:
        """See :meth:`warren.Client.fncall`."""
        body = _core.fncall_body(cmd, image=image, timeout=timeout, env=env, stdin=stdin,
                                 files=files, cpu=cpu, memory_mb=memory_mb, extra=extra)
        req = json_req("POST", "/v1/fncall", body,
                       timeout=_core.exec_read_timeout(self._cfg, timeout))
        return ExecResult.from_json(await self._json(req))

    async def trajectory(self, trajectory_id: str, path: Optional[str] = None, *,
                         project: Optional[str] = None) -> Trajectory:
        """Every recorded step of a trajectory, page by page (see Client.trajectory)."""
        steps: List[Dict[str, Any]] = []
        after = 0
        while True:
            params = [("after", str(after))] + ([("path", path)] if path else [])
            if project:
                params.append(("project", project))
            doc = await self._json(Req("GET", _core.trajectory_path(trajectory_id), params=params))
            t = Trajectory.from_json(doc)
            steps.extend(t.steps)
            nxt = doc.get("next") if isinstance(doc, dict) else None
            if not nxt:
                t.steps = steps
                return t
            after = int(nxt)

    async def trajectory_audit_summary(self, trajectory_id: str, *,
                                       project: Optional[str] = None) -> Dict[str, Any]:
        """See :meth:`warren.Client.trajectory_audit_summary`."""
        params = [("audit", "summary")] + ([("project", project)] if project else [])
        return dict(await self._json(Req("GET", _core.trajectory_path(trajectory_id), params=params)))

    async def replay_trajectory(self, trajectory: str, *, keep: bool = False, project: Optional[str] = None,
                                masks: Optional[Sequence[str]] = None,
                                ignore: Optional[Sequence[str]] = None,
                                timeout: Optional[Duration] = 3600) -> ReplayReport:
        """Re-execute a trajectory's log and report the steps that differ (see
        Client.replay_trajectory)."""
        body: Dict[str, Any] = {"trajectory": trajectory}
        if keep:
            body["keep"] = True
        if project:
            body["project"] = project
        if masks:
            body["masks"] = list(masks)
        if ignore:
            body["ignore"] = list(ignore)
        return ReplayReport.from_json(await self._json(json_req(
            "POST", "/v1/trajectories:replay", body, timeout=_core.seconds(timeout))))

    async def resume(self, trajectory: str, *, branch: bool = False) -> "AsyncSandbox":
        """Re-attach to a trajectory after a restart (see Client.resume)."""
        body: Dict[str, Any] = {"trajectory": trajectory, "resume": True}
        if branch:
            body["branch"] = True
        doc = await self._json(json_req("POST", "/v1/sandboxes", body))
        return AsyncSandbox(self, SandboxInfo.from_json(doc))


class _Creating:
    """What :meth:`AsyncClient.create` returns: awaitable, or an async context manager."""

    def __init__(self, coro: Awaitable["AsyncSandbox"]) -> None:
        self._coro = coro
        self._sb: Optional[AsyncSandbox] = None

    def __await__(self) -> Generator[Any, None, "AsyncSandbox"]:
        return self._coro.__await__()  # type: ignore[attr-defined]

    async def __aenter__(self) -> "AsyncSandbox":
        self._sb = await self._coro
        return self._sb

    async def __aexit__(self, *exc: object) -> None:
        if self._sb is not None:
            await self._sb.__aexit__(*exc)


class AsyncPools:
    """Warm pools (``/v1/pools``)."""

    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    async def create(self, name: str, *, image: Optional[str] = None, size: Optional[int] = None,
                     tier: Optional[str] = None, **spec: Any) -> Pool:
        body = _core.drop_none({"name": name, "image": image, "size": size, "tier": tier})
        body.update(_core.drop_none(spec))
        return Pool.from_json(await self._c._json(json_req("POST", "/v1/pools", body)))

    async def list(self) -> List[Pool]:
        doc = await self._c._json(Req("GET", "/v1/pools"))
        return [Pool.from_json(d) for d in _core.items_from(doc, "pools")]

    async def get(self, name: str) -> Pool:
        return Pool.from_json(await self._c._json(Req("GET", "/v1/pools/" + _core.q(name))))

    async def delete(self, name: str) -> None:
        await self._c._t.request(Req("DELETE", "/v1/pools/" + _core.q(name)))


class AsyncSandbox:
    """The asyncio twin of :class:`warren.Sandbox`."""

    def __init__(self, client: AsyncClient, info: SandboxInfo) -> None:
        self.client = client
        self.info = info
        self._files: Optional[AsyncFiles] = None

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
        return "AsyncSandbox(id=%r, state=%r)" % (self.info.id, self.info.state)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AsyncSandbox) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)

    async def __aenter__(self) -> "AsyncSandbox":
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            await self.stop()
        except (NotFound, Conflict):
            pass

    def _path(self, *rest: str) -> str:
        return sandbox_path(self.id, *rest)

    def _set(self, doc: Any) -> "AsyncSandbox":
        if isinstance(doc, dict) and doc.get("id"):
            self.info = SandboxInfo.from_json(doc)
        return self

    async def terminal(self, cmd: Optional[Command] = None, **kw: Any) -> AsyncTerminal:
        """An interactive terminal in this sandbox; see :meth:`AsyncClient.terminal`."""
        return await self.client.terminal(self.id, cmd, **kw)

    async def refresh(self) -> "AsyncSandbox":
        return self._set(await self.client._json(Req("GET", self._path())))

    async def wait_running(self, timeout: float = 300.0) -> "AsyncSandbox":
        deadline = time.monotonic() + timeout
        delay = 0.02
        while self.info.state == "creating":
            if time.monotonic() > deadline:
                raise Timeout("warren: sandbox %s still creating after %.0fs" % (self.id, timeout))
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.5)
            await self.refresh()
        if self.info.state == "failed":
            raise SandboxFailed(self.info.reason or "sandbox failed", code="sandbox_failed",
                                sandbox_id=self.id)
        return self

    async def stop(self) -> "AsyncSandbox":
        return self._set(await self.client._json(Req("DELETE", self._path())))

    async def pause(self) -> "AsyncSandbox":
        return self._set(await self.client._json(json_req("POST", self._path("pause"))))

    async def resume(self, *, prefetch: bool = True) -> "AsyncSandbox":
        body = None if prefetch else {"prefetch": False}
        return self._set(await self.client._json(json_req("POST", self._path("resume"), body)))

    async def commands(self) -> List[Dict[str, Any]]:
        """The sandbox's recent commands, oldest first (see Sandbox.commands)."""
        return list((await self.client._json(json_req("GET", self._path("commands"))))["commands"])

    async def stats(self) -> Dict[str, Any]:
        """What the sandbox uses now (see Sandbox.stats)."""
        return dict(await self.client._json(json_req("GET", self._path("stats"))))

    async def network(self) -> Dict[str, Any]:
        """The sandbox's network and its refusals (see Sandbox.network)."""
        return dict(await self.client._json(json_req("GET", self._path("network"))))

    async def screenshot(self) -> bytes:
        """The screen as PNG bytes (see Sandbox.screenshot)."""
        return (await self.client._t.request(Req("GET", self._path("screenshot"), accept="image/png"))).body

    async def display_input(self, type: str, **fields: Any) -> None:
        """One keyboard or mouse event for the screen (see Sandbox.display_input)."""
        await self.client._t.request(json_req("POST", self._path("display", "input"), dict(fields, type=type)))

    async def set_network(self, egress: List[str]) -> Dict[str, Any]:
        """Replace the egress list (see Sandbox.set_network)."""
        return dict(await self.client._json(json_req("PUT", self._path("network"),
                                                     {"egress": list(egress)})))

    async def network_denials(self) -> List[Dict[str, Any]]:
        """What the sandbox's network refused (see Sandbox.network_denials)."""
        return list((await self.client._json(json_req("GET", self._path("network/denials"))))["denials"])

    # -- ports
    def url(self, port: int) -> str:
        """The URL of ``port`` inside the sandbox through the API (see Sandbox.url)."""
        return self.client.url + _core.port_path(self.id, port) + "/"

    async def expose(self, port: int) -> Dict[str, Any]:
        """Make ``port`` public (see Sandbox.expose)."""
        return dict(await self.client._json(json_req("POST", _core.port_path(self.id, port),
                                                     {"public": True})))

    async def unexpose(self, port: int) -> Dict[str, Any]:
        """Revoke ``port``'s public URL."""
        return dict(await self.client._json(json_req("DELETE", _core.port_path(self.id, port))))

    async def connect_port(self, port: int) -> Tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A raw TCP stream to ``port`` inside the sandbox, as asyncio streams
        (``writer.write_eof()`` is passed on as a half close). Raises
        :class:`BadGateway` when nothing listens there."""
        cfg = self.client._cfg
        ctx = None
        if cfg.scheme == "https":
            ctx = self.client._t._ssl or ssl.create_default_context()
        reader, writer = await asyncio.open_connection(cfg.host, cfg.port, ssl=ctx)
        try:
            writer.write(_core.port_upgrade_request(cfg, self.id, port))
            await writer.drain()
            head = await reader.readuntil(b"\r\n\r\n")
            n = _core.content_length(head)
            body = await reader.readexactly(n) if n else b""
            _core.port_upgrade_answer(head, body)
            return reader, writer
        except BaseException:
            writer.close()
            raise

    async def audit(self, step: Optional[int] = None, kind: Optional[str] = None,
              summary: bool = False) -> Dict[str, Any]:
        """What the sandbox's processes did (see Sandbox.audit)."""
        params = [(k, str(v)) for k, v in (("step", step), ("kind", kind)) if v is not None]
        if summary:
            params.append(("summary", "1"))
        return dict(await self.client._json(json_req("GET", self._path("audit"), params=params)))

    async def snapshot(self, name: Optional[str] = None, **extra: Any) -> Snapshot:
        body = _core.drop_none({"name": name})
        body.update(_core.drop_none(extra))
        doc = await self.client._json(json_req("POST", self._path("snapshots"), body))
        return Snapshot.from_json(doc)

    async def fork(self, n: int = 1, **extra: Any) -> List["AsyncSandbox"]:
        body: Dict[str, Any] = {"count": n}
        body.update(_core.drop_none(extra))
        doc = await self.client._json(json_req("POST", self._path("fork"), body))
        return [AsyncSandbox(self.client, SandboxInfo.from_json(d))
                for d in _core.sandboxes_from(doc)]

    async def run(self, cmd: Command, *, timeout: Optional[Duration] = None,
                  session: Optional[str] = None, env: Optional[Mapping[str, str]] = None,
                  cwd: Optional[str] = None, stdin: Optional[Union[str, bytes]] = None,
                  user: Optional[str] = None, output_cap: Optional[int] = None,
                  on_stdout: Optional[OutputCallback] = None,
                  on_stderr: Optional[OutputCallback] = None, background: bool = False,
                  check: bool = False, **extra: Any) -> Any:
        """See :meth:`warren.Sandbox.run`. Callbacks may be plain functions or coroutines.
        Returns :class:`ExecResult`, or :class:`AsyncBackgroundCommand` with ``background=True``."""
        body = _core.exec_body(cmd, session=session, env=env, cwd=cwd, stdin=stdin, user=user,
                               timeout=timeout, output_cap=output_cap, background=background,
                               extra=extra)
        read_timeout = _core.exec_read_timeout(self.client._cfg, timeout)
        if background:
            if on_stdout or on_stderr:
                raise ValueError("warren: output callbacks need a foreground command")
            doc = await self.client._json(_core.exec_req(self.id, body, False, read_timeout))
            cid = (doc.get("command_id") or doc.get("id")) if isinstance(doc, dict) else None
            if not cid:
                raise WarrenError("warren: server did not return a command id")
            return AsyncBackgroundCommand(self, cid)
        if on_stdout is None and on_stderr is None:
            res = ExecResult.from_json(await self.client._json(
                _core.exec_req(self.id, body, False, read_timeout)))
        else:
            res = await self._run_stream(body, read_timeout, on_stdout, on_stderr)
        if res.sandbox and res.sandbox != self.id:
            self.info = (await self.client.get(res.sandbox)).info  # a branch: continue there
        return res.check() if check else res

    async def _run_stream(self, body: Dict[str, Any], read_timeout: float,
                          on_stdout: Optional[OutputCallback],
                          on_stderr: Optional[OutputCallback]) -> ExecResult:
        s = await self.client._t.open(_core.exec_req(self.id, body, True, read_timeout))
        try:
            if "ndjson" not in s.headers.get("content-type", "").lower():
                res = ExecResult.from_json(_core.decode_json(await s.read()))
                if res.stdout:
                    await _call(on_stdout, res.stdout)
                if res.stderr:
                    await _call(on_stderr, res.stderr)
                return res
            dec = _core.ExecStream()
            async for line in s.lines():
                ev = dec.feed(line)
                if ev is not None:
                    await _call(on_stdout if ev[0] == "stdout" else on_stderr, ev[1])
            return dec.finish()
        finally:
            await s.aclose()

    def command(self, command_id: str) -> "AsyncBackgroundCommand":
        return AsyncBackgroundCommand(self, command_id)

    def session(self, name: Optional[str] = None) -> "AsyncSession":
        return AsyncSession(self, name or _core.new_idempotency_key().replace("warren-py-",
                                                                               "s-")[:14])

    @property
    def files(self) -> "AsyncFiles":
        if self._files is None:
            self._files = AsyncFiles(self)
        return self._files


class AsyncSession:
    """A persistent shell in a sandbox (asyncio)."""

    def __init__(self, sandbox: AsyncSandbox, name: str) -> None:
        self.sandbox = sandbox
        self.name = name

    def __repr__(self) -> str:
        return "AsyncSession(%r, sandbox=%r)" % (self.name, self.sandbox.id)

    async def __aenter__(self) -> "AsyncSession":
        return self

    async def __aexit__(self, *exc: object) -> None:
        pass

    async def run(self, cmd: Command, **kwargs: Any) -> Any:
        kwargs["session"] = self.name
        return await self.sandbox.run(cmd, **kwargs)

    @property
    def files(self) -> "AsyncFiles":
        return self.sandbox.files


class AsyncBackgroundCommand:
    """A background command (asyncio)."""

    def __init__(self, sandbox: AsyncSandbox, command_id: str) -> None:
        self.sandbox = sandbox
        self.id = command_id
        self.status: Optional[CommandStatus] = None

    def __repr__(self) -> str:
        return "AsyncBackgroundCommand(%r, sandbox=%r)" % (self.id, self.sandbox.id)

    def _path(self, *rest: str) -> str:
        return self.sandbox._path("commands", _core.q(self.id), *rest)

    def _set(self, doc: Any) -> CommandStatus:
        self.status = CommandStatus.from_json(doc if isinstance(doc, dict) else {})
        if not self.status.id:
            self.status.id = self.id
        return self.status

    async def refresh(self) -> CommandStatus:
        return self._set(await self.sandbox.client._json(Req("GET", self._path())))

    async def wait(self, timeout: Optional[float] = None) -> ExecResult:
        deadline = None if timeout is None else time.monotonic() + timeout
        cfg = self.sandbox.client._cfg
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise Timeout("warren: command %s still running after %.1fs" % (self.id, timeout))
            rt = max(cfg.timeout, 630.0) if left is None else max(0.1, left)
            try:
                st = self._set(await self.sandbox.client._json(
                    Req("GET", self._path(), params=[("wait", "1")], timeout=rt)))
            except Timeout:
                continue  # the long poll ran out; the deadline check above decides
            if not st.running:
                return st.result()

    async def kill(self, signal: int = 9) -> CommandStatus:
        return self._set(await self.sandbox.client._json(
            json_req("POST", self._path("kill"), {"signal": signal})))


class AsyncFiles:
    """File operations inside a sandbox (asyncio)."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self.sandbox = sandbox

    def _c(self) -> AsyncClient:
        return self.sandbox.client

    def _fpath(self) -> str:
        return self.sandbox._path("files")

    async def read(self, path: str) -> bytes:
        return (await self._c()._t.request(Req("GET", self._fpath(),
                                               params=_core.file_params(path),
                                               accept="application/octet-stream"))).body

    async def read_text(self, path: str, encoding: str = "utf-8") -> str:
        return (await self.read(path)).decode(encoding)

    async def write(self, path: str, data: Union[bytes, bytearray, memoryview, str],
                    mode: Optional[int] = None) -> FileInfo:
        if isinstance(data, str):
            data = data.encode("utf-8")
        req = Req("PUT", self._fpath(), params=_core.file_params(path, mode=_core.mode_str(mode)),
                  body=bytes(data), content_type="application/octet-stream")
        return FileInfo.from_json((await self._c()._t.request(req)).json())

    async def list(self, path: str = "/") -> List[FileInfo]:
        doc = await self._c()._json(Req("GET", self._fpath(),
                                        params=_core.file_params(path, list=True)))
        return [FileInfo.from_json(d) for d in _core.items_from(doc, "files")]

    async def stat(self, path: str) -> FileInfo:
        return FileInfo.from_json(await self._c()._json(
            Req("GET", self._fpath(), params=_core.file_params(path, stat=True))))

    async def exists(self, path: str) -> bool:
        try:
            await self.stat(path)
            return True
        except NotFound:
            return False

    async def remove(self, path: str, recursive: bool = False) -> None:
        await self._c()._t.request(Req("DELETE", self._fpath(),
                                       params=_core.file_params(path, recursive=recursive)))

    async def mkdir(self, path: str, mode: Optional[int] = None, parents: bool = True) -> FileInfo:
        body = _core.drop_none({"path": path, "mode": mode, "parents": parents})
        return FileInfo.from_json(await self._c()._json(
            json_req("POST", self.sandbox._path("files", "mkdir"), body)))

    async def rename(self, src: str, dst: str) -> None:
        await self._c()._t.request(json_req("POST", self.sandbox._path("files", "rename"),
                                            {"from": src, "to": dst}))

    async def upload_tar(self, remote_dir: str, tar: bytes) -> int:
        req = Req("PUT", self.sandbox._path("archive"), params=_core.file_params(remote_dir),
                  body=tar, content_type="application/x-tar",
                  timeout=max(self._c()._cfg.timeout, 300.0))
        doc = (await self._c()._t.request(req)).json()
        return int(doc.get("files", 0)) if isinstance(doc, dict) else 0

    async def download_tar(self, remote_dir: str) -> bytes:
        return (await self._c()._t.request(Req("GET", self.sandbox._path("archive"),
                                               params=_core.file_params(remote_dir),
                                               accept="application/x-tar",
                                               timeout=max(self._c()._cfg.timeout, 300.0)))).body

    async def upload_dir(self, local_dir: PathLike, remote_dir: str) -> int:
        tar, _ = pack_dir(local_dir)
        return await self.upload_tar(remote_dir, tar)

    async def download_dir(self, remote_dir: str, local_dir: PathLike) -> int:
        return unpack(await self.download_tar(remote_dir), local_dir)
