"""The one tree of errors the service answers with, and what the messaging core raises.

Every error a caller can be answered with derives from :class:`ServiceError`, which carries
its answer: ``code`` (a stable machine code clients test), ``status`` (the HTTP status) and
``detail`` (the words). Each is defined where it is raised; the entrances map by the base:
the REST API answers ``status`` with :meth:`ServiceError.body` and :meth:`ServiceError.headers`,
the SQS API maps by status (a few classes by name, where SQS has codes of its own), the admin
shows every :class:`Refused` as a message. Three branches:

- :class:`Refused` (4xx): the call as it is will not be done; nothing was changed.
- :class:`Unavailable` (503 with Retry-After): an outage (a lease lost, a store or a peer
  down); nothing was confirmed, and the same call may succeed in a moment.
- :class:`Fault` (500): this node's own bug or broken data; answered as any other bug.

This module imports nothing of Django or of the runtime, so any layer may raise these. The
partition's errors are re-exported by ``queues.engine.partition``, the rest by ``queues.service``.
"""

from __future__ import annotations

from typing import Any


class ServiceError(Exception):
    """An error the service answers with: ``status`` and ``{"error": code, "detail": detail}``.

    ``code`` and ``status`` are class attributes; a subclass whose answer depends on the call
    (an :class:`~queues.service.errors.InvalidRequest`'s code) sets them on the instance.
    """

    #: a stable identifier clients can test (the answer's ``error``).
    code: str = "error"
    #: the HTTP status of the answer.
    status: int = 500
    #: seconds after which the call may be retried (a Retry-After header), or None.
    retry_after: float | None = None

    @property
    def detail(self) -> str:
        """What is wrong, in words (the answer's ``detail``)."""
        return str(self)

    def body(self) -> dict[str, Any]:
        """The JSON answer."""
        return {"error": self.code, "detail": self.detail}

    def headers(self) -> dict[str, str]:
        """The answer's headers."""
        return {} if self.retry_after is None else {"Retry-After": str(self.retry_after)}


class Refused(ServiceError):
    """The call is refused as it is (4xx); nothing was changed."""

    code = "invalid"
    status = 400


class NotFound(Refused):
    """The call names something that is not there (404)."""

    code = "not_found"
    status = 404


class PayloadTooLarge(Refused):
    """A request body over the call's limit (413): refused by its length before it is read, or
    as soon as the bytes read pass the limit."""

    code = "payload_too_large"
    status = 413


class Unavailable(ServiceError):
    """An outage: the call cannot be served now and may be retried (503 with Retry-After)."""

    code = "unavailable"
    status = 503
    retry_after = 1
    #: whether the node counts it in its figures as a failure of its own (False: a refusal to
    #: serve that says nothing of the node's health, e.g. a call for a partition it does not hold).
    node_failure: bool = True


class Fault(ServiceError):
    """This node's own bug or broken data (500): logged and answered as any other bug, without
    its words, which are for the operator."""

    code = "server_error"
    status = 500


class QueueNotFound(NotFound):
    """No queue (or topic) of that name, or none the caller may see. ``args[0]``: the name."""

    code = "queue_not_found"

    @property
    def detail(self) -> str:
        return f"no queue named {self.args[0]!r}"


class SubscriptionNotFound(NotFound):
    """No subscription of that name. ``args[0]``: ``<topic>/<subscription>``."""

    code = "subscription_not_found"

    @property
    def detail(self) -> str:
        return f"no subscription {self.args[0]!r}"


class PartitionUnavailable(Unavailable):
    """The partition cannot serve now (lease lost, store down); the client may retry."""


class NotServedHere(PartitionUnavailable):
    """This node holds no (usable) partition for the call; another node may."""

    node_failure = False


class StoredFormatTooNew(PartitionUnavailable):
    """A record in the key-value store is in a format version newer than this node reads: a
    node of a newer release wrote it (``queues.engine.format``). Refused, never misread: the
    partition is not opened here, or the call is answered 503, and the record stays as it is
    for a node of the newer release. ``key``, ``kind``, ``version``: the record's; ``reads``:
    the newest version this node reads."""

    def __init__(self, key: str, kind: str, version: int, reads: int):
        super().__init__(
            f"{key}: {kind} record in stored format version {version}, newer than this node reads ({reads})"
        )
        self.key = key
        self.kind = kind
        self.version = version
        self.reads = reads


class LeaseLost(Unavailable):
    """This node is no longer the owner (renewal failed, or the epoch moved on). Raised by the
    leases (``queues.cluster.leases``, where callers find it too) and by a partition's open."""


class ReceiptMismatch(Refused):
    """An ack or visibility change whose message is not in flight under that receipt (409)."""

    code = "receipt_mismatch"
    status = 409

    def __init__(self, msg_id: str, reason: str):
        super().__init__(f"{msg_id}: {reason}")
        self.msg_id = msg_id
        self.reason = reason

    def body(self) -> dict[str, Any]:
        return {**super().body(), "id": self.msg_id}
