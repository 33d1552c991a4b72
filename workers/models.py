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
