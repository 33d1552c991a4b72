"""The queue description, its partitions with their leases, and the nodes.

The messages themselves are not here: they live in the key-value store (see ``queues.kv``),
tracked by each partition's append tree. These rows are the seed's "queue description data"
and "partition files".
"""

from __future__ import annotations

import re

from django.conf import settings
from django.core.validators import BaseValidator, MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models

from queues.public import LIMITS, QUEUE_NAME_RE

DEFAULTS = {
    "partitions": 4,
    "block_size": 256,
    "lease_period": 10,
    "visibility_timeout": 30,
    "max_message_size": 256 * 1024,
    "retention": 4 * 24 * 3600,
    "dedup_window": 300,
    "delay": 0,
}


#: A queue's settings, in the order its API answers them: what a client may set, the API's
#: serializers and the queue catalog's description (``queues.cluster.catalog.QUEUE_COLUMNS``) read.
QUEUE_SETTINGS = (
    "partitions",
    "block_size",
    "lease_period",
    "visibility_timeout",
    "max_message_size",
    "retention",
    "strict",
    "group_batch",
    "dead_letter_queue",
    "max_receives",
    "dedup_window",
    "delay",
    "preprocess_estimate",
    "process_estimate",
    "archive",
)
#: The settings of :data:`QUEUE_SETTINGS` a topic has too: its subscriptions carry their own
#: dead-letter rule, and it has no workers' estimates.
TOPIC_SETTINGS = tuple(
    f
    for f in QUEUE_SETTINGS
    if f not in {"group_batch", "dead_letter_queue", "max_receives", "preprocess_estimate", "process_estimate"}
)

DEAD_LETTER_PAIRING = "dead_letter_queue and max_receives go together"
OWN_DEAD_LETTER_QUEUE = "a queue cannot be its own dead-letter queue"
PARTITIONS_ONLY_GROW = "partitions can only grow: existing partitions hold messages"


def dead_letter_pairing_error(dead_letter_queue: object, max_receives: int | None) -> str | None:
    """Why a queue's or subscription's dead-letter settings do not pair, or None: a
    dead-letter queue needs ``max_receives`` (the deliveries before a message moves there), and
    ``max_receives`` means nothing without one."""
    if (dead_letter_queue is None) != (max_receives is None):
        return DEAD_LETTER_PAIRING
    return None


def own_dead_letter_error(queue: object, dead_letter_queue: object) -> str | None:
    """Why a queue cannot have that dead-letter queue, or None: both given by the same key
    (their names, or their primary keys), ``dead_letter_queue`` None when it has none."""
    if dead_letter_queue is not None and dead_letter_queue == queue:
        return OWN_DEAD_LETTER_QUEUE
    return None


def partitions_shrink_error(current: int, asked: int) -> str | None:
    """Why a queue of ``current`` partitions cannot have ``asked``, or None: partitions only
    grow (existing ones hold messages, and a message's ID names its partition)."""
    if asked < current:
        return PARTITIONS_ONLY_GROW
    return None


def _bounded(field: str) -> list[BaseValidator]:
    low, high = LIMITS[field]
    return [MinValueValidator(low), MaxValueValidator(high)]


class Node(models.Model):
    """One server process; it registers itself at start and heartbeats while alive."""

    id = models.CharField(primary_key=True, max_length=40)
    address = models.CharField(max_length=200, help_text="host:port where the node serves HTTP")
    hostname = models.CharField(max_length=200, blank=True)
    pid = models.IntegerField(null=True, blank=True)
    started_at = models.DateTimeField()
    heartbeat_at = models.DateTimeField(db_index=True)
    stopped_at = models.DateTimeField(null=True, blank=True)
    cooling = models.BooleanField(default=False, help_text="sending enqueues elsewhere (overload)")

    class Meta:
        ordering = ["address", "started_at"]

    def __str__(self) -> str:
        return f"{self.address} ({self.id[:8]})"


class Queue(models.Model):
    """A queue, or a topic: a topic's messages are read through its subscriptions, each with
    its own delivery state, and stored once however many subscriptions there are."""

    class Kind(models.TextChoices):
        QUEUE = "queue"
        TOPIC = "topic"

    kind = models.CharField(max_length=8, choices=Kind.choices, default=Kind.QUEUE)
    name = models.CharField(
        max_length=80,
        unique=True,
        validators=[RegexValidator(QUEUE_NAME_RE, "letters, digits, '_' and '-', at most 80")],
    )
    partitions = models.PositiveIntegerField(default=DEFAULTS["partitions"], validators=_bounded("partitions"))
    block_size = models.PositiveIntegerField(
        default=DEFAULTS["block_size"],
        validators=_bounded("block_size"),
        help_text="positions per append-tree block (a busy partition's blocks grow to BLOCK_GROWTH times this)",
    )
    lease_period = models.PositiveIntegerField(
        default=DEFAULTS["lease_period"],
        validators=_bounded("lease_period"),
        help_text="seconds a partition lease lasts",
    )
    visibility_timeout = models.PositiveIntegerField(
        default=DEFAULTS["visibility_timeout"],
        validators=_bounded("visibility_timeout"),
        help_text="seconds a delivered message stays hidden",
    )
    max_message_size = models.PositiveIntegerField(
        default=DEFAULTS["max_message_size"], validators=_bounded("max_message_size"), help_text="bytes of UTF-8 body"
    )
    retention = models.PositiveIntegerField(
        default=DEFAULTS["retention"],
        validators=_bounded("retention"),
        help_text="seconds a message is kept unacknowledged",
    )
    strict = models.BooleanField(default=False, help_text="every message needs a group; acks need receipts")
    group_batch = models.BooleanField(
        default=False,
        help_text="a dequeue takes as many of a group's next messages as it has room for, in order (SQS FIFO), "
        "and the group is held until each is acked or visible again; off: one of a group at a time",
    )
    dead_letter_queue = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="dead_letter_sources",
        help_text="where messages go after max_receives deliveries",
    )
    max_receives = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=_bounded("max_receives"),
        help_text="deliveries before a message is dead-lettered",
    )
    dedup_window = models.PositiveIntegerField(
        default=DEFAULTS["dedup_window"],
        validators=_bounded("dedup_window"),
        help_text="seconds a dedup_id is remembered",
    )
    delay = models.PositiveIntegerField(
        default=DEFAULTS["delay"],
        validators=_bounded("delay"),
        help_text="seconds every message waits before its first delivery",
    )
    preprocess_estimate = models.FloatField(
        default=0.0, validators=_bounded("estimate"), help_text="default seconds of pre-processing per message"
    )
    process_estimate = models.FloatField(
        default=0.0, validators=_bounded("estimate"), help_text="default seconds of processing per message"
    )

    class Archive(models.TextChoices):
        NONE = "none", "no archiving"
        ALL = "all", "every message, when enqueued (acks are marked)"
        ACKED = "acked", "acknowledged messages, when acked"

    archive = models.CharField(
        max_length=8,
        choices=Archive.choices,
        default=Archive.NONE,
        help_text="what the archiver copies to the archive table",
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text="who created it: that user may manage it (change, delete, purge, grant...)",
    )
    dead_lettered_total = models.BigIntegerField(default=0)
    expired_total = models.BigIntegerField(default=0, help_text="removed by the retention rule")
    purged_total = models.BigIntegerField(default=0, help_text="removed by purges")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        # The console's actions, each its own permission (a staff user who may only view the
        # queues is offered none); the service still checks the caller's grant on each queue.
        permissions = [
            ("purge_queue", "Can purge the messages of a queue"),
            ("redrive_queue", "Can redrive a dead-letter queue's messages to their sources"),
        ]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        from django.core.exceptions import ValidationError

        why = own_dead_letter_error(self.pk, self.dead_letter_queue_id)
        if why:
            raise ValidationError({"dead_letter_queue": why})
        why = dead_letter_pairing_error(self.dead_letter_queue_id, self.max_receives)
        if why:
            raise ValidationError({"max_receives": why})
        if self.dead_letter_queue_id is not None and self.dead_letter_queue is not None:
            why = dead_letter_mismatch(self, self.dead_letter_queue)
            if why:
                raise ValidationError({"dead_letter_queue": why})
        if self.pk is not None and self.kind == self.Kind.QUEUE:
            # This queue as the dead-letter queue of others: a change must still take theirs.
            for source in Queue.objects.filter(dead_letter_queue_id=self.pk).exclude(pk=self.pk):
                why = dead_letter_mismatch(source, self)
                if why:
                    raise ValidationError({"max_message_size" if "size" in why else "strict": why})
            for topic in Queue.objects.filter(subscriptions__dead_letter_queue_id=self.pk).distinct():
                why = dead_letter_mismatch(topic, self)
                if why:
                    raise ValidationError({"max_message_size" if "size" in why else "strict": why})


def dead_letter_mismatch(source: Queue, dlq: Queue) -> str | None:
    """Why ``dlq`` cannot take every dead letter of ``source`` (a queue, or the topic of a
    subscription), or None. A dead letter keeps its body and its group; one the dead-letter
    queue refused would be set aside again at every dequeue of the source, for ever."""
    if dlq.kind != Queue.Kind.QUEUE:
        return f"{dlq.name} is a topic: a dead-letter queue must be a queue"
    if dlq.max_message_size < source.max_message_size:
        return (
            f"{dlq.name}'s max_message_size ({dlq.max_message_size}) is smaller than {source.name}'s "
            f"({source.max_message_size}): some dead letters would not fit"
        )
    if dlq.strict and not source.strict:
        return (
            f"{dlq.name} is strict (every message needs a group) and {source.name} is not: its messages may have none"
        )
    return None


class Subscription(models.Model):
    """A named reader of a topic: its own dequeue position, redelivery index, receipts,
    dead-letter rule and group order over the topic's shared blocks (see ``queues.engine.partition``).

    ``starts_at``: messages enqueued before it are not delivered to it (``start: newest``);
    None means every message still retained (``start: oldest``).
    """

    class Start(models.TextChoices):
        NEWEST = "newest"
        OLDEST = "oldest"

    topic = models.ForeignKey(
        Queue, on_delete=models.CASCADE, related_name="subscriptions", limit_choices_to={"kind": Queue.Kind.TOPIC}
    )
    name = models.CharField(
        max_length=80, validators=[RegexValidator(QUEUE_NAME_RE, "letters, digits, '_' and '-', at most 80")]
    )
    start = models.CharField(max_length=8, choices=Start.choices, default=Start.NEWEST)
    starts_at = models.DateTimeField(null=True, blank=True)
    visibility_timeout = models.PositiveIntegerField(
        null=True, blank=True, validators=_bounded("visibility_timeout"), help_text="seconds; the topic's when empty"
    )
    dead_letter_queue = models.ForeignKey(
        Queue,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="dead_letter_subscriptions",
        limit_choices_to={"kind": Queue.Kind.QUEUE},
    )
    max_receives = models.PositiveIntegerField(null=True, blank=True, validators=_bounded("max_receives"))
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["topic__name", "name"]
        constraints = [models.UniqueConstraint(fields=["topic", "name"], name="subscription_unique_name")]

    def __str__(self) -> str:
        return f"{self.topic.name}/{self.name}"

    def clean(self) -> None:
        from django.core.exceptions import ValidationError

        if self.dead_letter_queue_id is not None and self.dead_letter_queue is not None and self.topic_id is not None:
            why = dead_letter_mismatch(self.topic, self.dead_letter_queue)
            if why:
                raise ValidationError({"dead_letter_queue": why})


class DedupEntry(models.Model):
    """A remembered dedup_id (the embedded default; production keeps them in Redis)."""

    queue = models.CharField(max_length=80)
    dedup_id = models.CharField(max_length=128)
    message_id = models.CharField(max_length=200, blank=True, help_text="empty while the first enqueue runs")
    expires_at = models.DateTimeField(db_index=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["queue", "dedup_id"], name="dedup_unique")]

    def __str__(self) -> str:
        return f"{self.queue}: {self.dedup_id}"


class Partition(models.Model):
    """A partition and its lease: the seed's partition file.

    Lease protocol (see ``queues.cluster.leases``): a node claims the row by compare-and-set on
    ``(owner, epoch, lease_nonce)``. The owner changes ``lease_nonce`` at every renewal; a
    node that finds the row owned remembers the nonce and may take the row only after it has
    seen the same nonce for a whole ``lease_period`` on its *own* monotonic clock, so clock
    skew between nodes cannot make two owners. ``epoch`` grows at every change of owner and
    fences the previous owner's writes in the key-value store.
    """

    queue = models.ForeignKey(Queue, on_delete=models.CASCADE, related_name="partition_set")
    index = models.PositiveIntegerField()
    owner = models.ForeignKey(Node, null=True, blank=True, on_delete=models.SET_NULL, related_name="partitions")
    epoch = models.BigIntegerField(default=0)
    lease_nonce = models.CharField(max_length=32, blank=True)
    lease_period = models.PositiveIntegerField(default=DEFAULTS["lease_period"])
    lease_acquired_at = models.DateTimeField(null=True, blank=True)
    lease_renewed_at = models.DateTimeField(null=True, blank=True, help_text="the owner's clock; informational only")
    head_block = models.CharField(
        max_length=64, blank=True, help_text="the most recently allocated block of the append tree"
    )
    # Figures the owner publishes at each heartbeat, for the console (the live state is in
    # the owner's memory).
    enqueue_id = models.CharField(max_length=120, blank=True)
    dequeue_id = models.CharField(max_length=120, blank=True)
    depth = models.BigIntegerField(default=0)
    in_flight = models.BigIntegerField(default=0)
    delayed = models.BigIntegerField(default=0, help_text="stored, waiting for their delay to pass")
    enqueue_rate = models.FloatField(default=0.0, help_text="messages/s enqueued, over the last minute")
    ack_rate = models.FloatField(default=0.0, help_text="messages/s acknowledged, over the last minute")
    #: on a topic, per subscription: {"held": .., "in_flight": .., "dequeue_id": .., "acked": ..,
    #: "oldest_enqueued_at": ..} (``PartitionStats.cursors``).
    cursors = models.JSONField(default=dict, blank=True)
    tree_height = models.PositiveIntegerField(default=0)
    live_blocks = models.BigIntegerField(default=0)
    enqueued_total = models.BigIntegerField(default=0)
    acked_total = models.BigIntegerField(default=0)
    redelivered_total = models.BigIntegerField(default=0)
    oldest_enqueued_at = models.DateTimeField(null=True, blank=True)
    stats_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["queue__name", "index"]
        constraints = [models.UniqueConstraint(fields=["queue", "index"], name="partition_unique_index")]
        permissions = [("release_partition", "Can release a partition's lease")]

    def __str__(self) -> str:
        return f"{self.queue.name}/{self.index}"


class RateSample(models.Model):
    """One point of a partition's rate history: the enqueue and ack rates its owner published
    (``Partition.enqueue_rate`` / ``ack_rate``) at the start of one ``RATE_HISTORY_STEP``.

    Written by the owners' housekeeping pass, one row a partition a step, and the rows older
    than ``RATE_HISTORY_SECONDS`` deleted by the same pass: at most that many seconds over the
    step (plus one) rows a partition. The overview sums them a queue a step, for its sparklines.
    No foreign-key constraint: the rows of a deleted queue's partitions are left to age out
    rather than add to the delete.
    """

    partition = models.ForeignKey(
        Partition, on_delete=models.DO_NOTHING, db_constraint=False, related_name="+", db_index=False
    )
    at = models.DateTimeField(db_index=True)
    enqueue_rate = models.FloatField()
    ack_rate = models.FloatField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["partition", "at"], name="rate_sample_unique")]

    def __str__(self) -> str:
        return f"{self.partition_id} at {self.at:%H:%M:%S}: {self.enqueue_rate} / {self.ack_rate}"


class KVEntry(models.Model):
    """Rows of the ``postgres`` key-value backend (``queues.kv.sql``); unused otherwise."""

    pk = models.CompositePrimaryKey("bucket", "name")
    bucket = models.TextField()
    name = models.TextField()
    value = models.BinaryField()

    class Meta:
        db_table = "queues_kv_entry"
        verbose_name = "key-value entry"
        verbose_name_plural = "key-value entries"

    def __str__(self) -> str:
        return f"{self.bucket}/{self.name}"


#: A grant's name pattern: a queue (or topic) name, or one with ``*`` standing for any run of
#: name characters (``billing-*``), so queues created later are covered too.
GRANT_PATTERN_RE = re.compile(r"\A[A-Za-z0-9*][A-Za-z0-9_*-]{0,79}\Z")


class Grant(models.Model):
    """One action on one queue (or topic), or on every queue whose name matches a pattern,
    granted to a user or to a Django group.

    ``produce``: enqueue, publish. ``consume``: dequeue, ack, visibility, a subscription's calls.
    ``manage``: change, delete, purge, redrive, subscriptions, replay, release, grants; it
    includes produce and consume. ``read``: see it in lists, its stats; every other action
    includes it. A queue's creator may manage it without a grant; superusers may do anything.
    """

    class Action(models.TextChoices):
        READ = "read", "read (see it, its stats)"
        PRODUCE = "produce", "produce (enqueue, publish)"
        CONSUME = "consume", "consume (dequeue, ack, visibility, subscriptions' calls)"
        MANAGE = "manage", "manage (change, delete, purge, redrive, subscriptions, replay, release)"

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE, related_name="mq_grants"
    )
    group = models.ForeignKey("auth.Group", null=True, blank=True, on_delete=models.CASCADE, related_name="mq_grants")
    queue = models.ForeignKey(
        Queue,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="grants",
        help_text="this queue or topic (the grant goes with it when it is deleted)",
    )
    pattern = models.CharField(
        max_length=80,
        blank=True,
        validators=[RegexValidator(GRANT_PATTERN_RE, "a queue name, with * for any run of name characters")],
        help_text="or every queue and topic whose name matches, now and later (billing-*)",
    )
    action = models.CharField(max_length=8, choices=Action.choices)
    created_at = models.DateTimeField(auto_now_add=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["pattern", "queue__name", "action"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(user__isnull=False, group__isnull=True)
                | models.Q(user__isnull=True, group__isnull=False),
                name="grant_one_principal",
            ),
            models.CheckConstraint(
                condition=models.Q(queue__isnull=False, pattern="")
                | models.Q(queue__isnull=True) & ~models.Q(pattern=""),
                name="grant_one_target",
            ),
            # One row per principal, target and action (partial indexes: NULLs never compare equal).
            models.UniqueConstraint(
                fields=["user", "queue", "action"],
                condition=models.Q(user__isnull=False, queue__isnull=False),
                name="grant_user_queue",
            ),
            models.UniqueConstraint(
                fields=["user", "pattern", "action"],
                condition=models.Q(user__isnull=False, queue__isnull=True),
                name="grant_user_pattern",
            ),
            models.UniqueConstraint(
                fields=["group", "queue", "action"],
                condition=models.Q(group__isnull=False, queue__isnull=False),
                name="grant_group_queue",
            ),
            models.UniqueConstraint(
                fields=["group", "pattern", "action"],
                condition=models.Q(group__isnull=False, queue__isnull=True),
                name="grant_group_pattern",
            ),
        ]

    def __str__(self) -> str:
        who = f"user {self.user}" if self.user_id else f"group {self.group}"
        return f"{who}: {self.action} on {self.queue.name if self.queue is not None else self.pattern}"


class AuditEntry(models.Model):
    """A management action: who did what to which queue or topic, and when (read-only)."""

    at = models.DateTimeField(auto_now_add=True, db_index=True)
    #: the user's name as it was then (the user may be deleted later).
    actor = models.CharField(max_length=150)
    #: create, change, delete, purge, redrive, replay, release, grant, revoke, subscribe, unsubscribe,
    #: issue_key, revoke_key, move_start, move_cancel, move_end, relayed (an enqueue a relay sent
    #: for its writer: ``queues.service.on_behalf``).
    action = models.CharField(max_length=16, db_index=True)
    target = models.CharField(max_length=200, db_index=True, help_text="queue, topic or topic/subscription")
    detail = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-at"]
        verbose_name_plural = "audit entries"

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.actor} {self.action} {self.target}"
