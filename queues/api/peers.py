"""The service's calls to other nodes (``queues.service.peers.Peers``), over the REST API.

A forwarded call is the same REST call a client makes, authenticated as a cluster peer (signed
with the cluster secret by ``queues.peerauth``; never a user's token, never the secret itself),
naming the user it acts for (``X-MQ-On-Behalf-Of``: the peer checks that user's rights again)
and carrying its hop count, both covered by the signature; the answer is turned back
into the service's types, and a refusal into ``RemoteError`` (status and body, passed on as
they are by whoever called).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import orjson
import urllib3

from .. import peerauth
from ..access import Caller
from ..auth import on_behalf_value
from ..messages import MessageId, StoredMessage
from ..partition import Delivery
from ..router import MAX_HOPS
from ..service import AckResult, ExpireResult, MessageDraft, PeerUnreachable, RedriveResult, RemoteError

#: In a node's enqueue or ack call: check it, change nothing (``calls.check_only``).
CHECK_ONLY = "check_only"

#: Seconds a forwarded call may take (a long poll is never forwarded: its wait is 0 there).
TIMEOUT = 10.0


def draft_json(d: MessageDraft) -> dict[str, Any]:
    """A draft as the enqueue call's message object. ``delay: 0`` when it has no ``not_before``:
    the receiver must not apply its queue's default delay a second time."""
    item: dict[str, Any] = {"body": d.body}
    for key, value in (
        ("group", d.group),
        ("dedup_id", d.dedup_id),
        ("attributes", d.attributes),
        ("size", d.size),
        ("estimates", d.estimates),
        ("history", d.history),
        ("subscription", d.subscription),
    ):
        if value is not None:
            item[key] = value
    if d.not_before is not None:
        item["not_before"] = d.not_before
    else:
        item["delay"] = 0
    return item


def delivery_of(item: dict[str, Any]) -> Delivery:
    """A delivery from the dequeue call's answer (the inverse of ``calls.delivery_json``)."""
    enqueued_at = datetime.fromisoformat(item["enqueued_at"].replace("Z", "+00:00")).timestamp()
    message = StoredMessage(
        item["body"],
        enqueued_at,
        group=item.get("group"),
        sequence=item.get("sequence", 0),
        attributes=item.get("attributes") or None,
        size=item.get("size"),
        estimates=item.get("estimates"),
        history=item.get("history"),
    )
    return Delivery(item["id"], item["receipt"], item["receive_count"], message, bool(item.get("archived")))


class HttpPeers:
    def __init__(self) -> None:
        self.http = urllib3.PoolManager(num_pools=32, maxsize=16, retries=False)

    def post(
        self, address: str, path: str, payload: dict[str, Any], hops: int, caller: Caller | None
    ) -> tuple[int, dict[str, Any]]:
        """POST ``/api/v1/<path>`` at ``address`` for ``caller`` (None: the node's own call);
        its status and JSON answer."""
        full_path = f"/api/v1/{path}"
        data = orjson.dumps(payload)
        on_behalf = on_behalf_value(caller) if caller is not None else None
        headers = {
            "Content-Type": "application/json",
            **peerauth.sign("POST", full_path, data, hops + 1, on_behalf, to=address),
        }
        try:
            response = self.http.request(
                "POST",
                f"http://{address}{full_path}",
                body=data,
                headers=headers,
                timeout=urllib3.Timeout(connect=1.0, read=TIMEOUT),
            )
        except urllib3.exceptions.HTTPError as exc:  # refused, reset, timed out
            raise PeerUnreachable(f"node {address} did not answer ({type(exc).__name__}); retry") from exc
        try:
            body = orjson.loads(response.data) if response.data else {}
        except orjson.JSONDecodeError:
            body = {"error": "bad_gateway", "detail": f"{address} answered {response.status} without JSON"}
        return response.status, body

    def call(
        self,
        address: str,
        target: str,
        call: str,
        payload: dict[str, Any],
        hops: int,
        caller: Caller | None,
        ok: int = 200,
    ) -> Any:
        """A call on a queue or on a topic's subscription (``"topic/subscription"``)."""
        topic, slash, sub = target.partition("/")
        path = f"topics/{topic}/subscriptions/{sub}/{call}" if slash else f"queues/{target}/{call}"
        status, body = self.post(address, path, payload, hops, caller)
        if status != ok:
            raise RemoteError(status, body)
        return body

    def enqueue(self, address: str, queue: str, drafts: Sequence[MessageDraft], hops: int, caller: Caller) -> list[str]:
        payload = {"messages": [draft_json(d) for d in drafts]}
        body = self.call(address, queue, "enqueue", payload, hops, caller, ok=201)
        return body["ids"]

    def check_enqueue(
        self, address: str, queue: str, drafts: Sequence[MessageDraft], hops: int, caller: Caller
    ) -> None:
        payload = {"messages": [draft_json(d) for d in drafts], CHECK_ONLY: True}
        self.call(address, queue, "enqueue", payload, hops, caller)

    def dequeue(
        self, address: str, target: str, max_messages: int, visibility: float | None, hops: int, caller: Caller
    ) -> list[Delivery]:
        payload: dict[str, Any] = {"max": max_messages, "wait": 0}
        if visibility is not None:
            payload["visibility_timeout"] = visibility
        body = self.call(address, target, "dequeue", payload, hops, caller)
        return [delivery_of(item) for item in body.get("messages", ())]

    def ack(
        self, address: str, target: str, items: Sequence[tuple[MessageId, str | None]], hops: int, caller: Caller
    ) -> AckResult:
        payload = {"messages": [{"id": str(mid), "receipt": receipt} for mid, receipt in items]}
        body = self.call(address, target, "ack", payload, hops, caller)
        return AckResult(body.get("acked", 0), body.get("not_found", 0))

    def check_ack(
        self, address: str, target: str, items: Sequence[tuple[MessageId, str | None]], hops: int, caller: Caller
    ) -> None:
        payload = {"messages": [{"id": str(mid), "receipt": receipt} for mid, receipt in items], CHECK_ONLY: True}
        self.call(address, target, "ack", payload, hops, caller)

    def change_visibility(
        self, address: str, target: str, mid: MessageId, receipt: str | None, timeout: float, hops: int, caller: Caller
    ) -> None:
        payload = {"id": str(mid), "receipt": receipt, "visibility_timeout": timeout}
        self.call(address, target, "visibility", payload, hops, caller)

    def release_partition(self, address: str, queue: str, index: int, hops: int, caller: Caller) -> str:
        return self.call(address, queue, f"partitions/{index}/release", {}, hops, caller)["node"]

    def close_purged(self, address: str, queue: str) -> None:
        self.call(address, queue, "purge", {"close_only": True}, MAX_HOPS - 1, None)

    def refresh_topic(self, address: str, topic: str) -> None:
        self.call(address, topic, "refresh", {}, 1, None)

    def redrive(self, address: str, queue: str, max_messages: int, hops: int, caller: Caller) -> RedriveResult:
        body = self.call(address, queue, "redrive", {"max": max_messages}, hops, caller)
        return RedriveResult(body.get("moved", 0), body.get("skipped", 0), body.get("sources") or {})

    def expire(self, address: str, queue: str) -> ExpireResult:
        body = self.call(address, queue, "expire", {}, MAX_HOPS - 1, None)
        deferred = {int(k): v for k, v in (body.get("deferred") or {}).items()}
        return ExpireResult(body.get("expired", 0), body.get("archived", 0), deferred)
