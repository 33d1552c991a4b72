"""The Python client of the messaging API: what the workers use, and what applications may import.

It needs only ``requests`` (never Django), so an application can vendor or import it alone::

    from mq_client import Client

    mq = Client("http://10.0.0.1:8000,http://10.0.0.2:8000", token="...")   # or Client.from_env()
    mq.create_queue("orders", partitions=4)
    mq.enqueue("orders", "hello", group="customer-42")
    ids = mq.enqueue_many("orders", ({"body": str(i)} for i in range(2500)))   # 3 calls of <= 1,000
    for m in mq.dequeue("orders", 10, visibility_timeout=60, wait=5):
        ...
    mq.ack("orders", messages)

What it does for you:

* **Typed results.** Answers come back as frozen dataclasses (:class:`Message`, :class:`Queue`,
  :class:`Stats`, :class:`AckResult` ...); errors as :class:`ApiError` subclasses carrying the
  API's ``status``, ``code`` (e.g. ``queue_not_found``, ``receipt_mismatch``) and ``detail``.
* **Batching.** :meth:`Client.enqueue_many`, :meth:`Client.ack` and :meth:`Client.ack_ids` split
  their input into calls of at most 1,000 items (the API's limit).
* **Retries** (:mod:`mq_client.transport`). A 4xx other than 429 is never retried (the call was
  wrong and changed nothing). A 429 (a node's cap on concurrent long polls or consumers) is retried
  like a 5xx. A 5xx (503 means "this partition is not served here right now") and a connection
  error are retried up to ``retries`` times with exponential backoff and full jitter, honouring
  ``Retry-After``, each time on the next node of the round robin. A node that refused a connection
  is skipped for a short while. Retries are at least once: an enqueue whose answer was lost may be
  stored twice (give a ``dedup_id`` to make that impossible within the queue's dedup window), a
  dequeue whose answer was lost leaves its messages invisible until their visibility timeout.
* **Batching for one message at a time** (:mod:`mq_client.producer`, :mod:`mq_client.consumer`).
  :class:`Producer` sends the single messages of many threads as batches and returns a future
  at once; :class:`Acker` does the same for acks; :class:`Prefetcher` and :class:`Consumer`
  receive ahead, bounded so that nothing waits past its visibility.
* **asyncio** (:mod:`mq_client.aio`, with aiohttp installed): :class:`~mq_client.aio.AsyncClient`
  and :class:`~mq_client.aio.AsyncProducer`, the same calls awaited, the same retries and routing.
* **Round robin** over the nodes given (``urls``, a list or a comma-separated string).
* **Owner routing** (:mod:`mq_client.routing`). The client learns which node owns each partition
  (``GET /queues/{name}/partitions``, cached for ``owners_ttl`` seconds and dropped on any failure)
  and sends acks and visibility changes (and enqueues of a single message group) straight to the
  owner of the message's partition, ``http://<address>``. If the owner is unknown or fails (it is
  then left alone for a moment), the call goes round robin at once with all its retries: any node
  forwards a call to the owner, so this is only a shortcut, never a requirement.

A :class:`Client` is thread-safe: each thread gets its own ``requests.Session`` (connection pool);
the round robin, the node health and the owner cache are shared under a lock.

The package, by concept: :mod:`~mq_client.client` (the :class:`Client`), :mod:`~mq_client.types`
(the answers and :class:`NewMessage`), :mod:`~mq_client.errors`, :mod:`~mq_client.ids` (message IDs
and group placement), :mod:`~mq_client.transport` (HTTP, auth headers, retries) and
:mod:`~mq_client.routing` (the owner cache). Import the public names from ``mq_client`` itself.
"""

from mq_client.client import MAX_BATCH, MAX_WAIT, Client
from mq_client.consumer import Consumer, Prefetcher
from mq_client.errors import (
    ApiError,
    BadRequest,
    BufferFull,
    Conflict,
    ConnectionFailed,
    DeliveryUnknown,
    NotFound,
    ServerError,
    Unauthorized,
    Unavailable,
)
from mq_client.ids import group_partition, message_partition, message_queue
from mq_client.producer import Acker, Producer
from mq_client.types import (
    AckResult,
    Estimates,
    Health,
    History,
    Message,
    NewMessage,
    PartitionOwner,
    PartitionStats,
    Queue,
    RedriveResult,
    Stats,
    VisibilityResult,
)

__all__ = [
    "MAX_BATCH",
    "MAX_WAIT",
    "AckResult",
    "Acker",
    "ApiError",
    "BadRequest",
    "BufferFull",
    "Client",
    "Conflict",
    "ConnectionFailed",
    "Consumer",
    "DeliveryUnknown",
    "Estimates",
    "Health",
    "History",
    "Message",
    "NewMessage",
    "NotFound",
    "PartitionOwner",
    "PartitionStats",
    "Prefetcher",
    "Producer",
    "Queue",
    "RedriveResult",
    "ServerError",
    "Stats",
    "Unauthorized",
    "Unavailable",
    "VisibilityResult",
    "group_partition",
    "message_partition",
    "message_queue",
]
