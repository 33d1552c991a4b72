"""Who served a call: the partition managers a message call acted through, each as
``<node id>:<queue>/<index>:<epoch>``.

On only with ``SERVED_BY_HEADER`` (for the nemesis run, which checks that no call is answered by
an owner whose epoch was already superseded): an entrance opens a record around one call
(:func:`begin`), the message operations add each local partition manager they hand the call to
(:func:`record`), a call forwarded to another node adds the entries the owner's answer names
(:func:`extend`), and the entrance reads the list back at the end (:func:`end`) into its answer
(``queues.http.served``: the ``X-MQ-Served-By`` header).

Off (the default), :func:`begin` opens nothing and :func:`record` costs one context variable
read and one ``is None``. The record is a context variable: each request thread has its own, and
the service fans no call out to threads of its own (were one added, it must run in
``contextvars.copy_context()`` so that its records land in the call's list).
"""

from __future__ import annotations

from collections.abc import Iterable
from contextvars import ContextVar, Token
from typing import Any

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver

from queues.engine.partition import PartitionManager
from queues.engine.ports import Lease

#: The entries of the call in progress in this context, in the order met; None: no record.
_SERVED: ContextVar[list[str] | None] = ContextVar("mq_served_by", default=None)


#: ``SERVED_BY_HEADER``, read once (None: not yet): a look through Django's ``settings`` costs
#: about 180 ns (``LazySettings.__getattribute__``), more than the rest of :func:`begin`.
_enabled: bool | None = None


@receiver(setting_changed)
def _forget_setting(*, setting: str, **_: Any) -> None:
    global _enabled
    if setting == "SERVED_BY_HEADER":
        _enabled = None


def begin() -> Token[list[str] | None] | None:
    """Open a record for the call about to run here (None when ``SERVED_BY_HEADER`` is off):
    give the token to :func:`end`, whatever happens."""
    global _enabled
    enabled = _enabled
    if enabled is None:
        enabled = _enabled = bool(settings.SERVED_BY_HEADER)
    if not enabled:
        return None
    return _SERVED.set([])


def end(token: Token[list[str] | None] | None) -> list[str]:
    """The entries recorded since :func:`begin` gave ``token``, and the record closed."""
    if token is None:
        return []
    served = _SERVED.get() or []
    _SERVED.reset(token)
    return served


def active() -> bool:
    """Whether a call in this context records who served it."""
    return _SERVED.get() is not None


def record(m: PartitionManager[Lease]) -> None:
    """The call acted through ``m``, a partition manager of this node (under its lease's epoch
    now)."""
    served = _SERVED.get()
    if served is None:
        return
    entry = f"{m.node_id}:{m.queue}/{m.index}:{m.lease.epoch}"
    if entry not in served:
        served.append(entry)


def extend(entries: Iterable[str]) -> None:
    """The call was served, in part, by another node, whose answer names ``entries``."""
    served = _SERVED.get()
    if served is None:
        return
    for entry in entries:
        if entry and entry not in served:
            served.append(entry)
