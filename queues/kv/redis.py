"""The Redis backend, through django-redis' connection pool.

A bucket is a Redis hash and a name a field in it: message ``q/0/blk/17`` is field ``17`` of
hash ``q/0/blk``. So a block's messages are read by one HKEYS, and pruning a block is one DEL.

Fenced writes run as one Lua script: Redis executes it atomically, so the epoch check and the
writes cannot be split by a fence being raised. With ``KV_MIN_REPLICAS=n`` every write is
followed, in the same round trip, by ``WAIT n timeout``; fewer replicas than asked raises
:class:`ReplicationError` and the caller confirms nothing. (Redis cannot undo a write that
reached the primary only; such a message may still be delivered later, which at-least-once
allows, but it is never reported as stored.)

The scripts declare their hashes in KEYS, and a bucket's Redis key is made in one place
(:meth:`RedisStore.redis_key`, the identity here): ``queues.kv.redis_cluster`` runs the same
scripts on Redis Cluster, with hash-tagged keys and one script per partition (:meth:`_calls`).
"""

from __future__ import annotations

import os
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, cast

import redis as redis_lib
from hiredis import pack_command
from redis.exceptions import RedisClusterException

from queues.kv.base import Fence, Fenced, KeyValueStore, KVError, ReplicationError, split_key

if TYPE_CHECKING:
    from redis.commands.core import Script

#: A Lua script's ARGV: redis-py encodes str, bytes and int alike.
Args = list[str | bytes | int]
#: a Redis command as sent: its name, then its arguments (text, bytes, numbers)
Command = tuple[Any, ...]

# The scripts declare every key they touch in KEYS (Redis Cluster routes a script by its keys,
# which must share one hash slot). KEYS[1]: the fence's hash (any hash of the batch when
# unfenced); KEYS[2..]: one hash per group. ARGV[1], ARGV[2]: the fence's field and epoch
# ("" = unfenced), then per group its count n and its n field/value pairs (put) or n fields.
_PUT = """
if ARGV[2] ~= '' then
  local cur = redis.call('HGET', KEYS[1], ARGV[1])
  if cur ~= ARGV[2] then return redis.error_reply('FENCED ' .. tostring(cur)) end
end
local i = 3
for k = 2, #KEYS do
  local n = tonumber(ARGV[i])
  redis.call('HSET', KEYS[k], unpack(ARGV, i + 1, i + 2 * n))
  i = i + 1 + 2 * n
end
return 1
"""

_DELETE = """
if ARGV[2] ~= '' then
  local cur = redis.call('HGET', KEYS[1], ARGV[1])
  if cur ~= ARGV[2] then return redis.error_reply('FENCED ' .. tostring(cur)) end
end
local i, removed = 3, 0
for k = 2, #KEYS do
  local n = tonumber(ARGV[i])
  removed = removed + redis.call('HDEL', KEYS[k], unpack(ARGV, i + 1, i + n))
  i = i + 1 + n
end
return removed
"""

# KEYS[1]: the hash; ARGV: field, has_expected ("1"/"0"), expected, value
_CAS = """
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if ARGV[2] == '1' then
  if cur ~= ARGV[3] then return 0 end
elseif cur then
  return 0
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[4])
return 1
"""

# Lua's unpack has a stack limit (LUAI_MAXCSTACK 8000); keep each HSET/HDEL group below it.
_GROUP = 2000

#: One script call: its KEYS and ARGV.
Call = tuple[list[str], Args]


#: Forks this process went through: a connection made before the last one is the parent's.
_forks = 0


def _forked() -> None:
    global _forks
    _forks += 1


os.register_at_fork(after_in_child=_forked)


class ThreadConnections:
    """One connection to Redis per thread, made from the client's pool settings, for the calls
    of the message path (the scripts, the body reads).

    redis-py's client takes a connection from its pool and gives it back on every command:
    a lock twice, a readiness poll on the socket, its retry wrapper and its observability
    records: much of what a script call costs the node. A thread that holds its own
    connection sends and reads on it directly.

    A connection closes itself on a socket error (redis-py) and connects again on its next
    command; one whose server went away since its last use (Redis restarted) fails on that
    command, which :func:`_on_connection` then sends once more on a fresh connection. A
    thread's connection closes when the thread ends or the store goes. Connections inherited
    through a fork belong to the parent: the child makes its own.
    """

    def __init__(self, pool: redis_lib.ConnectionPool):
        self._make: Callable[[], redis_lib.Connection] = lambda: pool.connection_class(**pool.connection_kwargs)
        self._local = threading.local()

    def get(self) -> redis_lib.Connection:
        held: tuple[int, redis_lib.Connection] | None = getattr(self._local, "held", None)
        if held is None or held[0] != _forks:
            held = self._local.held = (_forks, self._make())
        return held[1]


def _chunked(by_bucket: dict[str, Args], width: int) -> list[tuple[str, int, Args]]:
    """``(bucket, n, fields)`` groups of at most ``_GROUP`` entries of ``width`` fields each
    (a put's name and value, a delete's name): the groups of :meth:`RedisStore._calls`."""
    groups: list[tuple[str, int, Args]] = []
    step = _GROUP * width
    for bucket, fields in by_bucket.items():
        if len(fields) <= step:
            groups.append((bucket, len(fields) // width, fields))
            continue
        for start in range(0, len(fields), step):
            chunk = fields[start : start + step]
            groups.append((bucket, len(chunk) // width, chunk))
    return groups


def plain_connections(pool: redis_lib.ConnectionPool) -> bool:
    """Whether ``pool`` makes plain connections (not Sentinel's, not a blocking pool with its
    own rules): the connections :func:`round_trip` uses one per thread."""
    return type(pool) is redis_lib.ConnectionPool and issubclass(pool.connection_class, redis_lib.Connection)


def round_trip(conn: redis_lib.Connection, commands: list[Command]) -> list[Any]:
    """Send ``commands`` on ``conn`` in one write and read one answer each, through redis-py's
    public connection calls (``send_packed_command``, ``read_response``): an error answer is an
    exception among the answers (``ResponseError``), the rest still read, so the connection
    stays in step. A ``BusyLoadingError`` (a Redis reading its data back: nothing was run) is
    every answer from it on, the connection closed by redis-py. A socket error or a closed
    connection raises ``ConnectionError``, a timeout ``TimeoutError``; redis-py disconnects
    ``conn`` on either.
    """
    packed = pack_command(commands[0]) if len(commands) == 1 else b"".join(map(pack_command, commands))
    conn.send_packed_command([packed], check_health=False)  # type: ignore[no-untyped-call]  # unannotated
    answers: list[Any] = []
    for _ in commands:
        try:
            answers.append(conn.read_response())
        except redis_lib.ResponseError as exc:
            answers.append(exc)
        except redis_lib.BusyLoadingError as exc:
            answers += [exc] * (len(commands) - len(answers))
            break
    return answers


def _on_connection(conns: ThreadConnections, commands: list[Command]) -> list[Any]:
    """``commands`` in one round trip on this thread's connection of ``conns``; their answers,
    an error answer as an exception among them (see :func:`round_trip`).

    A connection error on a connection that had been used before is taken for a server
    gone since (restarted, or the idle connection cut) and the commands are sent once
    more on a fresh connection: the commands here are the scripts and reads, which a
    second run leaves as the first did (a put writes the same values, a delete finds
    fewer to delete, a fence refuses both times; a compare-and-set that had been applied
    reports a mismatch, which its callers meet by reading again). redis-py's client
    retries them the same way. A timeout is not retried: :meth:`RedisStore._call` holds
    calls off.
    """
    conn = conns.get()
    fresh = not conn.is_connected
    if fresh:
        conn.connect()  # type: ignore[no-untyped-call]  # redis-py leaves it unannotated
    try:
        return round_trip(conn, commands)
    except redis_lib.ConnectionError:
        if fresh:
            raise
        return _on_connection(conns, commands)  # the server went away after our last use: once more


def raise_errors(answers: list[Any]) -> list[Any]:
    """``answers``, unless one is an error answer: then the first such is raised (a
    ResponseError, or one redis-py's parser makes a ConnectionError: LOADING, a Redis still
    reading its data back after a restart, where nothing was run)."""
    for answer in answers:
        if isinstance(answer, Exception):
            raise answer
    return answers


class RedisStore(KeyValueStore):
    """One Redis server (``redis://``), or its primary with replicas (``KV_MIN_REPLICAS``).

    A bucket's Redis key is the bucket itself (:meth:`redis_key`); every batch is one script call.
    """

    schemes: tuple[str, ...] = ("redis", "rediss", "unix")

    def __init__(self, client: redis_lib.Redis, *, min_replicas: int = 0, replica_timeout_ms: int = 1000):
        self.client = client
        self.min_replicas = min_replicas
        self.replica_timeout_ms = replica_timeout_ms
        self._put = client.register_script(_PUT)
        self._delete = client.register_script(_DELETE)
        self._cas = client.register_script(_CAS)
        pool = client.connection_pool
        # With plain connections, the message path's calls go on one connection per thread
        # (:func:`round_trip`).
        if plain_connections(pool):
            self._conns = ThreadConnections(pool)
            self._direct = True

    @classmethod
    def from_settings(cls) -> RedisStore:
        from django.conf import settings
        from django_redis import get_redis_connection

        return cls(get_redis_connection("kv"), min_replicas=settings.KV_MIN_REPLICAS)

    # --- when Redis does not answer -----------------------------------------------------------
    #: Seconds calls fail at once after one timed out, before one call (alone) tries again.
    HOLD_DOWN = 1.0
    #: Set after a call timed out (Redis paused or cut off): until then, calls fail at once
    #: instead of each waiting the socket timeout (see :meth:`_call`). Class-level defaults so
    #: that a subclass with an ``__init__`` of its own has them too.
    _unreachable_until = 0.0
    _probing = False
    _state = threading.Lock()
    #: The per-thread connections of the message path; None: every call through the client
    #: (Sentinel, a custom pool), or per primary (Redis Cluster: its own :meth:`_send`).
    _conns: ThreadConnections | None = None
    #: Whether the message path's calls go through :meth:`_send` (our own round trips), not
    #: through the client.
    _direct = False

    @contextmanager
    def _call(self) -> Iterator[None]:
        """One call to Redis, failing at once while Redis is known not to answer.

        A Redis that stops answering (paused, cut off) costs each call the socket timeout.
        Calls made under a partition's lock (a new block's record) queue behind each other,
        so a dozen of them would hold the lock, and every call waiting for it, for a dozen
        timeouts: far past any client's patience. So after a timeout, calls fail at once
        (KVError: 503 to the client) for ``HOLD_DOWN`` seconds; then one call tries Redis while
        the others still fail at once, and its success ends the outage for all. A refused
        connection (Redis restarting) fails fast by itself and changes nothing here.
        """
        probe = False
        if self._unreachable_until:  # (read without the lock: the common case, Redis answering)
            with self._state:
                if self._unreachable_until:
                    if self._probing or time.monotonic() < self._unreachable_until:
                        raise KVError("redis: not answering (a call timed out a moment ago); retry")
                    self._probing = probe = True
        try:
            yield
        except redis_lib.TimeoutError:
            with self._state:
                self._unreachable_until = time.monotonic() + self.HOLD_DOWN
                if probe:
                    self._probing = False
            raise
        except BaseException:
            if probe:
                with self._state:
                    self._probing = False
            raise
        if probe:
            with self._state:
                self._unreachable_until, self._probing = 0.0, False

    # --- key naming: where a bucket lives, the one place that says it ------------------------
    @staticmethod
    def redis_key(bucket: str) -> str:
        """The Redis key of a bucket's hash."""
        return bucket

    def _calls(self, fence: Fence | None, groups: list[tuple[str, int, Args]]) -> list[Call]:
        """The script calls of a batch: ``groups`` are (bucket, n, flat fields or pairs). One
        server runs the whole batch in one call, atomically with its fence."""
        fence_args: Args = ["", ""]
        head = groups[0][0]
        if fence is not None:
            head, name = split_key(fence.key)
            fence_args = [name, str(fence.epoch)]
        rkeys = [self.redis_key(head)]
        args = fence_args
        for bucket, n, flat in groups:
            rkeys.append(self.redis_key(bucket))
            args.append(n)
            args.extend(flat)
        return [(rkeys, args)]

    def _run(self, script: Script, keys: list[str], args: Args) -> int:
        try:
            with self._call():
                if not self.min_replicas:
                    # EVALSHA straight to the client, without ``Script.__call__`` (its import, its
                    # type checks, two more layers). A server that lost the script (restart,
                    # SCRIPT FLUSH) is handled by the Script.
                    try:
                        answer: int  # our scripts answer a number
                        if self._direct:
                            answer = self._send([("EVALSHA", script.sha, len(keys), *keys, *args)])[0]
                        else:
                            answer = self.client.execute_command(  # type: ignore[no-untyped-call]  # unannotated
                                "EVALSHA", script.sha, len(keys), *keys, *args
                            )
                        return answer
                    except redis_lib.exceptions.NoScriptError:
                        answer = script(keys=keys, args=args, client=self.client)
                        return answer
                pipe = self.client.pipeline(transaction=False)
                script(keys=keys, args=args, client=pipe)
                pipe.wait(self.min_replicas, self.replica_timeout_ms)
                result: int  # the script's answer, a number
                result, replicas = pipe.execute()
        except redis_lib.ResponseError as exc:
            if str(exc).startswith("FENCED"):
                raise Fenced(str(exc)) from exc
            raise KVError(str(exc)) from exc
        except (redis_lib.RedisError, RedisClusterException) as exc:
            raise KVError(f"redis: {exc}") from exc
        if replicas < self.min_replicas:
            raise ReplicationError(
                f"only {replicas} of {self.min_replicas} replicas acknowledged within {self.replica_timeout_ms} ms"
            )
        return result

    def _send(self, commands: list[Command]) -> list[Any]:
        """``commands`` in one round trip on this thread's connection; their answers. An error
        answer raises (after every answer is read, so the connection stays in step)."""
        assert self._conns is not None
        return raise_errors(_on_connection(self._conns, commands))

    # --- the interface ------------------------------------------------------------------------
    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        if not keys:
            return []
        by_bucket: dict[str, list[tuple[int, str]]] = defaultdict(list)
        for i, key in enumerate(keys):
            bucket, name = split_key(key)
            by_bucket[bucket].append((i, name))
        out: list[bytes | None] = [None] * len(keys)
        try:
            with self._call():
                if self._direct:
                    results = self._send(
                        [("HMGET", self.redis_key(b), *[name for _, name in e]) for b, e in by_bucket.items()]
                    )
                else:
                    pipe = self.client.pipeline(transaction=False)
                    for bucket, entries in by_bucket.items():
                        pipe.hmget(self.redis_key(bucket), [name for _, name in entries])
                    results = pipe.execute()
        except (redis_lib.RedisError, RedisClusterException) as exc:
            raise KVError(f"redis: {exc}") from exc
        for (_, entries), values in zip(by_bucket.items(), results):
            for (i, _), value in zip(entries, values):
                out[i] = value
        return out

    def put_many(self, items: Sequence[tuple[str, bytes]], *, fence: Fence | None = None) -> None:
        if not items:
            return
        by_bucket: dict[str, Args] = {}
        last, flat = None, cast("Args", [])
        for key, value in items:
            bucket, sep, name = key.rpartition("/")
            if not (sep and bucket and name):
                split_key(key)  # raises, saying why
            if bucket != last:  # a batch's keys mostly share their bucket (a block's messages)
                flat, last = by_bucket.setdefault(bucket, []), bucket
            flat.append(name)
            flat.append(value)
        groups = _chunked(by_bucket, 2)
        for keys, args in self._calls(fence, groups):
            self._run(self._put, keys, args)

    def delete_many(self, keys: Sequence[str], *, fence: Fence | None = None) -> int:
        if not keys:
            return 0
        by_bucket: dict[str, Args] = {}
        last, names = None, cast("Args", [])
        for key in keys:
            bucket, sep, name = key.rpartition("/")
            if not (sep and bucket and name):
                split_key(key)  # raises, saying why
            if bucket != last:
                names, last = by_bucket.setdefault(bucket, []), bucket
            names.append(name)
        groups = _chunked(by_bucket, 1)
        return sum(int(self._run(self._delete, rkeys, args)) for rkeys, args in self._calls(fence, groups))

    def compare_and_set(self, key: str, expected: bytes | None, value: bytes) -> bool:
        bucket, name = split_key(key)
        args: Args = [name, "0" if expected is None else "1", expected or b"", value]
        return bool(self._run(self._cas, [self.redis_key(bucket)], args))

    def scan(self, bucket: str) -> list[str]:
        try:
            # The client does not decode responses (django-redis' default): fields come back as bytes.
            with self._call():
                return [n.decode() for n in cast("list[bytes]", self.client.hkeys(self.redis_key(bucket)))]
        except (redis_lib.RedisError, RedisClusterException) as exc:
            raise KVError(f"redis: {exc}") from exc

    def delete_prefix(self, prefix: str) -> None:
        try:
            with self._call():
                batch = [prefix]
                for key in self.client.scan_iter(match=_glob_escape(prefix) + "/*", count=1000):
                    batch.append(key)
                    if len(batch) >= 500:
                        self.client.delete(*batch)
                        batch = []
                if batch:
                    self.client.delete(*batch)
        except redis_lib.RedisError as exc:
            raise KVError(f"redis: {exc}") from exc


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)
