"""The exceptions the service layer raises, all in the one tree of ``queues.errors``: each
carries its answer (``code``, ``status``, ``detail``). The API answers them in one place
(``queues.http.errors``); other entrances (admin, SQS, tasks, the archive) map by the base."""

from __future__ import annotations

from queues.errors import (
    Fault,
    NotFound,
    NotServedHere,
    PartitionUnavailable,
    QueueNotFound,
    ReceiptMismatch,
    Refused,
    ServiceError,
    SubscriptionNotFound,
    TooManyWaits,
    Unavailable,
)
from queues.service.peers import PeerUnreachable, RemoteError

__all__ = [
    "NOT_FOUND_CODES",
    "Conflict",
    "Fault",
    "InvalidRequest",
    "NoActiveUser",
    "NotFound",
    "NotServedHere",
    "PartitionUnavailable",
    "PeerUnreachable",
    "QueueNotFound",
    "ReceiptMismatch",
    "Refused",
    "RemoteError",
    "ServiceError",
    "SubscriptionNotFound",
    "TooManyWaits",
    "Unavailable",
]

#: InvalidRequest codes that mean "the path names nothing here" (404, not 400): a topic's name
#: under /queues/, a partition index past the queue's partitions.
NOT_FOUND_CODES = frozenset({"is_a_topic", "no_such_partition"})


class InvalidRequest(Refused):
    """The call asks for something the queue's rules refuse (400; 404 for the codes in
    :data:`NOT_FOUND_CODES`): nothing was changed. ``code`` is a stable identifier clients can
    test."""

    def __init__(self, detail: str, code: str = "invalid"):
        super().__init__(detail)
        self.code = code
        self.status = 404 if code in NOT_FOUND_CODES else 400


class NoActiveUser(Refused):
    """The user a call is made for, by a process that holds no credential of it (the outbox
    relay), was deleted or deactivated (403)."""

    code = "no_active_user"
    status = 403


class Conflict(Refused):
    """The call does not fit the current state (409), e.g. a partition no live node holds."""

    code = "conflict"
    status = 409

    def __init__(self, detail: str, code: str):
        super().__init__(detail)
        self.code = code
