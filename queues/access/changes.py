"""Access changes that every process of a node sees from the next call on.

The rows a call's access is decided by (grants, API tokens, users and their groups) are cached
in each process for a few seconds (``grants.TTL``, ``queues.http.auth.TTL``). A change made in a
process is counted here once it commits (:func:`changed`); a runnode's process also writes the
count on its board (``queues.cluster.siblings``), where its siblings read it. A cache keeps what
it read under the :func:`generation` it read it at, and reads again once that moves: a grant
revoked or a token deleted through any process of a node is in force in all of its processes at
once, and on other nodes within the caches' lifetime.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from django.db import transaction

_lock = threading.Lock()
#: the changes this process has made.
_made = 0
#: where this process writes its count, and where it reads its siblings' (None: no siblings).
_publish: Callable[[int], None] | None = None
_siblings: Callable[[], int] | None = None


def attach(publish: Callable[[int], None], siblings: Callable[[], int]) -> None:
    """Share this process's count with its siblings (``config.node``, with the board's
    ``count_changes`` and ``siblings_changes``)."""
    global _publish, _siblings
    _publish, _siblings = publish, siblings
    publish(_made)


def generation() -> int:
    """A number that moves whenever this process or a sibling has made an access change."""
    siblings = _siblings
    return _made + (siblings() if siblings is not None else 0)


def changed(**_: Any) -> None:
    """Count an access change once the transaction it is made in commits (at once outside one);
    a signal receiver."""
    transaction.on_commit(_count)


def _count() -> None:
    global _made
    with _lock:
        _made += 1
        made = _made
    publish = _publish
    if publish is not None:
        publish(made)
