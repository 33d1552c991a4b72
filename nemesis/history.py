"""The history of a nemesis run: what every client asked and heard, what every node served, which
faults were on. One JSON object a line, in the order written (Jepsen's histories are the model).

Three kinds of record, told apart by their keys:

- a client operation, two lines per call: ``{"process", "type": "invoke", "f", "time", ...}``
  when the call starts, then one with the same ``process`` and ``f`` and ``"type"`` ``"ok"``
  (it happened), ``"fail"`` (it certainly did not happen: the service said so) or ``"info"``
  (unknown: a timeout, a dropped connection, an answer that does not say). A process has at most
  one call open at a time; a call left without its second line counts as ``info``.
- a node's ownership: ``{"node", "event": "serve" | "unserve", "partition", "epoch", "time"}``,
  written when the node starts acting as the partition's owner (lease won, epoch raised) and when
  it stops (lease given up or found lost).
- a fault: ``{"fault": kind, "event": "start" | "stop", "time", "target"}``.

``time`` is one clock for the whole file: ``time.monotonic_ns()`` of the process that runs the
clients. A node whose clocks are made to drift must not stamp its own records: the run stamps
them as it reads them.

Fields of a client operation, on the line where they are known (the invoke's fields hold for the
completion unless it repeats them):

- ``queue`` (the queue, or ``topic/subscription`` for a dequeue or ack on a subscription) and
  ``group`` (the message group of an enqueue, if any);
- ``value``: for an enqueue, the message's token (a string unique in the run, its body) or a list
  of tokens (a batch); for a dequeue's ``ok``, the deliveries, each ``{"id", "value", "group"}``
  in the order answered;
- ``ids``: the message IDs an enqueue's ``ok`` assigned (in the order of ``value``), or those an
  ack acknowledges;
- ``fanout``: the subscriptions (as ``topic/subscription``) an enqueue to a topic must reach;
- ``status`` and ``retry_after``: the HTTP answer, where there was one;
- ``node``, ``partition``, ``epoch``: who answered the call, as the owner of which partition, under
  which epoch (the ownership check compares them with the nodes' records); ``served``: the same
  for a call that acted through several partitions, a list of ``[node, partition, epoch]``;
- ``error``: a short text for a failure or an unknown outcome.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, fields
from functools import cached_property
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO, Literal

import orjson

OpType = Literal["invoke", "ok", "fail", "info"]
OP_TYPES: tuple[OpType, ...] = ("invoke", "ok", "fail", "info")
NODE_EVENTS = ("serve", "renew", "unserve")
FAULT_EVENTS = ("start", "stop")


class HistoryError(ValueError):
    """A history that does not keep to its format (a line that is no record, a completion with
    no invocation, a process with two calls open): the run that wrote it is broken, not the
    service, so the checker refuses to judge it."""


@dataclass(frozen=True, slots=True)
class Op:
    """One line of a client operation: its invocation or its completion."""

    process: int | str
    type: OpType
    f: str
    time: int
    queue: str | None = None
    group: str | None = None
    value: Any = None
    ids: list[str] | None = None
    fanout: list[str] | None = None
    status: int | None = None
    retry_after: str | None = None
    node: str | None = None
    partition: str | None = None
    epoch: int | None = None
    error: str | None = None
    served: list[list[Any]] | None = None


@dataclass(frozen=True, slots=True)
class NodeEvent:
    """A node started (``serve``) or stopped (``unserve``) acting as a partition's owner, or
    renewed (``renew``) the lease it serves under."""

    node: str
    event: Literal["serve", "renew", "unserve"]
    partition: str
    epoch: int
    time: int
    #: ``serve`` and ``renew``: the time (the run's clock) after which the process does not act
    #: as owner unless it renews again: its lease's end, as the node reported it, converted
    #: by the node's clock rate (None: not reported, as by a release that does not).
    until: int | None = None
    #: the node process's own ID (what ``served`` names), when it reported it.
    id: str | None = None


@dataclass(frozen=True, slots=True)
class FaultEvent:
    """The nemesis started or stopped a fault of one ``kind`` on one ``target``."""

    fault: str
    event: Literal["start", "stop"]
    time: int
    target: str | None = None


Record = Op | NodeEvent | FaultEvent


def to_json(record: Record) -> dict[str, Any]:
    """The record as the JSON object of its line; fields left ``None`` are left out."""
    return {f.name: getattr(record, f.name) for f in fields(record) if getattr(record, f.name) is not None}


def from_json(obj: dict[str, Any]) -> Record:
    """The record a line's object holds; ``HistoryError`` if it is none of the three kinds."""
    try:
        if "process" in obj:
            if obj.get("type") not in OP_TYPES:
                raise HistoryError(f"an operation's type must be one of {OP_TYPES}: {obj!r}")
            return Op(**obj)
        if "node" in obj and obj.get("event") in NODE_EVENTS:
            return NodeEvent(**obj)
        if "fault" in obj and obj.get("event") in FAULT_EVENTS:
            return FaultEvent(**obj)
    except TypeError as exc:  # a missing or unknown key
        raise HistoryError(f"{exc}: {obj!r}") from exc
    raise HistoryError(f"neither an operation, a node's event nor a fault: {obj!r}")


class Recorder:
    """Appends records to a history file, from any number of threads.

    Each record is one ``write`` of one whole line under a lock, so lines never interleave; the
    file is buffered (a record costs an ``orjson.dumps`` and a buffered write, a few
    microseconds): ``flush()`` or ``close()`` puts it on disk. The recorder stamps the times (``clock``,
    ``time.monotonic_ns`` unless a test gives its own).
    """

    def __init__(self, path: str | Path, clock: Callable[[], int] = time.monotonic_ns) -> None:
        self.path = Path(path)
        self.clock = clock
        self._lock = threading.Lock()
        self._file: BinaryIO = self.path.open("ab")

    def write(self, record: Record) -> None:
        line = orjson.dumps(to_json(record), option=orjson.OPT_APPEND_NEWLINE)
        with self._lock:
            self._file.write(line)

    def invoke(self, process: int | str, f: str, **known: Any) -> Op:
        """Record the start of a call; returns the line, to pass to ``complete``."""
        op = Op(process=process, type="invoke", f=f, time=self.clock(), **known)
        self.write(op)
        return op

    def complete(self, invoked: Op, type: Literal["ok", "fail", "info"], **learnt: Any) -> Op:
        """Record how the call ``invoked`` ended: what it learnt (ids, status, who answered)."""
        op = Op(process=invoked.process, type=type, f=invoked.f, time=self.clock(), **learnt)
        self.write(op)
        return op

    def node(self, node: str, event: Literal["serve", "unserve"], partition: str, epoch: int) -> None:
        self.write(NodeEvent(node=node, event=event, partition=partition, epoch=epoch, time=self.clock()))

    def fault(self, fault: str, event: Literal["start", "stop"], target: str | None = None) -> None:
        self.write(FaultEvent(fault=fault, event=event, time=self.clock(), target=target))

    def flush(self) -> None:
        with self._lock:
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            self._file.close()

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.close()


@dataclass(frozen=True, slots=True)
class Operation:
    """A client's call, its invocation and completion paired: what the checker reads.

    ``type`` is ``ok``, ``fail`` or ``info``; ``completed`` is when the client heard the answer
    (for ``info``, when it gave up; ``None`` if the history ends with the call open). An ``info``
    call may take effect at any time after ``invoked``, even after ``completed``.
    """

    process: int | str
    f: str
    type: Literal["ok", "fail", "info"]
    invoked: int
    completed: int | None
    queue: str | None = None
    group: str | None = None
    value: Any = None
    ids: list[str] | None = None
    fanout: list[str] | None = None
    status: int | None = None
    retry_after: str | None = None
    node: str | None = None
    partition: str | None = None
    epoch: int | None = None
    error: str | None = None
    #: every ``[node, partition, epoch]`` that acted for the call (``X-MQ-Served-By``)
    served: list[list[Any]] | None = None

    @property
    def tokens(self) -> list[str]:
        """An enqueue's tokens (one, or a batch's), in order."""
        if self.value is None:
            return []
        return [self.value] if isinstance(self.value, str) else list(self.value)

    @property
    def streams(self) -> list[str]:
        """Where an enqueue's messages must be delivered: its subscriptions, or its queue."""
        if self.fanout:
            return list(self.fanout)
        return [self.queue] if self.queue is not None else []


_OUTCOMES: dict[str, Literal["ok", "fail", "info"]] = {"ok": "ok", "fail": "fail", "info": "info"}


def _pair(i: Op, c: Op | None) -> Operation:
    """The call ``i`` with what its completion ``c`` learnt. Spelt out field by field: a run's
    history holds millions of calls, and this is the checker's hottest loop."""
    if c is None:
        return Operation(
            i.process, i.f, "info", i.time, None, i.queue, i.group, i.value, i.ids, i.fanout,
            i.status, i.retry_after, i.node, i.partition, i.epoch, i.error, i.served,
        )  # fmt: skip
    return Operation(
        i.process,
        i.f,
        _OUTCOMES[c.type],
        i.time,
        c.time,
        i.queue if c.queue is None else c.queue,
        i.group if c.group is None else c.group,
        i.value if c.value is None else c.value,
        i.ids if c.ids is None else c.ids,
        i.fanout if c.fanout is None else c.fanout,
        i.status if c.status is None else c.status,
        i.retry_after if c.retry_after is None else c.retry_after,
        i.node if c.node is None else c.node,
        i.partition if c.partition is None else c.partition,
        i.epoch if c.epoch is None else c.epoch,
        i.error if c.error is None else c.error,
        i.served if c.served is None else c.served,
    )


@dataclass
class History:
    """A whole run's records, each kind in the order written. Read once, never changed after:
    the calls are paired once (``operations()``), and the span is taken once."""

    ops: list[Op] = field(default_factory=list)
    nodes: list[NodeEvent] = field(default_factory=list)
    faults: list[FaultEvent] = field(default_factory=list)

    @classmethod
    def of(cls, records: Iterable[Record]) -> History:
        history = cls()
        for record in records:
            if isinstance(record, Op):
                history.ops.append(record)
            elif isinstance(record, NodeEvent):
                history.nodes.append(record)
            else:
                history.faults.append(record)
        return history

    @cached_property
    def _operations(self) -> list[Operation]:
        return self._pair_calls()

    def operations(self) -> list[Operation]:
        """Each call paired with its completion (by process, in the order written), by start time.

        O(n log n), once. ``HistoryError`` on a completion with no call open, a call opened
        while the same process has one open, or a completion of another function than the call's.
        """
        return self._operations

    def _pair_calls(self) -> list[Operation]:
        open_: dict[int | str, Op] = {}
        paired: list[Operation] = []
        for op in self.ops:
            pending = open_.get(op.process)
            if op.type == "invoke":
                if pending is not None:
                    raise HistoryError(f"process {op.process!r} invoked {op.f!r} with {pending.f!r} still open")
                open_[op.process] = op
                continue
            if pending is None or pending.f != op.f:
                raise HistoryError(f"a completion with no matching call open: {to_json(op)!r}")
            del open_[op.process]
            paired.append(_pair(pending, op))
        paired.extend(_pair(op, None) for op in open_.values())
        paired.sort(key=lambda o: o.invoked)
        return paired

    @cached_property
    def start(self) -> int:
        """The earliest time in the history (0 if it is empty)."""
        return min((r.time for r in self.records()), default=0)

    @cached_property
    def end(self) -> int:
        """The latest time in the history (0 if it is empty)."""
        return max((r.time for r in self.records()), default=0)

    def records(self) -> Iterator[Record]:
        yield from self.ops
        yield from self.nodes
        yield from self.faults


def read(path: str | Path) -> History:
    """The history in a file written by a ``Recorder``. A last line cut short (the writer was
    killed mid-line) is dropped; any other line that is not a record raises ``HistoryError``
    with its number."""
    lines = Path(path).read_bytes().split(b"\n")
    records: list[Record] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            if number == len(lines):  # no newline after it: the write never finished
                break
            raise HistoryError(f"{path}:{number}: not JSON: {exc}") from exc
        if not isinstance(obj, dict):
            raise HistoryError(f"{path}:{number}: not a JSON object")
        try:
            records.append(from_json(obj))
        except HistoryError as exc:
            raise HistoryError(f"{path}:{number}: {exc}") from exc
    return History.of(records)
