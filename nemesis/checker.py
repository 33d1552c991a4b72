"""The checker: reads a whole history (``nemesis.history``) after the run, says what broke.

What must never happen, each counted with its first examples (``ANOMALIES``):

- ``lost``: an enqueue answered ``ok`` whose message was never delivered (on each subscription
  it had to reach);
- ``unexpected``: a delivery of a message nobody enqueued, or whose enqueue certainly failed;
- ``group_order``: within a message group, a message delivered while an earlier one of the group
  was not yet acknowledged (earlier: its enqueue was answered before the later one's was sent;
  in a batch, earlier in the batch); on a queue with ``group_batch``, an earlier one delivered
  before it in the same answer is in order;
- ``overlapping_owners``: two nodes serving one partition at overlapping times (a killed node
  serves nothing from its kill on, a paused one nothing while paused);
- ``stale_epoch``: an operation answered ``ok`` by an owner whose epoch had been superseded (a
  newer epoch served) before the call was even sent;
- ``server_error``: a 5xx other than 503; ``unavailable_without_retry_after``: a 503 without
  ``Retry-After``.

What is allowed and counted, by the fault active when it was answered (``"kill"``,
``"kill+redis-pause"`` when two were on, ``"none"``): duplicates (each delivery of a message after
its first) and deliveries after an ack (the dequeue was sent after an ack of the message had been
answered ``ok``; such a delivery is a duplicate too).

Unknown outcomes (``info``), as Jepsen counts them: an unknown enqueue is neither lost if never
delivered nor unexpected if delivered (then it is ``recovered``); an unknown ack may have taken
effect any time after it was sent; an unknown dequeue delivered nothing the checker knows of.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter, defaultdict
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any

from nemesis.history import FaultEvent, History, HistoryError, NodeEvent, Operation

#: What must be 0 in a valid run.
ANOMALIES = (
    "lost",
    "unexpected",
    "group_order",
    "overlapping_owners",
    "stale_epoch",
    "server_error",
    "unavailable_without_retry_after",
)
#: How many examples of each anomaly the result keeps (the counts are complete).
EXAMPLES = 3
#: The fault key of what happened while no fault was on.
NO_FAULT = "none"
#: Fault kinds that end a node's process (it serves nothing from then on) and that stop it (it
#: serves nothing while stopped); their ``target`` is the node's name.
KILL_FAULTS = frozenset({"kill"})
PAUSE_FAULTS = frozenset({"pause"})

NEVER = float("inf")


@dataclass
class Result:
    """The checker's verdict: ``valid`` when every anomaly count is 0."""

    #: each of ``ANOMALIES``: how many times it happened
    anomalies: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ANOMALIES, 0))
    #: each of ``ANOMALIES``: its first ``EXAMPLES`` occurrences, with what shows it
    examples: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: {a: [] for a in ANOMALIES})
    #: messages (tokens) by their enqueue's outcome: confirmed, failed, unknown, and recovered
    #: (unknown, yet delivered)
    enqueues: dict[str, int] = field(default_factory=dict)
    #: deliveries in all, duplicates included
    deliveries: int = 0
    #: by fault key: deliveries of a message after its first
    duplicates: dict[str, int] = field(default_factory=dict)
    #: by fault key: deliveries of a message sent after its ack was answered ok
    after_ack: dict[str, int] = field(default_factory=dict)
    #: operations by function and outcome, e.g. ``{"enqueue": {"ok": 10, "info": 1}}``
    operations: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def valid(self) -> bool:
        return not any(self.anomalies.values())

    def report(self, anomaly: str, example: dict[str, Any]) -> None:
        self.anomalies[anomaly] += 1
        if len(self.examples[anomaly]) < EXAMPLES:
            self.examples[anomaly].append(example)

    def to_json(self) -> dict[str, Any]:
        return {
            "valid": self.valid,
            "anomalies": self.anomalies,
            "examples": self.examples,
            "enqueues": self.enqueues,
            "deliveries": self.deliveries,
            "duplicates": self.duplicates,
            "after_ack": self.after_ack,
            "operations": self.operations,
        }


@dataclass(frozen=True, slots=True)
class Delivery:
    """One message in a dequeue's ``ok`` answer."""

    stream: str
    token: str
    id: str | None
    dequeue: Operation
    #: where in the dequeue's answer
    position: int

    @property
    def at(self) -> int:
        assert self.dequeue.completed is not None  # an ok was answered
        return self.dequeue.completed


class Faults:
    """The faults' windows: which were on at a time, when a node was down or stopped."""

    def __init__(self, events: Iterable[FaultEvent], end: int) -> None:
        self.windows: list[tuple[int, int, str, str | None]] = []  # start, stop, kind, target
        started: dict[tuple[str, str | None], int] = {}
        for event in sorted(events, key=lambda e: e.time):
            key = (event.fault, event.target)
            if event.event == "start":
                started.setdefault(key, event.time)
            elif key in started:
                self.windows.append((started.pop(key), event.time, event.fault, event.target))
        # a fault never stopped lasts to the end of the history
        self.windows.extend((start, max(end, start), kind, target) for (kind, target), start in started.items())
        self.windows.sort()

    def at(self, time: int) -> str:
        """The key of the faults on at ``time``: their kinds, sorted, joined by ``+``. O(faults)."""
        kinds = sorted({kind for start, stop, kind, _ in self.windows if start <= time < stop})
        return "+".join(kinds) or NO_FAULT

    def of(self, kinds: frozenset[str], target: str) -> list[tuple[int, int]]:
        """The windows of the faults of these kinds on ``target``, by start."""
        return [(start, stop) for start, stop, kind, t in self.windows if kind in kinds and hits(t, target)]


def hits(target: str | None, node: str) -> bool:
    """Whether a fault on ``target`` is one on ``node``: the same name, or ``node`` is one
    process of it (``<target>/<process>``, as a run names the processes of a node)."""
    return target is not None and (node == target or node.startswith(target + "/"))


def check(history: History, overlap_slack_ns: int = 0, group_batch: Collection[str] = ()) -> Result:
    """Check the whole history. ``overlap_slack_ns``: overlaps of two owners no longer than this
    are not reported (the run sets it to how late it may stamp a node's record; 0: none).
    ``group_batch``: the streams (queues, ``topic/subscription``) whose queue has ``group_batch``
    on, where one dequeue may deliver a group's next messages together."""
    result = Result()
    operations = history.operations()
    faults = Faults(history.faults, history.end)
    by_f: dict[str, Counter[str]] = defaultdict(Counter)
    for op in operations:
        by_f[op.f][op.type] += 1
    result.operations = {f: dict(counts) for f, counts in sorted(by_f.items())}

    deliveries = _deliveries(operations)
    result.deliveries = len(deliveries)
    _check_messages(operations, deliveries, faults, group_batch, result)
    _check_http(operations, result)
    _check_owners(history.nodes, faults, history.end, overlap_slack_ns, result, operations)
    _check_epochs(operations, history.nodes, result)
    return result


def _deliveries(operations: list[Operation]) -> list[Delivery]:
    found = []
    for op in operations:
        if op.f != "dequeue" or op.type != "ok" or not op.value:
            continue
        if op.queue is None:
            raise HistoryError(f"a dequeue with no queue: {op!r}")
        for position, message in enumerate(op.value):
            if not isinstance(message, dict) or not isinstance(message.get("value"), str):
                raise HistoryError(f"a delivery must be an object with a string value: {message!r}")
            found.append(Delivery(op.queue, message["value"], message.get("id"), op, position))
    found.sort(key=lambda d: d.at)
    return found


def _check_messages(
    operations: list[Operation],
    deliveries: list[Delivery],
    faults: Faults,
    group_batch: Collection[str],
    result: Result,
) -> None:
    enqueues = [op for op in operations if op.f == "enqueue"]
    # what each token's enqueues promise: (stream, token) confirmed, or possibly there
    confirmed: dict[tuple[str, str], Operation] = {}
    possible: set[tuple[str, str]] = set()
    outcome: dict[str, set[str]] = defaultdict(set)
    for op in enqueues:
        for token in op.tokens:
            outcome[token].add(op.type)
            for stream in op.streams:
                if op.type == "ok":
                    # the first confirmed enqueue of a token orders it in its group
                    first = confirmed.get((stream, token))
                    if first is None or (op.completed or 0) < (first.completed or 0):
                        confirmed[stream, token] = op
                if op.type in ("ok", "info"):
                    possible.add((stream, token))

    delivered: dict[tuple[str, str], list[Delivery]] = defaultdict(list)
    token_of: dict[tuple[str, str], str] = {}
    for d in deliveries:
        delivered[d.stream, d.token].append(d)
        if d.id is not None:
            token_of[d.stream, d.id] = d.token

    recovered = {token for (_, token) in delivered if "ok" not in outcome[token] and "info" in outcome[token]}
    result.enqueues = {
        "confirmed": sum(1 for o in outcome.values() if "ok" in o),
        "failed": sum(1 for o in outcome.values() if o == {"fail"}),
        "unknown": sum(1 for o in outcome.values() if "ok" not in o and "info" in o),
        "recovered": len(recovered),
    }

    for (stream, token), op in confirmed.items():
        if (stream, token) not in delivered:
            result.report("lost", {"stream": stream, "token": token, "enqueued": op.completed, "ids": op.ids})
    for (stream, token), ds in delivered.items():
        if (stream, token) not in possible:
            result.report("unexpected", {"stream": stream, "token": token, "delivered": ds[0].at, "id": ds[0].id})

    # acks: the earliest that may have taken effect (sent, ok or unknown) and the earliest answered ok
    ack_sent: dict[tuple[str, str], int] = {}
    ack_done: dict[tuple[str, str], int] = {}
    for op in operations:
        if op.f != "ack" or op.type == "fail" or op.queue is None:
            continue
        for id_ in op.ids or ():
            acked = token_of.get((op.queue, id_))
            if acked is None:
                continue  # an ack of a message never delivered to a client: nothing to order by
            key = (op.queue, acked)
            ack_sent[key] = min(ack_sent.get(key, op.invoked), op.invoked)
            if op.type == "ok" and op.completed is not None:
                ack_done[key] = min(ack_done.get(key, op.completed), op.completed)

    duplicates: Counter[str] = Counter()
    after_ack: Counter[str] = Counter()
    for key, ds in delivered.items():
        for d in ds[1:]:
            duplicates[faults.at(d.at)] += 1
        done = ack_done.get(key)
        for d in ds:
            if done is not None and d.dequeue.invoked > done:
                after_ack[faults.at(d.at)] += 1
    result.duplicates = dict(sorted(duplicates.items()))
    result.after_ack = dict(sorted(after_ack.items()))

    _check_groups(confirmed, deliveries, ack_sent, group_batch, result)


def _check_groups(
    confirmed: dict[tuple[str, str], Operation],
    deliveries: list[Delivery],
    ack_sent: dict[tuple[str, str], int],
    group_batch: Collection[str],
    result: Result,
) -> None:
    """A message B of a group is delivered by a dequeue answered at ``t``. Every message A of the
    group whose enqueue was answered before B's was sent (or that is earlier in B's batch) must
    have been acknowledged before ``t``: an ack sent at or after ``t`` cannot have taken effect
    before, and one never sent never did. On a ``group_batch`` stream, an A delivered before B
    in the same answer is in order too. O((messages + deliveries) log messages) when batches are
    delivered in order."""
    # per (stream, group): the confirmed messages in the order of their enqueue's answer, when
    # each one's first ack was sent, and the running latest of those (with whose it is)
    members: dict[tuple[str, str], list[tuple[int, str]]] = defaultdict(list)
    for (stream, token), op in confirmed.items():
        if op.group is not None:
            assert op.completed is not None
            members[stream, op.group].append((op.completed, token))
    orders: dict[tuple[str, str], _GroupOrder] = {}
    for (stream, group), entries in members.items():
        entries.sort()
        acks = [(ack_sent.get((stream, t), NEVER), t) for _, t in entries]
        orders[stream, group] = _GroupOrder(
            answered=[answered for answered, _ in entries],
            tokens=[t for _, t in entries],
            acks=acks,
            latest=list(accumulate(acks, max)),
        )

    for d in deliveries:
        b = confirmed.get((d.stream, d.token))
        if b is None or b.group is None:
            continue
        order = orders[d.stream, b.group]
        before = bisect_left(order.answered, b.invoked)  # answered strictly before B was sent
        same_answer = {m["value"] for m in d.dequeue.value[: d.position]} if d.stream in group_batch else set()
        # the predecessors delivered with B are the last ones before it, in a correct run: the
        # prefix up to the first of them by its running latest, the rest one by one
        first = min((order.position[t] for t in same_answer if order.position.get(t, before) < before), default=before)
        candidates = [order.latest[first - 1]] if first else []
        candidates += [order.acks[n] for n in range(first, before) if order.tokens[n] not in same_answer]
        in_batch = b.tokens[: b.tokens.index(d.token)]
        candidates += [(ack_sent.get((d.stream, a), NEVER), a) for a in in_batch if a not in same_answer]
        if not candidates:
            continue
        acked, a = max(candidates)
        if acked >= d.at:
            result.report(
                "group_order",
                {
                    "stream": d.stream,
                    "group": b.group,
                    "delivered": d.token,
                    "at": d.at,
                    "before": a,
                    "its_ack_sent": None if acked == NEVER else acked,
                },
            )


@dataclass
class _GroupOrder:
    """One group's confirmed messages on one stream, in order (see ``_check_groups``)."""

    answered: list[int]
    tokens: list[str]
    acks: list[tuple[float, str]]
    latest: list[tuple[float, str]]
    position: dict[str, int] = field(init=False)

    def __post_init__(self) -> None:
        self.position = {t: n for n, t in enumerate(self.tokens)}


def _check_http(operations: list[Operation], result: Result) -> None:
    for op in operations:
        if op.status is None:
            continue
        example = {"process": op.process, "f": op.f, "status": op.status, "at": op.completed, "error": op.error}
        if op.status >= 500 and op.status != 503:
            result.report("server_error", example)
        elif op.status == 503 and not op.retry_after:
            result.report("unavailable_without_retry_after", example)


def _serving(
    nodes: list[NodeEvent], faults: Faults, end: int, operations: Sequence[Operation] = ()
) -> dict[str, list[tuple[int, int, str, int]]]:
    """Per partition, when each node served it: (start, stop, node, epoch), a paused node's
    pauses cut out. A ``serve`` while serving starts a new stretch (a new epoch). A stretch
    ends at its ``unserve`` (or the node's kill), and at the latest at the lease end its
    process last reported (``until`` of its ``serve`` or ``renew``): a process acts no longer
    than that whether or not it can still tell (one frozen while its server stops it), unless
    a call shows it acting later (``served``: then the stretch lasts until that call was sent
    at least, so a process that broke its word is not let off by it)."""
    names = {e.id: e.node for e in nodes if e.id}
    acted: dict[tuple[str, str, int], int] = {}
    for op in operations:
        if op.type != "ok":
            continue
        for node_id, partition, epoch in op.served or ():
            name = names.get(str(node_id))
            if name is not None:
                key3 = (name, str(partition), int(epoch))
                acted[key3] = max(acted.get(key3, op.invoked), op.invoked)
    kills = sorted((start, target) for start, _, kind, target in faults.windows if kind in KILL_FAULTS and target)
    timeline: list[tuple[int, int, NodeEvent | str]] = [(e.time, 1, e) for e in nodes]
    timeline += [(time, 0, target) for time, target in kills]  # at one time, a kill goes first
    timeline.sort(key=lambda item: (item[0], item[1]))
    open_: dict[tuple[str, str], tuple[int, int, int | None]] = {}  # -> start, epoch, until
    stretches: list[tuple[int, int, str, str, int]] = []  # start, stop, node, partition, epoch

    def close(key: tuple[str, str], stop: int) -> None:
        start, epoch, until = open_.pop(key)
        if until is not None and until < stop:
            stop = max(start, until, min(stop, acted.get((*key, epoch), start)))
        stretches.append((start, stop, *key, epoch))

    for time, _, item in timeline:
        if isinstance(item, str):
            for key in [k for k in open_ if hits(item, k[0])]:
                close(key, time)
            continue
        key = (item.node, item.partition)
        if item.event == "renew":
            held = open_.get(key)
            if held is not None and held[1] == item.epoch:
                # (a renew with no end: one of the process's reports was dropped, so the last end
                # it reported may not be its last: unbounded until it reports one again)
                bound = item.until if item.until is None or held[2] is None else max(held[2], item.until)
                open_[key] = (held[0], held[1], bound)
            continue
        if key in open_:
            close(key, time)
        if item.event == "serve":
            open_[key] = (time, item.epoch, item.until)
    for key in list(open_):
        close(key, max(end, open_[key][0]))

    serving: dict[str, list[tuple[int, int, str, int]]] = defaultdict(list)
    for start, stop, node, part, epoch in stretches:
        pieces = [(start, stop)]
        for p_start, p_stop in faults.of(PAUSE_FAULTS, node):
            pieces = [
                piece for s, e in pieces for piece in ((s, min(e, p_start)), (max(s, p_stop), e)) if piece[0] < piece[1]
            ]
        serving[part] += [(s, e, node, epoch) for s, e in pieces]
    for stretches_ in serving.values():
        stretches_.sort()
    return serving


def _check_owners(
    nodes: list[NodeEvent], faults: Faults, end: int, slack: int, result: Result, operations: Sequence[Operation] = ()
) -> None:
    for partition, stretches in sorted(_serving(nodes, faults, end, operations).items()):
        for i, (_, stop, node, epoch) in enumerate(stretches):
            for other_start, other_stop, other, other_epoch in stretches[i + 1 :]:
                if other_start >= stop:
                    break
                if other != node and min(stop, other_stop) - other_start > slack:
                    result.report(
                        "overlapping_owners",
                        {
                            "partition": partition,
                            "nodes": [node, other],
                            "epochs": [epoch, other_epoch],
                            "from": other_start,
                            "to": min(stop, other_stop),
                        },
                    )


def _check_epochs(operations: list[Operation], nodes: list[NodeEvent], result: Result) -> None:
    served: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for e in nodes:
        if e.event == "serve":
            served[e.partition].append((e.time, e.epoch))
    newest: dict[str, tuple[list[int], list[int]]] = {}
    for partition, events in served.items():
        events.sort()
        newest[partition] = ([t for t, _ in events], list(accumulate((epoch for _, epoch in events), max)))
    for op in operations:
        if op.type != "ok":
            continue
        by: list[tuple[str | None, str, int | None]] = [(op.node, op.partition, op.epoch)] if op.partition else []
        by += [(str(node), str(partition), int(epoch)) for node, partition, epoch in op.served or ()]
        for node, partition, epoch in by:
            if partition not in newest or epoch is None:
                continue
            times, epochs = newest[partition]
            before = bisect_left(times, op.invoked)  # served strictly before the call was sent
            if before and epochs[before - 1] > epoch:
                result.report(
                    "stale_epoch",
                    {
                        "process": op.process,
                        "f": op.f,
                        "node": node,
                        "partition": partition,
                        "epoch": epoch,
                        "superseded_by": epochs[before - 1],
                        "sent": op.invoked,
                    },
                )
