"""The OpenAPI schema as the contract: what drf-spectacular cannot infer, added after it ran.

``SPECTACULAR_SETTINGS["POSTPROCESSING_HOOKS"]`` runs :func:`postprocess` on the generated
schema. It

- gives the message calls (checked by hand in ``validation``, not by serializers) request
  schemas that say exactly what ``validation`` accepts: lengths, ranges, batch sizes 1..1000,
  required fields, no unknown fields;
- documents on every operation each error status it can answer, with the error body
  (``{"error", "detail"}`` and the extra fields some errors carry) and 503's ``Retry-After``;
- refuses unknown fields in every request body the API checks with serializers (they refuse
  them: ``StrictSerializer``) and forbids NUL characters where DRF does;
- adds OpenAPI links: from a created queue, topic or subscription (its ``name``) to the calls
  that take the name, from enqueue to dequeue, and from dequeue's first message (``id``,
  ``receipt``) to ack and visibility. Client generators and fuzzers follow them.

The limits come from the code that enforces them (``LIMITS``, ``validation``), not copies.
"""

from __future__ import annotations

from typing import Any

from queues.engine.ids import _MESSAGE_ID
from queues.http import validation
from queues.public import LIMITS, QUEUE_NAME
from queues.service.limits import MAX_BATCH, MAX_WAIT

#: A name, whole (ECMA "$" is the end of the string; the service matches with "\\Z").
NAME_PATTERN = f"^{QUEUE_NAME}$"
NAME = {"type": "string", "pattern": NAME_PATTERN, "description": "letters, digits, '_' and '-', at most 80"}
MESSAGE_ID = {
    "type": "string",
    "pattern": _MESSAGE_ID.pattern,
    "maxLength": 200,
    "description": "a message ID as enqueue or dequeue returned it (<queue>/<partition>/<block>/<index>)",
}
RECEIPT = {
    "type": "string",
    "minLength": 1,
    "maxLength": 64,
    "nullable": True,
    "description": "the receipt of the delivery (dequeue's answer); required on strict queues",
}
NO_NUL = "^[^\\u0000]*$"


def _range(low: float, high: float, *, integer: bool = False, nullable: bool = True, **extra: Any) -> dict[str, Any]:
    return {
        "type": "integer" if integer else "number",
        "minimum": low,
        "maximum": high,
        **({"nullable": True} if nullable else {}),
        **extra,
    }


def _short_text(description: str) -> dict[str, Any]:
    return {
        "type": "string",
        "minLength": 1,
        "maxLength": 128,
        "pattern": NO_NUL,
        "nullable": True,
        "description": description,
    }


def _closed(properties: dict[str, Any], required: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    """An object with these properties and no others."""
    schema: dict[str, Any] = {"type": "object", "properties": properties, "additionalProperties": False}
    if required:
        schema["required"] = required
    schema.update(extra)
    return schema


MESSAGE_IN = _closed(
    {
        "body": {
            "type": "string",
            "minLength": 1,
            "description": "the message: non-empty text of at most the queue's max_message_size bytes of UTF-8",
        },
        "group": _short_text("messages of one group are delivered in order, one at a time; required on strict queues"),
        "fairness_key": _short_text(
            "a tenant's key: in each partition, the messages of each key take turns with the other keys' (a key "
            "that floods the queue holds the others back by one message a turn); no order follows from it (a "
            "group's messages are delivered by their group)"
        ),
        "dedup_id": _short_text("a second message with this ID within the queue's dedup_window is dropped"),
        "delay": _range(*LIMITS["delay"], description="seconds before it may be delivered (default: the queue's)"),
        "not_before": {
            "nullable": True,
            "description": "deliver at or after this time (epoch seconds or ISO 8601), at most "
            f"{LIMITS['delay'][1]} s ahead; not together with delay",
            "oneOf": [{"type": "number", "minimum": 0}, {"type": "string", "format": "date-time"}],
        },
        "attributes": {
            "type": "object",
            "nullable": True,
            "maxProperties": validation.MAX_ATTRIBUTES,
            "description": "names of 1 to 64 characters; values text (up to 1,024 characters), numbers or booleans",
            "additionalProperties": {
                "oneOf": [
                    {"type": "string", "maxLength": 1024, "pattern": NO_NUL},
                    {"type": "number"},
                    {"type": "boolean"},
                ]
            },
        },
        "size": _range(0, 1 << 50, integer=True, description="the size of the work it stands for (free use)"),
        "estimates": _closed(
            {
                "preprocess": _range(*LIMITS["estimate"]),
                "process": _range(*LIMITS["estimate"]),
            },
            nullable=True,
            minProperties=1,
            description="seconds this message's pre-processing and processing take (default: the queue's)",
        ),
    },
    ["body"],
    description="one message",
)

ENQUEUE = {
    "oneOf": [
        {"$ref": "#/components/schemas/MessageIn"},
        _closed(
            {
                "messages": {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": MAX_BATCH,
                    "items": {"$ref": "#/components/schemas/MessageIn"},
                }
            },
            ["messages"],
            description=f"a batch of 1 to {MAX_BATCH} messages, stored in order",
        ),
    ]
}

DEQUEUE = _closed(
    {
        "max": _range(1, MAX_BATCH, integer=True, description="at most this many messages (default 1)"),
        "visibility_timeout": _range(
            *LIMITS["visibility_timeout"], description="seconds each stays hidden (default: the queue's)"
        ),
        "wait": _range(0, MAX_WAIT, description="long poll: seconds to wait for a first message"),
    }
)

ACK = {
    "oneOf": [
        _closed(
            {"ids": {"type": "array", "minItems": 1, "maxItems": MAX_BATCH, "items": MESSAGE_ID}},
            ["ids"],
            description="message IDs (not on strict queues)",
        ),
        _closed(
            {
                "messages": {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": MAX_BATCH,
                    "items": _closed({"id": MESSAGE_ID, "receipt": RECEIPT}, ["id"]),
                }
            },
            ["messages"],
            description="{id, receipt} pairs: a stale receipt refuses the whole call (409)",
        ),
    ]
}

VISIBILITY = _closed(
    {
        "id": MESSAGE_ID,
        "receipt": RECEIPT,
        "visibility_timeout": _range(
            *LIMITS["visibility_timeout"], nullable=False, description="seconds from now; 0 makes it visible"
        ),
    },
    ["id", "visibility_timeout"],
)

REDRIVE = _closed({"max": _range(1, MAX_BATCH, integer=True, description="default 100")})
EXPIRE = _closed({"older_than": _range(0, LIMITS["retention"][1], description="seconds (default: the retention)")})
PURGE = _closed({})

#: Epoch seconds datetime can hold (years 1 to 9999).
_EPOCH = {"type": "number", "minimum": -62135596800, "exclusiveMaximum": True, "maximum": 253402300800}
TIME = {
    "nullable": True,
    "oneOf": [_EPOCH, {"type": "string", "format": "date-time"}],
    "description": "ISO 8601 (a time without zone is UTC) or epoch seconds; a time not in years 1 to 9999 "
    "once in UTC is refused (400)",
}
REPLAY = _closed(
    {
        "queue": {**NAME, "description": "the queue the messages were archived from"},
        "into": {
            "type": "string",
            "nullable": True,
            "pattern": f"^(?:{QUEUE_NAME})?$",
            "description": "the queue to enqueue the copies to (default: queue)",
        },
        "ids": {
            "type": "array",
            "nullable": True,
            "minItems": 1,
            "maxItems": 10_000,
            "items": MESSAGE_ID,
            "description": "message IDs of queue; not together with since/until",
        },
        "since": {**TIME, "description": f"enqueued at or after ({TIME['description']})"},
        "until": {**TIME, "description": f"enqueued before ({TIME['description']})"},
        "max": _range(1, 10_000, integer=True, description="at most this many (default 1000)"),
    },
    ["queue"],
)

ERROR = {
    "type": "object",
    "required": ["error", "detail"],
    "properties": {
        "error": {"type": "string", "description": "a stable code, e.g. queue_not_found, body_too_large"},
        "detail": {"description": "what is wrong, for people: text, or an object of field -> problems"},
        "missing": {"type": "string", "description": "403 permission_denied: the action the caller lacks"},
        "id": {"type": "string", "description": "409 receipt_mismatch: the message whose receipt is stale"},
    },
    "additionalProperties": True,
}

#: Request schemas written here, by component name (the views name them: ``request=EnqueueDoc``).
REQUESTS = {
    "EnqueueDocRequest": ENQUEUE,
    "DequeueDocRequest": DEQUEUE,
    "AckDocRequest": ACK,
    "VisibilityDocRequest": VISIBILITY,
}

#: Request bodies of the calls whose views take a free-form ``dict``: component name, schema.
BODIES = {
    ("/api/v1/queues/{name}/redrive", "post"): ("RedriveRequest", REDRIVE),
    ("/api/v1/queues/{name}/expire", "post"): ("ExpireRequest", EXPIRE),
    ("/api/v1/queues/{name}/purge", "post"): ("PurgeRequest", PURGE),
    ("/api/v1/archive/replay", "post"): ("ReplayRequest", REPLAY),
}
#: Path parameters that are names of queues, topics or subscriptions.
NAMED = {"name", "topic"}

_ERR = {"$ref": "#/components/schemas/ErrorDoc"}
STATUS_TEXT = {
    400: "bad input (the body's error names the rule); nothing was changed",
    401: "no token, or a token that is not valid (error: not_authenticated, authentication_failed)",
    403: "permission_denied: the caller may see this but lacks the action (`missing` names it), or the "
    "call is for staff and nodes only",
    404: "no such queue, topic, subscription or partition, or one the caller may not see (answered as if "
    "it did not exist); a topic's name under /queues/ is is_a_topic",
    409: "conflicts with the current state: a name already taken, a stale receipt (receipt_mismatch, with the "
    "message's id), a partition no node holds, a concurrent change (retry)",
    413: "request body over the node's limit (payload_too_large)",
    415: "the body is not application/json (unsupported_media_type)",
    429: "throttled: past the caller's rate (API_THROTTLE_USER) or one of its limits (long polls at once, "
    "consumers heard from); retry after Retry-After seconds",
    503: "the partition is not available on this node right now (a takeover, the store is down); retry "
    "after Retry-After seconds",
}
RETRY_AFTER = {
    "Retry-After": {"schema": {"type": "integer", "minimum": 0}, "description": "seconds to wait before retrying"}
}

_NO_400 = {"/api/v1/queues/{name}/partitions/{index}/release", "/api/v1/queues/{name}/refresh"}
_NO_409 = {"/api/v1/logs", "/api/v1/consumers/heartbeat"}


#: Operations whose body names a queue (404 when there is none, or the caller may not see it).
#: POST /logs names them in its records' message IDs.
_NAMES_IN_BODY = {"/api/v1/archive/replay", "/api/v1/logs"}


def _statuses(path: str, method: str, op: dict[str, Any]) -> list[int]:
    """The error statuses an operation can answer."""
    if not op.get("security") or op.get("security") == [{}]:
        return []  # healthz: no authentication, nothing to refuse
    out = [401, 403, 429, 503]
    writes = method in ("post", "patch", "put", "delete")
    has_body = "requestBody" in op
    if ((writes and path not in _NO_400) or (method == "get" and op.get("parameters"))) and method != "delete":
        out.append(400)
    if "{" in path or (path in _NAMES_IN_BODY and has_body):
        out.append(404)
    if writes and path not in _NO_409:
        out.append(409)
    if has_body:
        out += [413, 415]
    return sorted(out)


def _add_errors(schema: dict[str, Any]) -> None:
    for path, ops in schema["paths"].items():
        for method, op in ops.items():
            responses = op.setdefault("responses", {})
            for code in _statuses(path, method, op):
                key = str(code)
                response = responses.get(key) or {"description": STATUS_TEXT[code]}
                if not response.get("description"):
                    response["description"] = STATUS_TEXT[code]
                response["content"] = {"application/json": {"schema": _ERR}}
                if code in (429, 503):
                    response["headers"] = RETRY_AFTER
                responses[key] = response


def _close_requests(schema: dict[str, Any]) -> None:
    """Serializer-made request bodies: no unknown fields, no NUL in text (DRF refuses both)."""
    for name, component in schema["components"]["schemas"].items():
        if not name.endswith("Request") or name in REQUESTS or component.get("type") != "object":
            continue
        component["additionalProperties"] = False
        for prop in component.get("properties", {}).values():
            if prop.get("type") == "string" and "enum" not in prop and "format" not in prop:
                prop.setdefault("pattern", NO_NUL)
            if prop.get("type") == "array" and prop.get("items", {}).get("type") == "string":
                prop["items"].setdefault("pattern", NO_NUL)


#: Limits of query parameters and of fields DRF checks without saying so in the schema.
QUERY_LIMITS: dict[tuple[str, str], dict[str, Any]] = {
    ("/api/v1/archive", "limit"): {"type": "integer", "minimum": 1, "maximum": 1000},
    ("/api/v1/archive", "after"): {"type": "integer", "minimum": 0, "maximum": 2**63 - 1},
    ("/api/v1/archive", "queue"): {"type": "string", "pattern": f"^(?:{QUEUE_NAME})?$"},
    # since, until: ISO 8601 or epoch seconds, as text (the API reads either; 400 otherwise)
    ("/api/v1/logs", "limit"): {"type": "integer", "minimum": 1, "maximum": 1000},
}
FIELD_PATTERNS = {
    ("AttemptInRequest", "message_id"): MESSAGE_ID["pattern"],
    ("QueueRequest", "dead_letter_queue"): NAME_PATTERN,
    ("PatchedQueueUpdateRequest", "dead_letter_queue"): NAME_PATTERN,
    ("SubscriptionRequest", "dead_letter_queue"): NAME_PATTERN,
}


def _limits(schema: dict[str, Any]) -> None:
    for (path, name), limits in QUERY_LIMITS.items():
        for param in schema["paths"].get(path, {}).get("get", {}).get("parameters", []):
            if param["name"] == name and param["in"] == "query":
                param["schema"] = dict(limits)
    components = schema["components"]["schemas"]
    records = components.get("LogsInRequest", {}).get("properties", {}).get("records")
    if records is not None:
        records.update(minItems=1, maxItems=1000)
    for (component, field), pattern in FIELD_PATTERNS.items():
        prop = components.get(component, {}).get("properties", {}).get(field)
        if prop is not None:
            prop["pattern"] = pattern


def _operations(schema: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(path, method): op for path, ops in schema["paths"].items() for method, op in ops.items()}


def _link(target: dict[str, Any], description: str, parameters: dict[str, Any], body: Any = None) -> dict[str, Any]:
    link: dict[str, Any] = {"operationId": target["operationId"], "description": description}
    wanted = {p["name"] for p in target.get("parameters", []) if p.get("in") == "path"}
    link["parameters"] = {k: v for k, v in parameters.items() if k in wanted}
    if body is not None:
        link["requestBody"] = body
    return link


def _add_links(schema: dict[str, Any]) -> None:
    ops = _operations(schema)

    def under(prefix: str) -> list[tuple[str, str, dict[str, Any]]]:
        return [
            (p, m, op)
            for (p, m), op in ops.items()
            if (p == prefix or p.startswith(prefix + "/")) and not p.endswith("/refresh")  # a topic's, for nodes
        ]

    def add(source: tuple[str, str], status: str, links: dict[str, dict[str, Any]]) -> None:
        op = ops.get(source)
        if op is None:
            return
        response = op["responses"].setdefault(status, {"description": ""})
        response.setdefault("links", {}).update(links)

    def name_of(path: str, method: str) -> str:
        tail = path.rstrip("/").split("/")[-1]
        tail = "resource" if tail.startswith("{") else tail
        return f"{method.upper()} {tail}"

    created = {"name": "$response.body#/name", "index": 0}
    q = "/api/v1/queues/{name}"
    add(
        ("/api/v1/queues", "post"),
        "201",
        {name_of(p, m): _link(op, f"{m.upper()} {p} on the new queue", created) for p, m, op in under(q)},
    )
    t = "/api/v1/topics/{name}"
    topic_links = {name_of(p, m): _link(op, f"{m.upper()} {p} on the new topic", created) for p, m, op in under(t)}
    subs = "/api/v1/topics/{topic}/subscriptions"
    for m in ("get", "post"):
        if (subs, m) in ops:
            topic_links[f"{m.upper()} subscriptions"] = _link(
                ops[(subs, m)], f"{m.upper()} {subs} of the new topic", {"topic": "$response.body#/name"}
            )
    add(("/api/v1/topics", "post"), "201", topic_links)
    s = subs + "/{name}"
    add(
        (subs, "post"),
        "201",
        {
            name_of(p, m): _link(
                op,
                f"{m.upper()} {p} on the new subscription",
                {"topic": "$request.path.topic", "name": "$response.body#/name"},
            )
            for p, m, op in under(s)
        },
    )
    same = {"name": "$request.path.name", "topic": "$request.path.topic"}
    add((q + "/enqueue", "post"), "201", {"dequeue": _link(ops[(q + "/dequeue", "post")], "receive it", same)})
    for base in (q, s):
        first = "$response.body#/messages/0"
        add(
            (base + "/dequeue", "post"),
            "200",
            {
                "ack": _link(
                    ops[(base + "/ack", "post")],
                    "acknowledge the first message received",
                    same,
                    {"messages": [{"id": f"{first}/id", "receipt": f"{first}/receipt"}]},
                ),
                "visibility": _link(
                    ops[(base + "/visibility", "post")],
                    "make the first message received visible again",
                    same,
                    {"id": f"{first}/id", "receipt": f"{first}/receipt", "visibility_timeout": 0},
                ),
            },
        )


# ------------------------------------------------------------------------ response bodies


def type_schema(tp: Any) -> dict[str, Any]:
    """The JSON schema of a Python type the service answers with (TypedDicts, dataclasses,
    their fields' types), so the documented answers follow the code's types."""
    import dataclasses
    import types
    import typing

    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Annotated:
        # ``Annotated[T, {...}]``: T's schema with what the dicts add (e.g. ``deprecated``).
        schema = type_schema(args[0])
        for extra in args[1:]:
            if isinstance(extra, dict):
                schema = {**schema, **extra}
        return schema
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        schema = type_schema(inner[0]) if len(inner) == 1 else {"anyOf": [type_schema(a) for a in inner]}
        return {**schema, "nullable": True} if len(inner) < len(args) else schema
    if origin is typing.Literal:
        return {"type": "string", "enum": list(args)}
    if origin is list:
        return {"type": "array", "items": type_schema(args[0])}
    if origin is dict:
        return {"type": "object", "additionalProperties": type_schema(args[1])}
    if origin in (typing.NotRequired, typing.Required):
        return type_schema(args[0])
    if tp is bool:
        return {"type": "boolean"}
    if tp is int:
        return {"type": "integer"}
    if tp is float:
        return {"type": "number"}
    if tp is str:
        return {"type": "string"}
    if typing.is_typeddict(tp) or dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp, include_extras=True)
        if typing.is_typeddict(tp):
            # From the hints, not __required_keys__: with string annotations (``from __future__
            # import annotations``) Python 3.11 counts NotRequired keys as required there.
            required = [k for k, v in hints.items() if typing.get_origin(v) is not typing.NotRequired]
        else:
            required = [f.name for f in dataclasses.fields(tp)]
        return {"type": "object", "properties": {k: type_schema(v) for k, v in hints.items()}, "required": required}
    return {}


def _responses() -> dict[tuple[str, str, str], dict[str, Any]]:
    from queues.service.types import ExpireResult, PartitionOwner, QueueStats, RedriveResult, SubscriptionStats

    expire = type_schema(ExpireResult)
    expire["required"] = ["expired", "archived"]  # deferred only when a partition's pass failed
    archived = {
        "type": "object",
        "required": ["id", "queue", "partition", "body", "enqueued_at", "archived_at", "replay_count"],
        "properties": {
            "id": {"type": "string"},
            "queue": {"type": "string"},
            "partition": {"type": "integer"},
            "group": {"type": "string", "nullable": True},
            "body": {"type": "string"},
            "attributes": {"type": "object", "nullable": True},
            "size": {"type": "integer", "nullable": True},
            "sequence": {"type": "integer", "nullable": True},
            "enqueued_at": {"type": "string", "format": "date-time", "nullable": True},
            "acked_at": {"type": "string", "format": "date-time", "nullable": True},
            "archived_at": {"type": "string", "format": "date-time", "nullable": True},
            "replay_count": {"type": "integer"},
            "last_replayed_at": {"type": "string", "format": "date-time", "nullable": True},
        },
    }
    q = "/api/v1/queues/{name}"
    s = "/api/v1/topics/{topic}/subscriptions/{name}"
    return {
        ("/api/v1/healthz", "get", "200"): {
            "type": "object",
            "required": ["status"],
            "properties": {
                "status": {"type": "string", "enum": ["ok"]},
                "node": {"type": "string", "description": "this node's ID (staff and nodes only)"},
                "address": {"type": "string", "description": "its host:port (staff and nodes only)"},
                "partitions": {"type": "integer", "description": "partitions it serves (staff and nodes only)"},
            },
        },
        ("/api/v1/readyz", "get", "200"): _closed({"status": {"type": "string", "enum": ["ready"]}}, ["status"]),
        ("/api/v1/readyz", "get", "503"): _closed(
            {
                "status": {"type": "string", "enum": ["not_ready"]},
                "not_ready": {
                    "type": "array",
                    "items": {"type": "string", "enum": ["database", "partitions", "store"]},
                    "description": "the checks that fail",
                },
            },
            ["status", "not_ready"],
        ),
        (q + "/stats", "get", "200"): type_schema(QueueStats),
        (s + "/stats", "get", "200"): type_schema(SubscriptionStats),
        (q + "/partitions", "get", "200"): {
            "type": "object",
            "required": ["queue", "partitions"],
            "properties": {"queue": {"type": "string"}, "partitions": type_schema(list[PartitionOwner])},
        },
        (q + "/redrive", "post", "200"): type_schema(RedriveResult),
        (q + "/expire", "post", "200"): expire,
        (q + "/purge", "post", "200"): {
            "type": "object",
            "required": ["purged"],
            "properties": {"purged": {"type": "integer", "description": "messages removed"}},
        },
        (q + "/partitions/{index}/release", "post", "200"): {
            "type": "object",
            "required": ["released", "node"],
            "properties": {
                "released": {"type": "boolean"},
                "node": {"type": "string", "nullable": True, "description": "the node that gave the lease up"},
            },
        },
        ("/api/v1/archive", "get", "200"): {
            "type": "object",
            "required": ["messages", "next"],
            "properties": {
                "messages": {"type": "array", "items": archived},
                "next": {"type": "string", "nullable": True, "description": "give it as `after` for the next page"},
            },
        },
        ("/api/v1/archive/replay", "post", "200"): {
            "type": "object",
            "required": ["queue", "into", "selected", "replayed", "ids"],
            "properties": {
                "queue": {"type": "string"},
                "into": {"type": "string"},
                "selected": {"type": "integer"},
                "replayed": {"type": "integer"},
                "ids": {"type": "array", "items": {"type": "string"}, "description": "the copies' IDs"},
            },
        },
    }


def _document_responses(schema: dict[str, Any]) -> None:
    for (path, method, status), body in _responses().items():
        response = schema["paths"].get(path, {}).get(method, {}).get("responses", {}).get(status)
        if response is not None:
            response["content"] = {"application/json": {"schema": body}}


def postprocess(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    schemas = result.setdefault("components", {}).setdefault("schemas", {})
    schemas["ErrorDoc"] = ERROR
    schemas["MessageIn"] = MESSAGE_IN
    for name, component in REQUESTS.items():
        if name in schemas:
            schemas[name] = component
    ops = _operations(result)
    for key, (name, component) in BODIES.items():
        if key in ops:
            schemas[name] = component
            ops[key]["requestBody"] = {
                "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{name}"}}},
                "required": key[0] == "/api/v1/archive/replay",
            }
    for op in ops.values():
        for param in op.get("parameters", []):
            if param.get("in") == "path" and param["name"] in NAMED:
                param["schema"] = dict(NAME)
    _close_requests(result)
    _limits(result)
    _document_responses(result)
    _add_errors(result)
    not_ready = result["paths"].get("/api/v1/readyz", {}).get("get", {}).get("responses", {}).get("503")
    if not_ready is not None:
        not_ready["headers"] = RETRY_AFTER
    _add_links(result)
    for (path, _method), op in _operations(result).items():
        body = op.get("requestBody")
        if body and path.endswith(("/enqueue", "/publish", "/ack", "/visibility", "/replay")):
            body["required"] = True
    return result
