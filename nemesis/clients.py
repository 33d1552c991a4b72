"""The run's clients: producers and consumers over REST, the SDK and SQS (boto3), one thread
each, every call recorded in the history.

A client is one *process* of the history (Jepsen's word): it has one call open at a time. Each
call is recorded before it is sent (``invoke``) and when it ends: ``ok`` (the answer says it
happened), ``fail`` (it certainly did not: a 4xx, a refused connection, a dequeue that got no
answer) or ``info`` (unknown: a timeout, a 5xx to an enqueue or an ack, which may have taken
effect).

Producers send unique tokens as bodies (``<process>-<n>``), on the strict queue each in one of
the producer's own groups; consumers dequeue and acknowledge at once what they got. The run
tracks which confirmed tokens were delivered where (:class:`Ledger`), so that it knows when the
consumers have drained everything after the faults stop.
"""

from __future__ import annotations

import random
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import requests

from nemesis.history import Op, Recorder

#: Seconds a client waits for an answer before it counts the call unknown.
CALL_TIMEOUT = 8.0


@dataclass
class Ledger:
    """Confirmed tokens per stream (a queue, or ``topic/subscription``) and those delivered."""

    confirmed: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    delivered: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    lock: threading.Lock = field(default_factory=threading.Lock)

    def confirm(self, streams: Sequence[str], tokens: Sequence[str]) -> None:
        with self.lock:
            for stream in streams:
                self.confirmed[stream].update(tokens)

    def deliver(self, stream: str, tokens: Sequence[str]) -> None:
        with self.lock:
            self.delivered[stream].update(tokens)

    def missing(self) -> int:
        """Confirmed tokens not delivered yet, over every stream."""
        with self.lock:
            return sum(len(tokens - self.delivered[stream]) for stream, tokens in self.confirmed.items())

    def totals(self) -> dict[str, int]:
        with self.lock:
            return {
                "confirmed": sum(len(t) for t in self.confirmed.values()),
                "delivered": sum(len(t) for t in self.delivered.values()),
            }


@dataclass
class Context:
    """What every client shares: the history, the nodes' URLs, credentials and the run's flags."""

    recorder: Recorder
    urls: list[str]
    token: str
    access_key: tuple[str, str]
    ledger: Ledger
    visibility: int
    #: set when producers must stop (the faults are over: the consumers drain)
    stop_producing: threading.Event = field(default_factory=threading.Event)
    #: set when every client must stop
    stop: threading.Event = field(default_factory=threading.Event)
    #: seconds a producer sleeps between calls (its pace)
    pause: float = 0.02


def served(header: str | None) -> list[list[Any]] | None:
    """``X-MQ-Served-By`` (``node:queue/index:epoch, ...``) as ``[[node, partition, epoch], ...]``."""
    if not header:
        return None
    out: list[list[Any]] = []
    for item in header.split(","):
        node, _, rest = item.strip().partition(":")
        partition, _, epoch = rest.rpartition(":")
        if node and partition and epoch.isdigit():
            out.append([node, partition, int(epoch)])
    return out or None


class Client(threading.Thread):
    """One process of the history: a loop of calls until the run stops it."""

    protocol = "rest"
    #: whether it enqueues (it stops when the faults are over) or consumes (it drains)
    produces = False

    def __init__(self, ctx: Context, process: str, stream: str, home: int, seed: int) -> None:
        super().__init__(name=f"nemesis-{process}", daemon=True)
        self.ctx, self.process, self.stream = ctx, process, stream
        self.home = home % len(ctx.urls)
        self.rng = random.Random(seed)
        self.errors: list[str] = []

    def url(self) -> str:
        return self.ctx.urls[self.home]

    def next_node(self) -> None:
        """After a connection failure: the next node (the one called may be down)."""
        self.home = (self.home + 1) % len(self.ctx.urls)

    def run(self) -> None:
        try:
            self.loop()
        except Exception as exc:  # a bug of the run itself: reported by the run, not hidden
            self.errors.append(f"{type(exc).__name__}: {exc}")
            raise

    def loop(self) -> None:
        raise NotImplementedError


# ------------------------------------------------------------------------------------- REST


class Rest:
    """Calls to the REST API with a session of its own; answers as (status, json, headers)."""

    def __init__(self, ctx: Context) -> None:
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Token {ctx.token}"

    def post(self, url: str, body: dict[str, Any], timeout: float = CALL_TIMEOUT) -> tuple[int, Any, Mapping[str, str]]:
        """The answer's status, JSON (None if it has none) and headers (any case)."""
        response = self.session.post(url, json=body, timeout=timeout)
        try:
            payload = response.json()
        except ValueError:
            payload = None
        return response.status_code, payload, response.headers


def _path(stream: str, call: str) -> str:
    topic, slash, sub = stream.partition("/")
    if slash:
        return f"/api/v1/topics/{topic}/subscriptions/{sub}/{call}"
    return f"/api/v1/queues/{stream}/{call}"


def _http_outcome(status: int, f: str) -> str:
    """``ok``, ``fail`` or ``info`` for an HTTP status of a call ``f``."""
    if 200 <= status < 300:
        return "ok"
    if status >= 500 and f in ("enqueue", "publish", "ack"):
        return "info"  # it may have been stored, or acknowledged, before the failure
    return "fail"


class RestProducer(Client):
    """Enqueues (or publishes, on a topic) batches of 1 to ``batch`` tokens over REST; with
    ``fairness_keys``, each batch under one of them drawn at random (repeat a key to make it
    flood), so that a fair queue's lanes take turns under the faults."""

    produces = True

    def __init__(
        self,
        ctx: Context,
        process: str,
        stream: str,
        home: int,
        seed: int,
        *,
        groups: Sequence[str] = (),
        fanout: Sequence[str] = (),
        batch: int = 4,
        fairness_keys: Sequence[str] = (),
    ) -> None:
        super().__init__(ctx, process, stream, home, seed)
        self.groups, self.fanout, self.batch = list(groups), list(fanout), batch
        self.fairness_keys = list(fairness_keys)
        self.http = Rest(ctx)
        self.sent = 0

    def tokens(self) -> list[str]:
        n = self.rng.randint(1, self.batch)
        tokens = [f"{self.process}-{self.sent + i}" for i in range(n)]
        self.sent += n
        return tokens

    def loop(self) -> None:
        f = "publish" if self.fanout else "enqueue"
        path = f"/api/v1/topics/{self.stream}/publish" if self.fanout else f"/api/v1/queues/{self.stream}/enqueue"
        while not self.ctx.stop_producing.is_set():
            tokens = self.tokens()
            group = self.rng.choice(self.groups) if self.groups else None
            messages = [{"body": t, **({"group": group} if group else {})} for t in tokens]
            if self.fairness_keys:
                key = self.rng.choice(self.fairness_keys)
                for m in messages:
                    m["fairness_key"] = key
            invoked = self.ctx.recorder.invoke(
                self.process,
                "enqueue",
                queue=self.stream,
                group=group,
                value=tokens if len(tokens) > 1 else tokens[0],
                fanout=self.fanout or None,
            )
            self.call(invoked, f, path, messages, tokens)
            time.sleep(self.ctx.pause)

    def call(self, invoked: Op, f: str, path: str, messages: list[dict[str, Any]], tokens: list[str]) -> None:
        rec = self.ctx.recorder
        try:
            status, payload, headers = self.http.post(self.url() + path, {"messages": messages})
        except requests.ConnectionError as exc:
            self.next_node()
            rec.complete(invoked, "info", error=f"connection: {type(exc).__name__}")
            return
        except requests.Timeout:
            self.next_node()
            rec.complete(invoked, "info", error="timeout")
            return
        outcome = _http_outcome(status, f)
        ids = payload.get("ids") if outcome == "ok" and isinstance(payload, dict) else None
        rec.complete(
            invoked,
            outcome,  # type: ignore[arg-type]
            status=status,
            retry_after=headers.get("Retry-After"),
            ids=ids,
            served=served(headers.get("X-MQ-Served-By")),
            error=None if outcome == "ok" else _detail(payload),
        )
        if outcome == "ok":
            self.ctx.ledger.confirm(self.fanout or [self.stream], tokens)


def _detail(payload: Any) -> str | None:
    if isinstance(payload, dict):
        return str(payload.get("error") or payload.get("detail") or "")[:200] or None
    return None


class RestConsumer(Client):
    """Dequeues up to ``batch`` messages, then acknowledges them in one call."""

    def __init__(self, ctx: Context, process: str, stream: str, home: int, seed: int, *, batch: int = 10) -> None:
        super().__init__(ctx, process, stream, home, seed)
        self.batch = batch
        self.http = Rest(ctx)

    def loop(self) -> None:
        rec = self.ctx.recorder
        while not self.ctx.stop.is_set():
            invoked = rec.invoke(self.process, "dequeue", queue=self.stream)
            body = {"max": self.rng.randint(1, self.batch), "visibility_timeout": self.ctx.visibility, "wait": 1}
            try:
                status, payload, headers = self.http.post(self.url() + _path(self.stream, "dequeue"), body)
            except (requests.ConnectionError, requests.Timeout) as exc:
                self.next_node()
                rec.complete(invoked, "fail", error=f"no answer: {type(exc).__name__}")
                time.sleep(0.05)
                continue
            if not 200 <= status < 300:
                rec.complete(
                    invoked,
                    "fail",
                    status=status,
                    retry_after=headers.get("Retry-After"),
                    error=_detail(payload),
                )
                time.sleep(0.05)
                continue
            messages = payload.get("messages", []) if isinstance(payload, dict) else []
            deliveries = [{"id": m["id"], "value": m["body"], "group": m.get("group")} for m in messages]
            rec.complete(invoked, "ok", status=status, value=deliveries, served=served(headers.get("X-MQ-Served-By")))
            if not messages:
                continue
            self.ctx.ledger.deliver(self.stream, [m["body"] for m in messages])
            self.ack([{"id": m["id"], "receipt": m["receipt"]} for m in messages])

    def ack(self, items: list[dict[str, Any]]) -> None:
        rec = self.ctx.recorder
        invoked = rec.invoke(self.process, "ack", queue=self.stream, ids=[i["id"] for i in items])
        try:
            status, payload, headers = self.http.post(self.url() + _path(self.stream, "ack"), {"messages": items})
        except (requests.ConnectionError, requests.Timeout) as exc:
            self.next_node()
            rec.complete(invoked, "info", error=f"no answer: {type(exc).__name__}")
            return
        rec.complete(
            invoked,
            _http_outcome(status, "ack"),  # type: ignore[arg-type]
            status=status,
            retry_after=headers.get("Retry-After"),
            served=served(headers.get("X-MQ-Served-By")),
            error=None if 200 <= status < 300 else _detail(payload),
        )


# -------------------------------------------------------------------------------------- SDK


def _sdk(ctx: Context) -> Any:
    from mq_client import Client as Sdk

    # no retries of its own: each call the history records is one call the SDK made
    return Sdk(ctx.urls, ctx.token, timeout=CALL_TIMEOUT, retries=0)


def _sdk_outcome(exc: Any, f: str) -> tuple[str, int | None]:
    status = getattr(exc, "status", 0) or None
    if status is None:
        return ("info" if f in ("enqueue", "ack") else "fail"), None
    return _http_outcome(status, f), status


class SdkProducer(Client):
    """Enqueues one token at a time with the SDK (which sends a grouped message to its owner)."""

    protocol = "sdk"
    produces = True

    def __init__(
        self, ctx: Context, process: str, stream: str, home: int, seed: int, *, groups: Sequence[str] = ()
    ) -> None:
        super().__init__(ctx, process, stream, home, seed)
        self.groups = list(groups)
        self.sdk = _sdk(ctx)

    def loop(self) -> None:
        from mq_client.errors import ApiError

        rec, n = self.ctx.recorder, 0
        while not self.ctx.stop_producing.is_set():
            token, n = f"{self.process}-{n}", n + 1
            group = self.rng.choice(self.groups) if self.groups else None
            invoked = rec.invoke(self.process, "enqueue", queue=self.stream, group=group, value=token)
            try:
                mid = self.sdk.enqueue(self.stream, token, group=group)
            except ApiError as exc:
                outcome, status = _sdk_outcome(exc, "enqueue")
                rec.complete(invoked, outcome, status=_reported(status), error=str(exc)[:200])  # type: ignore[arg-type]
            else:
                rec.complete(invoked, "ok", ids=[mid])
                self.ctx.ledger.confirm([self.stream], [token])
            time.sleep(self.ctx.pause)


def _reported(status: int | None) -> int | None:
    """The SDK hides the answer's headers: a 503's ``Retry-After`` is checked on the REST and
    SQS clients' calls, so the SDK's calls report no 503 of their own."""
    return None if status == 503 else status


class SdkConsumer(Client):
    protocol = "sdk"

    def __init__(self, ctx: Context, process: str, stream: str, home: int, seed: int) -> None:
        super().__init__(ctx, process, stream, home, seed)
        self.sdk = _sdk(ctx)

    def loop(self) -> None:
        from mq_client.errors import ApiError

        rec = self.ctx.recorder
        while not self.ctx.stop.is_set():
            invoked = rec.invoke(self.process, "dequeue", queue=self.stream)
            try:
                messages = self.sdk.dequeue(self.stream, 5, visibility_timeout=self.ctx.visibility, wait=1)
            except ApiError as exc:
                _, status = _sdk_outcome(exc, "dequeue")
                rec.complete(invoked, "fail", status=_reported(status), error=str(exc)[:200])
                time.sleep(0.05)
                continue
            rec.complete(invoked, "ok", value=[{"id": m.id, "value": m.body, "group": m.group} for m in messages])
            if not messages:
                continue
            self.ctx.ledger.deliver(self.stream, [m.body for m in messages])
            invoked = rec.invoke(self.process, "ack", queue=self.stream, ids=[m.id for m in messages])
            try:
                self.sdk.ack(self.stream, messages)
            except ApiError as exc:
                # Unknown whatever the status: the SDK sends an ack to the owner, and after a 5xx
                # there (which may have acknowledged part of it) tries again round robin, where
                # what was acknowledged is refused as not in flight (409). Seen under a Redis
                # Cluster primary's restart (seed 21, --kv redis-cluster).
                _, status = _sdk_outcome(exc, "ack")
                rec.complete(invoked, "info", status=_reported(status), error=str(exc)[:200])
            else:
                rec.complete(invoked, "ok")


# -------------------------------------------------------------------------------------- SQS


def _sqs(ctx: Context, url: str) -> Any:
    import boto3
    from botocore.config import Config

    key_id, secret = ctx.access_key
    return boto3.client(
        "sqs",
        endpoint_url=f"{url}/sqs",
        region_name="eu-west-1",
        aws_access_key_id=key_id,
        aws_secret_access_key=secret,
        config=Config(
            retries={"max_attempts": 1}, connect_timeout=2, read_timeout=CALL_TIMEOUT, max_pool_connections=2
        ),
    )


def _sqs_answer(meta: dict[str, Any]) -> tuple[int | None, str | None, list[list[Any]] | None]:
    headers = meta.get("HTTPHeaders", {})
    return meta.get("HTTPStatusCode"), headers.get("retry-after"), served(headers.get("x-mq-served-by"))


class SqsClient(Client):
    """SQS over boto3 on a plain queue: a producer (``SendMessage``) or a consumer
    (``ReceiveMessage`` then ``DeleteMessageBatch``)."""

    protocol = "sqs"

    def __init__(self, ctx: Context, process: str, stream: str, home: int, seed: int, *, produce: bool) -> None:
        super().__init__(ctx, process, stream, home, seed)
        self.produce = self.produces = produce
        self._clients: dict[str, Any] = {}

    def client(self) -> Any:
        url = self.url()
        if url not in self._clients:
            self._clients[url] = _sqs(self.ctx, url)
        return self._clients[url]

    def queue_url(self) -> str:
        return f"{self.url()}/sqs/eu-west-1/000000000000/{self.stream}"  # (only the name counts)

    def service_id(self, message_id: str) -> str:
        """The REST API's spelling of an SQS ``MessageId`` (``<block>-<partition>-<index>``), so
        that the checker sees one ID whichever API delivered or acknowledged the message."""
        block, partition, index = message_id.rsplit("-", 2)
        return f"{self.stream}/{partition}/{block}/{index}"

    def loop(self) -> None:
        step: Callable[[], None] = self.send if self.produce else self.receive
        n = 0
        while not (self.ctx.stop_producing if self.produce else self.ctx.stop).is_set():
            step()
            n += 1
            if self.produce:
                time.sleep(self.ctx.pause)

    def _call(self, invoked: Op, f: str, method: str, **kwargs: Any) -> dict[str, Any] | None:
        """The call's answer, or None (recorded as failed or unknown)."""
        from botocore.exceptions import BotoCoreError, ClientError

        rec = self.ctx.recorder
        try:
            return dict(getattr(self.client(), method)(**kwargs))
        except ClientError as exc:
            status, retry_after, _ = _sqs_answer(exc.response.get("ResponseMetadata", {}))
            outcome = _http_outcome(status or 0, f) if status else "info"
            rec.complete(
                invoked,
                outcome,  # type: ignore[arg-type]
                status=status,
                retry_after=retry_after,
                error=str(exc.response.get("Error", {}).get("Code")),
            )
        except BotoCoreError as exc:  # no answer: refused, reset, timed out
            self.next_node()
            rec.complete(invoked, "fail" if f == "dequeue" else "info", error=type(exc).__name__)
        return None

    def send(self) -> None:
        token = f"{self.process}-{self.rng.getrandbits(48):012x}"
        invoked = self.ctx.recorder.invoke(self.process, "enqueue", queue=self.stream, value=token)
        answer = self._call(invoked, "enqueue", "send_message", QueueUrl=self.queue_url(), MessageBody=token)
        if answer is None:
            return
        status, _, by = _sqs_answer(answer.get("ResponseMetadata", {}))
        self.ctx.recorder.complete(invoked, "ok", status=status, ids=[self.service_id(answer["MessageId"])], served=by)
        self.ctx.ledger.confirm([self.stream], [token])

    def receive(self) -> None:
        rec = self.ctx.recorder
        invoked = rec.invoke(self.process, "dequeue", queue=self.stream)
        answer = self._call(
            invoked,
            "dequeue",
            "receive_message",
            QueueUrl=self.queue_url(),
            MaxNumberOfMessages=self.rng.randint(1, 10),
            VisibilityTimeout=int(self.ctx.visibility),
            WaitTimeSeconds=1,
        )
        if answer is None:
            time.sleep(0.05)
            return
        messages = answer.get("Messages", [])
        status, _, by = _sqs_answer(answer.get("ResponseMetadata", {}))
        rec.complete(
            invoked,
            "ok",
            status=status,
            value=[{"id": self.service_id(m["MessageId"]), "value": m["Body"], "group": None} for m in messages],
            served=by,
        )
        if not messages:
            return
        self.ctx.ledger.deliver(self.stream, [m["Body"] for m in messages])
        ids = [self.service_id(m["MessageId"]) for m in messages]
        invoked = rec.invoke(self.process, "ack", queue=self.stream, ids=ids)
        entries = [{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)]
        answer = self._call(invoked, "ack", "delete_message_batch", QueueUrl=self.queue_url(), Entries=entries)
        if answer is None:
            return
        status, _, by = _sqs_answer(answer.get("ResponseMetadata", {}))
        failed = answer.get("Failed", [])
        if failed:
            # a partial batch: some were deleted, some not; which is known, but one call records
            # one outcome, so it counts as unknown (an ack that may have taken effect)
            rec.complete(invoked, "info", status=status, served=by, error=f"{len(failed)} of {len(ids)} failed")
        else:
            rec.complete(invoked, "ok", status=status, served=by)
