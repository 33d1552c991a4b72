"""Who may do what to which queue: the callers and the rules, in one place.

Every service function that acts on a queue or topic takes a :class:`Caller` and asks
:func:`require` before it changes or reads anything, so no entrance (the REST API, the fast
path, the admin, a forwarded call, a later protocol) can skip the check.

The rules (``Grant`` rows, see ``queues.models``):

- ``read`` (see it in lists, its stats) is included in every other action;
- ``produce`` (enqueue, publish) and ``consume`` (dequeue, ack, visibility, a subscription's
  calls) are included in ``manage`` (change, delete, purge, redrive, subscriptions, replay,
  release, grants);
- a grant names one queue or topic, or a name pattern (``billing-*``: ``*`` stands for any run
  of name characters), and goes to a user or to one of the user's Django groups;
- a queue's creator may manage it; superusers may do anything; the service itself
  (:data:`SYSTEM`: dead-letter moves, housekeeping) may do anything.

A caller that may not even read a queue is told it does not exist (``QueueNotFound``, 404),
so names do not leak; one that may read it but lacks the action gets ``Forbidden`` (403) naming
the action it lacks.

Grants are read once per :data:`TTL` seconds per process (the fast path checks every call), and
at once after an access change in this process or a sibling of its node (``changes``); another
node sees a change within ``TTL``.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from django.db import models
from django.db.models.signals import m2m_changed, post_delete, post_save

from queues.access import changes
from queues.errors import QueueNotFound, Refused
from queues.models import Grant

#: seconds a process trusts the grants it read.
TTL = 2.0

ACTIONS = ("read", "produce", "consume", "manage")

#: which granted actions satisfy a wanted one.
_SATISFIED_BY: dict[str, frozenset[str]] = {
    "read": frozenset(ACTIONS),
    "produce": frozenset({"produce", "manage"}),
    "consume": frozenset({"consume", "manage"}),
    "manage": frozenset({"manage"}),
}


@dataclass(frozen=True, slots=True)
class Caller:
    """Who makes a call: a user as the service sees it (the same on every node)."""

    user_id: int | None
    username: str
    is_superuser: bool = False
    is_staff: bool = False
    group_ids: frozenset[int] = field(default_factory=frozenset)
    #: the service itself: a node's own work (dead-letter moves, retention), not a user's.
    system: bool = False

    @classmethod
    def of(cls, user: Any) -> Caller:
        """The caller for a Django user (an anonymous one has no rights)."""
        if user is None or not getattr(user, "is_authenticated", False) or getattr(user, "pk", None) is None:
            return ANONYMOUS
        return cls(
            user.pk,
            user.get_username(),
            bool(user.is_superuser),
            bool(user.is_staff),
            frozenset(user.groups.values_list("pk", flat=True)),
        )

    @property
    def unrestricted(self) -> bool:
        return self.system or self.is_superuser

    def __str__(self) -> str:
        return self.username


ANONYMOUS = Caller(None, "anonymous")
SYSTEM = Caller(None, "system", system=True)


class Forbidden(Refused):
    """The caller may see the queue but not do this to it (403). The answer names the
    permission that is ``missing``."""

    code = "permission_denied"
    status = 403

    def __init__(self, caller: Caller, action: str, target: str):
        super().__init__(f"{caller} may not {action} {target!r}: it needs the {action!r} permission on it")
        self.caller = caller
        self.action = action
        self.target = target

    def body(self) -> dict[str, Any]:
        return {**super().body(), "missing": self.action}


def pattern_regex(pattern: str) -> re.Pattern[str]:
    """``billing-*`` -> names that start with ``billing-`` (``*``: any run of name characters).

    Anchored with ``\\A``/``\\Z`` (``$`` also matches before a trailing newline) and ``*`` is
    name characters only, so a pattern reaches whole names and nothing else.
    """
    body = "[A-Za-z0-9_-]*".join(re.escape(part) for part in pattern.split("*"))
    return re.compile(rf"\A{body}\Z")


@dataclass(frozen=True, slots=True)
class _Rule:
    user_id: int | None
    group_id: int | None
    queue_id: int | None
    pattern: re.Pattern[str] | None
    action: str


class _Rules:
    """The grants of the whole service, read at most once per ``TTL`` (a few hundred rows)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rules: list[_Rule] = []
        self._read_at = -float("inf")
        self._generation = -1

    def current(self) -> list[_Rule]:
        # the generation before the rows: a change that commits meanwhile moves it, and the
        # next call reads them again
        generation = changes.generation()
        if generation == self._generation and time.monotonic() - self._read_at < TTL:
            return self._rules
        rules = [
            _Rule(g.user_id, g.group_id, g.queue_id, pattern_regex(g.pattern) if g.pattern else None, g.action)
            for g in Grant.objects.all().only("user_id", "group_id", "queue_id", "pattern", "action")
        ]
        with self._lock:
            self._rules, self._read_at, self._generation = rules, time.monotonic(), generation
        return rules

    def forget(self, **_: Any) -> None:
        with self._lock:
            self._read_at = -float("inf")


RULES = _Rules()


def _names(rule: _Rule, queue_id: int, name: str) -> bool:
    """Whether the grant is on this queue (by its id, or by a pattern its name matches)."""
    if rule.queue_id is not None:
        return rule.queue_id == queue_id
    return rule.pattern is not None and rule.pattern.fullmatch(name) is not None


def _applies(rule: _Rule, caller: Caller, queue_id: int, name: str) -> bool:
    if rule.user_id is not None:
        if rule.user_id != caller.user_id:
            return False
    elif rule.group_id not in caller.group_ids:
        return False
    return _names(rule, queue_id, name)


def _implied(have: set[str]) -> frozenset[str]:
    """The actions the granted ones allow (``manage`` allows all, any allows ``read``)."""
    return frozenset(a for a in ACTIONS if _SATISFIED_BY[a] & have)


def granted(caller: Caller, queue_id: int, name: str, created_by: int | None) -> frozenset[str]:
    """Every action ``caller`` may take on the queue (``read`` included where any is)."""
    if caller.unrestricted or (caller.user_id is not None and caller.user_id == created_by):
        return frozenset(ACTIONS)
    if caller.user_id is None:
        return frozenset()
    return _implied({r.action for r in RULES.current() if _applies(r, caller, queue_id, name)})


def granted_to_group(group_id: int, queue_id: int, name: str) -> frozenset[str]:
    """Every action the grants to group ``group_id`` allow its members on the queue."""
    return _implied({r.action for r in RULES.current() if r.group_id == group_id and _names(r, queue_id, name)})


def grants_on(queue_id: int, name: str) -> list[Grant]:
    """The grants that name the queue, by its id or by a pattern its name matches, read now
    (not cached), with their user and group: who has rights on it besides its creator and the
    superusers (the admin's effective-access table)."""
    rows = Grant.objects.filter(models.Q(queue_id=queue_id) | models.Q(queue__isnull=True)).select_related(
        "user", "group"
    )
    return [g for g in rows if g.queue_id == queue_id or pattern_regex(g.pattern).fullmatch(name)]


def granted_now(caller: Caller, queue_id: int, name: str, created_by: int | None) -> frozenset[str]:
    """As :func:`granted`, read from the database now rather than from the rules cached for
    :data:`TTL`: the user (still active, still a superuser, its groups now) and its grants.

    For the end of a call that waited (a long poll): its caller was checked when it started,
    and a revocation since must stop it from taking anything. A few queries; only such calls
    pay them."""
    from django.contrib.auth import get_user_model

    if caller.system:
        return frozenset(ACTIONS)
    if caller.user_id is None:
        return frozenset()
    user = get_user_model().objects.filter(pk=caller.user_id, is_active=True).first()
    if user is None:
        return frozenset()
    now = Caller.of(user)
    if now.is_superuser or now.user_id == created_by:
        return frozenset(ACTIONS)
    rows = Grant.objects.filter(models.Q(user_id=now.user_id) | models.Q(group_id__in=now.group_ids)).filter(
        models.Q(queue_id=queue_id) | models.Q(queue__isnull=True)
    )
    return _implied(
        {
            action
            for q, pattern, action in rows.values_list("queue_id", "pattern", "action")
            if q == queue_id or (pattern and pattern_regex(pattern).fullmatch(name))
        }
    )


def require(caller: Caller, action: str, queue_id: int, name: str, created_by: int | None, *, target: str = "") -> None:
    """Raise unless ``caller`` may take ``action`` on the queue: ``QueueNotFound`` when it may
    not even read it (answered as if it did not exist), ``Forbidden`` when it lacks the action."""
    have = granted(caller, queue_id, name, created_by)
    if action in have:
        return
    if "read" not in have:
        raise QueueNotFound(target or name)
    raise Forbidden(caller, action, target or name)


def visible(caller: Caller, queues: Iterable[Any], action: str = "read") -> list[Any]:
    """Those of ``queues`` (``Queue`` rows or anything with ``pk``/``id``, ``name``,
    ``created_by_id``) the caller may read (or take ``action`` on)."""
    out = []
    for q in queues:
        queue_id = getattr(q, "pk", None) or q.id
        if action in granted(caller, queue_id, q.name, getattr(q, "created_by_id", None)):
            out.append(q)
    return out


def _user_saved(update_fields: Any = None, **kwargs: Any) -> None:
    """A user's save is an access change (active, superuser), but a login's ``last_login``."""
    if update_fields is not None and set(update_fields) <= {"last_login"}:
        return
    changes.changed()


def connect_signals() -> None:
    """Forget the cached grants when one changes in this process, and count every change to
    grants, users and their groups as an access change (``changes``: the sibling processes read
    theirs again) (``QueuesConfig.ready``)."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group

    user = get_user_model()
    post_save.connect(RULES.forget, sender=Grant, dispatch_uid="queues.access.grants")
    post_delete.connect(RULES.forget, sender=Grant, dispatch_uid="queues.access.grants")
    for signal in (post_save, post_delete):
        signal.connect(changes.changed, sender=Grant, dispatch_uid="queues.access.changes.grant")
        signal.connect(changes.changed, sender=Group, dispatch_uid="queues.access.changes.group")
    post_save.connect(_user_saved, sender=user, dispatch_uid="queues.access.changes.user")
    post_delete.connect(changes.changed, sender=user, dispatch_uid="queues.access.changes.user")
    m2m_changed.connect(changes.changed, sender=user.groups.through, dispatch_uid="queues.access.changes.groups")
