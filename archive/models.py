"""The archive table (in the default database: PostgreSQL in production, SQLite embedded)."""

from __future__ import annotations

from django.db import models
from django.utils import timezone


class ArchivedMessage(models.Model):
    """One message copied from the key-value store by the archiver (or by a topic's owner when
    retention moves a message a subscription still holds out of the store: the row is then its
    only copy, read back for that subscription). Never changed by the queue; the admin cannot
    delete rows."""

    message_id = models.CharField(max_length=200, unique=True)
    queue = models.CharField(max_length=80, help_text="the queue it was enqueued to (the name, kept after deletion)")
    #: the id of the queue's row it was enqueued to: that incarnation of the name. A plain
    #: column, not a foreign key: it stays when the queue is deleted (a superuser still reads
    #: the history), and an id is never handed out again, so a queue created later under the
    #: name never owns these rows. Empty: the queue was gone before rows were tied to one.
    incarnation = models.BigIntegerField(
        null=True,
        blank=True,
        help_text="the id of the queue's row (kept after deletion; a re-created queue has another)",
    )
    partition = models.PositiveIntegerField()
    group = models.CharField(max_length=128, null=True, blank=True)
    #: the body as text (NUL characters, which PostgreSQL text cannot hold, shown as U+FFFD;
    #: the exact record is then in ``raw``).
    body = models.TextField()
    attributes = models.JSONField(null=True, blank=True)
    size = models.BigIntegerField(null=True, blank=True)
    estimates = models.JSONField(null=True, blank=True)
    history = models.JSONField(null=True, blank=True, help_text="a dead letter's origin")
    sequence = models.BigIntegerField(default=0, help_text="epoch << 32 | counter: increasing within the partition")
    not_before = models.DateTimeField(null=True, blank=True)
    enqueued_at = models.DateTimeField()
    acked_at = models.DateTimeField(null=True, blank=True, help_text="empty: not (yet) acknowledged")
    archived_at = models.DateTimeField(default=timezone.now)
    replay_count = models.PositiveIntegerField(default=0)
    last_replayed_at = models.DateTimeField(null=True, blank=True)
    #: the stored record, byte for byte, only when the columns cannot hold it exactly (NUL).
    raw = models.BinaryField(null=True, blank=True, editable=False)

    class Meta:
        indexes = [
            models.Index(fields=["queue", "enqueued_at"], name="archive_queue_enqueued"),
            models.Index(fields=["queue", "acked_at"], name="archive_queue_acked"),
            models.Index(fields=["incarnation", "enqueued_at"], name="archive_incarnation_enqueued"),
        ]
        verbose_name = "archived message"
        permissions = [("replay_archivedmessage", "Can replay archived messages into their queue")]

    def __str__(self) -> str:
        return self.message_id

    @property
    def latency(self) -> float | None:
        """Seconds from enqueue to ack."""
        if self.acked_at is None:
            return None
        return (self.acked_at - self.enqueued_at).total_seconds()


class ArchiverLock(models.Model):
    """The per-queue lease that lets one archiver at a time work on a queue.

    Claimed by a conditional UPDATE (free, expired, or already ours), renewed between
    rounds, given back at the end. A holder whose lease ran out while it was paused may
    overlap the next one: the worst outcome is a message copied twice, which the unique
    ``message_id`` absorbs.
    """

    queue = models.CharField(max_length=80, primary_key=True)
    holder = models.CharField(max_length=200, blank=True)
    expires_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.queue}: {self.holder or 'free'}"
