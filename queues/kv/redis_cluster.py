"""The Redis Cluster backend: ``KV_URL=redis-cluster://host:port,host:port,...``.

The URL names seed nodes (one is enough; name several so that a start-up finds the cluster
while one is down): ``redis-cluster://[user:password@]host:port[,host:port...]``, or
``rediss-cluster://`` for TLS. The client (redis-py's ``RedisCluster``) learns every primary
and the hash slots each serves from them, and follows the cluster's redirections.

Redis Cluster spreads keys over 16,384 hash slots by the part of a key inside its first
``{...}`` (its *hash tag*), and runs a script only if every key it declares lies in one slot.
So the Redis key of a bucket puts its *partition* in a tag (:func:`redis_key`): the bucket's
first two segments, ``<queue>/<partition>``, which every key of a partition shares
(``queues.engine.keys``). With ``KV_PREFIX=mq:``::

    message orders/0/<block>/17   field 17      of hash mq:{orders/0}/<block>
    block   orders/0/_blocks/<b>  field <b>     of hash mq:{orders/0}/_blocks
    fence   orders/0/_fence       field _fence  of hash mq:{orders/0}

The tag opens after the last ``:`` of the first segment: queue names have none, and the
store's prefixes (``KV_PREFIX``, a queue's incarnation) end with one, so every key still
begins with ``KV_PREFIX``, and the tag (the queue and partition) hashes alike under any prefix.
A prefix without a trailing ``:`` only moves the tag's opening to the front of the key: the
partition still shares one slot.

What holds on one Redis holds per partition here: a fenced batch is one script on the
partition's primary, the fence checked and every write made atomically, as on one server. A
fenced batch must therefore hold keys of its fence's partition only (the partition manager's
are; anything else is refused with ``ValueError`` before it is sent). An unfenced batch that
spans partitions runs as one script per partition: each atomic, the whole not.
:meth:`delete_prefix` scans every primary. ``KV_MIN_REPLICAS`` is not supported here (``WAIT``
would have to follow each script on its primary's connection): a cluster store refuses it at
start-up.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote, urlsplit

import redis as redis_lib
from django.core.exceptions import ImproperlyConfigured
from redis.cluster import ClusterNode, RedisCluster
from redis.crc import key_slot
from redis.exceptions import (
    AskError,
    ClusterDownError,
    MasterDownError,
    MovedError,
    RedisClusterException,
    RedisError,
    TryAgainError,
)

from queues.kv.base import Fence, KVError, split_key
from queues.kv.redis import (
    _CAS,
    _DELETE,
    _PUT,
    Args,
    Call,
    Command,
    RedisStore,
    ThreadConnections,
    _glob_escape,
    _on_connection,
    raise_errors,
)

SCHEMES = ("redis-cluster", "rediss-cluster")

#: Answers that say a command went to a node that does not serve its slot (now), or that the
#: cluster is changing: nothing was run. The client sends such commands again, following the
#: redirection and learning the new slot map.
_REDIRECTED = (MovedError, AskError, TryAgainError, ClusterDownError, MasterDownError)

#: Seconds a primary that timed out on the direct path is reached through the cluster client.
VIA_CLIENT_AFTER_TIMEOUT = 30.0


def _tag_span(bucket: str) -> tuple[int, int]:
    """Where the partition's name lies in ``bucket``: from after the last ``:`` of the first
    segment to the end of the second (or of the bucket)."""
    first = bucket.find("/")
    if first < 0:
        first = end = len(bucket)
    else:
        end = bucket.find("/", first + 1)
        if end < 0:
            end = len(bucket)
    return bucket.rfind(":", 0, first) + 1, end


def redis_key(bucket: str) -> str:
    """The Redis key of ``bucket`` on a cluster: ``mq:orders/0/<b>`` -> ``mq:{orders/0}/<b>``."""
    start, end = _tag_span(bucket)
    return f"{bucket[:start]}{{{bucket[start:end]}}}{bucket[end:]}"


def bucket_of(key: str) -> str:
    """:func:`redis_key` undone: the first ``{`` and the ``}`` after it removed."""
    opening = key.find("{")
    closing = key.find("}", opening + 1)
    if opening < 0 or closing < 0:
        return key  # not one of ours
    return key[:opening] + key[opening + 1 : closing] + key[closing + 1 :]


def scan_head(prefix: str) -> str:
    """What the Redis key of every bucket under ``prefix`` (itself, or below ``prefix/``) begins
    with: its own Redis key, less the closing ``}`` when it is one segment (``mq:{orders``
    reaches ``mq:{orders/0}/...``). It may begin others too (``mq:{ordersx/0}``): a match
    narrows a scan, :func:`bucket_of` decides."""
    head = redis_key(prefix)
    return head if "/" in prefix else head[:-1]


def partition_of(bucket: str) -> str:
    """The part of ``bucket`` that names its partition (``mq:orders/0``): buckets with the same
    one hash to the same slot."""
    return bucket[: _tag_span(bucket)[1]]


def parse_url(url: str) -> dict[str, Any]:
    """``RedisCluster`` keyword arguments from a ``redis-cluster://`` URL."""
    u = urlsplit(url)
    if u.scheme not in SCHEMES:
        raise ImproperlyConfigured(f"KV_URL={url!r}: a Redis Cluster URL starts with redis-cluster://")
    userinfo, _, hosts = u.netloc.rpartition("@")
    nodes = []
    for seed in hosts.split(","):
        host, _, port = seed.strip().rpartition(":")
        if not host or not port.isdigit():
            raise ImproperlyConfigured(f"KV_URL={url!r}: name the seed nodes as host:port[,host:port...], got {seed!r}")
        nodes.append(ClusterNode(host.strip("[]"), int(port)))  # type: ignore[no-untyped-call]  # unannotated
    if u.path not in ("", "/", "/0"):
        raise ImproperlyConfigured(f"KV_URL={url!r}: Redis Cluster has database 0 only")
    kwargs: dict[str, Any] = {"startup_nodes": nodes, "ssl": u.scheme == "rediss-cluster"}
    if userinfo:
        user, has_password, password = userinfo.partition(":")
        kwargs["username"] = unquote(user) or None
        kwargs["password"] = unquote(password) if has_password else None
    return kwargs


def cluster_client(url: str, **options: Any) -> RedisCluster:
    """A client of the cluster ``url`` names (``options`` go to ``RedisCluster``)."""
    return RedisCluster(**parse_url(url), **options)


class RedisClusterStore(RedisStore):
    """The store on a Redis Cluster. It connects on first use, as django-redis does for a single
    Redis: a node started while the cluster is unreachable answers 503 until it is back."""

    schemes = SCHEMES
    #: the calls it inherits are timed as the single Redis' are: one label for both
    metrics_name = "redis"
    #: the message path's calls go to the primaries on connections of our own (:meth:`_send`)
    _direct = True

    def __init__(self, client: RedisCluster | Callable[[], RedisCluster]):
        # (not RedisStore.__init__: its client is made at once and its scripts registered on it)
        self.min_replicas = 0
        self.replica_timeout_ms = 0
        self._client: RedisCluster | None = None
        self._connect: Callable[[], RedisCluster] | None = None
        if isinstance(client, RedisCluster):
            self._client = client  # (its giver's to close)
        else:
            self._connect = client
        self._lock = threading.Lock()
        #: each primary's connections of the message path, by node name (host:port)
        self._nodes: dict[str, ThreadConnections] = {}
        #: primaries whose commands go through the client until then (monotonic): one that
        #: timed out (its host gone?) until the client, meeting the timeout itself, has found
        #: the new slot map
        self._via_client: dict[str, float] = {}
        # The scripts are sent by ``_send`` (and through the cluster client when it must):
        # this client never connects, it only encodes them to hash them.
        scripts = redis_lib.Redis()
        self._put = scripts.register_script(_PUT)
        self._delete = scripts.register_script(_DELETE)
        self._cas = scripts.register_script(_CAS)

    @property
    def client(self) -> RedisCluster:  # type: ignore[override]  # a RedisCluster, made on first use
        """The cluster client, made on first use (contacting the seed nodes); raises
        ``RedisClusterException`` while none answers, which the calls turn into :class:`KVError`."""
        client = self._client
        if client is None:
            with self._lock:
                if self._client is None:
                    assert self._connect is not None
                    self._client = self._connect()
                client = self._client
        return client

    @classmethod
    def from_url(cls, url: str, *, min_replicas: int = 0) -> RedisClusterStore:
        if min_replicas:
            raise ImproperlyConfigured(
                f"KV_MIN_REPLICAS={min_replicas}: not supported with a Redis Cluster KV_URL (use 0)"
            )
        from django.conf import settings

        parse_url(url)  # a malformed URL fails at start-up, an unreachable cluster on use
        # As many connections per primary as the single Redis' pool, and its timeouts
        # (config/settings.py): a primary that stops answering fails a call in REDIS_TIMEOUT.
        return cls(
            lambda: cluster_client(
                url,
                max_connections=256,
                health_check_interval=30,
                socket_timeout=settings.REDIS_TIMEOUT,
                socket_connect_timeout=settings.REDIS_CONNECT_TIMEOUT,
            )
        )

    def close(self) -> None:
        if self._connect is not None and self._client is not None:
            self._client.close()
            self._client = None

    def _send(self, commands: list[Command]) -> list[Any]:
        """``commands`` on this thread's connection to the primary of each one's slot, one
        round trip per primary; their answers. An error answer raises, after all are read.

        Where the client's slot map says (the client keeps it: it learns it from the seed
        nodes and on every redirection it follows). The cluster client's own path costs the
        node much more CPU per call than a single Redis's: it finds the slot and the node
        again, takes a connection from the node's pool under a lock, and wraps the reply. A
        primary whose answer redirects (the slot moved: MOVED, ASK; the cluster changing:
        TRYAGAIN, CLUSTERDOWN) or whose connection fails (a failover) gets its commands sent again
        through the client, which follows the redirection and refreshes the map: a redirected
        command was not run, and a failed connection's commands are the scripts and reads that
        a second run leaves as the first did (:func:`~queues.kv.redis._on_connection`). One
        that times out (a host gone without a word) raises, for :meth:`_call`'s hold-down,
        and its commands go through the client for :data:`VIA_CLIENT_AFTER_TIMEOUT` seconds:
        the client, timing out itself, reads the slot map again and finds the new primary.
        """
        slots = self.client.nodes_manager.slots_cache
        now = time.monotonic()
        by_node: dict[str, tuple[Any, list[int]]] = {}
        through_client: list[int] = []
        for i, command in enumerate(commands):
            key = command[3] if command[0] == "EVALSHA" else command[1]  # (our scripts declare keys)
            owners = slots.get(key_slot(key.encode()))
            node = owners[0] if owners else None
            if node is None or node.redis_connection is None or self._via_client.get(node.name, 0.0) > now:
                through_client.append(i)
            else:
                by_node.setdefault(node.name, (node, []))[1].append(i)
        answers: list[Any] = [None] * len(commands)
        for i in through_client:
            answers[i] = self._through_client(commands[i])
        for node, positions in by_node.values():
            mine = [commands[i] for i in positions]
            try:
                got = _on_connection(self._connections(node), mine)
            except redis_lib.ConnectionError:
                got = []  # the primary is gone (a failover?): the client finds where its slots went
            except redis_lib.TimeoutError:
                self._via_client[node.name] = time.monotonic() + VIA_CLIENT_AFTER_TIMEOUT
                raise
            if not got or any(isinstance(answer, _REDIRECTED) for answer in got):
                got = [self._through_client(c) for c in mine]
                self._forget_gone_primaries()  # the map changed: a primary may be no more
            for i, answer in zip(positions, got):
                answers[i] = answer
        return raise_errors(answers)

    def _forget_gone_primaries(self) -> None:
        """Drop our connections to nodes that are no longer a primary in the client's slot map
        (failed over, or replaced by a node at another address), and the hold-downs that are
        over: a node that lived through many failovers would otherwise keep a connection per
        request thread to every primary it ever had. A node still in use is met again by
        :meth:`_connections`, which makes its connections anew. Runs only after a redirection
        or a failed connection (a walk of the 16,384 slots: about a millisecond)."""
        # (each dict read whole first, by list(): other threads add to them meanwhile)
        primaries = {owners[0].name for owners in list(self.client.nodes_manager.slots_cache.values()) if owners}
        for name in list(self._nodes):
            if name not in primaries:
                self._nodes.pop(name, None)  # (its connections close when their last user lets go)
        now = time.monotonic()
        for name, until in list(self._via_client.items()):
            if until <= now:
                self._via_client.pop(name, None)

    def _through_client(self, command: Command) -> Any:
        """One command through the cluster client; an error answer returned, not raised (as
        :func:`~queues.kv.redis.round_trip` gives them)."""
        try:
            return self.client.execute_command(*command)  # type: ignore[no-untyped-call]  # unannotated
        except redis_lib.ResponseError as exc:
            return exc

    def _connections(self, node: ClusterNode) -> ThreadConnections:
        conns = self._nodes.get(node.name)
        if conns is None:
            client = node.redis_connection
            if client is None:  # (redis-py made it when it learnt the node: a ConnectionError is retried)
                raise redis_lib.ConnectionError(f"redis cluster: no connection settings for {node.name} yet")
            conns = self._nodes.setdefault(node.name, ThreadConnections(client.connection_pool))
        return conns

    # --- key naming: the module's function above ----------------------------------------------
    redis_key = staticmethod(redis_key)

    def _calls(self, fence: Fence | None, groups: list[tuple[str, int, Args]]) -> list[Call]:
        """One script call per partition (its keys share a slot); a fenced batch is one."""
        by_partition: dict[str, list[tuple[str, int, Args]]] = {}
        for group in groups:
            by_partition.setdefault(partition_of(group[0]), []).append(group)
        if fence is not None:
            fenced = partition_of(split_key(fence.key)[0])
            if by_partition.keys() != {fenced}:
                others = sorted(set(by_partition) - {fenced})
                raise ValueError(
                    f"a fenced batch on Redis Cluster holds keys of its fence's partition {fenced!r} only, "
                    f"not of {others[:3]}"
                )
            return super()._calls(fence, groups)
        calls: list[Call] = []
        for part in by_partition.values():
            calls.extend(super()._calls(None, part))
        return calls

    def delete_prefix(self, prefix: str) -> None:
        below = prefix + "/"
        try:
            batch: list[bytes] = []
            for key in self.client.scan_iter(match=_glob_escape(scan_head(prefix)) + "*", count=1000):  # every primary
                bucket = bucket_of(key.decode())
                if bucket == prefix or bucket.startswith(below):
                    batch.append(key)
                if len(batch) >= 500:
                    self.client.delete(*batch)  # one DEL per slot
                    batch = []
            if batch:
                self.client.delete(*batch)
        except (RedisError, RedisClusterException) as exc:
            raise KVError(f"redis cluster: {exc}") from exc
