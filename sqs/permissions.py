"""AddPermission and RemovePermission as the service's grants.

SQS's AddPermission lets the principals of other AWS accounts call some actions on a queue,
under a label, and writes a statement (its ``Sid`` the label) into the queue's ``Policy``.
Here the principals are the service's users, and a permission is grants on the queue:

- an entry of ``AWSAccountIds`` names one user: by user name, or by one of their active access
  key IDs (what a user of the SQS API knows of itself). The endpoint's own account ID (the one
  its queue URLs name) is taken as SQS takes its own account: the statement names the account
  (``arn:aws:iam::<account>:root``) and grants nobody anything here (the account's users have
  what their grants give them, as in-account access in AWS comes from their own policies).
  Anything else, another 12-digit AWS account ID included, names nobody here and is refused
  (``InvalidParameterValue``): this service has one account, its own users inside it;
- each action maps to the grant that allows it (:data:`GRANT_OF`): ``SendMessage`` to
  ``produce``; ``ReceiveMessage``, ``DeleteMessage``, ``ChangeMessageVisibility`` to ``consume``;
  ``GetQueueAttributes``, ``GetQueueUrl`` and the other reads to ``read``; ``*`` and the actions
  that change the queue to ``manage``;
- the statement is written into the queue's ``Policy`` as SQS writes it (principal
  ``arn:aws:iam::<account>:user/<name>``), and RemovePermission reads it back to take away what
  the label gave: a grant that another label of the queue still gives stays.

Both need ``manage`` on the queue (as changing a grant does everywhere), and are recorded in the
audit trail as the grants they make or take back.
"""

from __future__ import annotations

import json
import re
from typing import Any

from django.contrib.auth import get_user_model
from django.db import transaction

from queues import service
from queues.access import require
from sqs import service as sqs_service
from sqs import wire
from sqs.attributes import settings_of
from sqs.context import Context, invalid, missing, queue_arn, queue_param, service_errors, shown, text_param
from sqs.models import AccessKey
from sqs.query import valid_text

_LABEL = re.compile(r"^[A-Za-z0-9_-]{1,80}$")
_PRINCIPAL = re.compile(r"^arn:aws:iam::[^:]*:user/(?P<name>.+)$")

_READ = ("GetQueueAttributes", "GetQueueUrl", "ListQueueTags", "ListDeadLetterSourceQueues", "ListMessageMoveTasks")
_CONSUME = (
    "ReceiveMessage",
    "DeleteMessage",
    "DeleteMessageBatch",
    "ChangeMessageVisibility",
    "ChangeMessageVisibilityBatch",
)
_MANAGE = (
    "*",
    "DeleteQueue",
    "PurgeQueue",
    "SetQueueAttributes",
    "TagQueue",
    "UntagQueue",
    "StartMessageMoveTask",
    "CancelMessageMoveTask",
    "AddPermission",
    "RemovePermission",
)
#: SQS action -> the grant that allows it here.
GRANT_OF: dict[str, str] = {
    **dict.fromkeys(_READ, "read"),
    **dict.fromkeys(_CONSUME, "consume"),
    **dict.fromkeys(("SendMessage", "SendMessageBatch"), "produce"),
    **dict.fromkeys(_MANAGE, "manage"),
}


def _names(params: dict[str, Any], key: str) -> list[str]:
    value = params.get(key)
    if not value:
        raise missing(key)
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise invalid(f"{key} must be a list of names")
    return value


#: the longest AWSAccountIds entry: a user name (Django's are at most 150 characters) or a key ID.
_MAX_ENTRY = 150


def _user(entry: str) -> Any:
    """The user an ``AWSAccountIds`` entry names (user name, or an active access key ID of theirs)."""
    if not valid_text(entry) or len(entry) > _MAX_ENTRY:
        # (a NUL reaches no query: PostgreSQL refuses it in text, an error that is no outage)
        raise invalid(f"Value {shown(entry)} for parameter AWSAccountIds is invalid. Reason: not a user name.")
    users = get_user_model()
    user = users.objects.filter(username=entry, is_active=True).first()
    if user is None:
        key = AccessKey.objects.filter(access_key_id=entry, revoked_at__isnull=True, user__is_active=True).first()
        user = key.user if key is not None else None
    if user is None:
        raise invalid(
            f"Value {entry} for parameter AWSAccountIds is invalid. Reason: it names no user of this service "
            "(give a user name or an access key ID of theirs: the service has one account, its users in it)."
        )
    return user


def _policy(q: Any) -> dict[str, Any]:
    """The queue's Policy as a JSON object (an empty one if it has none or it is not one)."""
    text = (settings_of(q).opaque or {}).get("Policy") or ""
    try:
        policy = wire.loads(text) if text else {}  # (bounded: the Policy is the caller's text)
    except ValueError:
        policy = {}
    if not isinstance(policy, dict) or not isinstance(policy.get("Statement", []), list):
        policy = {}
    return policy


def _granted(statement: Any) -> set[tuple[str, str]]:
    """(user name, grant) pairs a statement written by AddPermission gives."""
    if not isinstance(statement, dict):
        return set()
    principals = (statement.get("Principal") or {}).get("AWS") if isinstance(statement.get("Principal"), dict) else []
    actions = statement.get("Action") or []
    principals = [principals] if isinstance(principals, str) else principals or []
    actions = [actions] if isinstance(actions, str) else actions
    names = [m["name"] for p in principals if isinstance(p, str) and (m := _PRINCIPAL.fullmatch(p))]
    grants = [GRANT_OF.get(a.removeprefix("SQS:")) for a in actions if isinstance(a, str)]
    return {(n, g) for n in names for g in grants if g}


def _managed(params: dict[str, Any], ctx: Context) -> Any:
    """The queue of the call, which the caller must manage (checked before its parameters)."""
    q = queue_param(params, ctx)
    with service_errors():
        require(ctx.caller, "manage", q.pk, q.name, q.created_by_id)
    return q


def add_permission(params: dict[str, Any], ctx: Context) -> dict[str, Any]:
    q = _managed(params, ctx)
    label = text_param(params, "Label", required=True)
    assert label is not None
    if not _LABEL.fullmatch(label):
        raise invalid(f"Value {label} for parameter Label is invalid. Reason: 1 to 80 of A-Z, a-z, 0-9, - and _.")
    entries = _names(params, "AWSAccountIds")
    users = [_user(e) for e in entries if e != ctx.account]
    principals = [f"arn:aws:iam::{ctx.account}:root"] if ctx.account in entries else []
    principals += [f"arn:aws:iam::{ctx.account}:user/{u.get_username()}" for u in users]
    actions = _names(params, "Actions")
    unknown = [a for a in actions if a not in GRANT_OF]
    if unknown:
        raise invalid(f"Value {unknown[0]} for parameter ActionName is invalid. Reason: no such action to permit.")
    policy = _policy(q)
    statements = list(policy.get("Statement", []))
    if any(isinstance(s, dict) and s.get("Sid") == label for s in statements):
        raise invalid(f"Value {label} for parameter Label is invalid. Reason: Already exists.")
    arn = queue_arn(ctx, q.name, q.strict)
    statements.append(
        {
            "Sid": label,
            "Effect": "Allow",
            "Principal": {"AWS": principals},
            "Action": [f"SQS:{a}" for a in actions],
            "Resource": arn,
        }
    )
    policy = {"Version": policy.get("Version", "2012-10-17"), "Id": policy.get("Id", f"{arn}/SQSDefaultPolicy")}
    policy["Statement"] = statements
    with service_errors(), transaction.atomic():
        for user in users:
            for grant in sorted({GRANT_OF[a] for a in actions}):
                service.grant(caller=ctx.caller, action=grant, user=user, queue=q)
        sqs_service.update_queue_settings(q, caller=ctx.caller, opaque={"Policy": json.dumps(policy)})
    return {}


def remove_permission(params: dict[str, Any], ctx: Context) -> dict[str, Any]:
    q = _managed(params, ctx)
    label = text_param(params, "Label", required=True)
    policy = _policy(q)
    statements = list(policy.get("Statement", []))
    gone = [s for s in statements if isinstance(s, dict) and s.get("Sid") == label]
    if not gone:
        raise invalid(f"Value {label} for parameter Label is invalid. Reason: can't find label.")
    kept = [s for s in statements if s not in gone]
    still = set().union(*(_granted(s) for s in kept))
    users = get_user_model()
    with service_errors(), transaction.atomic():
        for name, grant in sorted(_granted(gone[0]) - still):
            user = users.objects.filter(username=name).first()
            if user is not None:
                service.revoke(caller=ctx.caller, action=grant, user=user, queue=q)
        if kept:
            sqs_service.update_queue_settings(
                q, caller=ctx.caller, opaque={"Policy": json.dumps({**policy, "Statement": kept})}
            )
        else:  # no statement left: no Policy
            opaque = {k: v for k, v in (settings_of(q).opaque or {}).items() if k != "Policy"}
            sqs_service.update_queue_settings(q, caller=ctx.caller, opaque=opaque, replace=["opaque"])
    return {}
