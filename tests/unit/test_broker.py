"""The embedded broker: a consumer never reads a message before its producer has written all of it.

kombu's filesystem transport creates a message file and only then writes it, and a consumer
that lists the folder in between takes the empty file and fails to parse it (a worker's
``JSONDecodeError``, which stops it). These tests run a producer process and a consumer side
by side on one broker folder, with messages large enough that writing one takes a while, and
binders side by side on new exchanges. That kombu's own transport fails there is shown by
forcing the moment its race opens (a file created and not yet written), not by hoping a race
hits it: on a quiet machine it may not, in a few rounds.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from pathlib import Path
from queue import Empty
from typing import Any

import pytest
from kombu import Connection
from kombu.exceptions import ChannelError

from config.broker import UNREADABLE_GRACE, Transport

PLAIN = "kombu.transport.filesystem:Transport"
OURS = "config.broker:Transport"

#: Messages the producer sends; each carries ``_BULK`` numbers, so that serialising and writing
#: one takes milliseconds: the window kombu's own transport leaves open.
_COUNT = 8
_BULK = 200_000


def _options(folder: Path) -> dict[str, object]:
    for sub in ("out", "processed", "control"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    return {
        "data_folder_in": str(folder / "out"),
        "data_folder_out": str(folder / "out"),
        "processed_folder": str(folder / "processed"),
        "control_folder": str(folder / "control"),
        "store_processed": False,
    }


def _connection(transport: str, folder: Path) -> Connection:
    return Connection("filesystem://", transport=transport, transport_options=_options(folder))


def _produce(transport: str, folder: str, count: int) -> None:
    """The producer process: ``count`` large messages onto queue ``q``, one after another."""
    with _connection(transport, Path(folder)) as conn:
        channel = conn.default_channel
        for i in range(count):
            channel._put("q", {"n": i, "bulk": list(range(_BULK))})


def _race(transport: str, folder: Path, count: int = _COUNT) -> tuple[list[int], list[BaseException]]:
    """A producer process sends ``count`` messages while this process takes each one as soon as
    it is listed, until the first error. Returns the numbers received in order, and the error."""
    received: list[int] = []
    errors: list[BaseException] = []
    producer = multiprocessing.get_context("fork").Process(target=_produce, args=(transport, str(folder), count))
    with _connection(transport, folder) as conn:
        channel = conn.default_channel
        producer.start()
        try:
            deadline = time.monotonic() + 60
            while len(received) < count and time.monotonic() < deadline:
                try:
                    message = channel._get("q")
                except Empty:
                    if producer.exitcode is not None and not _listed(folder):
                        break
                    continue
                except (ValueError, ChannelError) as exc:  # what the worker died of
                    errors.append(exc)
                    break
                assert message["bulk"] == list(range(_BULK))
                received.append(message["n"])
        finally:
            if errors:
                producer.terminate()
            producer.join(60)
    return received, errors


def _listed(folder: Path) -> list[str]:
    return [name for name in os.listdir(folder / "out") if name.endswith(".q.msg")]


def test_a_consumer_beside_a_producer_gets_every_message_whole_and_in_order(tmp_path):
    # given a producer process writing large messages and a consumer polling the same folder
    received, errors = _race(OURS, tmp_path)
    # then the consumer got every message, whole, in the order sent, and never failed
    assert errors == []
    assert received == list(range(_COUNT))
    # and nothing is left behind: not in the inbox, not half-written, not claimed
    assert os.listdir(tmp_path / "out") == []
    assert os.listdir(tmp_path / "processed") == []


def test_kombus_own_filesystem_transport_hands_out_half_written_messages(tmp_path):
    # given kombu's own transport (the one this project replaces) at the moment the race opens:
    # a producer has created a message file and not yet written all of it (forced, not hoped for)
    with _connection(PLAIN, tmp_path) as conn:
        channel = conn.default_channel
        (tmp_path / "out" / "1_a.q.msg").write_bytes(b'{"n": ')
        # when a consumer polls, then it takes the file and fails to parse it (what stopped
        # `make run`'s worker), and the message is gone from its queue
        with pytest.raises(ValueError):
            channel._get("q")
        assert os.listdir(tmp_path / "out") == []


def test_a_message_written_in_place_is_left_until_whole_and_a_broken_one_is_set_aside(tmp_path):
    # given a message file another writer (kombu's own, say) has created and half written
    with _connection(OURS, tmp_path) as conn:
        channel = conn.default_channel
        half = tmp_path / "out" / "1_a.q.msg"
        half.write_bytes(b'{"n": ')
        # when a consumer polls, then it finds nothing yet, and the file stays in the queue
        with pytest.raises(Empty):
            channel._get("q")
        assert os.listdir(tmp_path / "out") == ["1_a.q.msg"]
        # and once the writer is done, the consumer gets it
        with half.open("ab") as f:
            f.write(b"1}")
        assert channel._get("q") == {"n": 1}
        # given a file that has not parsed for longer than the grace, ahead of a good message
        broken = tmp_path / "out" / "0_b.q.msg"
        broken.write_bytes(b"not json")
        old = time.time() - UNREADABLE_GRACE - 1
        os.utime(broken, (old, old))
        channel._put("q", {"n": 3})
        # when a consumer polls, then it gets the good message, and the broken one is set aside
        assert channel._get("q") == {"n": 3}
        assert os.listdir(tmp_path / "out") == []
        assert os.listdir(tmp_path / "processed") == ["0_b.q.msg.unreadable"]


def test_the_celery_app_takes_this_transport_for_the_filesystem_url_only(settings):
    # given the Celery app as `make run` (the embedded default) or `make test` (Redis) loads it
    from config.celery import app

    ours = settings.CELERY_BROKER_URL.startswith("filesystem://")
    # when it makes its broker connection
    transport = app.connection_for_write().transport
    # then filesystem:// goes through this transport, any other broker through kombu's own
    assert (OURS if ours else None) == settings.CELERY_BROKER_TRANSPORT
    assert isinstance(transport, Transport) == ours, type(transport)


#: Binders racing on the same new exchanges, and the exchanges each binds its queue to.
_BINDERS = 4
_EXCHANGES = 60


def _bind(transport: str, folder: str, me: int, start: Any) -> None:
    """A binder process: its queue ``q<me>`` onto exchanges ``e0``, ``e1``..., after the others are ready."""
    with _connection(transport, Path(folder)) as conn:
        channel = conn.default_channel
        start.wait()
        for i in range(_EXCHANGES):
            channel._queue_bind(f"e{i}", f"q{me}", "", f"q{me}")


def _bind_race(transport: str, folder: Path) -> tuple[list[int | None], int]:
    """Binders in processes of their own; their exit codes, and the tables that lack a binding."""
    context = multiprocessing.get_context("fork")
    start = context.Barrier(_BINDERS)
    binders = [context.Process(target=_bind, args=(transport, str(folder), me, start)) for me in range(_BINDERS)]
    for binder in binders:
        binder.start()
    for binder in binders:
        binder.join(60)
    with _connection(transport, folder) as conn:
        channel = conn.default_channel
        short = 0
        for i in range(_EXCHANGES):
            try:
                short += {q.queue for q in channel.get_table(f"e{i}")} != {f"q{me}" for me in range(_BINDERS)}
            except (ValueError, ChannelError):
                short += 1
    return [binder.exitcode for binder in binders], short


def test_processes_binding_queues_to_new_exchanges_at_once_keep_every_binding(tmp_path):
    # given four processes that bind their queue to the same new exchanges at the same moment
    exits, short = _bind_race(OURS, tmp_path)
    # then none failed, and every exchange's table lists all four queues
    assert exits == [0] * _BINDERS
    assert short == 0
    # and no file is left half-done in the control folder
    assert not [name for name in os.listdir(tmp_path / "control") if name.startswith(".partial-")]


def test_kombus_own_filesystem_transport_fails_a_bind_beside_another_on_a_new_exchange(tmp_path):
    # given kombu's own transport at the moment its race opens: a binder has created a new
    # exchange's table (opened "wb": empty) and not yet written it (forced, not hoped for)
    with _connection(PLAIN, tmp_path) as conn:
        channel = conn.default_channel
        (tmp_path / "control" / "e0.exchange").write_bytes(b"")
        # when a second binder binds its queue to it, or a publisher reads its table, then each
        # fails to parse the table
        with pytest.raises(ValueError):
            channel._queue_bind("e0", "q1", "", "q1")
        with pytest.raises(ValueError):
            channel.get_table("e0")
