"""The group hash is computed twice: by the core when it places an enqueued message
(``queues.engine.ids.group_partition``) and by the SDK when it sends a group's messages straight
to their partition's owner (``mq_client.group_partition``). They must agree for every group
and partition count, or the SDK's direct sends land on the wrong partition and a group's order
is lost; and they must not change between releases, or stored groups move."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mq_client import group_partition as sdk_group_partition
from queues.engine.ids import group_partition as core_group_partition


@given(group=st.text(max_size=200), partitions=st.integers(min_value=1, max_value=256))
def test_the_sdk_and_the_core_put_every_group_on_the_same_partition(group, partitions):
    placed = core_group_partition(group, partitions)
    assert sdk_group_partition(group, partitions) == placed
    assert 0 <= placed < partitions


@pytest.mark.parametrize(
    ("group", "partitions", "expected"),
    [("order-42", 6, 5), ("", 1, 0), ("customer/7", 64, 34), ("é", 1000, 743), ("g0", 6, 2)],
)
def test_the_group_hash_does_not_change_between_releases(group, partitions, expected):
    # Values computed once (blake2b, 8 bytes, big-endian, modulo): a change here moves the
    # groups of every stored message to other partitions.
    assert core_group_partition(group, partitions) == expected
    assert sdk_group_partition(group, partitions) == expected
