"""What a call names: a queue (``"orders"``), a topic (``"news"``, published to by name) or a
topic's subscription (``"news/mail"``, read through)."""

from __future__ import annotations

from contextvars import ContextVar, Token
from dataclasses import dataclass

from queues.access import Caller, granted_now, require
from queues.engine.config import QueueConfig
from queues.public import QUEUE_NAME_RE
from queues.service.errors import InvalidRequest, QueueNotFound, SubscriptionNotFound
from queues.service.runtime import get_runtime


def checked_name(name: str) -> str:
    """A name no queue can have (NUL, '/', too long...) is unknown, not a database error."""
    if not QUEUE_NAME_RE.fullmatch(name):
        raise QueueNotFound(name)
    return name


def queue_config(name: str) -> QueueConfig:
    """The queue's (or topic's) settings as this node knows them. Raises QueueNotFound."""
    return get_runtime().queue(checked_name(name))


def resolve(target: str, *, reading: bool = True) -> tuple[QueueConfig, str]:
    """``(config, subscription)`` of a call's target; subscription "" for a queue.

    Raises QueueNotFound, SubscriptionNotFound, and InvalidRequest (``is_a_topic``) when
    ``reading`` names a topic itself: a topic is read only through a subscription.
    """
    queue, slash, sub = target.partition("/")
    cfg = queue_config(queue)
    if slash:
        if cfg.kind != "topic":
            raise QueueNotFound(target)
        if cfg.subscription(sub) is None:
            raise SubscriptionNotFound(target)
    elif reading and cfg.kind == "topic":
        raise InvalidRequest(
            f"{queue} is a topic: read it through a subscription (/api/v1/topics/{queue}/subscriptions/<name>/...)",
            "is_a_topic",
        )
    return cfg, sub


def allowed_now(name: str, action: str, *, caller: Caller) -> bool:
    """Whether ``caller`` may take ``action`` on queue ``name`` by the rows read now (the user
    still active, its grants now), not by the rules cached for a while: for work that goes on
    long after its call was checked (a message move task). Raises QueueNotFound."""
    cfg = queue_config(name)
    return action in granted_now(caller, cfg.id, cfg.name, cfg.created_by)


def authorize(target: str, action: str, *, caller: Caller, reading: bool = False) -> tuple[QueueConfig, str]:
    """:func:`resolve` ``target`` and check that ``caller`` may take ``action`` on its queue or
    topic (a subscription's calls are checked on its topic) before anything else is looked at.

    Raises QueueNotFound (also when the caller may not even read it: answered as if it did not
    exist), ``access.Forbidden`` (it may read it but lacks ``action``), SubscriptionNotFound,
    InvalidRequest (``is_a_topic``, with ``reading``).
    """
    memo = _ONE_CALL.get()
    if memo is not None:
        key = (target, action, reading)
        hit = memo.get(key)
        if hit is not None and hit[0] is caller:
            return hit[1]
    queue, slash, _ = target.partition("/")
    cfg = queue_config(queue)
    require(caller, action, cfg.id, cfg.name, cfg.created_by, target=target if slash else cfg.name)
    found = resolve(target, reading=reading) if slash or reading else (cfg, "")
    if memo is not None:
        memo[key] = (caller, found)
    return found


@dataclass(frozen=True, slots=True)
class Checked:
    """What :func:`check` found: ``caller`` may take ``action`` on ``target``, whose queue or
    topic is ``cfg`` and subscription ``sub`` ("" for none). An entrance that checked a call's
    right before reading its body hands this on to the service's message call, which then does
    not check again (:func:`authorized`): the call is authorized once."""

    target: str
    action: str
    reading: bool
    caller: Caller
    cfg: QueueConfig
    sub: str


def check(target: str, action: str, *, caller: Caller, reading: bool = False) -> Checked:
    """:func:`authorize`, its answer kept to be handed on. Raises what it raises."""
    cfg, sub = authorize(target, action, caller=caller, reading=reading)
    return Checked(target, action, reading, caller, cfg, sub)


def authorized(
    checked: Checked | None, target: str, action: str, *, caller: Caller, reading: bool = False
) -> tuple[QueueConfig, str]:
    """``(config, subscription)`` of ``target`` for ``caller`` and ``action``: ``checked``'s
    when it answered that very question (the same target, action, ``reading`` and caller
    object), else :func:`authorize`'s."""
    if (
        checked is not None
        and checked.caller is caller
        and checked.target == target
        and checked.action == action
        and checked.reading == reading
    ):
        return checked.cfg, checked.sub
    return authorize(target, action, caller=caller, reading=reading)


#: The answers :func:`authorize` gave within the request being served (see :func:`one_call`).
_Answers = dict[tuple[str, str, bool], tuple[Caller, tuple[QueueConfig, str]]]
_ONE_CALL: ContextVar[_Answers | None] = ContextVar("authorized_in_this_call", default=None)


def begin_call() -> Token[_Answers | None]:
    """From here until :func:`end_call`, :func:`authorize` answers a question it already
    answered (same target, action, ``reading`` and the same caller object) as it did, without
    checking again: for an entrance whose request asks the same question more than once and
    cannot hand the answer on (a message call hands on its :class:`Checked` instead). Only granted answers are kept (a
    refusal raises); the first check
    of the request is as fresh as ever (``access.TTL``), so a revoked grant stops working from
    the next request on. Around one request, never across requests."""
    return _ONE_CALL.set({})


def end_call(token: Token[_Answers | None]) -> None:
    _ONE_CALL.reset(token)
