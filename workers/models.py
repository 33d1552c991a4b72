"""Queue clients as the service sees them: consumers (workers) and their attempt log."""

from __future__ import annotations

from django.conf import settings
from django.db import models


class Consumer(models.Model):
    """A worker process that consumes queues; it heartbeats while alive."""

    id = models.CharField(primary_key=True, max_length=64, help_text="chosen by the worker (a UUID)")
    name = models.CharField(max_length=200, blank=True, help_text="e.g. celery@host")
    hostname = models.CharField(max_length=200, blank=True)
    pid = models.IntegerField(null=True, blank=True)
    queues = models.JSONField(default=list, help_text="queue names it consumes")
    load = models.FloatField(default=0.0, help_text="busy share of its capacity, 0..1")
    capacity = models.PositiveIntegerField(default=1, help_text="messages it can process at once")
    held = models.JSONField(default=list, help_text="message IDs it holds (pre-processing or processing)")
    asleep_until = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(auto_now_add=True)
    last_heartbeat = models.DateTimeField(db_index=True)
    #: whose token heartbeats it: a user has at most WORKER_MAX_CONSUMERS_PER_USER of them.
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE, related_name="consumers"
    )

    class Meta:
        ordering = ["-last_heartbeat"]

    def __str__(self) -> str:
        return self.name or self.id[:12]


class HeldMessage(models.Model):
    """A message a consumer said it holds in its latest heartbeat, by ID: a redelivery looks
    up its holder here by index instead of loading every consumer's ``held`` list."""

    consumer = models.ForeignKey(Consumer, on_delete=models.CASCADE, related_name="held_messages")
    message_id = models.CharField(max_length=200, db_index=True)

    def __str__(self) -> str:
        return f"{self.consumer_id}: {self.message_id}"


class AttemptLog(models.Model):
    """One processing attempt of one message: the failure-management seed's log data."""

    class Outcome(models.TextChoices):
        SUCCEEDED = "succeeded"
        FAILED = "failed"
        TIMED_OUT = "timed_out"
        #: the service's record: the visibility ran out without an ack or a report.
        ABANDONED = "abandoned"
        #: the service's record: the consumer gave the message back (visibility 0) unreported.
        GIVEN_BACK = "given_back"

    message_id = models.CharField(max_length=200, db_index=True)
    queue = models.CharField(max_length=80)
    #: the id of the queue's row when the attempt was recorded: that incarnation of the name
    #: (see ``archive.models.ArchivedMessage.incarnation``). Empty: no queue of the name then.
    incarnation = models.BigIntegerField(
        null=True,
        blank=True,
        help_text="the id of the queue's row (kept after deletion; a re-created queue has another)",
    )
    partition = models.PositiveIntegerField()
    group = models.CharField(max_length=128, blank=True)
    worker = models.ForeignKey(
        Consumer, null=True, blank=True, on_delete=models.SET_NULL, related_name="attempts", db_constraint=False
    )
    attempt = models.PositiveIntegerField(help_text="the delivery's receive count")
    enqueued_at = models.DateTimeField(
        null=True, blank=True, help_text="when the message was enqueued: wait time = process start - this"
    )
    preprocess_started_at = models.DateTimeField(null=True, blank=True)
    preprocess_ended_at = models.DateTimeField(null=True, blank=True)
    process_started_at = models.DateTimeField(null=True, blank=True)
    process_ended_at = models.DateTimeField(null=True, blank=True)
    outcome = models.CharField(max_length=16, choices=Outcome.choices)
    error = models.TextField(blank=True)
    traceback = models.TextField(blank=True)
    size = models.BigIntegerField(null=True, blank=True)
    recorded_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-recorded_at", "-id"]
        indexes = [
            models.Index(fields=["queue", "recorded_at"], name="attempt_queue_time"),
            models.Index(fields=["incarnation", "recorded_at"], name="attempt_incarnation_time"),
        ]

    def __str__(self) -> str:
        return f"{self.message_id} #{self.attempt} {self.outcome}"


class OutboxMessage(models.Model):
    """Messages an application enqueued inside a database transaction, not sent yet.

    Written in the caller's transaction (:mod:`workers.outbox`), so they exist exactly when
    that transaction committed; sent after the commit and deleted, or, when the process died
    in between, sent by a relay (``mq_tasks_worker``) once they are ``relay_after`` seconds old,
    as their writer, or given up with the reason.
    """

    #: also each message's ``dedup_id`` when it has none: a second send within the queue's
    #: dedup window gets the first one's ID, so a relay after a lost answer stores nothing twice.
    id = models.CharField(primary_key=True, max_length=64)
    queue = models.CharField(max_length=80)
    #: the enqueue call's messages, as the API takes them (``body``, ``group``, ``dedup_id``...)
    messages = models.JSONField()
    created_at = models.DateTimeField(db_index=True)
    #: relays that failed, and why the last one did (a missing queue, a refused message...)
    failures = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True)
    #: until when a sender (the writer, or a relay) has claimed the row to send it; no other
    #: sender takes it before then (:func:`workers.outbox.send_row`)
    claimed_until = models.DateTimeField(null=True, blank=True)
    #: the id of the user whose client wrote the row (its token's user): a relay sends the row
    #: as this user, with its rights checked then, never with its own. No token is kept. Empty:
    #: a row written before writers were recorded, which a relay gives up.
    writer_id = models.BigIntegerField(null=True, blank=True, help_text="the user a relay sends it as")
    #: when a relay gave the row up, and why: its writer deleted or deactivated, or without
    #: ``produce`` on the queue then. A given-up row is never sent; it stays for the operator.
    given_up_at = models.DateTimeField(null=True, blank=True)
    # db_default: a process of an earlier version, which does not know the column, still inserts rows
    given_up_reason = models.TextField(blank=True, db_default="")

    class Meta:
        ordering = ["created_at"]

    def __str__(self) -> str:
        return f"{self.queue}: {len(self.messages)} message(s) from {self.created_at:%Y-%m-%d %H:%M:%S}"


class TaskRecord(models.Model):
    """A ``django.tasks`` task enqueued on a queue, and what became of it (its ``TaskResult``).

    Written with the enqueue, in the caller's transaction; the worker updates it around each
    attempt. The attempts themselves are the attempt log's records of ``message_id``.
    """

    id = models.CharField(primary_key=True, max_length=64)
    task_path = models.CharField(max_length=300, help_text="the task function's module path")
    backend = models.CharField(max_length=100, help_text="the TASKS alias it was enqueued with")
    queue = models.CharField(max_length=80)
    priority = models.IntegerField(default=0)
    run_after = models.DateTimeField(null=True, blank=True)
    #: a task due further ahead than the service may delay a message waits here, its message not
    #: yet sent: a worker's relay sends it from this time on (``QueueTaskBackend.release_held``);
    #: None once sent, or when it never waited
    held_until = models.DateTimeField(null=True, blank=True, db_index=True)
    #: a held task's writer: the user of the enqueuing client's API token (no token is stored),
    #: whom the relay sends its message as; None for a task sent with its enqueue
    writer_id = models.BigIntegerField(
        null=True, blank=True, help_text="the user a relay sends the held task's message as"
    )
    args = models.JSONField(default=list)
    kwargs = models.JSONField(default=dict)
    status = models.CharField(max_length=16, db_index=True)
    enqueued_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    last_attempted_at = models.DateTimeField(null=True, blank=True)
    return_value = models.JSONField(null=True, blank=True)
    #: one ``{"exception_class_path", "traceback"}`` per failed attempt
    errors = models.JSONField(default=list)
    #: the consumer of each attempt the worker started
    worker_ids = models.JSONField(default=list)
    #: the queue message that carries it (known from its first attempt)
    message_id = models.CharField(max_length=200, blank=True, db_index=True)

    class Meta:
        ordering = ["-enqueued_at"]

    def __str__(self) -> str:
        return f"{self.task_path} {self.id} {self.status}"
