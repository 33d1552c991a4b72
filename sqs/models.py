"""Access keys for SigV4, and what SQS knows about a queue that the service does not."""

from __future__ import annotations

import secrets
import string

from django.conf import settings
from django.db import models
from django.utils import timezone

_KEY_ALPHABET = string.ascii_uppercase + string.digits

#: the longest access key ID.
ACCESS_KEY_ID_MAX = 32

#: ``last_used_at`` is written at most this often per key (seconds): not one UPDATE per call.
LAST_USED_RESOLUTION = 60


class AccessKey(models.Model):
    """An access key pair of one user: the SQS API acts as that user.

    The secret is kept as given out (not hashed): SigV4 is an HMAC keyed by the secret, so the
    server must hold it to check a signature, as AWS does. It is shown once, when created.
    """

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="sqs_access_keys")
    access_key_id = models.CharField(max_length=ACCESS_KEY_ID_MAX, unique=True, editable=False)
    secret = models.CharField(max_length=64, editable=False)
    description = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    revoked_at = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return self.access_key_id

    @property
    def active(self) -> bool:
        return self.revoked_at is None

    @classmethod
    def issue(cls, user: object, description: str = "") -> AccessKey:
        """A new active key pair for ``user`` (ID ``AKMQ`` + 16 characters, 40-character secret)."""
        key_id = "AKMQ" + "".join(secrets.choice(_KEY_ALPHABET) for _ in range(16))
        secret = secrets.token_urlsafe(30)[:40]
        return cls.objects.create(user=user, access_key_id=key_id, secret=secret, description=description)

    def revoke(self) -> None:
        if self.revoked_at is None:
            self.revoked_at = timezone.now()
            self.save(update_fields=["revoked_at"])

    def touch(self) -> None:
        """Record a use (compare-and-set on the old value: concurrent calls write once)."""
        now = timezone.now()
        if self.last_used_at is None or (now - self.last_used_at).total_seconds() >= LAST_USED_RESOLUTION:
            AccessKey.objects.filter(pk=self.pk, last_used_at=self.last_used_at).update(last_used_at=now)
            self.last_used_at = now


class QueueSettings(models.Model):
    """The SQS attributes of a queue the service's ``Queue`` has no field for; one row per queue
    created or changed over the SQS API (absent: the SQS defaults). Deleted with its queue."""

    queue = models.OneToOneField("queues.Queue", on_delete=models.CASCADE, primary_key=True, related_name="sqs")
    #: ReceiveMessageWaitTimeSeconds: the long poll of a ReceiveMessage that names none.
    receive_wait = models.PositiveIntegerField(default=0)
    #: ContentBasedDeduplication (FIFO): the SHA-256 of the body is the dedup ID.
    content_based_dedup = models.BooleanField(default=False)
    #: TagQueue's tags.
    tags = models.JSONField(default=dict, blank=True)
    #: attributes kept as given and answered back, with no effect here (Policy, KmsMasterKeyId,
    #: RedriveAllowPolicy, DeduplicationScope, FifoThroughputLimit...).
    opaque = models.JSONField(default=dict, blank=True)
    modified_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = verbose_name_plural = "queue settings"

    def __str__(self) -> str:
        return f"SQS settings of queue {self.queue_id}"


class MoveTask(models.Model):
    """A message move task (StartMessageMoveTask) of a source queue, as ListMessageMoveTasks
    lists it: in the database, so that every process of a node (and every node) lists it, and a
    CancelMessageMoveTask that lands on any of them stops it. The process that runs it writes
    its progress and ``beat_at`` after every round and reads ``status`` between rounds: a
    cancel is ``CANCELLING`` until it sees it. The ``KEEP`` most recent of a source are kept;
    deleted with the source queue."""

    RUNNING, COMPLETED, CANCELLING, CANCELLED, FAILED = "RUNNING", "COMPLETED", "CANCELLING", "CANCELLED", "FAILED"
    #: tasks kept of each source queue (SQS lists at most 10).
    KEEP = 10

    handle = models.CharField(max_length=600, unique=True)
    queue = models.ForeignKey("queues.Queue", on_delete=models.CASCADE, related_name="sqs_move_tasks")
    source_arn = models.CharField(max_length=300)
    destination_arn = models.CharField(max_length=300, blank=True)
    status = models.CharField(max_length=10, default=RUNNING)
    moved = models.BigIntegerField(default=0)
    to_move = models.BigIntegerField(null=True, blank=True)
    #: MaxNumberOfMessagesPerSecond (None: as fast as the node moves them).
    rate = models.PositiveIntegerField(null=True, blank=True)
    failure_reason = models.CharField(max_length=300, blank=True)
    #: StartedTimestamp (epoch milliseconds).
    started_ms = models.BigIntegerField()
    #: the running process's last write.
    beat_at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [models.Index(fields=["queue", "-started_ms"], name="sqs_move_task_recent")]

    def __str__(self) -> str:
        return f"move task {self.pk} of queue {self.queue_id}: {self.status}"


class ReceiveAttempt(models.Model):
    """A FIFO queue's ReceiveMessage answer under its ``ReceiveRequestAttemptId``, so that the
    same attempt (the same user, queue and ID) within :attr:`WINDOW` seconds answers the same
    messages and receipt handles while they are in flight, whichever process or node it lands
    on. Deleted with its queue or user; rows past the window are deleted as new ones come."""

    #: SQS: "You can use ReceiveRequestAttemptId only for 5 minutes after a ReceiveMessage action."
    WINDOW = 300

    queue = models.ForeignKey("queues.Queue", on_delete=models.CASCADE, related_name="sqs_receive_attempts")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, null=True, related_name="+")
    attempt_id = models.CharField(max_length=128)
    #: the answer's messages, as answered (handles included).
    messages = models.JSONField(default=list)
    #: the receive's visibility timeout (seconds): a retry sets it again, as SQS does.
    visibility = models.PositiveIntegerField()
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["queue", "user", "attempt_id"], name="sqs_receive_attempt_once")]
        indexes = [models.Index(fields=["queue", "created_at"], name="sqs_receive_attempt_age")]

    def __str__(self) -> str:
        return f"receive attempt {self.attempt_id!r} on queue {self.queue_id}"
