"""Credentials: the REST API's tokens here, the SQS API's access keys in ``sqs.service``; both
on the rules of :func:`check_issuer` and :func:`check_revoker`; and the stamp that tells every
process a credential changed (:func:`credentials_stamp`, :func:`announce_credentials_change`).

A credential acts with every right of the user it is made for, so who may make one for whom is
narrow: a user for themselves; a superuser for another user, but never for another superuser
(nobody but a superuser holds a credential with a superuser's rights); the service itself
(``access.SYSTEM``: ``manage.py`` on the host) for anyone. A credential is taken back by its
holder or by a superuser. A Django permission (``sqs.add_accesskey``, ``authtoken.add_tokenproxy``)
lets a staff user use the console's form, never more than these rules.

The secret is answered once, by the call that makes it; the entrances never list it again (the
console shows a token's first characters only). Each issue and revoke is recorded in the audit
trail, on the target ``user:<name>``.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.db import IntegrityError, transaction
from rest_framework.authtoken.models import Token

from queues.access import Caller, Forbidden, audit
from queues.kv import get_store
from queues.service.errors import Conflict

#: how many leading characters of a token the console shows (never the whole key).
TOKEN_PREFIX = 8


class CredentialForbidden(Forbidden):
    """``caller`` may not make (or take back) a credential of ``user`` (403)."""

    def __init__(self, caller: Caller, what: str, user: Any, why: str):
        Exception.__init__(self, f"{caller} may not {what} for {user.get_username()!r}: {why}")
        self.caller = caller
        self.action = what
        self.target = f"user:{user.get_username()}"


def user_label(user: Any) -> str:
    """How the audit trail names the holder of a credential."""
    return f"user:{user.get_username()}"


def check_issuer(caller: Caller, user: Any, what: str = "issue a credential") -> None:
    """Raise CredentialForbidden unless ``caller`` may make a credential that acts as ``user``."""
    if caller.system or (caller.user_id is not None and caller.user_id == user.pk):
        return
    if user.is_superuser:
        raise CredentialForbidden(caller, what, user, "only a superuser makes their own")
    if not caller.is_superuser:
        raise CredentialForbidden(caller, what, user, "only a superuser makes one for another user")


def check_revoker(caller: Caller, user: Any, what: str = "revoke a credential") -> None:
    """Raise CredentialForbidden unless ``caller`` may take back a credential of ``user``."""
    if caller.unrestricted or (caller.user_id is not None and caller.user_id == user.pk):
        return
    raise CredentialForbidden(caller, what, user, "only its holder or a superuser takes it back")


def token_prefix(key: str) -> str:
    """What the console shows of a token: its first characters."""
    return f"{key[:TOKEN_PREFIX]}\u2026"


def issue_token(user: Any, *, caller: Caller) -> Token:
    """A new REST API token for ``user`` (:func:`check_issuer`); its ``key`` is the secret, shown
    by the caller once. A user holds one token: revoke it first to make another. Recorded as
    ``issue_token``. Raises CredentialForbidden, Conflict (``token_exists``)."""
    check_issuer(caller, user, "issue an API token")
    try:
        with transaction.atomic():
            token = Token.objects.create(user=user)
            audit.record(caller, "issue_token", user_label(user), prefix=token_prefix(token.key))
    except IntegrityError as exc:
        raise Conflict(f"{user.get_username()} has an API token: revoke it first", "token_exists") from exc
    return token


def revoke_token(user: Any, *, caller: Caller) -> bool:
    """Delete ``user``'s REST API token (:func:`check_revoker`): whether there was one. Recorded
    as ``revoke_token``. This node's processes stop trusting it at once (an access change:
    ``queues.access.changes``), the other nodes within their token cache's lifetime
    (``queues.http.auth.TTL``). Raises CredentialForbidden."""
    check_revoker(caller, user, "revoke an API token")
    with transaction.atomic():
        token = Token.objects.select_for_update().filter(user=user).first()
        if token is None:
            return False
        prefix = token_prefix(token.key)
        Token.objects.filter(pk=token.pk).delete()
        audit.record(caller, "revoke_token", user_label(user), prefix=prefix)
    return True


def token_holder(key: str) -> int | None:
    """The id of the user the REST API token ``key`` acts as; None: no token has that key (one
    of another service, or revoked). Whether the user is active is not looked at here."""
    user_id: int | None = Token.objects.filter(key=key).values_list("user_id", flat=True).first()
    return user_id


# --- the credentials stamp ------------------------------------------------------------------------
# A process may keep the credentials it read (the SQS API's access keys) while the stamp it read
# them under is unchanged: a change writes a new one, and every process of the cluster, which
# shares the key-value store, reads its credentials again once it reads the new stamp (``sqs.keys``
# holds a stamp on a short lease, which a change waits out).


def _stamp_key(kind: str) -> str:
    # (bucket ``<kind>``, beside no queue's keys: those lie under a queue's incarnation, ``<id>:``)
    return f"{kind}/credentials"


def credentials_stamp(kind: str) -> bytes | None:
    """The current stamp of the credentials of ``kind`` (``"sqs"``: the SQS API's access
    keys), read from the key-value store (one read); None if none was ever written. No lock,
    no permission: a process's own bookkeeping. Raises Unavailable (the store)."""
    return get_store().get(_stamp_key(kind))


def announce_credentials_change(kind: str, stamp: bytes | None = None) -> None:
    """Write a new stamp of the credentials of ``kind`` (``stamp``, or random bytes): every
    process reads those it keeps again once it reads the stamp (``sqs.keys``: at the end of the
    lease it holds on the one before). Call it before a change is written (a store out of reach
    then fails the change rather than leave other processes trusting the old rows) and again
    once it commits. No lock, no permission: the change's own function checked it. Raises
    Unavailable (the store)."""
    get_store().put(_stamp_key(kind), stamp if stamp is not None else uuid.uuid4().bytes)


def initialize_credentials_stamp(kind: str, stamp: bytes) -> bool:
    """Write ``stamp`` as the first stamp of the credentials of ``kind``, unless one was written
    already (a compare-and-set from absent): whether it was written. No lock, no permission.
    Raises Unavailable (the store)."""
    return get_store().compare_and_set(_stamp_key(kind), None, stamp)
