"""What the client raises: :class:`ApiError` and one subclass per kind of refusal or failure."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = [
    "ApiError",
    "BadRequest",
    "BufferFull",
    "Conflict",
    "ConnectionFailed",
    "DeliveryUnknown",
    "NotFound",
    "ServerError",
    "Unauthorized",
    "Unavailable",
    "error_class",
    "error_from_answer",
]


class ApiError(Exception):
    """An answer the API refused, or no answer at all.

    ``status`` is the HTTP status (0 when no node answered), ``code`` the API's stable error code
    (``queue_not_found``, ``receipt_mismatch``, ``body_too_large``, ``unavailable`` ...), ``detail``
    what is wrong, for people (a string, or the field errors of a queue call), and ``payload`` the
    whole JSON answer.
    """

    #: set by :meth:`Client.enqueue_many` only: the IDs of the batches stored before the failing one
    ids: list[str]

    def __init__(
        self,
        status: int,
        code: str,
        detail: Any = None,
        payload: Mapping[str, Any] | None = None,
        url: str | None = None,
    ) -> None:
        self.status = status
        self.code = code
        self.detail = detail
        self.payload: dict[str, Any] = dict(payload or {})
        self.url = url
        super().__init__(f"{status} {code}: {detail}" if detail is not None else f"{status} {code}")


class BadRequest(ApiError):
    """400 (or 413, 415...): the call was wrong and changed nothing. ``code`` says what was wrong."""


class Unauthorized(ApiError):
    """401 or 403: no token, a bad token, or a call this token may not make."""


class NotFound(ApiError):
    """404: no such queue (``code == "queue_not_found"``) or no such path."""


class Conflict(ApiError):
    """409: a stale receipt (``code == "receipt_mismatch"``): the message was delivered again
    since, to someone else. ``message_id`` names it. Nothing of that call was removed on that node."""

    @property
    def message_id(self) -> str | None:
        mid: str | None = self.payload.get("id")
        return mid


class Unavailable(ApiError):
    """503 after all retries: no node served the partition (a takeover in progress, the store
    unreachable). Retrying later is the right thing to do."""


class ServerError(ApiError):
    """Another 5xx after all retries: a bug on the server (see the node's log)."""


class ConnectionFailed(Unavailable):
    """No node could be reached (refused, reset, timed out) after all retries; ``status`` is 0."""


class DeliveryUnknown(Exception):
    """A buffered message whose call may have stored it: no answer came (the connection was lost
    after the request was sent, a timeout) or the nodes answered 5xx after all retries. It is
    neither sent nor failed for sure.

    ``dedup_id`` is the message's (given by the application, or by the producer with
    ``dedup_ids=True``; else None): send it again with that ``dedup_id`` and the queue stores it
    once, as long as the retry comes within the queue's ``dedup_window`` (300 s by default) of
    the first try; after that a retry may store it twice. Without one, a retry may store it twice. ``message`` is the message's JSON object, ``cause`` the client's last error.
    """

    def __init__(self, queue: str, message: Mapping[str, Any], cause: BaseException) -> None:
        self.queue = queue
        self.message: dict[str, Any] = dict(message)
        self.dedup_id: str | None = self.message.get("dedup_id")
        self.cause = cause
        super().__init__(f"{queue}: delivery unknown (dedup_id {self.dedup_id}): {cause}")


class BufferFull(Exception):
    """A buffered producer holds its ``max_buffered`` messages: the caller is ahead of the service."""


def error_class(status: int) -> type[ApiError]:
    """The exception class of an HTTP status of 400 and above (408 and 429 are
    :class:`Unavailable`: nothing wrong with the call, a later try may do)."""
    if status == 404:
        return NotFound
    if status == 409:
        return Conflict
    if status in (401, 403):
        return Unauthorized
    if status in (408, 429, 503):
        return Unavailable
    if status >= 500:
        return ServerError
    if 400 <= status < 500:
        return BadRequest
    return ApiError


def error_from_answer(status: int, body: Mapping[str, Any], url: str | None) -> ApiError:
    """The typed error of a refused call: the API's ``{"error": code, "detail": ...}`` answer."""
    return error_class(status)(status, str(body.get("error") or f"http_{status}"), body.get("detail"), body, url=url)
