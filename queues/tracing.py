"""The node's OpenTelemetry spans: off, and free, unless an SDK is configured.

:func:`configure` runs once in every process when the app starts (``QueuesConfig.ready``): it
installs the exporter ``settings.TRACES_EXPORT`` names, if any, then decides whether the process's
global ``TracerProvider`` is a real one and keeps the answer in :data:`ON`. Every hook in the
code paths is ``if tracing.ON:`` (a module attribute read), so with no SDK a call pays nothing
more; with one, the helpers here make the spans.

Spans (their names are ``"<call> <queue>"``, as OpenTelemetry's messaging conventions name them;
``messaging.system`` is ``mq``):

- ``enqueue``, ``dequeue``, ``ack``: SERVER spans of the service's calls (``queues.service``),
  children of the caller's ``traceparent`` header (the fast path, the DRF views and the SQS API
  attach it), or of the message's own context when a one-message enqueue brings no header. An
  enqueue gives each message that has no ``traceparent`` attribute its span's context (a
  producer that sent only the header has its consumers continue its trace); a dequeue links to
  the context of each message it delivers.
- ``forward <call> <target>``: a CLIENT span around a call forwarded to another node
  (``queues.api.peers``), whose ``traceparent`` header it carries: the owner's spans join the trace.
- ``store <queue>``: an INTERNAL span around a partition's store write (``PartitionManager.enqueue``).

The trace context in messages and the conventions' attributes are :mod:`mq_client.tracing`'s,
shared with the SDK and the workers.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar, cast

from mq_client import tracing as common

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span, Tracer, TracerProvider

log = logging.getLogger(__name__)

#: Whether this process makes spans: a real TracerProvider is configured (:func:`configure`).
ON = False
_tracer: Tracer | None = None
#: this node's address (``server.address`` of its spans).
_node = ""

_T = TypeVar("_T")

#: ``messaging.operation.type`` of the calls a node makes or serves.
OPERATION_TYPES = {
    "enqueue": "send",
    "publish": "send",
    "dequeue": "receive",
    "ack": "settle",
    "visibility": "settle",
}


# --------------------------------------------------------------------------- on and off


def configure(export: str = "", path: str = "", node: str = "") -> bool:
    """Install the exporter ``export`` names (``""``: none, the process's own configuration
    decides; ``"jsonl"``: spans as JSON lines appended to ``path``; ``"console"``: printed;
    ``"otlp"``: OTLP to ``OTEL_EXPORTER_OTLP_ENDPOINT``, with ``opentelemetry-exporter-otlp``
    installed), then decide once whether spans are made. Whether they are (:data:`ON`)."""
    global _node
    _node = node
    if export:
        _install(export, path)
    return use(None)


def use(provider: TracerProvider | None) -> bool:
    """Make spans with ``provider``; None: with the global provider if it is a real one (an SDK
    is configured), else make none. Whether spans are made."""
    global ON, _tracer
    if provider is None and not common.enabled():
        ON, _tracer = False, None
    else:
        ON, _tracer = True, common.tracer(provider)
    return ON


def _install(export: str, path: str) -> None:
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        ConsoleSpanExporter,
        SimpleSpanProcessor,
        SpanExporter,
    )

    provider = TracerProvider(resource=Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", "mq")}))
    if export == "jsonl":
        provider.add_span_processor(SimpleSpanProcessor(cast("SpanExporter", JsonLinesExporter(path))))
    elif export == "console":
        provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter()))
    elif export == "otlp":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # type: ignore[import-not-found, unused-ignore]
            OTLPSpanExporter,
        )

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    else:
        raise ValueError(f"TRACES_EXPORT: {export!r} is none of jsonl, console, otlp")
    trace.set_tracer_provider(provider)


class JsonLinesExporter:
    """A span exporter that appends each span as one JSON line to a file: what a node's
    ``TRACES_EXPORT=jsonl`` writes, for a test (or a person) to read its spans back. Processes
    of one node append to the same file (each line one ``write`` in append mode)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()

    def export(self, spans: Sequence[Any]) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        lines = "".join(json.dumps(span_json(s)) + "\n" for s in spans)
        with self._lock, open(self.path, "a", encoding="utf-8") as f:
            f.write(lines)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def span_json(span: Any) -> dict[str, Any]:
    """A finished SDK span as JSON: its IDs in hex, as W3C writes them."""
    ctx = span.get_span_context()
    parent = span.parent
    return {
        "name": span.name,
        "kind": span.kind.name,
        "trace_id": f"{ctx.trace_id:032x}",
        "span_id": f"{ctx.span_id:016x}",
        "parent_id": f"{parent.span_id:016x}" if parent is not None else None,
        "links": [f"{link.context.trace_id:032x}-{link.context.span_id:016x}" for link in span.links],
        "attributes": dict(span.attributes or {}),
        "status": span.status.status_code.name,
        "pid": os.getpid(),
    }


# --------------------------------------------------------------------------- the incoming context


def attach(traceparent: str | None, tracestate: str | None = None) -> object | None:
    """Make the caller's context (its ``traceparent`` header) the current one; a token for
    :func:`detach`, None when it brought none."""
    if not traceparent:
        return None
    ctx = common.extract({common.TRACEPARENT: traceparent, common.TRACESTATE: tracestate})
    if ctx is None:
        return None
    from opentelemetry import context

    return context.attach(ctx)


def attach_meta(meta: Mapping[str, Any]) -> object | None:
    """:func:`attach` for a WSGI environ or Django's ``request.META``."""
    return attach(meta.get("HTTP_TRACEPARENT"), meta.get("HTTP_TRACESTATE"))


def detach(token: object | None) -> None:
    if token is not None:
        from opentelemetry import context

        context.detach(token)  # type: ignore[arg-type]  # the token attach gave


# --------------------------------------------------------------------------- spans


def _attributes(call: str, destination: str, count: int = 1, message_id: str | None = None) -> dict[str, Any]:
    attrs = common.messaging_attributes(OPERATION_TYPES.get(call, call), call, destination, count=count)
    if message_id is not None:
        attrs["messaging.message.id"] = message_id
    if _node:
        host, _, port = _node.rpartition(":")
        attrs["server.address"] = host or _node
        if port.isdigit():
            attrs["server.port"] = int(port)
    return attrs


@contextmanager
def _span(name: str, kind_name: str, attributes: dict[str, Any], context: Context | None = None) -> Iterator[Span]:
    from opentelemetry.trace import SpanKind

    assert _tracer is not None
    with _tracer.start_as_current_span(
        name, context=context, kind=SpanKind[kind_name], attributes=attributes, record_exception=False
    ) as span:
        try:
            yield span
        except BaseException as exc:
            common.record_error(span, exc)
            raise


def enqueue_span(
    call: Callable[..., list[str]], queue: str, drafts: Sequence[_T], hops: int, **kwargs: Any
) -> list[str]:
    """``call(queue, drafts, hops=hops, **kwargs)`` (the service's enqueue) inside its span;
    at the first node (``hops`` 0), each draft without a ``traceparent`` attribute is given the
    span's context (``drafts`` are dataclasses with ``attributes``)."""
    from opentelemetry import trace

    parent: Context | None = None
    if len(drafts) == 1 and not trace.get_current_span().get_span_context().is_valid:
        parent = common.context_of(getattr(drafts[0], "attributes", None))
    with _span(f"enqueue {queue}", "SERVER", _attributes("enqueue", queue, len(drafts)), parent) as span:
        span.set_attribute("mq.hops", hops)
        if hops == 0:
            drafts = _carrying_context(drafts)
        ids = call(queue, drafts, hops=hops, **kwargs)
        if len(ids) == 1:
            span.set_attribute("messaging.message.id", ids[0])
        return ids


def _carrying_context(drafts: Sequence[_T]) -> list[_T]:
    carried: dict[str, str] = {}
    common.inject(carried)
    if not carried:
        return list(drafts)
    out = []
    for d in drafts:
        attrs = getattr(d, "attributes", None)
        # A message that has its own context keeps it (with_context), and so does one that came
        # through the SQS API: its AWSTraceHeader (an attribute more would show in its SQS
        # message attributes).
        added = attrs if attrs and common.SQS_META in attrs else common.with_context(attrs, carried)
        out.append(d if added is attrs else dataclasses.replace(d, attributes=added))  # type: ignore[type-var]
    return out


def dequeue_span(call: Callable[..., list[_T]], target: str, **kwargs: Any) -> list[_T]:
    """``call(target, **kwargs)`` (the service's dequeue) inside its span, linked to the
    contexts of the messages it delivers."""
    with _span(f"dequeue {target}", "SERVER", _attributes("dequeue", target)) as span:
        found = call(target, **kwargs)
        span.set_attribute("messaging.batch.message_count", len(found))
        contexts = []
        for d in found[: common.MAX_LINKS]:
            message = getattr(d, "message", None)
            contexts.append(common.context_of(getattr(message, "attributes", None)))
        for link in common.links_of(contexts):
            span.add_link(link.context)
        if len(found) == 1:
            span.set_attribute("messaging.message.id", str(getattr(found[0], "id", "")))
        return found


def ack_span(call: Callable[..., _T], target: str, items: Sequence[Any], **kwargs: Any) -> _T:
    """``call(target, items, **kwargs)`` (the service's ack) inside its span."""
    message_id = str(items[0][0]) if len(items) == 1 else None
    with _span(f"ack {target}", "SERVER", _attributes("ack", target, len(items), message_id)):
        return call(target, items, **kwargs)


@contextmanager
def forward_span(address: str, call: str, target: str) -> Iterator[None]:
    """A call forwarded to the node at ``address``: the request made inside it carries its
    context (``inject`` into its headers)."""
    attrs = _attributes(call, target)
    host, _, port = address.rpartition(":")
    attrs["server.address"] = host or address
    if port.isdigit():
        attrs["server.port"] = int(port)
    with _span(f"forward {call} {target}", "CLIENT", attrs):
        yield


def inject(headers: dict[str, str]) -> None:
    """The current context into a forwarded call's headers."""
    common.inject(headers)


def store_span(
    call: Callable[[Sequence[Any]], list[str]], queue: str, index: int, messages: Sequence[Any]
) -> list[str]:
    """A partition's store write (``call(messages)``) inside its span."""
    attrs = {
        "messaging.system": common.SYSTEM,
        "messaging.destination.name": queue,
        "messaging.destination.partition.id": str(index),
        "messaging.batch.message_count": len(messages),
    }
    with _span(f"store {queue}", "INTERNAL", attrs):
        return call(messages)
