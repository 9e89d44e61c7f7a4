"""Typed errors raised by the warren SDK.

Every error the server sends has the shape ``{"error": {"code", "message"}}``;
the SDK turns it into one of the classes below, keeping the server's code,
message and HTTP status::

    try:
        client.get("sb-node-nope")
    except warren.NotFound as e:
        print(e.code, e.status, e.message)

All classes derive from :class:`WarrenError`, so ``except warren.WarrenError``
catches everything the SDK raises on purpose.
"""

from typing import Any, Dict, Optional, Type

__all__ = [
    "WarrenError",
    "BadRequest",
    "TooLarge",
    "Unauthorized",
    "Forbidden",
    "NotFound",
    "Conflict",
    "QuotaExceeded",
    "Timeout",
    "SandboxFailed",
    "ServerError",
    "Unavailable",
    "ConnectionFailed",
    "CommandFailed",
]


class WarrenError(Exception):
    """Base class of every error raised by the SDK.

    Attributes:
        message: the server's message (or the SDK's, for client-side errors).
        code: the server's error code (``not_found``, ``invalid``, ...), or
            ``None`` for errors detected on the client side.
        status: the HTTP status, or ``None`` when no response was received.
        reason: on a 503, what is short (``cpu``, ``memory``,
            ``memory_pressure``, ``disk``, ``pids``, ``sandboxes``) or why no
            node qualifies (``tier``, ``node_selector``, ``no_nodes``,
            ``shutting_down``, ``network_group``); otherwise ``None``.
    """

    def __init__(self, message: str, code: Optional[str] = None,
                 status: Optional[int] = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.status = status
        # On a 409 from a resumed trajectory: {"step", "logged", "received"}.
        self.divergence: Optional[Dict[str, Any]] = None
        self.reason: Optional[str] = None

    def __str__(self) -> str:
        if self.code:
            return "%s: %s" % (self.code, self.message)
        return self.message

    def __repr__(self) -> str:
        return "%s(message=%r, code=%r, status=%r)" % (
            type(self).__name__, self.message, self.code, self.status)


class BadRequest(WarrenError):
    """The request was malformed or invalid (HTTP 400 ``bad_request``, 422 ``invalid``)."""


class TooLarge(BadRequest):
    """A body or value exceeded a server limit (HTTP 413 ``too_large``)."""


class Unauthorized(WarrenError):
    """The token is missing or wrong (HTTP 401)."""


class Forbidden(WarrenError):
    """The token may not perform this operation (HTTP 403)."""


class NotFound(WarrenError):
    """The sandbox, file, command or route does not exist (HTTP 404).

    Features that a server does not offer yet also answer ``NotFound``.
    """


class Conflict(WarrenError):
    """The operation conflicts with the resource's state (HTTP 409),
    e.g. running a command in a stopped sandbox."""


class QuotaExceeded(WarrenError):
    """A quota or rate limit was hit (HTTP 429 ``too_many_requests``, or
    ``quota_exceeded``) and did not clear within the SDK's retries."""


class Timeout(WarrenError):
    """The server (HTTP 504) or the SDK's own socket timeout gave up waiting."""


class SandboxFailed(WarrenError):
    """A sandbox ended in state ``failed`` (its ``reason`` is the message).

    Attributes:
        sandbox_id: the id of the failed sandbox, when known.
    """

    def __init__(self, message: str, code: Optional[str] = None,
                 status: Optional[int] = None, sandbox_id: Optional[str] = None) -> None:
        super().__init__(message, code, status)
        self.sandbox_id = sandbox_id


class ServerError(WarrenError):
    """The server failed (HTTP 500 and other 5xx)."""


class Unavailable(ServerError):
    """The server or a node is unavailable (HTTP 503) and stayed so within the SDK's retries."""


class BadGateway(ServerError):
    """Nothing answered on a sandbox's port (HTTP 502 ``bad_gateway``): no
    server listens there, or its answer broke."""


class ConnectionFailed(ServerError):
    """No answer could be obtained from the server (refused, reset, DNS ...)."""


class CommandFailed(WarrenError):
    """Raised by :meth:`ExecResult.check` (and ``run(..., check=True)``) when a
    command exited non-zero or timed out.

    Attributes:
        result: the :class:`~warren.ExecResult`.
    """

    def __init__(self, message: str, result: Any) -> None:
        super().__init__(message, code="command_failed")
        self.result = result


_BY_CODE: Dict[str, Type[WarrenError]] = {
    "bad_request": BadRequest,
    "invalid": BadRequest,
    "too_large": TooLarge,
    "unauthorized": Unauthorized,
    "forbidden": Forbidden,
    "not_found": NotFound,
    "conflict": Conflict,
    "too_many_requests": QuotaExceeded,
    "quota_exceeded": QuotaExceeded,
    "timeout": Timeout,
    "sandbox_failed": SandboxFailed,
    "internal": ServerError,
    "unavailable": Unavailable,
    "bad_gateway": BadGateway,
}

_BY_STATUS: Dict[int, Type[WarrenError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    405: NotFound,
    409: Conflict,
    413: TooLarge,
    422: BadRequest,
    429: QuotaExceeded,
    500: ServerError,
    502: Unavailable,
    503: Unavailable,
    504: Timeout,
}


def error_for(code: Optional[str], message: str, status: Optional[int] = None) -> WarrenError:
    """Build the typed error for a server error code and/or HTTP status."""
    cls: Optional[Type[WarrenError]] = _BY_CODE.get(code or "")
    if cls is None and status is not None:
        cls = _BY_STATUS.get(status)
        if cls is None:
            cls = ServerError if status >= 500 else BadRequest if status >= 400 else WarrenError
    if cls is None:
        cls = WarrenError
    return cls(message, code=code, status=status)


def error_from_body(status: int, body: bytes, reason: str = "") -> WarrenError:
    """Decode an error answer ``{"error":{"code","message"}}`` into a typed error.

    Bodies that are not in that shape (a proxy's HTML page, say) still give an
    error typed by the HTTP status, with the body text as the message.
    """
    import json

    code: Optional[str] = None
    message = ""
    extra: Dict[str, Any] = {}
    try:
        doc = json.loads(body.decode("utf-8")) if body else None
    except (ValueError, UnicodeDecodeError):
        doc = None
    if isinstance(doc, dict) and isinstance(doc.get("error"), dict):
        err = doc["error"]
        code = err.get("code") if isinstance(err.get("code"), str) else None
        message = str(err.get("message") or "")
        extra = err
    elif isinstance(doc, dict) and isinstance(doc.get("error"), str):
        message = doc["error"]
    if not message:
        text = body.decode("utf-8", "replace").strip() if body else ""
        message = text[:500] or reason or ("HTTP %d" % status)
    e = error_for(code, message, status)
    if isinstance(extra.get("divergence"), dict):
        e.divergence = extra["divergence"]
    if isinstance(extra.get("reason"), str):
        e.reason = extra["reason"]
    return e
