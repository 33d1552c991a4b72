"""Bounds a node keeps per process, divided among its processes (``NODE_PROCESSES``)."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.test import override_settings

from queues.access import Caller
from queues.http.throttles import UserRate
from queues.service.messages import TooManyWaits, WaitSlots


def _rates(user: str):
    return override_settings(REST_FRAMEWORK={**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": {"user": user}})


@pytest.mark.parametrize("processes, allowed", [(0, 16), (1, 16), (2, 8), (3, 6)])
def test_a_users_long_polls_are_shared_among_the_processes(processes, allowed):
    caller = Caller(user_id=7, username="u")
    slots = WaitSlots()
    with override_settings(NODE_PROCESSES=processes, LONG_POLL_MAX_PER_USER=16, LONG_POLL_MAX_PER_NODE=100):
        held = [slots.slot(caller) for _ in range(allowed)]
        with pytest.raises(TooManyWaits):
            slots.slot(caller)
    for s in held:
        s.__exit__(None, None, None)
    assert slots.total == 0


_LOCAL = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}


@pytest.mark.parametrize("processes, allowed", [(0, 10), (1, 10), (2, 5), (4, 3)])
def test_a_rate_counted_per_process_is_shared_among_the_processes(processes, allowed):
    # the embedded cache (local memory) counts in each process alone; 0: not runnode's, one process
    with _rates("10/m"), override_settings(NODE_PROCESSES=processes, CACHES=_LOCAL):
        assert UserRate().num_requests == allowed


def test_a_rate_counted_in_a_shared_cache_is_not_divided():
    shared = {"default": {"BACKEND": "django.core.cache.backends.dummy.DummyCache"}}
    with _rates("10/m"), override_settings(NODE_PROCESSES=4, CACHES=shared):
        assert UserRate().num_requests == 10
