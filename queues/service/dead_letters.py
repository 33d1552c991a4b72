"""The dead-letter move: messages a partition set aside past ``max_receives`` go to the queue's
(or subscription's) dead-letter queue, each on its own, after the dequeue that set them aside."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime

from queues.cluster.long_polls import message_id
from queues.engine.config import QueueConfig
from queues.engine.ids import group_partition
from queues.engine.isotime import iso
from queues.engine.partition import Delivery
from queues.service.errors import InvalidRequest, NotServedHere, PartitionUnavailable, QueueNotFound, RemoteError
from queues.service.middleware import MIDDLEWARE
from queues.service.runtime import get_runtime
from queues.service.targets import queue_config
from queues.service.types import MessageDraft

log = logging.getLogger(__name__)

#: How dead letters are checked and stored: ``(queue, partition or None, drafts, now)``.
Store = Callable[[QueueConfig, int | None, list[MessageDraft], float], object]


def move_dead_letters(cfg: QueueConfig, sub: str, store: Store) -> None:
    """Move the messages this node set aside (past max_receives) to the dead-letter queue,
    each on its own.

    Each is stored there first, then removed from the source: a crash in between leaves a
    message in both queues (at least once), never in neither. One that cannot be moved (the
    dead-letter queue or the owner of its partition there refuses it, or no owner can be reached)
    is given back to the source, where the next dequeue sets it aside and tries again; it is
    counted (``mq_dead_letter_moves_failed``) and logged, and the others move on. After a failure
    that is not the message's own (a 5xx, an owner unreachable), the rest bound for the same
    partition of the dead-letter queue are given back untried, as are the rest of a failed
    one's group (kept in order): a dequeue never waits out one timeout per dead letter.

    ``store(dlq, index, drafts, now)``: the dead-letter queue's rules checked, then an
    enqueue's routing (the partition may be on another node), for the service itself.
    """
    rt = get_runtime()
    spec = cfg.subscription(sub) if sub else None
    dead_letter_queue = spec.dead_letter_queue if spec is not None else cfg.dead_letter_queue
    source = f"{cfg.name}/{sub}" if sub else cfg.name
    for m in rt.local_managers(cfg.name):
        dead = m.take_dead(sub)
        if not dead:
            continue
        try:
            if dead_letter_queue is None:
                raise NotServedHere("the queue no longer names a dead-letter queue")
            dlq = queue_config(dead_letter_queue)
            found = m.load_bodies([Delivery(mid, "", count) for mid, count in dead])
        except Exception as exc:  # noqa: BLE001 - none can move now: given back, tried again later
            _not_moved(source, dead_letter_queue, [mid for mid, _ in dead], exc)
            m.give_back_dead([mid for mid, _ in dead], sub)
            continue
        now = datetime.now(UTC).timestamp()
        moved: list[str] = []
        held: list[str] = []
        unreachable: set[int | None] = set()  # the dead-letter queue's partitions that failed
        failed_groups: set[str] = set()
        for d in found:
            msg = d.message
            assert msg is not None
            # In its group still: a strict dead-letter queue needs one, and its dead letters
            # keep their order there (and when redriven).
            index = group_partition(msg.group, dlq.partitions) if msg.group else None
            if index in unreachable or (msg.group is not None and msg.group in failed_groups):
                held.append(d.id)
                continue
            history = {
                "source": source,
                "id": d.id,
                "receive_count": d.receive_count,
                "group": msg.group,
                "enqueued_at": iso(msg.enqueued_at),
                "dead_lettered_at": iso(now),
            }
            draft = MessageDraft(
                msg.body,
                group=msg.group,
                attributes=msg.attributes,
                size=msg.size,
                estimates=msg.estimates,
                history=history,
                fairness_key=msg.fairness_key,
            )
            try:
                store(dlq, index, [draft], now)
            except Exception as exc:  # noqa: BLE001 - this one stays; the others move on
                _not_moved(source, dead_letter_queue, [d.id], exc)
                held.append(d.id)
                if msg.group is not None:
                    failed_groups.add(msg.group)
                if not _refused(exc):
                    unreachable.add(index)
                continue
            moved.append(d.id)
        if held:
            m.give_back_dead(held, sub)
        if not moved:
            continue
        try:
            m.remove_dead_lettered([message_id(mid) for mid in moved], sub)  # not archived
        except Exception:
            # Copied already: given back, a later move copies them again (at least once).
            log.exception("removing %d moved dead letters of %s", len(moved), source)
            m.give_back_dead(moved, sub)
            continue
        with m.lock:
            m.dead_lettered_total += len(moved)
        for hook in MIDDLEWARE.dead_letters:
            hook.after_dead_letters(source, moved=len(moved))


def _refused(exc: Exception) -> bool:
    """Whether a dead letter's move failed for the message itself (the dead-letter queue's
    rules, a 4xx of its owner), not for the way there."""
    return isinstance(exc, InvalidRequest) or (isinstance(exc, RemoteError) and exc.status < 500)


def _not_moved(source: str, dead_letter_queue: str | None, mids: list[str], exc: Exception) -> None:
    """Count and log dead letters of ``source`` (a queue, or ``topic/subscription``) that stay."""
    for hook in MIDDLEWARE.dead_letters:
        hook.after_dead_letters(source, failed=len(mids))
    expected = isinstance(exc, (InvalidRequest, RemoteError, PartitionUnavailable, QueueNotFound))
    log.warning(
        "%s: %d dead letter(s) not moved to %s, kept to try again (%s): %s",
        source,
        len(mids),
        dead_letter_queue,
        ", ".join(mids[:5]) + (" ..." if len(mids) > 5 else ""),
        exc if expected else repr(exc),
        exc_info=None if expected else exc,
    )
