"""Settings, read from the environment.

Every value has an embedded default (SQLite, the filesystem key-value store, Celery's
filesystem broker, Spark in local mode) so that `make run` works with nothing installed.
Setting ``MQ_ENV=production`` turns on the checks that refuse an unsafe configuration.
"""

from __future__ import annotations

import ipaddress
import os
import re
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent
DATA_DIR = Path(os.environ.get("MQ_DATA_DIR", BASE_DIR / "data"))

_DEFAULT_SECRET = "embedded-insecure-secret-change-me"  # noqa: S105 - the embedded default; refused when DEBUG is off


def env(name: str, default: str) -> str:
    return os.environ.get(name, default)


def envbool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ImproperlyConfigured(f"{name}={raw!r} is not a boolean (use 1/0, true/false, yes/no, on/off)")


def envint(name: str, default: int, *, minimum: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not an integer") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name}={value} is below its minimum {minimum}")
    return value


def envfloat(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not a number") from None


def envsecret(name: str, default: str) -> str:
    """A secret from ``NAME`` or from the file named by ``NAME_FILE``."""
    path = os.environ.get(f"{name}_FILE")
    if path:
        return Path(path).read_text().strip()
    return os.environ.get(name, default)


def generated_secret(path: Path) -> str:
    """The secret in ``path``, made on first use: 48 random bytes (URL-safe base64), mode 0600.

    Made atomically: written whole to a private temporary file, then hard-linked to ``path``,
    which fails if it exists. Of several processes starting at once (the nodes of one embedded
    cluster share the data folder) exactly one link succeeds and every one reads that file.
    """
    try:
        value = path.read_text().strip()
    except FileNotFoundError:
        value = ""
    if value:
        return value
    import secrets
    import tempfile

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)  # 0600 by mkstemp
    try:
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(48) + "\n")
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass  # another process made it first: theirs is the secret
    finally:
        os.unlink(tmp)
    value = path.read_text().strip()
    if not value:
        raise ImproperlyConfigured(f"{path} is empty: delete it (a new secret is made) or set CLUSTER_SECRET")
    return value


MQ_ENV = env("MQ_ENV", "embedded")
if MQ_ENV not in ("embedded", "production"):
    raise ImproperlyConfigured(f"MQ_ENV={MQ_ENV!r}: use 'embedded' or 'production'")

SECRET_KEY = envsecret("SECRET_KEY", _DEFAULT_SECRET)
DEBUG = envbool("DEBUG", False)
# Nodes sign forwarded calls with this (an HMAC, queues/cluster/peerauth.py); it never travels. Unset:
# production refuses to start; embedded generates one into the data folder on first start,
# shared by every node using that folder (nodes elsewhere must be given the same one).
CLUSTER_SECRET_PATH = DATA_DIR / "cluster-secret"
CLUSTER_SECRET = envsecret("CLUSTER_SECRET", "")
# Seconds a forwarded call's timestamp may be off this node's clock (either way); a replayed
# signature is refused within it, and outside it the timestamp is.
CLUSTER_CLOCK_SKEW = envfloat("CLUSTER_CLOCK_SKEW", 30.0)

if MQ_ENV == "production":
    if DEBUG:
        raise ImproperlyConfigured("MQ_ENV=production refuses DEBUG=1")
    if SECRET_KEY == _DEFAULT_SECRET:
        raise ImproperlyConfigured("MQ_ENV=production needs SECRET_KEY (or SECRET_KEY_FILE)")
    if not CLUSTER_SECRET:
        raise ImproperlyConfigured("MQ_ENV=production needs CLUSTER_SECRET (or CLUSTER_SECRET_FILE)")
    if "ALLOWED_HOSTS" not in os.environ:
        raise ImproperlyConfigured("MQ_ENV=production needs ALLOWED_HOSTS (the names clients and nodes call it by)")
elif not CLUSTER_SECRET:
    CLUSTER_SECRET = generated_secret(CLUSTER_SECRET_PATH)
if CLUSTER_SECRET in (SECRET_KEY, _DEFAULT_SECRET):
    raise ImproperlyConfigured(
        "CLUSTER_SECRET must differ from SECRET_KEY and from the published default: "
        "each is a secret of its own (CLUSTER_SECRET is shared by every node)"
    )
if not 0 < CLUSTER_CLOCK_SKEW <= 300:
    raise ImproperlyConfigured(f"CLUSTER_CLOCK_SKEW={CLUSTER_CLOCK_SKEW}: use seconds in (0, 300]")

# --- HTTPS, cookies, login -----------------------------------------------------------------
_production = MQ_ENV == "production"
# Production: the session and CSRF cookies travel over HTTPS only (not configurable there).
SESSION_COOKIE_SECURE = _production
CSRF_COOKIE_SECURE = _production
#: Seconds browsers keep to HTTPS after an HTTPS answer (HSTS; sent on HTTPS answers only,
#: so behind a TLS proxy it needs SECURE_PROXY_SSL_HEADER). 0: none (the embedded default).
SECURE_HSTS_SECONDS = envint("SECURE_HSTS_SECONDS", 365 * 24 * 3600 if _production else 0, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = envbool("SECURE_HSTS_INCLUDE_SUBDOMAINS", _production)
#: Listing in the browsers' preload lists is a commitment for the whole domain: opt in.
SECURE_HSTS_PRELOAD = envbool("SECURE_HSTS_PRELOAD", False)


def _proxy_ssl_header(raw: str) -> tuple[str, str] | None:
    """``"X-Forwarded-Proto: https"`` -> ``("HTTP_X_FORWARDED_PROTO", "https")``."""
    if not raw.strip():
        return None
    name, sep, value = raw.partition(":")
    if not sep or not name.strip() or not value.strip():
        raise ImproperlyConfigured(f"SECURE_PROXY_SSL_HEADER={raw!r}: use 'Header-Name: value'")
    return "HTTP_" + name.strip().upper().replace("-", "_"), value.strip()


#: Where TLS ends at a proxy: the header (and value) it sets on HTTPS requests, e.g.
#: ``X-Forwarded-Proto: https``. Only behind a proxy that always sets or strips it: a client
#: could send it otherwise. Empty: requests are HTTPS only when the node itself sees TLS.
SECURE_PROXY_SSL_HEADER = _proxy_ssl_header(env("SECURE_PROXY_SSL_HEADER", ""))
#: Redirect plain HTTP to HTTPS. Off by default even in production: nodes forward calls to
#: each other's NODE_ADDRESS over plain HTTP inside the cluster, and a redirect would break
#: them; let the TLS proxy redirect the public side.
SECURE_SSL_REDIRECT = envbool("SECURE_SSL_REDIRECT", False)
#: Failed console logins allowed per username (and 4x that per client address) within
#: ADMIN_LOGIN_WINDOW seconds; past them the login answers 429 (consoles/login_guard.py).
ADMIN_LOGIN_FAILURES = envint("ADMIN_LOGIN_FAILURES", 5, minimum=1)
ADMIN_LOGIN_WINDOW = envint("ADMIN_LOGIN_WINDOW", 900, minimum=1)

# Embedded default: the loopback names and the host this node advertises to its peers
# (``runnode --advertise``), so a web page cannot reach the node by DNS rebinding.
_advertised = os.environ.get("NODE_ADDRESS", "").rpartition(":")[0]
ALLOWED_HOSTS = [
    h.strip() for h in env("ALLOWED_HOSTS", f"localhost,127.0.0.1,[::1],{_advertised}").split(",") if h.strip()
]
CSRF_TRUSTED_ORIGINS = [o.strip() for o in env("CSRF_TRUSTED_ORIGINS", "").split(",") if o.strip()]

INSTALLED_APPS = [
    "config.apps.MQAdminConfig",  # django.contrib.admin, its default site the console's
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI served by the node, never from a CDN
    "queues",
    "workers",
    "consoles",
    "archive",
    "sqs",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # API call latency (the fast path times its own calls).
    "queues.metrics.ApiTimingMiddleware",
    # An outage met by a page or a form of the console: 503 with Retry-After, not 500.
    "queues.http.errors.OutageMiddleware",
]

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = "config.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# --- stores -------------------------------------------------------------------------------
DATABASE_URL = env("DATABASE_URL", f"sqlite:///{DATA_DIR / 'db.sqlite3'}")
DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=600)}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    Path(DATABASES["default"]["NAME"]).parent.mkdir(parents=True, exist_ok=True)
    # Several threads of one node and several processes share the file: wait for the
    # write lock instead of failing at once, and let readers run beside the writer.
    DATABASES["default"]["OPTIONS"] = {
        "timeout": 30,
        "transaction_mode": "IMMEDIATE",
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
    DATABASES["default"]["CONN_MAX_AGE"] = 0
    test_name = os.environ.get("SQLITE_TEST_NAME")
    if test_name:
        # Node processes started by the tests must see the same file, not a memory DB.
        DATABASES["default"]["TEST"] = {"NAME": test_name}
#: Seconds a database call may wait for PostgreSQL before it fails (503 to the client) and its
#: connection is dropped: a server that is paused or cut off never answers, and nothing on the
#: client side ends the wait otherwise (config/postgresql/base.py). 0: no deadline. Keep it
#: above the slowest query the service runs (migrations run in their own process: raise it
#: there with the variable if a migration needs longer).
DB_CALL_TIMEOUT = envfloat("DB_CALL_TIMEOUT", 5.0)
#: Seconds to open a connection to PostgreSQL (libpq's connect_timeout: at least 2). A call that
#: meets an unreachable database answers 503 after at most about DB_CALL_TIMEOUT (the kept
#: connection's check) plus DB_CONNECT_TIMEOUT (the new connection): keep the sum below your
#: clients' timeouts.
DB_CONNECT_TIMEOUT = envint("DB_CONNECT_TIMEOUT", 3, minimum=2)
if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    DATABASES["default"]["ENGINE"] = "config.postgresql"
    DATABASES["default"].setdefault("OPTIONS", {})["connect_timeout"] = DB_CONNECT_TIMEOUT
    # A kept connection is checked (SELECT 1) before a request's first query: one cut by a
    # database restart is replaced there, instead of failing that request. Not one that
    # answered within the last second (config/postgresql/base.py: HEALTH_CHECK_IDLE).
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
    # The key-value store's statements (queues/kv/sql.py, server-bound) are prepared once per
    # connection: planning them costs PostgreSQL more CPU than running them. Django
    # disables prepared statements for connection poolers; its own queries bind on the client
    # and are never prepared, so only ours are. Behind a pooler in transaction mode, set
    # DB_PREPARED_STATEMENTS=false (or use PgBouncer 1.21+ with max_prepared_statements).
    if envbool("DB_PREPARED_STATEMENTS", True):
        DATABASES["default"]["OPTIONS"]["prepare_threshold"] = 5

#: Where messages and append-tree blocks live: file:///path, redis://host:port/db,
#: redis-cluster://host:port,host:port,... (seed nodes of a Redis Cluster), postgres.
KV_URL = env("KV_URL", f"file://{DATA_DIR / 'kv'}")
#: Every key the service writes starts with this (letters, digits, _ . : -; not empty), and
#: deleting a queue reaches no key outside it: a Redis database can be shared with Celery's
#: broker or another application. Changing it on a store in use hides the existing keys
#: (they are not read under another prefix): see docs/explanation/correctness.md, "Keys in the store".
KV_PREFIX = env("KV_PREFIX", "mq:")
if not re.match(r"^[A-Za-z0-9_][A-Za-z0-9_.:\-]*$", KV_PREFIX):
    raise ImproperlyConfigured(f"KV_PREFIX={KV_PREFIX!r}: use letters, digits and _ . : - (no /), not empty")
#: Redis only (not a Redis Cluster): every write waits until this many replicas have it (WAIT), else fails.
KV_MIN_REPLICAS = envint("KV_MIN_REPLICAS", 0, minimum=0)

#: Seconds a Redis call (key-value store, cache) may wait for an answer, and to connect, before
#: it fails (503 to the client): a Redis that is paused or cut off would otherwise hold the
#: call, and the partition's lock, until it comes back. Keep it well above Redis' slowest
#: answer (a large fenced write with WAIT for replicas: KV_MIN_REPLICAS waits up to 1 s).
REDIS_TIMEOUT = envfloat("REDIS_TIMEOUT", 2.0)
REDIS_CONNECT_TIMEOUT = envfloat("REDIS_CONNECT_TIMEOUT", 2.0)
REDIS_URL = env("REDIS_URL", "")
CACHES: dict[str, dict[str, object]] = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
if REDIS_URL:
    CACHES["default"] = {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": REDIS_URL,
        "OPTIONS": {
            "CLIENT_CLASS": "django_redis.client.DefaultClient",
            "SOCKET_TIMEOUT": REDIS_TIMEOUT,
            "SOCKET_CONNECT_TIMEOUT": REDIS_CONNECT_TIMEOUT,
        },
    }
if KV_URL.startswith(("redis://", "rediss://", "unix://")):
    # The key-value store goes through django-redis' connection factory, like the cache.
    CACHES["kv"] = {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": KV_URL,
        "OPTIONS": {
            "CLIENT_CLASS": "django_redis.client.DefaultClient",
            "SOCKET_TIMEOUT": REDIS_TIMEOUT,
            "SOCKET_CONNECT_TIMEOUT": REDIS_CONNECT_TIMEOUT,
            "CONNECTION_POOL_KWARGS": {"max_connections": 256, "health_check_interval": 30},
        },
    }

# --- Celery -------------------------------------------------------------------------------
CELERY_BROKER_URL = env("CELERY_BROKER_URL", "filesystem://")
CELERY_BROKER_TRANSPORT_OPTIONS = {}
CELERY_BROKER_TRANSPORT = None
if CELERY_BROKER_URL.startswith("filesystem://"):
    # kombu's filesystem transport with its files written whole (config/broker.py): kombu's own
    # lets a worker read a message file its producer has created but not yet written.
    CELERY_BROKER_TRANSPORT = "config.broker:Transport"
    _broker_dir = DATA_DIR / "broker"
    # kombu's filesystem transport does not create its folders.
    for _sub in ("out", "processed", "control"):
        (_broker_dir / _sub).mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_broker_dir / "out"),
        "data_folder_out": str(_broker_dir / "out"),
        "processed_folder": str(_broker_dir / "processed"),
        "control_folder": str(_broker_dir / "control"),
        "store_processed": False,
    }
CELERY_RESULT_BACKEND = env("CELERY_RESULT_BACKEND", "") or None
CELERY_TASK_IGNORE_RESULT = True
CELERY_TIMEZONE = "UTC"
CELERY_BEAT_SCHEDULE = {
    "retention": {"task": "queues.expire", "schedule": envfloat("RETENTION_EVERY", 60.0)},
    "attempt-logs": {"task": "workers.expire_attempt_logs", "schedule": 3600.0},
    "consumers": {"task": "workers.expire_consumers", "schedule": 300.0},
    "dashboards": {"task": "consoles.refresh_dashboards", "schedule": envfloat("DASHBOARDS_EVERY", 300.0)},
    "archive": {"task": "archive.run_archiver", "schedule": envfloat("ARCHIVE_EVERY", 10.0)},
    "outbox": {"task": "workers.relay_outbox", "schedule": envfloat("OUTBOX_RELAY_EVERY", 10.0)},
}
#: Days an attempt record is kept.
ATTEMPT_LOG_RETENTION_DAYS = envint("ATTEMPT_LOG_RETENTION_DAYS", 30, minimum=1)
#: Seconds a consumer (a worker's heartbeat row) is kept after its last heartbeat.
CONSUMER_RETENTION = envint("CONSUMER_RETENTION", 3600, minimum=60)
#: Consumers one user may have heard from within CONSUMER_RETENTION; a new one past it is 429.
WORKER_MAX_CONSUMERS_PER_USER = envint("WORKER_MAX_CONSUMERS_PER_USER", 100, minimum=1)
#: Held messages one heartbeat may list (400 past it).
WORKER_MAX_HELD = envint("WORKER_MAX_HELD", 1000, minimum=1)

# --- Django's tasks framework ------------------------------------------------------------
# ``@task`` functions of this project run on the service's queues (docs/how-to/django-tasks.md):
# TASKS_QUEUES names the queues tasks may use (they must exist), TASKS_MODULES the modules that
# declare them (a worker runs only the tasks declared there, and imports nothing a message names);
# the service is reached at QUEUE_API_URL with QUEUE_API_TOKEN, as the workers do.
#: Seconds an enqueue's outbox row waits for its writer before a relay sends it (workers/outbox.py).
OUTBOX_RELAY_AFTER = envfloat("OUTBOX_RELAY_AFTER", 10.0)
TASKS = {
    "default": {
        "BACKEND": "workers.tasks_backend.QueueTaskBackend",
        "QUEUES": [q.strip() for q in env("TASKS_QUEUES", "default").split(",") if q.strip()],
        "OPTIONS": {
            "modules": [m.strip() for m in env("TASKS_MODULES", "").split(",") if m.strip()],
            "relay_after": OUTBOX_RELAY_AFTER,
        },
    }
}
#: Mail from tasks and the console (Django's backends; the file one writes into EMAIL_FILE_PATH).
EMAIL_BACKEND = env("EMAIL_BACKEND", "django.core.mail.backends.smtp.EmailBackend")
EMAIL_FILE_PATH = env("EMAIL_FILE_PATH", str(DATA_DIR / "mail"))

# --- Spark --------------------------------------------------------------------------------
SPARK_MASTER = env("SPARK_MASTER", "local[2]")
#: Partitions of the dashboards job's shuffles: its results are small, few partitions are faster.
SPARK_SHUFFLE_PARTITIONS = envint("SPARK_SHUFFLE_PARTITIONS", 4, minimum=1)
#: Driver memory of the dashboards job (applies when this process starts the JVM).
SPARK_DRIVER_MEMORY = env("SPARK_DRIVER_MEMORY", "2g")
#: PostgreSQL's JDBC driver (Debian's libpostgresql-jdbc-java): Spark reads the attempt log with it.
SPARK_JDBC_JAR = env("SPARK_JDBC_JAR", "/usr/share/java/postgresql.jar")
#: At most this many parallel JDBC reads of the attempt log (one per 100,000 attempts).
SPARK_JDBC_PARTITIONS = envint("SPARK_JDBC_PARTITIONS", 4, minimum=1)
#: Seconds per time bucket of the dashboards' figures.
DASHBOARDS_BUCKET = envint("DASHBOARDS_BUCKET", 60, minimum=1)
#: Seconds of attempt log each refresh reads (its buckets are recomputed, older ones kept).
DASHBOARDS_WINDOW = envint("DASHBOARDS_WINDOW", 24 * 3600, minimum=60)
#: Samples a queue needs before its time estimates are learned from them.
DASHBOARDS_MIN_SAMPLES = envint("DASHBOARDS_MIN_SAMPLES", 20, minimum=2)
#: Days of figures, runs and learned-estimate history kept.
DASHBOARDS_HISTORY_DAYS = envint("DASHBOARDS_HISTORY_DAYS", 30, minimum=1)

# --- the node -----------------------------------------------------------------------------
#: Seconds between the points of the queues' rate history (the overview's sparklines): at the
#: start of each step, a node's housekeeping pass writes the rates it publishes for each of its
#: partitions (``queues.models.RateSample``) and deletes the points older than
#: RATE_HISTORY_SECONDS. 0: no history.
RATE_HISTORY_STEP = envfloat("RATE_HISTORY_STEP", 60.0)
RATE_HISTORY_SECONDS = envint("RATE_HISTORY_SECONDS", 3600, minimum=60)
#: The most points a queue's history holds (RATE_HISTORY_SECONDS / RATE_HISTORY_STEP): the
#: overview sends them all, and each is a row a partition.
RATE_HISTORY_MAX_POINTS = 1440
if RATE_HISTORY_STEP != 0 and not 1 <= RATE_HISTORY_STEP < float("inf"):
    raise ImproperlyConfigured(f"RATE_HISTORY_STEP={RATE_HISTORY_STEP}: use 0 (no history) or seconds >= 1")
if RATE_HISTORY_STEP and RATE_HISTORY_SECONDS / RATE_HISTORY_STEP > RATE_HISTORY_MAX_POINTS:
    raise ImproperlyConfigured(
        f"RATE_HISTORY_SECONDS / RATE_HISTORY_STEP = {RATE_HISTORY_SECONDS / RATE_HISTORY_STEP:g} points: "
        f"at most {RATE_HISTORY_MAX_POINTS} (a longer step, or a shorter history)"
    )
#: The address other nodes and clients reach this node at (set by `runnode`).
NODE_ADDRESS = env("NODE_ADDRESS", "")
#: Seconds between node heartbeats / housekeeping passes.
NODE_HEARTBEAT = envfloat("NODE_HEARTBEAT", 1.0)
#: A node process that has not answered its own probe (``queues.cluster.watchdog``: a call through its
#: own server, which needs a free request thread) for this many seconds gives up its leases and
#: stops its heartbeat until it answers again. Keep it under the queues' lease periods (10 s by
#: default), so a process that serves nobody loses its partitions within one lease period.
NODE_STUCK_AFTER = envfloat("NODE_STUCK_AFTER", 5.0)
if not 0.5 <= NODE_STUCK_AFTER <= 600:
    raise ImproperlyConfigured(f"NODE_STUCK_AFTER={NODE_STUCK_AFTER}: use seconds in [0.5, 600]")
#: For a test run that checks ownership from outside (the nemesis run): the path of a UNIX
#: datagram socket to which each node process sends a JSON datagram when it starts and when it
#: stops serving a partition (``queues.cluster.ownership``). "" (the default): nothing is sent.
OWNERSHIP_EVENTS = env("OWNERSHIP_EVENTS", "")
#: For the same runs: every answer to a message call says which partition managers served it
#: (``X-MQ-Served-By``: node, partition and epoch of each). Cluster-wide: a node that forwards a
#: call passes on the owner's list. Off by default.
SERVED_BY_HEADER = envbool("SERVED_BY_HEADER", False)
#: Bytes of message bodies a node keeps in memory after enqueue, to deliver without a read.
NODE_BODY_CACHE_BYTES = envint("NODE_BODY_CACHE_BYTES", 64 * 1024 * 1024, minimum=0)
#: A busy partition's append-tree blocks grow up to this many times its queue's `block_size` (at
#: most 10,000 positions): a block that filled within a second is followed by one twice its size
#: (`queues.engine.tree.next_block_size`). 1: every block holds `block_size`.
BLOCK_GROWTH = envint("BLOCK_GROWTH", 16, minimum=1)
#: Request threads of `runnode` (its --threads default), per process: a long poll holds one for up to 20 s.
NODE_THREADS = envint("NODE_THREADS", 64, minimum=1)
#: Processes of `runnode` (its --processes default), each a node (a full member of the cluster)
#: behind runnode's one port (``queues.cluster.serving``). 0 (the default): the machine's cores, but 1 on SQLite (the
#: embedded default: SQLite takes one writer at a time, and every process heartbeats, renews and
#: publishes figures through it; a second process adds lock waits, not throughput). runnode sets
#: it to the count it serves with for its processes, which divide per-process bounds by it; any
#: other process (a shell, a Celery worker, a test) is one process and counts 0 as 1.
NODE_PROCESSES = envint("NODE_PROCESSES", 0, minimum=0)
#: Where `runnode` runs its worker processes (its --cpu-affinity default): "auto", each process
#: on a CPU of its own among those runnode may use (worker i on the i-th after one chosen by the
#: node's port; more processes than CPUs share them round robin); "off", left to the kernel
#: (for nodes that share a machine: one-process nodes on one port would all start on one CPU);
#: or a list of CPUs to pin them to, whatever their number ("0-3,6"). On one CPU a request's
#: hand-offs between the server's threads and the GIL's stay on it (see
#: `queues.cluster.serving.cpu_plan`).
NODE_CPU_AFFINITY = env("NODE_CPU_AFFINITY", "auto")
#: Seconds between a process's looks at how the node's client connections are spread over its
#: processes (``queues.cluster.balance``: the busiest closes one when it has two more than another at two
#: looks running); 0: never.
NODE_BALANCE_INTERVAL = envfloat("NODE_BALANCE_INTERVAL", 1.0)
NODE_PROCESSES_AUTO = 1 if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3" else (os.cpu_count() or 1)
#: Concurrent long polls (dequeue with wait > 0) one user may have waiting on a node; past it 429.
LONG_POLL_MAX_PER_USER = envint("LONG_POLL_MAX_PER_USER", 16, minimum=1)
#: Concurrent long polls on a node in all (default: half its request threads, so waits never
#: take the threads acks and enqueues need); past it 429.
LONG_POLL_MAX_PER_NODE = envint("LONG_POLL_MAX_PER_NODE", max(1, NODE_THREADS // 2), minimum=1)

#: Cooling (enqueues sent to other nodes) above this many messages in flight on the node...
NODE_COOLING_IN_FLIGHT = envint("NODE_COOLING_IN_FLIGHT", 500_000, minimum=0)
#: ...or above this many store/partition failures in ten seconds.
NODE_COOLING_FAILURES = envint("NODE_COOLING_FAILURES", 50, minimum=0)

# --- metrics (GET /metrics, Prometheus) ---------------------------------------------------
#: A bearer token of its own for /metrics (unset: only METRICS_ALLOW's networks may scrape).
METRICS_TOKEN = envsecret("METRICS_TOKEN", "")


def envnetworks(name: str, default: str) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    """A comma-separated list of networks (``10.0.0.0/8``, ``::1``); empty: none."""
    raw = env(name, default)
    try:
        return [ipaddress.ip_network(part.strip(), strict=False) for part in raw.split(",") if part.strip()]
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name}={raw!r}: {exc}") from None


#: Addresses that may scrape /metrics without the token (default: loopback only).
METRICS_ALLOW = envnetworks("METRICS_ALLOW", "127.0.0.0/8,::1/128")

# --- traces (OpenTelemetry; docs/how-to/traces.md) ---------------------------------------
#: "" (default): spans only when the process has an OpenTelemetry SDK configured already
#: (``opentelemetry-instrument``, the application's own setup); "otlp", "console" or "jsonl"
#: install the SDK (``opentelemetry-sdk``, not in the runtime's requirements) with that exporter.
TRACES_EXPORT = env("TRACES_EXPORT", "")
#: the file "jsonl" appends the spans to, one JSON object a line
TRACES_FILE = env("TRACES_FILE", str(DATA_DIR / "traces.jsonl"))

# --- API ----------------------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        # Token first: DRF answers 401 with the first class's WWW-Authenticate header.
        "queues.http.auth.CachedTokenAuthentication",
        "queues.http.auth.ClusterAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PARSER_CLASSES": ["queues.http.parsers.FastJSONParser"],
    "DEFAULT_RENDERER_CLASSES": [
        "queues.http.renderers.FastJSONRenderer",
        "rest_framework.renderers.BrowsableAPIRenderer",
    ],
    "EXCEPTION_HANDLER": "queues.http.errors.exception_handler",
    # Calls per user and per anonymous address (queues/api/throttles.py; the fast path too).
    # Off in the embedded mode unless set; production defaults: a guard against a runaway or
    # hostile client, far above what one application's calls need (a batch is one call).
    "DEFAULT_THROTTLE_CLASSES": ["queues.http.throttles.UserRate", "queues.http.throttles.AnonRate"],
    "DEFAULT_THROTTLE_RATES": {
        "user": env("API_THROTTLE_USER", "1000/s" if _production else "") or None,
        "anon": env("API_THROTTLE_ANON", "60/m" if _production else "") or None,
    },
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "UNAUTHENTICATED_USER": None,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Partitioned message queue",
    "DESCRIPTION": "Enqueue, dequeue and ack over partitioned queues with append-tree tracking.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    # The schema and its pages need a user (token or the console's session): the schema maps
    # every call, the cluster's internal ones included, and no client needs it before it has a
    # token. A browser without a session is sent to the console's login (config/urls.py).
    "SERVE_PERMISSIONS": ["rest_framework.permissions.IsAuthenticated"],
    # The pages' JavaScript, CSS and favicon come from drf-spectacular-sidecar's static files,
    # served by the node (WhiteNoise): no third-party script runs in the console's origin, and
    # the docs work without Internet access.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    # validatorUrl: Swagger UI would send the schema to validator.swagger.io for its badge.
    "SWAGGER_UI_SETTINGS": {"deepLinking": True, "validatorUrl": None},
    # Request bodies get components of their own (no read-only fields): what a client may send.
    "COMPONENT_SPLIT_REQUEST": True,
    # Exact request limits of the message calls, every error status, links (queues/api/schema.py).
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "queues.api.schema.postprocess",
    ],
}

# --- the rest -----------------------------------------------------------------------------
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
STATIC_ROOT = DATA_DIR / "static"
STATIC_ROOT.mkdir(parents=True, exist_ok=True)  # WhiteNoise warns on every request otherwise
WHITENOISE_USE_FINDERS = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
#: The most bytes of a request body, refused by its Content-Length before a byte is read (413).
#: Parsing takes many times a body's size in memory, so this bounds a request's; a message
#: call's own limit is lower still (``queues.api.calls.body_limit``: the queue's limits).
API_MAX_REQUEST_BYTES = envint("API_MAX_REQUEST_BYTES", 8 * 1024 * 1024, minimum=64 * 1024)
DATA_UPLOAD_MAX_MEMORY_SIZE = API_MAX_REQUEST_BYTES
#: A body from a caller whose headers name no one this node knows (no valid token, signature
#: or session: ``queues.http.bodies``) is refused over this many bytes, unread (413): enough for
#: the console's login form and an SQS error; every other body comes from a known caller.
API_ANONYMOUS_MAX_REQUEST_BYTES = envint("API_ANONYMOUS_MAX_REQUEST_BYTES", 8 * 1024, minimum=1024)
#: ... read by at most this many request threads of a process at once (more: 503, unread), so
#: clients trickling such bodies cannot hold the threads that known callers need.
API_ANONYMOUS_BODY_READERS = envint("API_ANONYMOUS_BODY_READERS", max(2, NODE_THREADS // 8), minimum=1)
#: Request threads of a process that one known caller's bodies may hold at once on the fast
#: path (a body read waits for the client, and granian cannot cut it short); past it 503, unread.
API_BODY_READS_PER_CALLER = envint("API_BODY_READS_PER_CALLER", max(2, NODE_THREADS // 4), minimum=1)
#: Bodies are read by the node's front (``queues.http.front``) on its event loop, never by a
#: request thread. After this many seconds a body must keep up with the rate below (a slower
#: one is cut: 408), so a client trickling its body holds a coroutine for seconds, not minutes.
API_BODY_READ_GRACE = envfloat("API_BODY_READ_GRACE", 5.0)
if not 0.1 <= API_BODY_READ_GRACE <= 600:
    raise ImproperlyConfigured(f"API_BODY_READ_GRACE={API_BODY_READ_GRACE}: use seconds in [0.1, 600]")
#: The slowest a body may arrive after the grace, bytes a second.
API_BODY_MIN_BYTES_PER_SECOND = envint("API_BODY_MIN_BYTES_PER_SECOND", 64 * 1024, minimum=1)
#: Bytes of bodies a process holds at once, read or being read, until each is answered (a
#: body's Content-Length is reserved when its read starts); one caller (address and credential)
#: may hold a quarter, one address half. Past it: 429 with Retry-After, unread.
API_BODY_BYTES_IN_FLIGHT = envint(
    "API_BODY_BYTES_IN_FLIGHT", max(4 * API_MAX_REQUEST_BYTES, 128 * 1024 * 1024), minimum=API_MAX_REQUEST_BYTES
)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    # one record, one line: control characters in what callers wrote are escaped (config.logs)
    "filters": {"escape": {"()": "config.logs.EscapeControls"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain", "filters": ["escape"]}},
    "root": {"handlers": ["console"], "level": env("LOG_LEVEL", "INFO")},
    "loggers": {"django.request": {"level": "ERROR"}},
}

# The SQS API (``sqs/``): the account ID in its queue URLs and ARNs (one account: the node's).
SQS_ACCOUNT_ID = env("SQS_ACCOUNT_ID", "000000000000")
# The one region a node serves (queue URLs and ARNs name it; a call signed for another region is
# refused). Empty: the region a call is signed for, every region sharing one namespace.
SQS_REGION = env("SQS_REGION", "")
# How long a process trusts the SQS credentials stamp it read (seconds, 0 to 5; the same on every
# process of a cluster): a key revoked is refused from the next call after the revoke returns,
# which waits this long (``sqs.keys``). 0: the stamp is read on every call.
SQS_KEY_LEASE = envfloat("SQS_KEY_LEASE", 0.25)
