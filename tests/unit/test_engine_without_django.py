"""The partition engine runs without Django: what it needs of the node (the lease, the lease's
row, the counters) comes in as the protocols of ``queues.engine.ports``.

Each test runs a fresh interpreter in which any import of ``django`` fails.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

NO_DJANGO = """
import importlib.abc
import sys


class NoDjango(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "django" or name.startswith("django."):
            raise ImportError(f"the engine imported {name}")
        return None


sys.meta_path.insert(0, NoDjango())
"""


def run_without_django(code: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-c", NO_DJANGO + textwrap.dedent(code)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_partition_is_written_taken_over_and_drained_without_django():
    # given an interpreter in which Django cannot be imported, a memory store and a row
    result = run_without_django(
        """
        from dataclasses import dataclass

        from queues.kv.memory import MemoryStore
        from queues.engine.ids import StoredMessage, parse_message_id
        from queues.engine.partition import BodyCache, PartitionManager
        from queues.engine.ports import BoundRow


        @dataclass
        class Lease:
            queue: str
            index: int
            epoch: int

            def valid(self):
                return True


        class Row:
            head = None

            def read_head(self, lease):
                return self.head

            def set_head(self, lease, node_id, head):
                self.head = head

            def move_epoch(self, lease, node_id, epoch):
                lease.epoch = epoch


        store, row = MemoryStore(), Row()


        def owner(epoch):
            lease = Lease("q", 0, epoch)
            m = PartitionManager(
                lease,
                block_size=2,
                store=store,
                node_id="n",
                cache=BodyCache(0),
                row=BoundRow(lease, "n", row.read_head, row.set_head, row.move_epoch),
            )
            m.open()
            return m


        # when one owner stores five messages and acknowledges the first two it delivers
        first = owner(1)
        first.enqueue([StoredMessage(f"m{i}", 0.0) for i in range(5)])
        got = first.load_bodies(first.dequeue(2, 30.0))
        first.ack([(parse_message_id(d.id), d.receipt) for d in got])
        # then the next owner finds the other three, in order
        second = owner(2)
        bodies = [d.message.body for d in second.load_bodies(second.dequeue(10, 30.0))]
        print(bodies)
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "['m2', 'm3', 'm4']"
