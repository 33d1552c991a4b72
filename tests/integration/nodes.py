"""Helpers of the integration tests around real node processes (``tests.launcher`` starts them).

A test that uses them must commit its data (``django_db(transaction=True)``) so the node
processes, which connect to the same test database, can see it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest
import requests
from django.conf import settings
from django.db import connection

from queues.kv import reset_store
from tests.launcher import KV_BACKENDS, NodeProcess, kv_url, node_env, wait_until

#: The Redis database of the tests' key-value store (the ``redis_client`` fixture flushes it).
KV_REDIS_DB = 5

#: Every node of a test beats this often (seconds): a takeover or a grant shows within moments.
HEARTBEAT = "0.3"

#: The backend of a node that shares this process's key-value store (``settings.KV_URL``), so
#: that the test reads what the node wrote.
THIS_PROCESS = "this-process"

#: What ``@pytest.mark.node(...)`` takes (:func:`node_options`).
NODE_OPTIONS = frozenset({"env", "backend", "processes", "shared"})


def database_url() -> str:
    """The URL of the database this test process uses (the pytest-django test database)."""
    s = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{s['NAME']}"
    return f"postgres://{s['USER']}:{s['PASSWORD']}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


def local_node_env(tmp_path: Path, backend: str = "redis", *, data: str = "data", **extra: str) -> dict[str, str]:
    """A node's environment in a test: the test database, its data under ``tmp_path / data``,
    its key-value store on ``backend`` (Redis db 5, the test Redis Cluster, files under
    ``tmp_path / "kv"``, or PostgreSQL), this process's cluster secret (so every node of the test, and the test
    itself, sign and check forwarded calls alike, whatever data folder each uses); ``extra``
    adds variables."""
    kv = kv_url(
        backend,
        redis_url=os.environ.get("MQ_TEST_REDIS_URL", ""),
        redis_db=KV_REDIS_DB,
        directory=tmp_path / "kv",
        redis_cluster_url=os.environ.get("MQ_TEST_REDIS_CLUSTER_URL", ""),
    )
    extra.setdefault("CLUSTER_SECRET", settings.CLUSTER_SECRET)
    return node_env(database_url=database_url(), data_dir=tmp_path / data, kv=kv, **extra)


def backend_store(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    """A key-value store of this process on ``backend`` ("file": under ``tmp_path / "kv"``,
    "redis": db 5, emptied around the test, "postgres": the test database), under the service's
    key prefix as a node opens it: it reads what the test's nodes wrote there."""
    if backend == "file":
        from queues.kv.filesystem import FileStore

        return FileStore(tmp_path / "kv").within(settings.KV_PREFIX)
    if backend == "redis":
        from queues.kv.redis import RedisStore

        return RedisStore(request.getfixturevalue("redis_client")).within(settings.KV_PREFIX)
    if backend == "postgres":
        from queues.kv.sql import SQLStore

        return SQLStore().within(settings.KV_PREFIX)
    raise ValueError(f"no store of this process on {backend!r}: file, redis or postgres")


def peer_request(
    method: str,
    url: str,
    payload: dict | None = None,
    *,
    hops: int = 1,
    on_behalf: str | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 10,
) -> requests.Response:
    """``method url`` as a node makes it: signed with this process's cluster secret
    (``queues.cluster.peerauth``) for the node at ``url``, ``hops`` and ``on_behalf`` under the signature; ``headers`` are sent
    too (after signing: a header signed differently breaks the signature)."""
    from queues.cluster import peerauth

    body = b"" if payload is None else orjson.dumps(payload)
    netloc, _, rest = url.split("://", 1)[1].partition("/")
    path = "/" + rest
    signed = peerauth.sign(method, path, body, hops, on_behalf, to=netloc)
    if body:
        signed["Content-Type"] = "application/json"
    return requests.request(method, url, data=body or None, headers={**signed, **(headers or {})}, timeout=timeout)


def member_ids(node: NodeProcess) -> set[str]:
    """The ``Node`` ids of a node's processes (one with ``--processes 1``): the newest row of
    each of its worker pids (a pid may be reused by a later node)."""
    from queues.models import Node

    def ids() -> set[str]:
        found = set()
        for pid in node.member_pids():
            row = Node.objects.filter(pid=pid).order_by("-started_at").first()
            if row is not None:
                found.add(row.id)
        return found

    wait_until(lambda: len(ids()) == node.processes, 30, f"{node.processes} processes of {node.url} to register")
    return ids()


def member_addresses(node: NodeProcess) -> list[str]:
    """The addresses a node's processes registered (each serves the whole API there)."""
    from queues.models import Node

    return list(Node.objects.filter(pk__in=member_ids(node)).values_list("address", flat=True))


def node_info(url: str) -> dict:
    """A node's ``healthz`` as its peers see it (ID, address, partitions): a signed call."""
    r = peer_request("GET", f"{url}/api/v1/healthz", hops=0)
    assert r.status_code == 200 and "node" in r.json(), r.text
    return r.json()


class NodeSet:
    """Nodes started on demand with one environment, logging into ``log_dir``; ``stop()``
    stops every one (a node that failed to start too). ``processes`` is each node's
    ``runnode --processes`` unless ``start`` says otherwise (None: the launcher's default, 1)."""

    def __init__(self, env: dict[str, str], log_dir: Path, *, processes: int | None = None):
        self.env, self.log_dir, self.processes = env, log_dir, processes
        self.nodes: list[NodeProcess] = []

    def start(self, processes: int | None = None, **extra_env: str) -> NodeProcess:
        node = NodeProcess({**self.env, **extra_env}, self.log_dir, processes=processes or self.processes)
        self.nodes.append(node)
        return node.start()

    def stop(self) -> None:
        """Every node asked to stop at once, then each waited for."""
        for node in self.nodes:
            node.ask_to_stop()
        for node in self.nodes:
            node.stop()


def node_options(item: pytest.Item | pytest.Module) -> dict[str, Any]:
    """The ``@pytest.mark.node(...)`` of a test (or a module), its markers merged nearest first:
    the test's, its class's, its module's, then those a conftest adds. ``env`` dicts are merged
    (the nearest's value of a variable wins), every other option is the nearest's. ``env``
    always, ``NODE_HEARTBEAT`` in it."""
    env: dict[str, str] = {}
    options: dict[str, Any] = {}
    for marker in item.iter_markers("node"):
        if marker.args or set(marker.kwargs) - NODE_OPTIONS:
            raise TypeError(
                f"@pytest.mark.node takes {', '.join(sorted(NODE_OPTIONS))} (as keywords) only, not {marker}"
            )
        for name, value in marker.kwargs.items():
            if name == "env":
                env = {**value, **env}
            else:
                options.setdefault(name, value)
    backend = options.get("backend", "redis")
    if backend not in (*KV_BACKENDS, THIS_PROCESS):
        raise ValueError(f"@pytest.mark.node(backend={backend!r}): one of {', '.join(KV_BACKENDS)}, {THIS_PROCESS}")
    return {**options, "env": {"NODE_HEARTBEAT": HEARTBEAT, **env}}


class NodeFactory:
    """What the ``node_factory`` fixture returns (tests/conftest.py): ``node_factory(**env)``
    starts a node process for the test and returns it, set up by the test's ``node`` marker
    (:func:`node_options`) with ``env`` on top; every node it made is stopped at the test's end.

    ``processes`` (``runnode --processes``; the one positional argument), and as keywords
    ``backend`` (its key-value store, the marker's by default), ``data`` (its data folder under
    the test's ``tmp_path``: nodes of one test share ``data`` unless told otherwise), ``port``,
    ``timeout`` (of the start) and ``start=False`` (made, to be started by the test: a node that
    takes over from another)."""

    def __init__(self, request: pytest.FixtureRequest, tmp_path: Path):
        self.request, self.tmp_path = request, tmp_path
        self.options = node_options(request.node)
        self.nodes: list[NodeProcess] = []
        self._flushed: set[str] = set()
        self._empty_once(self.options.get("backend", "redis"))

    def __call__(
        self,
        processes: int | None = None,
        *,
        backend: str | None = None,
        data: str = "data",
        port: int | None = None,
        timeout: float = 30,
        start: bool = True,
        **env: str,
    ) -> NodeProcess:
        backend = backend or self.options.get("backend", "redis")
        self._empty_once(backend)
        if backend == THIS_PROCESS:
            env = {"KV_URL": settings.KV_URL, **env}
        node_env_ = local_node_env(
            self.tmp_path, "file" if backend == THIS_PROCESS else backend, data=data, **{**self.options["env"], **env}
        )
        node = NodeProcess(node_env_, self.tmp_path, port, processes=processes or self.options.get("processes"))
        self.nodes.append(node)
        return node.start(timeout=timeout) if start else node

    def _empty_once(self, backend: str) -> None:
        """The test's Redis db (or Redis Cluster) emptied before its first node and after the
        test (their fixtures; the test is skipped where the store is not there)."""
        fixture = {"redis": "redis_client", "redis-cluster": "redis_cluster_client"}.get(backend)
        if fixture and fixture not in self._flushed:
            self._flushed.add(fixture)
            self.request.getfixturevalue(fixture)

    def stop(self) -> None:
        """Every node asked to stop at once, then each waited for."""
        for node in self.nodes:
            node.ask_to_stop()
        for node in self.nodes:
            node.stop()


class Client:
    """A thin API client for tests (the SDK proper is ``mq_client``)."""

    def __init__(self, base: str, token: str):
        self.base = base
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Token {token}"

    def post(self, path: str, payload: dict, timeout: float = 30) -> requests.Response:
        return self.session.post(f"{self.base}/api/v1/{path}", json=payload, timeout=timeout)

    def get(self, path: str, timeout: float = 30) -> requests.Response:
        return self.session.get(f"{self.base}/api/v1/{path}", timeout=timeout)


def drain(c: Client, path: str, *, batch: int = 100, timeout: float = 60) -> list[dict]:
    """Dequeue from ``path`` (a queue's or a subscription's, ``queues/q`` or ``topics/t/subscriptions/s``)
    and ack, until three empty answers in a row; 503 (a takeover in progress) is retried. The
    messages, in the order they came."""
    out: list[dict] = []
    quiet = 0
    deadline = time.monotonic() + timeout
    while quiet < 3:
        assert time.monotonic() < deadline, f"{path}: still draining after {timeout}s ({len(out)} so far)"
        r = c.post(f"{path}/dequeue", {"max": batch, "visibility_timeout": 120})
        if r.status_code == 503:
            time.sleep(0.2)
            continue
        assert r.status_code == 200, r.text
        got = r.json()["messages"]
        if not got:
            quiet += 1
            time.sleep(0.2)
            continue
        quiet = 0
        out.extend(got)
        r = c.post(f"{path}/ack", {"messages": [{"id": m["id"], "receipt": m["receipt"]} for m in got]})
        assert r.status_code == 200, r.text
    return out


@contextmanager
def in_cluster_of(node: NodeProcess) -> Iterator[None]:
    """This process a member of ``node``'s cluster meanwhile, as an admin process of it is: its
    key-value store the node's (``KV_URL``, under ``KV_PREFIX``), where a change of SQS
    credentials is announced to every process (``sqs.keys``). The test process's own store is
    another database."""
    from queues import kv

    url = node.env["KV_URL"]
    if url.startswith("redis://"):
        import redis

        from queues.kv.redis import RedisStore

        # (a Redis store of the settings is the "kv" cache's connection, made once)
        inner: kv.KeyValueStore = RedisStore(redis.Redis.from_url(url))
    else:
        inner = kv.open_store(url)
    reset_store()
    kv._store = inner.within(node.env.get("KV_PREFIX", settings.KV_PREFIX))
    try:
        yield
    finally:
        reset_store()
