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
_XRAY = re.compile(r"(?:^|;)\s*Root=1-([0-9a-f]{8})-([0-9a-f]{24})\s*(?:;|$)")
_XRAY_PARENT = re.compile(r"(?:^|;)\s*Parent=([0-9a-f]{16})\s*(?:;|$)")
_XRAY_SAMPLED = re.compile(r"(?:^|;)\s*Sampled=([01?])\s*(?:;|$)")


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
    ``carrier``: HTTP headers or a message's attributes. Nothing when it has no valid span."""
    if _W3C is not None:
        _W3C.inject(carrier, context)


def with_context(attributes: Mapping[str, Any] | None, carried: Mapping[str, str]) -> Mapping[str, Any] | None:
    """``attributes`` with the trace context ``carried`` (:func:`inject`'s) added; ``attributes``
    themselves when they have a ``traceparent`` already or no room is left (:data:`MAX_ATTRIBUTES`)."""
    if not carried or (attributes and (TRACEPARENT in attributes or len(attributes) + len(carried) > MAX_ATTRIBUTES)):
        return attributes
    return {**(attributes or {}), **carried}


def extract(carrier: Mapping[str, Any] | None) -> Context | None:
    """The context ``carrier``'s ``traceparent`` names (headers or attributes), else None."""
    if _W3C is None or not carrier:
        return None
    parent = carrier.get(TRACEPARENT)
    if not isinstance(parent, str):
        return None
    headers = {TRACEPARENT: parent}
    state = carrier.get(TRACESTATE)
    if isinstance(state, str):
        headers[TRACESTATE] = state
    ctx = _W3C.extract(headers)
    return ctx if trace.get_current_span(ctx).get_span_context().is_valid else None


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
    one with a dash; None when it names no root and parent."""
    root = _XRAY.search(header)
    parent = _XRAY_PARENT.search(header)
    if root is None or parent is None:
        return None
    sampled = _XRAY_SAMPLED.search(header)
    flags = "01" if sampled is not None and sampled.group(1) == "1" else "00"
    return f"00-{root.group(1)}{root.group(2)}-{parent.group(1)}-{flags}"


def xray_of_traceparent(value: str) -> str | None:
    """A W3C ``traceparent`` as an X-Ray trace header (the inverse of :func:`traceparent_of_xray`)."""
    parts = value.split("-")
    if len(parts) < 4 or len(parts[1]) != 32 or len(parts[2]) != 16 or len(parts[3]) != 2:
        return None
    trace_id, span_id, flags = parts[1].lower(), parts[2].lower(), parts[3]
    try:
        sampled = int(flags, 16) & 1
    except ValueError:
        return None
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


def record_error(span: Span, exc: BaseException) -> None:
    """``error.type`` and an error status on ``span``, the exception as its event."""
    span.set_attribute("error.type", type(exc).__qualname__)
    span.record_exception(exc)
    span.set_status(trace.Status(trace.StatusCode.ERROR, str(exc)[:200]))
