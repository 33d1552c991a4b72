"""Deadline orders of the redelivery index (``queues.engine.redelivery``): items by visibility
deadline, as a sorted run with a binary heap beside it."""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from heapq import heapify, heappop, heappush

#: (deadline it sits under, sequence number: unique, so the ID is never compared, message ID)
Item = tuple[float, int, str]


class Deadlines:
    """Items in deadline order: a sorted run for the items that come in order, and a binary heap
    for the others; the first is the earlier of the run's first and the heap's top.

    Deliveries mostly come in deadline order (a queue hides each of its messages for the same
    time), and acks in delivery order, so the items an ack makes stale are at the front of the
    run, and dropping one is a deque pop, where one binary heap would pay a heap pop (log n of
    the messages in flight) per acknowledged message. A later delivery hidden for less time (or
    a visibility change) goes into the heap.

    ``len``, iteration (in no order) and the lock-free readings of :class:`RedeliveryIndex` see
    both parts; a reader without the lock may find them changing (IndexError, RuntimeError:
    an estimate).
    """

    __slots__ = ("heap", "run")

    def __init__(self, run: Iterable[Item] = (), heap: list[Item] | None = None) -> None:
        self.run: deque[Item] = deque(run)
        self.heap: list[Item] = [] if heap is None else heap

    def __len__(self) -> int:
        return len(self.run) + len(self.heap)

    def __iter__(self) -> Iterator[Item]:
        return itertools.chain(self.run, self.heap)

    def push(self, item: Item) -> None:
        run = self.run
        if not run or run[-1] <= item:
            run.append(item)
        else:
            heappush(self.heap, item)

    def extend(self, items: list[Item]) -> None:
        """:meth:`push` of each of ``items``, which are in order."""
        run = self.run
        if items and (not run or run[-1] <= items[0]):
            run.extend(items)
        else:
            for item in items:
                self.push(item)

    def push_front(self, item: Item) -> None:
        """Put back an item taken first (:meth:`first`): no later than any other."""
        run = self.run
        if not run or item <= run[0]:
            run.appendleft(item)
        else:
            heappush(self.heap, item)

    def first(self) -> Item | None:
        run, heap = self.run, self.heap
        if heap and (not run or heap[0] < run[0]):
            return heap[0]
        return run[0] if run else None

    def pop(self) -> Item:
        """Take the first item (there must be one)."""
        run, heap = self.run, self.heap
        if heap and (not run or heap[0] < run[0]):
            return heappop(heap)
        return run.popleft()

    def kept(self, keep: Callable[[Item], bool]) -> Deadlines:
        """A new one with the items ``keep`` accepts (a reader without the lock keeps this one)."""
        heap = [it for it in self.heap if keep(it)]
        heapify(heap)
        return Deadlines([it for it in self.run if keep(it)], heap)

    def until(self, now: float) -> Iterator[Item]:
        """The items at or before ``now``, in no order: the run's from its start, the heap's by
        its subtrees (one above ``now`` is skipped whole). Changes nothing."""
        for item in self.run:
            if item[0] > now:
                break
            yield item
        heap, stack = self.heap, [0]
        while stack:
            i = stack.pop()
            if i < len(heap) and heap[i][0] <= now:
                yield heap[i]
                stack += (2 * i + 1, 2 * i + 2)

    def first_such(self, accept: Callable[[Item], bool]) -> Item | None:
        """The earliest item ``accept`` takes, or None: the run from its start, the heap best
        first, the earlier of the two. Changes nothing."""
        found = next((it for it in self.run if accept(it)), None)
        heap = self.heap
        frontier = [(heap[0], 0)] if heap else []
        while frontier:
            item, i = heappop(frontier)
            if found is not None and found < item:
                break
            if accept(item):
                return item
            for child in (2 * i + 1, 2 * i + 2):
                if child < len(heap):
                    heappush(frontier, (heap[child], child))
        return found

    def _check(self) -> None:
        run = list(self.run)
        assert run == sorted(run), "the run is out of order"
        heap = self.heap
        assert all(heap[(i - 1) // 2] <= heap[i] for i in range(1, len(heap))), "the heap is not one"
