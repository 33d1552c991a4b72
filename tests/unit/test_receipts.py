"""Receipts come from pools made of ``os.urandom`` bytes, one per thread
(``queues.engine.ids.new_receipt``): each must be new, shaped as before, across threads too, and
a forked process must not hand out its parent's."""

from __future__ import annotations

import os
import re
import threading

from queues.engine import ids as messages
from queues.engine.ids import new_receipt, new_receipts


def test_receipts_are_16_url_safe_characters_and_never_repeat():
    receipts = [new_receipt() for _ in range(20_000)]  # several refills of the pool
    assert all(re.fullmatch(r"[A-Za-z0-9_-]{16}", r) for r in receipts)
    assert len(set(receipts)) == len(receipts)


def test_receipts_drawn_in_runs_are_shaped_alike_and_never_repeat():
    drawn = [r for n in (0, 1, 5, 255, 256, 257, 1000, 3) * 4 for r in new_receipts(n)] + [new_receipt()]
    assert len(drawn) == 4 * (1 + 5 + 255 + 256 + 257 + 1000 + 3) + 1
    assert all(re.fullmatch(r"[A-Za-z0-9_-]{16}", r) for r in drawn)
    assert len(set(drawn)) == len(drawn)


def test_threads_drawing_at_once_never_hand_out_the_same_receipt():
    drawn: list[list[str]] = [[] for _ in range(8)]
    start = threading.Barrier(8)

    def draw(out: list[str]) -> None:
        start.wait()
        out.extend(new_receipt() for _ in range(5_000))

    threads = [threading.Thread(target=draw, args=(out,)) for out in drawn]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = [r for out in drawn for r in out]
    assert len(every) == 40_000 and len(set(every)) == len(every)


def test_a_forked_child_does_not_reuse_the_parents_pool():
    new_receipt()  # the pool holds bytes now
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next receipts, to the parent
        os.close(read)
        os.write(write, "".join(new_receipt() for _ in range(8)).encode())
        os._exit(0)
    os.close(write)
    child = os.read(read, 4096).decode()
    os.close(read)
    os.waitpid(pid, 0)
    parent = "".join(new_receipt() for _ in range(8))
    assert len(child) == len(parent) == 128
    assert child != parent


def test_each_receipt_is_the_encoding_of_its_own_12_random_bytes(monkeypatch):
    # a pool is encoded in one piece and cut every 16 characters: each piece must be what
    # encoding its 12 bytes alone gives (as secrets.token_urlsafe(12) would)
    import base64

    made, real = [], os.urandom

    def urandom(n: int) -> bytes:
        made.append(real(n))
        return made[-1]

    monkeypatch.setattr(messages.os, "urandom", urandom)
    monkeypatch.setattr(messages, "_RECEIPTS", messages._ReceiptPool())
    drawn = [new_receipt() for _ in range(messages._ReceiptPool.BATCH + 1)]  # a refill too
    chunks = [raw[i : i + 12] for raw in made for i in range(0, len(raw), 12)]
    assert len(made) == 2 and all(len(raw) == 12 * messages._ReceiptPool.BATCH for raw in made)
    assert set(drawn) <= {base64.urlsafe_b64encode(c).decode() for c in chunks}
    assert len(set(drawn)) == len(drawn)
