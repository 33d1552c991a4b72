"""A process holds the SQS credentials stamp it read on a lease (``SQS_KEY_LEASE``), and a
change's announcement returns only once every lease on an older stamp has run out (``sqs.keys``).

Here one process plays both sides: "another process" is a stamp written and a row changed
without this process's own announcement (which would make it forget what it holds).
"""

from __future__ import annotations

import time
import uuid

import pytest
from django.contrib.auth.models import User

from queues import service as queues_service
from queues.access import SYSTEM
from sqs import keys, service
from sqs.models import AccessKey

pytestmark = pytest.mark.django_db


@pytest.fixture
def stamp_reads(monkeypatch):
    """The reads of the credentials stamp this process makes (kinds read, in order)."""
    reads: list[str] = []
    read = queues_service.credentials_stamp

    def counted(kind: str) -> bytes | None:
        reads.append(kind)
        return read(kind)

    monkeypatch.setattr(keys.service, "credentials_stamp", counted)
    keys.forget()
    yield reads
    keys.forget()


@pytest.fixture
def waits(monkeypatch):
    """The waits for the leases a committed change makes (seconds each, from when it is made)."""
    made: list[float] = []
    monkeypatch.setattr(keys, "_sleep_until", lambda until: made.append(until - time.monotonic()))
    return made


def _key() -> AccessKey:
    user = User.objects.create(username=f"lease-{uuid.uuid4().hex[:8]}")
    return service.issue_access_key(user, "test", caller=SYSTEM)


def test_calls_within_a_lease_read_the_stamp_once(settings, stamp_reads):
    # given a process whose lease is long, and a key
    settings.SQS_KEY_LEASE = 30
    key = _key()
    # when fifty calls name it
    found = [keys.active_key(key.access_key_id) for _ in range(50)]
    # then each found it, and the stamp was read once
    assert all(k is not None and k.pk == key.pk for k in found)
    assert stamp_reads == [keys.STAMP]


def test_without_a_lease_every_call_reads_the_stamp(settings, stamp_reads):
    settings.SQS_KEY_LEASE = 0
    key = _key()
    for _ in range(5):
        assert keys.active_key(key.access_key_id) is not None
    assert stamp_reads == [keys.STAMP] * 5


def test_a_key_revoked_elsewhere_is_refused_once_the_lease_on_the_old_stamp_runs_out(settings, stamp_reads):
    # given a process that holds a key under a short lease
    settings.SQS_KEY_LEASE = 0.2
    key = _key()
    assert keys.active_key(key.access_key_id) is not None
    # when another process revokes it: the row changed and a new stamp written (not announced
    # to this process, which forgets nothing)
    AccessKey.objects.filter(pk=key.pk).update(revoked_at=key.created_at)
    queues_service.announce_credentials_change(keys.STAMP)
    # then within the lease the key read before is trusted (which is why a change's
    # announcement waits the lease out), and once it has run out the new stamp is read and the
    # key refused
    assert keys.active_key(key.access_key_id) is not None
    time.sleep(keys.in_force_after())
    assert keys.active_key(key.access_key_id) is None
    assert len(stamp_reads) == 2


def test_a_committed_change_returns_once_the_leases_have_run_out(
    settings, waits, stamp_reads, django_capture_on_commit_callbacks
):
    # given processes that hold the stamp on leases of a second
    settings.SQS_KEY_LEASE = 1
    key = _key()
    # when a key is revoked
    with django_capture_on_commit_callbacks(execute=True):
        key.revoke()
    # then its announcement waited the lease and the margin for clock rates
    assert len(waits) == 1
    assert keys.in_force_after() - 0.05 <= waits[0] <= keys.in_force_after()
    assert keys.in_force_after() > 1


def test_a_bulk_revoke_waits_for_the_leases_once(settings, waits, django_capture_on_commit_callbacks):
    settings.SQS_KEY_LEASE = 1
    three = [_key() for _ in range(3)]
    # when three keys are revoked, each in its own transaction, within one bulk change
    with keys.changes_in_force_at_exit():
        for k in three:
            with django_capture_on_commit_callbacks(execute=True):
                service.revoke_access_key(k, caller=SYSTEM)
        assert waits == []
    # then the leases are waited for once, at its end, from the last announcement
    assert len(waits) == 1
    assert 0 < waits[0] <= keys.in_force_after()


def test_a_user_deleted_with_its_keys_announces_once(settings, waits, django_capture_on_commit_callbacks):
    settings.SQS_KEY_LEASE = 1
    key = _key()
    service.issue_access_key(key.user, "second", caller=SYSTEM)
    # when the user goes, and its two keys with it, in one transaction
    with django_capture_on_commit_callbacks(execute=True) as hooks:
        key.user.delete()
    # then one hook announced the change, and waited once
    assert len([h for h in hooks if h is keys._announce_committed]) == 1
    assert len(waits) == 1


def test_the_lease_is_bounded(settings):
    settings.SQS_KEY_LEASE = 3600
    assert keys.lease_seconds() == keys.MAX_LEASE
    settings.SQS_KEY_LEASE = -1
    assert keys.lease_seconds() == 0 and keys.in_force_after() == 0
