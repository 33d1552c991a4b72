"""Who may do what to which queue: grants (``grants``: the rules, cached for ``TTL`` seconds,
and the check every entrance makes) and the audit trail of what was done (``audit``).

The vocabulary every entrance uses is here: a :class:`Caller`, the :data:`ACTIONS`, and
:class:`Forbidden` when a caller lacks one."""

from queues.access.grants import (
    ACTIONS,
    ANONYMOUS,
    RULES,
    SYSTEM,
    TTL,
    Caller,
    Forbidden,
    connect_signals,
    granted,
    granted_now,
    granted_to_group,
    grants_on,
    pattern_regex,
    require,
    visible,
)

__all__ = [
    "ACTIONS",
    "ANONYMOUS",
    "RULES",
    "SYSTEM",
    "TTL",
    "Caller",
    "Forbidden",
    "connect_signals",
    "granted",
    "granted_now",
    "granted_to_group",
    "grants_on",
    "pattern_regex",
    "require",
    "visible",
]
