"""A process holds the SQS credentials stamp it read on a lease, the shorter of its own
(``SQS_KEY_LEASE``) and the one the stamp names, and a change's announcements wait until the
leases on the stamps they replaced have run out (``sqs.keys``).

Here one process plays every side: "another process" is a stamp written and a row changed
without this process's own announcement (which would make it forget what it holds), and the
clock is the test's (``keys._now``), moved by hand.
"""

from __future__ import annotations

import uuid

import pytest
from django.contrib.auth.models import User

from queues import service as queues_service
from queues.access import SYSTEM
from queues.kv import get_store
from sqs import keys, service
from sqs.models import AccessKey
from tests.stand_ins import Ticks

pytestmark = pytest.mark.django_db


@pytest.fixture
def clock(monkeypatch):
    c = Ticks()
    monkeypatch.setattr(keys, "_now", c)
    return c


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
def waits(monkeypatch, clock):
    """The waits a change makes for the leases (seconds each, on the test's clock)."""
    made: list[float] = []
    monkeypatch.setattr(keys, "_sleep_until", lambda until: made.append(round(until - clock.now, 6)))
    monkeypatch.setattr(keys._waits, "due", 0.0, raising=False)
    return made


def _key() -> AccessKey:
    user = User.objects.create(username=f"lease-{uuid.uuid4().hex[:8]}")
    return service.issue_access_key(user, "test", caller=SYSTEM)


def _written_by(lease: float) -> None:
    """A stamp written by a process whose lease is ``lease`` seconds (not this one's)."""
    queues_service.announce_credentials_change(keys.STAMP, b"v2 %d %s" % (lease * 1000, uuid.uuid4().hex.encode()))


def test_calls_within_a_lease_read_the_stamp_once(settings, clock, stamp_reads):
    # given a process whose lease is 5 s, a stamp that allows it, and a key
    settings.SQS_KEY_LEASE = 5
    _written_by(5)
    key = _key()
    # when fifty calls name it within 4.9 s
    found = []
    for _ in range(50):
        found.append(keys.active_key(key.access_key_id))
        clock.now += 4.9 / 50
    # then each found it, and the stamp was read once; past the lease, it is read again
    assert all(k is not None and k.pk == key.pk for k in found)
    assert stamp_reads == [keys.STAMP]
    clock.now += 0.2
    assert keys.active_key(key.access_key_id) is not None
    assert stamp_reads == [keys.STAMP] * 2


def test_a_lease_is_the_shorter_of_the_process_s_and_the_stamp_s(settings, clock, stamp_reads):
    settings.SQS_KEY_LEASE = 5
    _written_by(1)  # (a writer whose lease is 1 s waits only that long)
    key = _key()
    assert keys.active_key(key.access_key_id) is not None
    clock.now += 0.9
    assert keys.active_key(key.access_key_id) is not None and len(stamp_reads) == 1
    clock.now += 0.2
    assert keys.active_key(key.access_key_id) is not None and len(stamp_reads) == 2


@pytest.mark.parametrize("stamp", [None, "an earlier version's"])
def test_a_stamp_that_names_no_lease_is_read_every_call(settings, clock, stamp_reads, stamp):
    # given a store with no stamp yet, or one an earlier version wrote (random bytes: its
    # writer does not wait for leases)
    settings.SQS_KEY_LEASE = 5
    store_key = "sqs/credentials"
    if stamp is None:
        get_store().delete(store_key)
    else:
        queues_service.announce_credentials_change(keys.STAMP)
    key = _key()
    # when calls name a key: the first holds no lease
    assert keys.active_key(key.access_key_id) is not None
    assert keys.active_key(key.access_key_id) is not None
    if stamp is None:
        # then the first wrote a stamp that names this process's lease, which the second holds
        assert keys.stamp_lease(get_store().get("sqs/credentials")) == 5
        assert stamp_reads == [keys.STAMP] * 2
        keys.active_key(key.access_key_id)
        assert len(stamp_reads) == 2
    else:
        # then every call reads the stamp, and none overwrites it
        keys.active_key(key.access_key_id)
        assert stamp_reads == [keys.STAMP] * 3
        assert keys.stamp_lease(get_store().get("sqs/credentials")) == 0


def test_a_key_revoked_elsewhere_is_refused_once_the_lease_on_the_old_stamp_runs_out(settings, clock, stamp_reads):
    # given a process that holds a key under a lease of 2 s
    settings.SQS_KEY_LEASE = 2
    _written_by(2)
    key = _key()
    assert keys.active_key(key.access_key_id) is not None
    # when another process revokes it: the row changed and a new stamp written (not announced
    # to this process, which forgets nothing)
    AccessKey.objects.filter(pk=key.pk).update(revoked_at=key.created_at)
    _written_by(2)
    # then within the lease the key read before is trusted (which is why a change waits the
    # lease out), and once it has run out the new stamp is read and the key refused
    clock.now += 1.9
    assert keys.active_key(key.access_key_id) is not None
    clock.now += 0.2
    assert keys.active_key(key.access_key_id) is None
    assert len(stamp_reads) == 2


def test_a_committed_change_waits_for_the_longer_lease_it_replaced(
    settings, waits, stamp_reads, django_capture_on_commit_callbacks
):
    # given processes that hold the stamp on leases of 2 s (their writer's), and this process's
    # own lease of 0.25 s (a management command run without the nodes' settings)
    settings.SQS_KEY_LEASE = 0.25
    _written_by(2)
    key = _key()
    # when a key is revoked
    with django_capture_on_commit_callbacks(execute=True):
        key.revoke()
    # then its change waited for the 2 s leases (and the margin for clock rates), once
    assert waits == [keys.in_force_after(2)]
    assert keys.in_force_after(2) > 2
    # and the stamp it wrote names its own lease
    assert keys.stamp_lease(get_store().get("sqs/credentials")) == 0.25


def test_a_change_whose_last_announcement_fails_still_waits(
    settings, waits, monkeypatch, django_capture_on_commit_callbacks
):
    settings.SQS_KEY_LEASE = 1
    _written_by(1)
    key = _key()
    written: list[bytes | None] = []

    def announce(kind: str, stamp: bytes | None = None) -> None:
        written.append(stamp)
        if len(written) == 2:  # the one after the commit
            raise queues_service.Unavailable("the store is not answering")
        get_store().put("sqs/credentials", stamp or b"")

    monkeypatch.setattr(keys.service, "announce_credentials_change", announce)
    with django_capture_on_commit_callbacks(execute=True):
        key.revoke()
    # the leases on the stamp before the change (replaced before the write) are waited for
    assert len(written) == 2 and waits == [keys.in_force_after(1)]


def test_a_bulk_change_waits_for_the_leases_once(settings, waits, clock):
    settings.SQS_KEY_LEASE = 1
    _written_by(1)
    # when three changes commit within one bulk change, a second apart
    with keys.changes_in_force_at_exit():
        for _ in range(3):
            keys._announce_committed()
            clock.now += 1
        assert waits == []
    # then the leases are waited for once, at its end, until the last announcement's are over
    assert waits == [round(keys.in_force_after(1) - 1, 6)]


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
    assert keys.lease_seconds() == 0 and keys.in_force_after(0) == 0
    assert keys.stamp_lease(b"v2 250 " + b"0" * 32) == 0.25
    assert keys.stamp_lease(uuid.uuid4().bytes) == 0 and keys.stamp_lease(None) == 0
