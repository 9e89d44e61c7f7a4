"""warren: Python SDK for the warren sandbox platform (standard library only).

Quick start::

    import warren

    client = warren.Client()            # $WARREN_URL, $WARREN_TOKEN
    with client.create(image="busybox", cpu=1, memory_mb=256) as sb:
        r = sb.run("echo hello")
        print(r.exit_code, r.stdout)
        sb.files.write("/tmp/a.txt", b"data")

asyncio::

    async with warren.AsyncClient() as client:
        sb = await client.create(image="busybox")
        r = await sb.run("echo hello")
        await sb.stop()

See docs/python.md for the whole surface.
"""

from ._version import __version__
from .aio import (AsyncBackgroundCommand, AsyncClient, AsyncFiles, AsyncPools, AsyncSandbox,
                  AsyncSession)
from .client import BackgroundCommand, Client, Files, Pools, Sandbox, Session
from ._ws import AsyncTerminal, Terminal, WebSocketClosed
from .errors import (BadGateway, BadRequest, CommandFailed, Conflict, ConnectionFailed, Forbidden, NotFound,
                     QuotaExceeded, SandboxFailed, ServerError, Timeout, TooLarge, Unauthorized,
                     Unavailable, WarrenError)
from .models import (CommandStatus, ExecResult, FileInfo, Image, Layer, Node, Pool, SandboxInfo,
                     ReplayReport, Snapshot, Trajectory)

__all__ = [
    "__version__",
    # clients and handles
    "Client", "Sandbox", "Session", "Files", "BackgroundCommand", "Pools", "Terminal",
    "AsyncClient", "AsyncSandbox", "AsyncSession", "AsyncFiles", "AsyncBackgroundCommand",
    "AsyncPools", "AsyncTerminal",
    # data
    "SandboxInfo", "ExecResult", "CommandStatus", "FileInfo", "Image", "Layer", "Node", "Snapshot",
    "Pool", "Trajectory", "ReplayReport",
    # errors
    "WarrenError", "BadRequest", "TooLarge", "Unauthorized", "Forbidden", "NotFound",
    "Conflict", "QuotaExceeded", "Timeout", "SandboxFailed", "ServerError", "Unavailable",
    "ConnectionFailed", "CommandFailed", "WebSocketClosed", "BadGateway",
]
