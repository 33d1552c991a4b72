"""bench/serving.py's pieces that run without a server: the option checks, the no-store WSGI
app, and the pipelined Redis protocol's reply matching (replies in order, split anywhere)."""

from __future__ import annotations

import asyncio
import io
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

import serving  # noqa: E402
import serving_apps  # noqa: E402


def test_unknown_model_and_missing_store_are_refused(monkeypatch):
    with pytest.raises(SystemExit):
        serving.parse_args(["--models", "wsgi-threads,fastest", "--redis-url", "redis://x"])
    monkeypatch.delenv("REDIS_URL", raising=False)
    with pytest.raises(SystemExit):
        serving.parse_args([])
    args = serving.parse_args(["--models", "wsgi-1thread, rsgi-protocol", "--redis-url", "redis://x"])
    assert args.models == ["wsgi-1thread", "rsgi-protocol"]


def test_every_model_names_an_app_of_its_interface():
    for interface, target, *_ in serving.MODELS.values():
        app = getattr(serving_apps, target)
        assert asyncio.iscoroutinefunction(app) == (interface == "rsgi")


def test_every_model_sets_only_what_granian_takes():
    import inspect

    from granian import Granian
    from granian.constants import HTTPModes, RuntimeModes

    takes = inspect.signature(Granian.__init__).parameters
    for name, (*_, settings) in serving.MODELS.items():
        assert set(settings) <= set(takes), name
        RuntimeModes(settings.get("runtime_mode", "auto"))
        HTTPModes(settings.get("http", "auto"))
    assert set(serving.DEFAULT_MODELS) <= set(serving.MODELS)


def test_the_nostore_app_reads_the_body_and_answers_json():
    body = io.BytesIO(b'{"body": "x"}')
    seen = []
    out = serving_apps.wsgi_nostore(
        {"CONTENT_LENGTH": "13", "wsgi.input": body}, lambda status, headers: seen.append((status, headers))
    )
    assert body.tell() == 13
    assert seen == [("200 OK", serving_apps.HEADERS)]
    assert b"".join(out) == serving_apps.BODY


def test_pipelined_replies_go_to_the_callers_in_order_however_they_are_split():
    async def run() -> list[bytes]:
        proto = serving_apps._Pipelined()
        written: list[bytes] = []
        proto.connection_made(type("T", (), {"write": staticmethod(written.append)})())
        calls = [asyncio.ensure_future(proto.ping()) for _ in range(3)]
        await asyncio.sleep(0)
        assert written == [serving_apps.PING] * 3
        for chunk in (b"+PO", b"NG\r\n+ONE\r", b"\n+TWO\r\n"):
            proto.data_received(chunk)
        return await asyncio.gather(*calls)

    assert asyncio.run(run()) == [b"+PONG", b"+ONE", b"+TWO"]


def test_a_lost_connection_fails_the_calls_in_flight():
    async def run() -> None:
        proto = serving_apps._Pipelined()
        proto.connection_made(type("T", (), {"write": staticmethod(lambda data: None)})())
        call = asyncio.ensure_future(proto.ping())
        await asyncio.sleep(0)
        proto.connection_lost(None)
        with pytest.raises(ConnectionError):
            await call

    asyncio.run(run())
