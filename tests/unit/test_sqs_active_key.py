"""The key an SQS call names is read with a plain query, its last use with it, on either database.

SQLite answers a plain query's time without its zone (PostgreSQL with it): a key used once
before must still be usable, its last use compared with the time now.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from queues.access import SYSTEM
from sqs import keys, service
from sqs.keys import active_key
from sqs.models import LAST_USED_RESOLUTION, AccessKey

pytestmark = pytest.mark.django_db


def test_a_key_used_before_is_read_with_an_aware_last_use_and_touched_again():
    # given a key used once, longer ago than the resolution of its last use
    user = User.objects.create(username="shop-key-user")
    issued = service.issue_access_key(user, "test", caller=SYSTEM)
    first = active_key(issued.access_key_id)
    assert first is not None and first.last_used_at is None
    first.touch()
    earlier = timezone.now() - timedelta(seconds=LAST_USED_RESOLUTION + 5)
    AccessKey.objects.filter(pk=first.pk).update(last_used_at=earlier)
    keys.forget()  # (an update() announces no change: the key read above would be kept)

    # when a later call reads it and records its use
    again = active_key(issued.access_key_id)
    assert again is not None
    again.touch()

    # then its last use was read with its zone, and the new one is stored
    assert again.last_used_at is not None and again.last_used_at.tzinfo is not None
    stored = AccessKey.objects.get(pk=first.pk).last_used_at
    assert stored is not None and stored > earlier
