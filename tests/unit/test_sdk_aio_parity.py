"""The asyncio client (``mq_client.aio.AsyncClient``) keeps the synchronous client's calls: the
same public names, each awaited, with the same parameters, so code moves between the two by
adding ``await`` (and ``async for`` for :meth:`receive`)."""

from __future__ import annotations

import asyncio
import inspect

import pytest

from mq_client import Client
from mq_client.aio import AsyncClient
from mq_client.client import QUEUE_FIELDS

#: Client's name -> AsyncClient's, where they differ.
RENAMED = {"close": "aclose"}
#: The queue calls whose settings the asyncio client takes as ``**settings`` (checked by name).
SETTINGS_CALLS = {"create_queue", "update_queue"}


def _public(cls: type) -> set[str]:
    return {name for name in dir(cls) if not name.startswith("_")}


def _shape(fn: object) -> list[tuple[str, object, object]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]  # type: ignore[arg-type]


def test_every_call_of_the_sync_client_is_on_the_async_one_with_its_parameters():
    missing = {RENAMED.get(name, name) for name in _public(Client)} - _public(AsyncClient)
    assert not missing
    for name in sorted(_public(Client)):
        sync = inspect.getattr_static(Client, name)
        aio = inspect.getattr_static(AsyncClient, RENAMED.get(name, name))
        if aio is sync:  # shared (mq_client.client.ClientSettings): the settings, forget_owners
            continue
        if isinstance(sync, property):
            assert isinstance(aio, property) and (aio.fset is None) == (sync.fset is None), name
            continue
        if isinstance(sync, classmethod):
            assert isinstance(aio, classmethod) and _shape(aio.__func__) == _shape(sync.__func__), name
            continue
        assert callable(sync), name
        if name == "receive":  # an iterator there, an async iterator here
            assert inspect.isasyncgenfunction(aio)
        else:
            assert inspect.iscoroutinefunction(aio), name
        if name in SETTINGS_CALLS:
            params = inspect.signature(sync).parameters
            assert set(params) - {"self", "name"} == set(QUEUE_FIELDS)
            assert [p.kind for p in inspect.signature(aio).parameters.values()][-1] is inspect.Parameter.VAR_KEYWORD
        else:
            assert _shape(aio) == _shape(sync), name
            if name != "receive":  # (an Iterator there, an AsyncGenerator here)
                assert inspect.signature(aio).return_annotation == inspect.signature(sync).return_annotation, name
    # the constructor: the same parameters, and the connection bound of aiohttp's pool
    sync_init = _shape(Client.__init__)
    aio_init = [p for p in _shape(AsyncClient.__init__) if p[0] != "max_connections"]
    assert aio_init == sync_init


def test_a_setting_the_sync_client_would_not_take_is_refused_before_any_call():
    async def scenario() -> None:
        mq = AsyncClient("http://127.0.0.1:9", "tok", retries=0)
        with pytest.raises(TypeError, match="partitons"):
            await mq.create_queue("q", partitons=3)
        with pytest.raises(TypeError, match="visibility"):
            await mq.update_queue("q", visibility=3)
        await mq.aclose()

    asyncio.run(scenario())


def test_the_async_client_from_the_environment_and_its_settings():
    mq = AsyncClient.from_env({"QUEUE_API_URL": "http://x:8000,http://y:8000", "QUEUE_API_TOKEN": "k"}, backoff=0.5)
    assert isinstance(mq, AsyncClient) and mq.urls == ["http://x:8000", "http://y:8000"] and mq.token == "k"
    assert mq.backoff == 0.5
    mq.owners_ttl, mq.retries, mq.max_backoff = 0, 1, 2.0
    assert (mq.owners_ttl, mq.retries, mq.max_backoff) == (0, 1, 2.0)
    with pytest.raises(ValueError):
        AsyncClient.from_env({"QUEUE_API_URL": "http://x"})
