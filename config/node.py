"""The WSGI entry point of a node's worker process (``runnode`` serves it with granian).

Importing it starts this process's node runtime: registration, leases, housekeeping. It
releases the leases when the worker exits normally (SIGTERM/SIGINT to ``runnode``), and exits
at once, releasing nothing, if the process that started it is gone: a node whose server died
must not go on serving half-alive.
"""

import gc
import logging
import os
import threading
from multiprocessing import util as mp_util

from django.conf import settings

from config.wsgi import application  # the app granian serves
from queues import service
from queues.access import changes as access_changes
from queues.cluster import peerauth
from queues.cluster.balance import Balancer
from queues.cluster.node import NodeRuntime
from queues.cluster.siblings import Board
from queues.cluster.watchdog import ServingProbe, Watchdog

log = logging.getLogger("queues.runnode")

runtime = NodeRuntime(
    os.environ.get("NODE_ADDRESS") or settings.NODE_ADDRESS or "in-process",
    heartbeat=settings.NODE_HEARTBEAT,
    # The runnode's memory budget for bodies is shared by its sibling nodes (``--processes``).
    cache_bytes=settings.NODE_BODY_CACHE_BYTES // max(1, settings.NODE_PROCESSES),
)
service.set_runtime(runtime)
peerauth.ADDRESS = runtime.address  # forwarded calls are signed for the address they go to
# Leases only while this process answers calls (its own probe through its server).
_watchdog = Watchdog(
    runtime.address,
    interval=min(settings.NODE_HEARTBEAT, settings.NODE_STUCK_AFTER / 3),
    stuck_after=settings.NODE_STUCK_AFTER,
)
runtime.serving = _watchdog.serving
if os.environ.get("NODE_SIBLINGS_DIR"):
    # One of several processes of a runnode: what it could deliver, for its siblings' dequeues
    # and long polls (queues.cluster.siblings).
    runtime.board = Board(os.environ["NODE_SIBLINGS_DIR"], runtime.notify)
    mp_util.Finalize(runtime.board, runtime.board.close, exitpriority=5)
    # and the access changes each makes, so that none trusts what a sibling revoked
    access_changes.attach(runtime.board.count_changes, runtime.board.siblings_changes)
runtime.start()
_watchdog.start()
print(f"node {runtime.node_id} serving on http://{runtime.address}/ (pid {os.getpid()})", flush=True)

# multiprocessing ends its children with os._exit, which skips atexit; Finalize still runs.
mp_util.Finalize(runtime, runtime.stop, kwargs={"release": True}, exitpriority=10)

# One of several sibling nodes of a runnode (--processes): tell the siblings where this one
# answers, for the runnode's /metrics (queues.api.observability).
_siblings = os.environ.get("NODE_SIBLINGS_DIR")
if _siblings:
    _me = os.path.join(_siblings, str(os.getpid()))
    with open(_me, "w") as f:
        f.write(runtime.address)
    mp_util.Finalize(runtime, os.unlink, args=(_me,), exitpriority=20)
    # Its share of the runnode's clients (queues.cluster.balance): the kernel's spread of a few long-lived
    # connections is chance.
    if os.environ.get("NODE_PUBLIC_PORT") and settings.NODE_BALANCE_INTERVAL > 0:
        application = Balancer(
            application, int(os.environ["NODE_PUBLIC_PORT"]), _siblings, settings.NODE_BALANCE_INTERVAL
        ).start()

# Outermost: the watchdog's probe is answered by whichever request thread picks it up.
application = ServingProbe(application)

#: The collector's first threshold in a serving process (Python's default: 700). A batch call
#: allocates thousands of tracked objects (records, deliveries, JSON), so at 700 the young
#: generations would be collected several times per call, each pass walking what the call
#: still holds.
GC_THRESHOLD = 20_000
#: Its second (Python's default: 10 young collections per collection of the middle generation).
#: What survives a young collection is mostly alive until its ack (a dequeue's redelivery
#: entries), so every middle pass would walk the messages in flight again
#: (``bench/inprocess.py --kv redis --batch 100``).
#: Garbage in cycles waits longer for its pass; the message path makes next to none.
GC_THRESHOLD_1 = 100

# Before this process serves: freeze what start-up made (Django, the app, the runtime: never
# freed, and no longer walked by every full collection) and collect the young generations less
# often. Cycles are still collected, in bigger, rarer passes.
gc.collect()
gc.freeze()
gc.set_threshold(GC_THRESHOLD, GC_THRESHOLD_1, gc.get_threshold()[2])

_parent = os.getppid()


def _watch_parent() -> None:
    while True:
        threading.Event().wait(0.5)
        if os.getppid() != _parent:
            log.error("runnode (pid %s) is gone: exiting without releasing leases", _parent)
            os._exit(3)


threading.Thread(target=_watch_parent, name="parent-watch", daemon=True).start()
