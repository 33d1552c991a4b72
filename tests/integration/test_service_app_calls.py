"""The service functions the apps call instead of the core's models and store
(``queues.service.rows``, ``journal``, the credentials stamp): what they read, lock, record and
refuse."""

from __future__ import annotations

import threading
import uuid

import pytest
from django.contrib.auth.models import User
from django.db import DatabaseError, connection

from queues import service
from queues.access import SYSTEM, Caller, Forbidden
from queues.engine.ids import parse_message_id
from queues.models import AuditEntry, Partition, Queue
from queues.service import journal, rows
from queues.service.types import MessageDraft


def _caller(name: str = "") -> Caller:
    return Caller.of(User.objects.create(username=name or f"c-{uuid.uuid4().hex[:8]}"))


@pytest.fixture
def owner(db) -> Caller:
    return _caller()


@pytest.fixture
def queue(runtime, owner, unique_name, purge_kv) -> Queue:
    return service.create_queue(name=unique_name(), partitions=2, caller=owner)


# --- reads --------------------------------------------------------------------------------------
def test_queue_fields_and_name_read_the_row_now(queue):
    assert rows.queue_fields(queue.name, "visibility_timeout", "partitions") == (queue.visibility_timeout, 2)
    assert rows.queue_fields(f"{queue.name}-none", "partitions") is None
    assert rows.queue_name(queue.pk) == queue.name
    Queue.objects.filter(pk=queue.pk).update(visibility_timeout=7)
    assert rows.queue_fields(queue.name, "visibility_timeout") == (7,)


def test_depth_and_served_partitions_as_the_owners_published_them(queue, runtime):
    # given one partition with 3 messages and an owner, the other empty
    Partition.objects.filter(queue=queue, index=1).update(depth=3)
    Partition.objects.filter(queue=queue, index=0).update(depth=0)
    # then
    assert rows.total_depth([queue.name, "no-such-queue"]) == 3
    assert rows.total_depth([]) == 0
    served = rows.served_partitions([queue.name])
    owner = Partition.objects.get(queue=queue, index=1).owner
    assert owner is not None
    assert served == [rows.ServedPartition(queue.name, 1, owner.address, 3)]
    # and a partition without an owner is not served
    Partition.objects.filter(queue=queue, index=1).update(owner=None)
    assert rows.served_partitions([queue.name]) == []


def test_partition_row_id_is_of_the_incarnation_not_the_name(queue, owner):
    pk = Partition.objects.get(queue=queue, index=1).pk
    assert rows.partition_row_id(queue.pk, 1) == pk
    assert rows.partition_row_id(queue.pk, 2) is None
    service.delete_queue(queue, caller=owner)
    again = service.create_queue(name=queue.name, partitions=2, caller=owner)
    assert rows.partition_row_id(queue.pk, 1) is None
    assert rows.partition_row_id(again.pk, 1) not in (None, pk)


# --- rights -------------------------------------------------------------------------------------
def test_require_on_queue_by_name_and_for_a_name_that_is_gone(queue, owner):
    stranger = _caller()
    rows.require_on_queue(owner, "read", queue.name)
    with pytest.raises(service.QueueNotFound):
        rows.require_on_queue(stranger, "read", queue.name)
    service.grant(caller=owner, action="read", user=User.objects.get(username=stranger.username), queue=queue)
    rows.require_on_queue(stranger, "read", queue.name)
    with pytest.raises(Forbidden):
        rows.require_on_queue(stranger, "manage", queue.name)
    # a name that is gone: the unrestricted only
    rows.require_on_queue(SYSTEM, "read", "gone-queue")
    with pytest.raises(service.QueueNotFound):
        rows.require_on_queue(owner, "read", "gone-queue")


def test_require_on_incarnations_checks_each_row_in_order(queue, owner):
    stranger = _caller()
    rows.require_on_incarnations(owner, "read", [(queue.pk, queue.name), (queue.pk, queue.name)])
    rows.require_on_incarnations(stranger, "read", [])
    with pytest.raises(service.QueueNotFound) as refused:
        rows.require_on_incarnations(owner, "read", [(queue.pk, queue.name), (None, "older")])
    assert "older" in str(refused.value)
    with pytest.raises(service.QueueNotFound):
        rows.require_on_incarnations(stranger, "read", [(queue.pk, queue.name)])
    rows.require_on_incarnations(SYSTEM, "read", [(None, "older"), (queue.pk + 1000, "deleted")])


# --- a queue's job: its lock and its audit record ---------------------------------------------------
def test_start_queue_job_records_the_start_in_the_same_transaction(queue, owner):
    # when a job starts
    job = rows.start_queue_job(queue, caller=owner, action="move_start", start=lambda: ("job-1", {"task": 1}))
    # then it is returned and its start recorded on the queue, as the caller
    assert job == "job-1"
    entry = AuditEntry.objects.filter(target=queue.name, action="move_start").get()
    assert (entry.actor, entry.detail) == (owner.username, {"task": 1})

    # when a start refuses, nothing of it stays
    def refuse():
        Queue.objects.filter(pk=queue.pk).update(visibility_timeout=99)
        raise service.Conflict("a job of this queue is running", "running")

    with pytest.raises(service.Conflict):
        rows.start_queue_job(queue, caller=owner, action="move_start", start=refuse)
    assert AuditEntry.objects.filter(target=queue.name, action="move_start").count() == 1
    assert Queue.objects.get(pk=queue.pk).visibility_timeout != 99


def test_start_queue_job_on_a_queue_gone(queue, owner):
    service.delete_queue(queue, caller=owner)
    with pytest.raises(service.QueueNotFound):
        rows.start_queue_job(queue, caller=owner, action="move_start", start=lambda: (None, {}))


@pytest.mark.django_db(transaction=True)
def test_start_queue_job_holds_the_queue_row_while_it_starts(runtime, unique_name):
    if connection.vendor != "postgresql":
        pytest.skip("SELECT FOR UPDATE NOWAIT: PostgreSQL")
    owner = _caller()
    q = service.create_queue(name=unique_name(), partitions=1, caller=owner)
    seen: list[str] = []
    base = connection  # (this thread's: the test database)

    def other_start() -> None:
        # another process's start, while the first one's is inside: the row is held
        try:
            other = base.copy()
            try:
                with other.cursor() as cursor:
                    cursor.execute("BEGIN")
                    cursor.execute("SELECT id FROM queues_queue WHERE id = %s FOR UPDATE NOWAIT", [q.pk])
                    cursor.execute("ROLLBACK")
                seen.append("free")
            finally:
                other.close()
        except DatabaseError:
            seen.append("held")

    def start():
        t = threading.Thread(target=other_start)
        t.start()
        t.join(10)
        return "job", {}

    try:
        rows.start_queue_job(q, caller=owner, action="move_start", start=start)
        assert seen == ["held"]
        # and once it has started, the row is free again
        other_start()
        assert seen == ["held", "free"]
    finally:
        service.delete_queue(q, caller=owner)


# --- the credentials stamp -----------------------------------------------------------------------
def test_a_change_announced_is_a_new_stamp_for_every_process(runtime):
    before = service.credentials_stamp("sqs")
    service.announce_credentials_change("sqs")
    first = service.credentials_stamp("sqs")
    service.announce_credentials_change("sqs")
    assert first is not None and first != before
    assert service.credentials_stamp("sqs") not in (first, None)
    # each kind has its own
    assert service.credentials_stamp(f"other-{uuid.uuid4().hex[:6]}") is None


# --- the archive journal ----------------------------------------------------------------------------
def test_the_journal_is_read_in_batches_and_dropped_as_read(runtime, owner, unique_name, purge_kv):
    # given a queue that journals every message, 3 messages in its one partition, one acked
    q = service.create_queue(name=unique_name(), partitions=1, archive="all", caller=owner)
    ids = service.enqueue(q.name, [MessageDraft(f"m{i}") for i in range(3)], caller=owner)
    [d] = service.dequeue(q.name, caller=owner, max_messages=1)
    mid = parse_message_id(d.id)
    assert mid is not None
    service.ack(q.name, [(mid, d.receipt)], caller=owner)
    found = journal.journal_queues(q.name)
    assert found == [journal.JournalQueue(q.name, q.pk, 1, "all")]
    assert journal.journal_holds(found[0])
    # when the archiver reads a batch of two
    first = journal.read_journal(q.name, 0, incarnation=q.pk, batch=2)
    # then it gets the two oldest entries with their stored records, and the ack of the first
    assert first is not None and first.more
    assert [m for m, _ in first.entries] == sorted(str(i) for i in ids)[:2]
    assert [m for m, _ in first.acks] == [d.id]
    assert float(first.acks[0][1]) > 0
    assert len(first.names) == 3
    # when it drops them, the next read gets the rest, and then nothing
    journal.drop_journal(q.name, 0, first.names, incarnation=q.pk)
    rest = journal.read_journal(q.name, 0, incarnation=q.pk, batch=2)
    assert rest is not None and not rest.more and len(rest.entries) == 1
    journal.drop_journal(q.name, 0, rest.names, incarnation=q.pk)
    assert journal.read_journal(q.name, 0, incarnation=q.pk, batch=2) is None
    assert not journal.journal_holds(found[0])
    # and another incarnation's journal is not this one's
    assert journal.read_journal(q.name, 0, incarnation=q.pk + 1000, batch=2) is None
