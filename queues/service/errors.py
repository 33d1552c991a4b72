"""The exceptions the service layer raises. The API maps each to one status in one place
(``queues.api.errors``); other entrances (admin, tasks, the archive) catch them by type."""

from __future__ import annotations

from ..node import QueueNotFound, SubscriptionNotFound
from ..partition import NotServedHere, PartitionUnavailable, ReceiptMismatch
from .peers import PeerUnreachable, RemoteError

__all__ = [
    "Conflict",
    "InvalidRequest",
    "NotServedHere",
    "PartitionUnavailable",
    "PeerUnreachable",
    "QueueNotFound",
    "ReceiptMismatch",
    "RemoteError",
    "SubscriptionNotFound",
    "TooManyWaits",
]


class InvalidRequest(Exception):
    """The call asks for something the queue's rules refuse (400): nothing was changed.
    ``code`` is a stable identifier clients can test."""

    def __init__(self, detail: str, code: str = "invalid"):
        super().__init__(detail)
        self.detail = detail
        self.code = code


class Conflict(Exception):
    """The call does not fit the current state (409), e.g. a partition no live node holds."""

    def __init__(self, detail: str, code: str):
        super().__init__(detail)
        self.detail = detail
        self.code = code


class TooManyWaits(Exception):
    """A long poll past the node's cap on concurrent waits (429 with Retry-After): nothing was
    dequeued. Each waiting poll holds a request thread, so one user must not hold them all."""

    def __init__(self, detail: str, retry_after: int = 1):
        super().__init__(detail)
        self.detail = detail
        self.retry_after = retry_after
