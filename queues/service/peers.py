"""Calls to other nodes, in the service's own types.

The service decides *where* a call must run (the router knows the partitions' owners); how it
travels is the API's business: ``queues.api.peers.HttpPeers`` implements this protocol over the
REST API and is installed when the app starts (``QueuesConfig.ready``). A peer's refusal comes
back as the exception the peer raised (``RemoteError`` carries a peer's answer that has no type
of ours, to be passed on as it is).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from queues.access import Caller
from queues.engine.ids import MessageId
from queues.engine.partition import BlockListing, Delivery
from queues.errors import PeerUnreachable, RemoteError
from queues.service.types import AckResult, ExpireResult, MessageDraft, RedriveResult

__all__ = ["PeerUnreachable", "Peers", "RemoteError", "get_peers", "set_peers"]


class Peers(Protocol):
    """One method per call a node makes of another. ``hops``: how often the call has been
    forwarded so far (the peer answers where it is past ``router.MAX_HOPS``).

    ``caller``: who the call is made for; the peer acts as that user (``access.SYSTEM``: the
    service's own work) and checks its rights again, so a forwarded call never has more rights
    than its user. The node-only calls (``close_purged``, ``reload``, ``expire``) are the
    node's own and carry no caller.
    """

    def enqueue(
        self, address: str, queue: str, drafts: Sequence[MessageDraft], hops: int, caller: Caller
    ) -> list[str]: ...

    def check_enqueue(
        self, address: str, queue: str, drafts: Sequence[MessageDraft], hops: int, caller: Caller
    ) -> None: ...

    def dequeue(
        self, address: str, target: str, max_messages: int, visibility_timeout: float | None, hops: int, caller: Caller
    ) -> list[Delivery]: ...

    def ack(
        self,
        address: str,
        target: str,
        items: Sequence[tuple[MessageId, str | None]],
        hops: int,
        caller: Caller,
        *,
        unexpired: bool = False,
    ) -> AckResult: ...

    def check_ack(
        self,
        address: str,
        target: str,
        items: Sequence[tuple[MessageId, str | None]],
        hops: int,
        caller: Caller,
        *,
        unexpired: bool = False,
    ) -> None: ...

    def change_visibility(
        self,
        address: str,
        target: str,
        mid: MessageId,
        receipt: str | None,
        visibility_timeout: float,
        hops: int,
        caller: Caller,
    ) -> None: ...

    def release_partition(self, address: str, queue: str, index: int, hops: int, caller: Caller) -> str: ...

    def block_messages(
        self, address: str, queue: str, index: int, block: str, limit: int, hops: int, caller: Caller
    ) -> BlockListing: ...

    def redrive(self, address: str, queue: str, max_messages: int, hops: int, caller: Caller) -> RedriveResult: ...

    def close_purged(self, address: str, queue: str) -> None: ...

    def reload(self, address: str, name: str) -> None: ...

    def expire(self, address: str, queue: str) -> ExpireResult: ...


_peers: Peers | None = None


def set_peers(peers: Peers | None) -> None:
    global _peers
    _peers = peers


def get_peers() -> Peers:
    if _peers is None:
        raise RuntimeError("no transport to other nodes is installed (queues.apps installs the HTTP one)")
    return _peers
