"""Calls made for a user by a process that is not a node: the workers app's relays send what
a user enqueued and its own process did not send (an enqueue left after its transaction's
commit, a task held until it is due).

Such a process holds no credential of the user (none is stored for it) and runs no node
runtime (it must not start one). It acts for the user as a node forwarding a call does: it
reads the user and the user's grants now, from the database (not from the caches a node
trusts for a few seconds), checks the queue's rules, and has a live node store the messages
with a call signed for that user (``queues.cluster.peerauth``), where the user's rights are
checked once more. A user deleted or deactivated, or without ``produce`` on the queue, is
refused here: the call is never made with the rights of the process that makes it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from django.contrib.auth import get_user_model

from queues.access import Caller, Forbidden, audit, granted_now
from queues.cluster import catalog, clock
from queues.engine.config import QueueConfig
from queues.engine.ids import group_partition
from queues.models import Node, Partition
from queues.service.errors import NoActiveUser, PartitionUnavailable, QueueNotFound
from queues.service.messages import check_drafts
from queues.service.overview import alive_cutoff
from queues.service.peers import PeerUnreachable, get_peers
from queues.service.targets import checked_name
from queues.service.types import MessageDraft

log = logging.getLogger(__name__)


def acting_user(user_id: int) -> Caller:
    """The caller user ``user_id`` is now, read from the database (its groups, superuser flag).
    Raises NoActiveUser (deleted, or deactivated)."""
    user = get_user_model().objects.filter(pk=user_id).first()
    if user is None:
        raise NoActiveUser(f"user {user_id} no longer exists")
    if not user.is_active:
        raise NoActiveUser(f"user {user.get_username()!r} (id {user_id}) is deactivated")
    return Caller.of(user)


def producer_config(queue: str, *, caller: Caller) -> QueueConfig:
    """The description of ``queue``, read from its row now, once ``caller`` may ``produce`` to
    it by the user and grants read now (``access.granted_now``). Raises QueueNotFound (no such
    queue), ``access.Forbidden`` (the caller lacks ``produce``, or may not even read it: the
    process that asks is trusted with the name)."""
    cfg = catalog.load(checked_name(queue)).get(queue)
    if cfg is None:
        raise QueueNotFound(queue)
    if "produce" not in granted_now(caller, cfg.id, cfg.name, cfg.created_by):
        raise Forbidden(caller, "produce", cfg.name)
    return cfg


def enqueue_through_node(
    cfg: QueueConfig, drafts: Sequence[MessageDraft], *, caller: Caller, detail: Mapping[str, Any]
) -> list[str]:
    """Store ``drafts`` in queue ``cfg`` through a live node, for ``caller`` (a call signed for
    it: the node checks its rights and the queue's rules again, and keeps each ``dedup_id``);
    the messages' IDs. Recorded in the audit trail as ``relayed`` by ``caller``, with
    ``detail``. Check the caller first (:func:`producer_config`): this checks the queue's rules
    only, and the node, whose caches may be a few seconds old, the rights.

    The node asked first is the owner of the first grouped message's partition, then the other
    owners of the queue's partitions, then any live node: each forwards what it does not own.
    Another node is asked only when one refused the connection (the call never reached it).
    Raises InvalidRequest (the queue's rules), RemoteError (a node's answer), PeerUnreachable (a node that may have stored the messages did not
    answer: send again with the same ``dedup_id``), PartitionUnavailable (no live node).
    """
    check_drafts(cfg, drafts)
    for address in _nodes_for(cfg, drafts):
        try:
            ids = get_peers().enqueue(address, cfg.name, drafts, 0, caller)
        except PeerUnreachable as exc:
            if not exc.refused:
                raise
            log.info("enqueue for %s to %s: %s refused the connection, trying another node", caller, cfg.name, address)
            continue
        audit.record(caller, "relayed", cfg.name, messages=len(drafts), **detail)
        return ids
    raise PartitionUnavailable(f"no live node took the enqueue to {cfg.name}: retry later")


def _nodes_for(cfg: QueueConfig, drafts: Sequence[MessageDraft]) -> list[str]:
    """The addresses of the live nodes to ask, best first (see :func:`enqueue_through_node`)."""
    live = Node.objects.filter(stopped_at=None, heartbeat_at__gte=alive_cutoff(clock.now()))
    owners = dict(
        Partition.objects.filter(queue_id=cfg.id, owner__in=live)
        .values_list("index", "owner__address")
        .order_by("index")
    )
    first = next((d.group for d in drafts if d.group), None)
    preferred = owners.get(group_partition(first, cfg.partitions)) if first else None
    addresses = [preferred] if preferred else []
    for address in [*owners.values(), *live.order_by("-heartbeat_at").values_list("address", flat=True)]:
        if address not in addresses:
            addresses.append(address)
    return addresses
