"""The service layer: every operation of the messaging core, one typed function each.

Every entrance calls these and only these: the REST API's views and its WSGI fast path
(``queues.api``), the admin, Celery tasks, the archive's replay and the workers app. Each
function takes checked Python values and returns typed results (``types``); it raises the
exceptions in ``errors``, which the API maps to statuses in one place (``queues.http.errors``).
Its docstring states what it locks and what it raises.

Modules: ``descriptions`` (queues, topics, subscriptions, their figures), ``overview`` (the
whole cluster as one caller may see it), ``messages`` (enqueue, dequeue,
ack, visibility, the dead-letter move), ``operations`` (purge, redrive, expire, release), ``blocks`` (a tree block's messages, read at
its owner),
``grants`` (grant, revoke: who may do what, recorded in the audit trail), ``credentials``
(API tokens, and who may issue or revoke a credential for whom), ``on_behalf`` (calls a
process that is not a node makes for a user: the outbox relay's),
``peers`` (calls to other nodes, a protocol the API implements), ``runtime`` (this process's
node), ``journal`` (the archive journal's drain, for the archive app), ``rows`` (what the
apps read of queue and partition rows, and the lock a queue's job starts under).
"""

from queues.engine.ids import MessageId, parse_message_id
from queues.engine.isotime import iso
from queues.engine.partition import BLOCK_LISTING_MAX, BlockListing
from queues.kv import KeyValueStore, KVError
from queues.service.blocks import block_messages
from queues.service.credentials import (
    CredentialForbidden,
    announce_credentials_change,
    check_issuer,
    check_revoker,
    credentials_stamp,
    initialize_credentials_stamp,
    issue_token,
    revoke_token,
    token_holder,
)
from queues.service.descriptions import (
    check_subscription_update,
    create_queue,
    create_subscription,
    current_queue_ids,
    delete_queue,
    delete_subscription,
    get_queue,
    get_subscription,
    learn_estimate,
    list_queues,
    partition_owners,
    queue_stats,
    readable_names,
    readable_queue_ids,
    reload,
    subscription_stats,
    update_queue,
    update_subscription,
)
from queues.service.errors import (
    Conflict,
    Fault,
    InvalidRequest,
    NoActiveUser,
    NotFound,
    NotServedHere,
    PartitionUnavailable,
    PeerUnreachable,
    QueueNotFound,
    ReceiptMismatch,
    Refused,
    RemoteError,
    ServiceError,
    SubscriptionNotFound,
    TooManyWaits,
    Unavailable,
)
from queues.service.grants import check_grant, grant, revoke
from queues.service.limits import MAX_BATCH, MAX_WAIT
from queues.service.messages import ack, change_visibility, check_drafts, dequeue, enqueue, publish
from queues.service.on_behalf import acting_user, enqueue_through_node, producer_config
from queues.service.operations import (
    close_purged,
    expire,
    expire_everywhere,
    forget_expired_dedup,
    purge,
    redrive,
    release_partition,
)
from queues.service.overview import Overview, cluster_overview
from queues.service.peers import Peers, get_peers, set_peers
from queues.service.reads import only_permitted, permitted_queues
from queues.service.runtime import get_runtime, set_runtime
from queues.service.targets import (
    Checked,
    allowed_now,
    authorize,
    begin_call,
    check,
    checked_name,
    end_call,
    queue_config,
    resolve,
)
from queues.service.types import (
    AckResult,
    ExpireResult,
    MessageDraft,
    NewQueueFields,
    NewSubscriptionFields,
    PartitionOwner,
    PartitionStats,
    QueueFields,
    QueueStats,
    RedriveResult,
    ReleaseResult,
    SubscriptionFields,
    SubscriptionStats,
)

__all__ = [
    "BLOCK_LISTING_MAX",
    "MAX_BATCH",
    "MAX_WAIT",
    "AckResult",
    "BlockListing",
    "Checked",
    "Conflict",
    "CredentialForbidden",
    "ExpireResult",
    "Fault",
    "InvalidRequest",
    "KVError",
    "KeyValueStore",
    "MessageDraft",
    "MessageId",
    "NewQueueFields",
    "NewSubscriptionFields",
    "NoActiveUser",
    "NotFound",
    "NotServedHere",
    "Overview",
    "PartitionOwner",
    "PartitionStats",
    "PartitionUnavailable",
    "PeerUnreachable",
    "Peers",
    "QueueFields",
    "QueueNotFound",
    "QueueStats",
    "ReceiptMismatch",
    "RedriveResult",
    "Refused",
    "ReleaseResult",
    "RemoteError",
    "ServiceError",
    "SubscriptionFields",
    "SubscriptionNotFound",
    "SubscriptionStats",
    "TooManyWaits",
    "Unavailable",
    "ack",
    "acting_user",
    "allowed_now",
    "announce_credentials_change",
    "authorize",
    "begin_call",
    "block_messages",
    "change_visibility",
    "check",
    "check_drafts",
    "check_grant",
    "check_issuer",
    "check_revoker",
    "check_subscription_update",
    "checked_name",
    "close_purged",
    "cluster_overview",
    "create_queue",
    "create_subscription",
    "credentials_stamp",
    "current_queue_ids",
    "delete_queue",
    "delete_subscription",
    "dequeue",
    "end_call",
    "enqueue",
    "enqueue_through_node",
    "expire",
    "expire_everywhere",
    "forget_expired_dedup",
    "get_peers",
    "get_queue",
    "get_runtime",
    "get_subscription",
    "grant",
    "initialize_credentials_stamp",
    "iso",
    "issue_token",
    "learn_estimate",
    "list_queues",
    "only_permitted",
    "parse_message_id",
    "partition_owners",
    "permitted_queues",
    "producer_config",
    "publish",
    "purge",
    "queue_config",
    "queue_stats",
    "readable_names",
    "readable_queue_ids",
    "redrive",
    "release_partition",
    "reload",
    "resolve",
    "revoke",
    "revoke_token",
    "set_peers",
    "set_runtime",
    "subscription_stats",
    "token_holder",
    "update_queue",
    "update_subscription",
]
