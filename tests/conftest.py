"""Fixtures shared by every test layer.

The suite runs against real services: ``make test`` starts PostgreSQL, Redis and a
three-primary Redis Cluster on loopback and exports ``DATABASE_URL``, ``KV_URL``,
``MQ_TEST_PG_URL``, ``MQ_TEST_REDIS_URL`` and ``MQ_TEST_REDIS_CLUSTER_URL``. Unit tests of the
pure core need none of them.

Every run starts from empty stores, so that a second run in one clone sees nothing of the first:
pytest-django makes the test database anew (never ``--reuse-db``), and :func:`_empty_redis`
empties the Redis and the Redis Cluster the ``MQ_TEST_*`` variables name before the first test.
Those must be servers for tests only (``scripts/services.sh`` starts them), and one run at a
time uses them.
"""

from __future__ import annotations

import os
import uuid

import pytest
from hypothesis import settings as hypothesis_settings

# Hypothesis's per-example deadline is a timed pass/fail check: on a loaded machine a first
# example that imports or warms a cache runs past it. Examples are judged on what they do.
hypothesis_settings.register_profile("mq", deadline=None)
hypothesis_settings.load_profile("mq")

REDIS_URL = os.environ.get("MQ_TEST_REDIS_URL", "")
PG_URL = os.environ.get("MQ_TEST_PG_URL", "")
REDIS_CLUSTER_URL = os.environ.get("MQ_TEST_REDIS_CLUSTER_URL", "")


def pytest_configure(config):
    """The tests' nodes are left where the kernel puts them (``NODE_CPU_AFFINITY=off``) unless a
    test asks otherwise (tests/integration/test_runnode_affinity.py). Under ``auto`` each
    would be pinned to a CPU its random port picks: on a small machine the nodes of one test
    would often share a CPU that PostgreSQL, Redis or a node of a parallel run keeps busy, and
    the kernel could not move them away; their heartbeats and leases would lag for no gain
    the tests measure."""
    from tests import launcher

    launcher.NodeProcess.default_cpu_affinity = "off"


#: The fixtures that start node processes: a test that uses one is a ``cluster`` test.
NODE_FIXTURES = frozenset({"node", "node_factory", "module_node"})


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects by marker
def pytest_collection_modifyitems(items):
    """Mark ``cluster`` every test that starts nodes through the shared fixtures."""
    for item in items:
        if NODE_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.cluster)


def pytest_runtest_setup(item):
    """Only a test marked ``cluster`` may start a node process (its fixtures included), so that
    ``-m "not cluster"`` is the in-process tests, all of them."""
    from tests import launcher

    if item.get_closest_marker("cluster"):
        launcher.start_check = None
        return

    def refuse() -> None:
        raise AssertionError(f"{item.nodeid} starts a node process: mark it @pytest.mark.cluster")

    launcher.start_check = refuse


def pytest_terminal_summary(terminalreporter):
    """The fuzzing's cases per entrance, when fuzz tests ran (tests/fuzzing.py)."""
    from tests import fuzzing

    lines = fuzzing.TALLY.lines()
    if lines:
        terminalreporter.section("fuzzing: cases per entrance")
        for line in lines:
            terminalreporter.write_line(line)


def pytest_report_header(config):
    from django.conf import settings

    return [f"database: {settings.DATABASES['default']['ENGINE']}  KV_URL: {settings.KV_URL}"]


@pytest.fixture
def unique_name():
    """A queue name no other test uses."""

    def make(prefix: str = "q") -> str:
        return f"{prefix}-{uuid.uuid4().hex[:10]}"

    return make


@pytest.fixture(scope="session", autouse=True)
def _empty_redis():
    """Empty every database of the test Redis and the primaries of the test Redis Cluster before
    the first test: the key-value store of this process (``KV_URL``: db 1 under ``make test``)
    and of the node processes (db 5), the cache and the Celery broker. A queue's keys are named
    by its row's ID, which a new test database hands out again from 1: what a run before left
    under them would show up in this run's queues."""
    if REDIS_URL:
        import redis

        client = redis.Redis.from_url(REDIS_URL)
        try:
            client.flushall()
        finally:
            client.close()
    if REDIS_CLUSTER_URL:
        from queues.kv.redis_cluster import cluster_client

        cluster = cluster_client(REDIS_CLUSTER_URL)
        try:
            cluster.flushall()
        finally:
            cluster.close()


@pytest.fixture
def redis_client():
    if not REDIS_URL:
        pytest.skip("MQ_TEST_REDIS_URL is not set (make test sets it)")
    import redis

    client = redis.Redis.from_url(REDIS_URL + "/5")
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


@pytest.fixture(scope="session")
def redis_cluster_client():
    """A client of the test Redis Cluster, its primaries flushed at the end of the session only
    (empty at its start: :func:`_empty_redis`; a flush of three primaries and a new client cost
    0.3 s): the tests that use it write under keys of their own (a random prefix, a queue name
    used once)."""
    if not REDIS_CLUSTER_URL:
        pytest.skip("MQ_TEST_REDIS_CLUSTER_URL is not set (make test sets it)")
    from queues.kv.redis_cluster import cluster_client

    client = cluster_client(REDIS_CLUSTER_URL)
    yield client
    client.flushall()
    client.close()


@pytest.fixture
def node_factory(request, transactional_db, tmp_path):
    """``node_factory(**env)``: start a node process for this test and return it
    (tests.integration.nodes.NodeFactory: its keywords, ``processes=``, ``backend=``, ...); every
    one it started is stopped at the test's end, before the database is flushed.

    The nodes run on the test database (so the test is transactional: a node sees committed
    rows only), their data and logs under ``tmp_path``; ``@pytest.mark.node(...)`` on the test,
    its class or its module sets them up (tests.integration.nodes.node_options):

    - ``env={"NAME": "value"}``: settings of every node (on top of ``NODE_HEARTBEAT=0.3``);
    - ``backend="redis"``: their key-value store (``tests.launcher.KV_BACKENDS``, Redis db 5
      emptied before and after the test by default; or ``"this-process"``: this process's);
    - ``processes=N``: ``runnode --processes`` of each (1 by default);
    - ``shared=True``: the ``node`` of the module's tests is one node for them all (below)."""
    from tests.integration.nodes import NodeFactory

    factory = NodeFactory(request, tmp_path)
    request.node.started_nodes = factory.nodes  # for a teardown that keeps their logs (tests/e2e)
    yield factory
    factory.stop()


@pytest.fixture
def node(request):
    """One node process, as :func:`node_factory` starts them; in a module marked
    ``@pytest.mark.node(shared=True)``, the module's node (``module_node``,
    tests/integration/conftest.py), shared by its tests, which commit their rows themselves."""
    from tests.integration.nodes import node_options

    if node_options(request.node).get("shared"):
        return request.getfixturevalue("module_node")
    return request.getfixturevalue("node_factory")()


@pytest.fixture
def kv_reset():
    """Forget the process's key-value store before and after (tests switch backends)."""
    from queues.kv import reset_store

    reset_store()
    yield
    reset_store()


@pytest.fixture
def runtime(request, db, kv_reset, tmp_path):
    """A node runtime in this process, without its housekeeping thread (the test ticks it), on
    the configured key-value store; parametrized indirectly (``runtime`` given "file", "redis"
    or "postgres"), on that backend as a node opens it (tests.integration.nodes.backend_store),
    what it wrote there removed afterwards."""
    from queues import service
    from queues.cluster.node import NodeRuntime
    from queues.http.auth import CachedTokenAuthentication
    from queues.http.errors import exception_handler  # noqa: F401  (import the API's error mapping)

    backend = getattr(request, "param", None)
    store = None
    if backend is not None:
        from tests.integration.nodes import backend_store

        store = backend_store(backend, request, tmp_path)
    CachedTokenAuthentication.forget()
    rt = NodeRuntime("test-node", store=store, background=False).start()
    service.set_runtime(rt)
    yield rt
    if store is not None:
        from queues.engine.keys import incarnation
        from queues.models import Queue

        for pk, name in Queue.objects.values_list("pk", "name"):
            store.within(incarnation(pk)).delete_prefix(name)
    rt.stop(release=True)
    service.set_runtime(None)


@pytest.fixture
def user(db):
    """A user without a password (hashing one costs half a second per test)."""
    from django.contrib.auth.models import User

    return User.objects.create(username=f"u-{uuid.uuid4().hex[:8]}")


@pytest.fixture
def purge_kv(runtime):
    """The database rolls back after each test, the key-value store does not: empty it."""
    yield
    from queues.engine.keys import incarnation
    from queues.models import Queue

    for pk, name in Queue.objects.values_list("pk", "name"):
        runtime.store.within(incarnation(pk)).delete_prefix(name)


@pytest.fixture
def api(request, runtime, user):
    """A test client of the node runtime, authenticated with a real token: DRF's test client
    (straight to Django); in a test marked ``transports``, that one and then the node's WSGI
    application, whose fast path serves the message calls (tests/integration/wsgi_client.py)."""
    from tests.integration.wsgi_client import token_client

    return token_client(getattr(request, "param", "drf"), user)


def pytest_generate_tests(metafunc):
    """A test marked ``transports`` runs once per transport of its ``api``: ``[drf]`` and ``[fastpath]``."""
    if metafunc.definition.get_closest_marker("transports") and "api" in metafunc.fixturenames:
        from tests.integration.wsgi_client import TRANSPORTS

        metafunc.parametrize("api", TRANSPORTS, indirect=True)


@pytest.fixture
def superuser_api(api, user, purge_kv):
    """``api`` as a superuser's: it may purge, redrive, change and delete any queue."""
    from queues.http.auth import CachedTokenAuthentication

    user.is_staff = user.is_superuser = True
    user.save()
    CachedTokenAuthentication.forget()
    return api


@pytest.fixture(scope="session")
def spark():
    """One local Spark session for the whole run (its start costs seconds)."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from consoles.spark.job import spark_session

    return spark_session()


@pytest.fixture
def exporter():
    """Spans of a TracerProvider of the SDK's (``exporter.provider``), finished ones in memory
    (``get_finished_spans``); ``exporter.tracer``: the client SDK's tracer on it."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from mq_client import tracing

    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    memory.provider = provider
    memory.tracer = tracing.tracer(provider)
    return memory


@pytest.fixture
def make_queue(api, unique_name):
    """Create a queue through the API; returns its name."""

    def make(**fields) -> str:
        fields.setdefault("name", unique_name())
        r = api.post("/api/v1/queues", fields, format="json")
        assert r.status_code == 201, r.content
        return fields["name"]

    return make


@pytest.fixture
def token(transactional_db):
    """A committed API token, for node processes (which cannot see a test's transaction)."""
    from django.contrib.auth.models import User
    from rest_framework.authtoken.models import Token

    return Token.objects.create(user=User.objects.create(username=f"t-{uuid.uuid4().hex[:8]}")).key
