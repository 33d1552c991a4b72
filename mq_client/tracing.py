"""Trace context in messages, and the OpenTelemetry spans of the SDK's calls.

A message carries the W3C trace context of its creation in two attributes, ``traceparent`` and
``tracestate`` (the HTTP headers' names and formats, https://www.w3.org/TR/trace-context/), so a
consumer continues the producer's trace whoever carried the message (REST, this SDK, a node that
forwarded it). A message sent through the SQS API carries it as SQS does, in its
``AWSTraceHeader`` (X-Ray's ``Root=1-...;Parent=...;Sampled=1``): :func:`context_of` reads either.

Everything here is off unless an OpenTelemetry SDK is configured: :func:`enabled` asks once (a
caller keeps the answer) whether the global ``TracerProvider`` is a real one; with none, or without
the ``opentelemetry-api`` package at all, the SDK's calls make no span and add no attribute. The
spans follow OpenTelemetry's semantic conventions for messaging (``messaging.system`` is ``mq``).

Django-free (the nodes use it too, through ``queues.tracing``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, MutableMapping
from typing import TYPE_CHECKING, Any

try:
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # pragma: no cover - the SDK runs without OpenTelemetry installed
    trace = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span, Tracer, TracerProvider

#: ``messaging.system`` of every span.
SYSTEM = "mq"
TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
#: The attribute under which the SQS API keeps what SQS knows of a message (``sqs.meta``); its
#: ``trace`` is the message's ``AWSTraceHeader``.
SQS_META = "sqs:meta"
#: The most messages of one call that a span links to.
MAX_LINKS = 128
#: The most attributes a message may have (the API's limit): trace context is added to a
#: message only while it fits, so that tracing never makes a call refused.
MAX_ATTRIBUTES = 16

_W3C = TraceContextTextMapPropagator() if trace is not None else None

#: The longest ``tracestate`` kept, in characters: W3C has every vendor propagate at least this
#: much of it, and says how to cut a longer one (:func:`checked_tracestate`).
MAX_TRACESTATE = 512
#: The most list members a ``tracestate`` may have (W3C's limit).
MAX_TRACESTATE_MEMBERS = 32
#: W3C cuts a ``tracestate`` that is too long by its members over this many characters first.
_LONG_MEMBER = 128
#: The longest ``tracestate`` read at all (OpenTelemetry's own bound): a longer one is dropped.
_MAX_TRACESTATE_READ = 8192
#: The longest X-Ray trace header taken, in characters. One X-Ray writes is about a hundred
#: (``Root``, ``Parent``, ``Sampled``); the rest leaves room for ``Self`` (a load balancer's),
#: ``Lineage`` and fields of the caller's own.
MAX_XRAY_HEADER = 1024

#: ``traceparent``: version, trace ID, parent ID, flags (lowercase hex); a later version may
#: add fields after a dash (W3C). :func:`valid_traceparent` checks the rest.
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-[\x21-\x7e]*)?")
#: the longest ``traceparent`` taken (OpenTelemetry's bound on the header).
MAX_TRACEPARENT = 512
#: one ``tracestate`` list member, ``key=value`` (W3C's grammar: a simple key, or a tenant's
#: ``tenant@system``; a value of printable ASCII but ``,`` and ``=``, not ending in a space).
_TRACESTATE_MEMBER = re.compile(
    r"(?:[a-z][_0-9a-z*/-]{0,255}|[a-z0-9][_0-9a-z*/-]{0,240}@[a-z][_0-9a-z*/-]{0,13})"
    r"=[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]"
)
#: one field of an X-Ray trace header, ``Key=value``; its value printable ASCII but ``;``, ``=``
#: and spaces (a ``Lineage`` has ``:`` and ``|``).
_XRAY_FIELD = re.compile(r"([A-Za-z][A-Za-z0-9_-]{0,63})=([\x21-\x3a\x3c\x3e-\x7e]+)")
_XRAY_ROOT = re.compile(r"1-[0-9a-fA-F]{8}-[0-9a-fA-F]{24}")
_XRAY_PARENT = re.compile(r"[0-9a-fA-F]{16}")
_XRAY_SAMPLED = frozenset({"0", "1", "?"})


def enabled() -> bool:
    """Whether an OpenTelemetry SDK is configured: the global ``TracerProvider`` is set (not the
    API's proxy or no-op one). Callers ask once and keep the answer."""
    if trace is None:
        return False
    return not isinstance(trace.get_tracer_provider(), (trace.ProxyTracerProvider, trace.NoOpTracerProvider))


def tracer(provider: TracerProvider | None = None) -> Tracer:
    """The tracer of the ``mq`` instrumentation (``provider``: the global one)."""
    return (provider or trace.get_tracer_provider()).get_tracer("mq")


# --------------------------------------------------------------------------- trace context


def inject(carrier: MutableMapping[str, Any], context: Context | None = None) -> None:
    """Write ``traceparent`` (and ``tracestate``) of ``context`` (None: the current one) into
    ``carrier``: HTTP headers or a message's attributes. Nothing when it has no valid span.
    The ``tracestate`` is cut to :data:`MAX_TRACESTATE` as W3C says (a context an application
    made itself may hold more), so a message's is one the API takes."""
    if _W3C is not None:
        _W3C.inject(carrier, context)
        state = carrier.get(TRACESTATE)
        if isinstance(state, str) and len(state) > MAX_TRACESTATE:
            checked = checked_tracestate(state)
            if checked:
                carrier[TRACESTATE] = checked
            else:
                del carrier[TRACESTATE]


def with_context(attributes: Mapping[str, Any] | None, carried: Mapping[str, str]) -> Mapping[str, Any] | None:
    """``attributes`` with the trace context ``carried`` (:func:`inject`'s) added; ``attributes``
    themselves when they have a ``traceparent`` already or no room is left (:data:`MAX_ATTRIBUTES`)."""
    if not carried or (attributes and (TRACEPARENT in attributes or len(attributes) + len(carried) > MAX_ATTRIBUTES)):
        return attributes
    return {**(attributes or {}), **carried}


def extract(carrier: Mapping[str, Any] | None) -> Context | None:
    """The context ``carrier``'s ``traceparent`` names (headers or attributes), else None.

    Both values are checked here, before OpenTelemetry sees them: a ``traceparent`` that is
    not W3C's is no context, and a ``tracestate`` that is not is dropped (W3C: the parent
    stands without it), one too long cut as W3C says (:func:`checked_tracestate`). So what a
    caller wrote never reaches OpenTelemetry's own warnings, which print it as it came."""
    if _W3C is None or not carrier:
        return None
    parent = carrier.get(TRACEPARENT)
    if not isinstance(parent, str) or not valid_traceparent(parent):
        return None
    headers = {TRACEPARENT: parent}
    state = carrier.get(TRACESTATE)
    if isinstance(state, str):
        checked = checked_tracestate(state)
        if checked:
            headers[TRACESTATE] = checked
    ctx = _W3C.extract(headers)
    return ctx if trace.get_current_span(ctx).get_span_context().is_valid else None


def valid_traceparent(value: str) -> bool:
    """Whether ``value`` is a W3C ``traceparent``: version 00 exactly (55 characters), or a
    later one that begins as 00 does (version ``ff`` is none); trace and parent IDs not all
    zeros; at most :data:`MAX_TRACEPARENT` characters."""
    if len(value) > MAX_TRACEPARENT:
        return False
    match = _TRACEPARENT.fullmatch(value)
    if match is None:
        return False
    version, trace_id, parent_id, _, rest = match.groups()
    if version == "ff" or (version == "00" and rest is not None):
        return False
    return trace_id != "0" * 32 and parent_id != "0" * 16


def checked_tracestate(value: str) -> str | None:
    """What is kept of the W3C ``tracestate`` ``value``: its list members (``key=value``, the
    spaces around them and empty ones left out), at most :data:`MAX_TRACESTATE` characters of
    them, cut as W3C says (members over 128 characters go first, then members from the end);
    ``""`` when it has none. None when it is no ``tracestate`` (a member out of the grammar, a
    key twice, over :data:`MAX_TRACESTATE_MEMBERS` members), to be dropped whole."""
    if len(value) > _MAX_TRACESTATE_READ:
        return None
    members = []
    keys = set()
    for part in value.split(","):
        member = part.strip(" \t")
        if not member:
            continue
        if _TRACESTATE_MEMBER.fullmatch(member) is None:
            return None
        key = member.partition("=")[0]
        if key in keys:
            return None
        keys.add(key)
        members.append(member)
    if len(members) > MAX_TRACESTATE_MEMBERS:
        return None
    size = sum(map(len, members)) + max(len(members) - 1, 0)
    for cut_long in (True, False):
        for i in range(len(members) - 1, -1, -1):
            if size <= MAX_TRACESTATE:
                break
            if not cut_long or len(members[i]) > _LONG_MEMBER:
                size -= len(members[i]) + (1 if len(members) > 1 else 0)
                del members[i]
    return ",".join(members)


def valid_xray(header: str) -> bool:
    """Whether ``header`` is an X-Ray trace header (``Root=1-<8 hex>-<24 hex>;Parent=<16 hex>;
    Sampled=<0|1|?>``, in any order, with more ``Key=value`` fields allowed): ``;``-separated
    fields of printable ASCII, each key once, a ``Root`` of version 1; a ``Parent`` and a
    ``Sampled``, when given, of their forms; at most :data:`MAX_XRAY_HEADER` characters."""
    return _xray_fields(header) is not None


def _xray_fields(header: str) -> dict[str, str] | None:
    """The fields of an X-Ray trace header by key; None when it is not one (:func:`valid_xray`)."""
    if not header or len(header) > MAX_XRAY_HEADER:
        return None
    fields: dict[str, str] = {}
    for part in header.split(";"):
        part = part.strip(" \t")
        if not part:
            continue
        match = _XRAY_FIELD.fullmatch(part)
        if match is None or match.group(1) in fields:
            return None
        fields[match.group(1)] = match.group(2)
    root = fields.get("Root")
    if root is None or _XRAY_ROOT.fullmatch(root) is None:
        return None
    if "Parent" in fields and _XRAY_PARENT.fullmatch(fields["Parent"]) is None:
        return None
    if "Sampled" in fields and fields["Sampled"] not in _XRAY_SAMPLED:
        return None
    return fields


def context_of(attributes: Mapping[str, Any] | None) -> Context | None:
    """The trace context a message was created in: its ``traceparent``, else the
    ``AWSTraceHeader`` it came with through the SQS API; None when it has neither."""
    if not attributes:
        return None
    found = extract(attributes)
    if found is not None:
        return found
    meta = attributes.get(SQS_META)
    if isinstance(meta, str) and '"trace"' in meta:
        try:
            header = json.loads(meta).get("trace")
        except (ValueError, AttributeError):
            return None
        parent = traceparent_of_xray(header) if isinstance(header, str) else None
        return extract({TRACEPARENT: parent}) if parent else None
    return None


def traceparent_of_xray(header: str) -> str | None:
    """An X-Ray trace header (``Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;
    Sampled=1``, SQS's ``AWSTraceHeader``) as a W3C ``traceparent``: X-Ray's trace ID is the W3C
    one with a dash; None when it is no X-Ray header (:func:`valid_xray`) or names no parent."""
    fields = _xray_fields(header)
    if fields is None or "Parent" not in fields:
        return None
    _, time, rest = fields["Root"].split("-")
    flags = "01" if fields.get("Sampled") == "1" else "00"
    parent = f"00-{time.lower()}{rest.lower()}-{fields['Parent'].lower()}-{flags}"
    return parent if valid_traceparent(parent) else None  # (an ID of zeros is none)


def xray_of_traceparent(value: str) -> str | None:
    """A W3C ``traceparent`` as an X-Ray trace header (the inverse of :func:`traceparent_of_xray`);
    None when it is no ``traceparent`` (:func:`valid_traceparent`)."""
    if not valid_traceparent(value):
        return None
    _, trace_id, span_id, flags = value.split("-")[:4]
    sampled = int(flags, 16) & 1
    return f"Root=1-{trace_id[:8]}-{trace_id[8:]};Parent={span_id};Sampled={sampled}"


# --------------------------------------------------------------------------- spans


def messaging_attributes(
    operation: str, name: str, destination: str, *, count: int = 1, message_id: str | None = None
) -> dict[str, Any]:
    """The semantic conventions' attributes of a messaging span: ``operation`` is
    ``messaging.operation.type`` (create, send, receive, process, settle), ``name`` the call's
    own name (``messaging.operation.name``: enqueue, dequeue, ack, ...)."""
    attrs: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.operation.type": operation,
        "messaging.operation.name": name,
        "messaging.destination.name": destination,
    }
    if count != 1:
        attrs["messaging.batch.message_count"] = count
    if message_id is not None:
        attrs["messaging.message.id"] = message_id
    return attrs


def links_of(contexts: list[Context | None]) -> list[trace.Link]:
    """Links to the spans of ``contexts`` (at most :data:`MAX_LINKS`, no repeats)."""
    out: list[trace.Link] = []
    seen: set[tuple[int, int]] = set()
    for ctx in contexts:
        if ctx is None:
            continue
        sc = trace.get_current_span(ctx).get_span_context()
        key = (sc.trace_id, sc.span_id)
        if key not in seen:
            seen.add(key)
            out.append(trace.Link(sc))
            if len(out) >= MAX_LINKS:
                break
    return out


def client_span(client_tracer: Tracer, operation: str, name: str, queue: str, count: int = 1) -> Any:
    """The span of one of the SDK's calls (a context manager making it current): ``enqueue``
    (``send``, a PRODUCER span), ``dequeue`` (``receive``) or ``ack`` (``settle``), CLIENT spans,
    named ``"<name> <queue>"`` with :func:`messaging_attributes`."""
    kind = trace.SpanKind.PRODUCER if operation == "send" else trace.SpanKind.CLIENT
    return client_tracer.start_as_current_span(
        f"{name} {queue}", kind=kind, attributes=messaging_attributes(operation, name, queue, count=count)
    )


def carry(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """New message items (the API's JSON) carrying the current context in their attributes
    (:func:`with_context`), inside a producer span."""
    carried: dict[str, str] = {}
    inject(carried)
    return [{**item, "attributes": with_context(item.get("attributes"), carried)} for item in items]


def link_messages(span: Span, contexts: list[Context | None]) -> None:
    """``span`` (a receive's) linked to the creation contexts of the messages it got, and their count."""
    span.set_attribute("messaging.batch.message_count", len(contexts))
    for link in links_of(contexts):
        span.add_link(link.context)


def record_error(span: Span, exc: BaseException) -> None:
    """``error.type`` and an error status on ``span``, the exception as its event."""
    span.set_attribute("error.type", type(exc).__qualname__)
    span.record_exception(exc)
    span.set_status(trace.Status(trace.StatusCode.ERROR, str(exc)[:200]))
