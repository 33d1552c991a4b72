"""The node's OpenTelemetry spans: off, and free, unless an SDK is configured.

:func:`configure` runs once in every process when the app starts (``QueuesConfig.ready``): it
installs the exporter ``settings.TRACES_EXPORT`` names, if any, then decides whether the process's
global ``TracerProvider`` is a real one and keeps the answer in :data:`ON`. While it is, the
service's calls have their spans from a middleware (:class:`Spans`, in
``queues.service.middleware.MIDDLEWARE``) and the partitions announce their store writes to
:class:`StoreSpans` (``queues.engine.ports.ANNOUNCE``); neither the service nor the engine
imports this module. With no SDK, neither is attached and a call pays nothing more; the HTTP
entrances read :data:`ON` (a module attribute) before they look at a caller's header.

Spans (their names are ``"<call> <queue>"``, as OpenTelemetry's messaging conventions name them;
``messaging.system`` is ``mq``):

- ``enqueue``, ``dequeue``, ``ack``: SERVER spans of the service's calls (``queues.service``, by :class:`Spans`),
  children of the caller's ``traceparent`` header (the fast path, the DRF views and the SQS API
  attach it), or of the message's own context when a one-message enqueue brings no header. An
  enqueue gives each message that has no ``traceparent`` attribute its span's context (a
  producer that sent only the header has its consumers continue its trace); a dequeue links to
  the context of each message it delivers.
- ``forward <call> <target>``: a CLIENT span around a call forwarded to another node
  (``queues.api.peers``), whose ``traceparent`` header it carries: the owner's spans join the trace.
- ``store <queue>``: an INTERNAL span around a partition's store write (``PartitionManager.enqueue``,
  announced to :class:`StoreSpans`).

The trace context in messages and the conventions' attributes are :mod:`mq_client.tracing`'s,
shared with the SDK and the workers.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any, cast

from mq_client import tracing as common
from queues.engine.ids import MessageId
from queues.engine.partition import Delivery
from queues.engine.ports import ANNOUNCE
from queues.service.middleware import MIDDLEWARE, Middleware
from queues.service.types import AckResult, MessageDraft

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span, Tracer, TracerProvider

log = logging.getLogger(__name__)

#: Whether this process makes spans: a real TracerProvider is configured (:func:`configure`).
ON = False
_tracer: Tracer | None = None
#: this node's address (``server.address`` of its spans).
_node = ""

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
        MIDDLEWARE.remove(SPANS)
        ANNOUNCE.to = None
    else:
        ON, _tracer = True, common.tracer(provider)
        MIDDLEWARE.add(SPANS)
        ANNOUNCE.to = STORE_SPANS
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


class Spans(Middleware):
    """The service's calls as SERVER spans: a middleware (``queues.service.middleware``) that
    :func:`use` attaches while spans are made. Each span is opened by a ``before_*`` hook and
    closed by its ``after_*``, on the thread that runs the call (so the spans made inside it,
    a store write's, a forwarded call's, are its children)."""

    def __init__(self) -> None:
        self._open = threading.local()

    def _push(self, cm: AbstractContextManager[Span]) -> Span:
        span = cm.__enter__()
        stack = getattr(self._open, "spans", None)
        if stack is None:
            stack = self._open.spans = []
        stack.append((cm, span))
        return span

    def _top(self) -> Span:
        """The span of the call whose ``after_*`` hook runs (the innermost open here)."""
        span: Span = self._open.spans[-1][1]
        return span

    def _pop(self, exception: BaseException | None) -> None:
        cm, _ = self._open.spans.pop()
        if exception is None:
            cm.__exit__(None, None, None)
        else:
            cm.__exit__(type(exception), exception, exception.__traceback__)

    def before_enqueue(self, queue: str, drafts: Sequence[MessageDraft], hops: int) -> Sequence[MessageDraft]:
        """The enqueue's span: a child of the caller's context, or of the message's own when a
        one-message enqueue brings none. At the first node (``hops`` 0), each draft without a
        ``traceparent`` attribute is given the span's context."""
        from opentelemetry import trace

        parent: Context | None = None
        if len(drafts) == 1 and not trace.get_current_span().get_span_context().is_valid:
            parent = common.context_of(drafts[0].attributes)
        span = self._push(_span(f"enqueue {queue}", "SERVER", _attributes("enqueue", queue, len(drafts)), parent))
        span.set_attribute("mq.hops", hops)
        return _carrying_context(drafts) if hops == 0 else drafts

    def after_enqueue(
        self,
        queue: str,
        drafts: Sequence[MessageDraft],
        hops: int,
        *,
        result: list[str] | None = None,
        exception: BaseException | None = None,
    ) -> None:
        if result is not None and len(result) == 1:
            self._top().set_attribute("messaging.message.id", result[0])
        self._pop(exception)

    def before_dequeue(self, target: str, hops: int) -> None:
        self._push(_span(f"dequeue {target}", "SERVER", _attributes("dequeue", target)))

    def after_dequeue(
        self,
        target: str,
        hops: int,
        *,
        result: list[Delivery] | None = None,
        exception: BaseException | None = None,
    ) -> None:
        """The dequeue's span links to the contexts of the messages it delivers."""
        if result is not None:
            span = self._top()
            span.set_attribute("messaging.batch.message_count", len(result))
            contexts = [
                common.context_of(d.message.attributes if d.message is not None else None)
                for d in result[: common.MAX_LINKS]
            ]
            for link in common.links_of(contexts):
                span.add_link(link.context)
            if len(result) == 1:
                span.set_attribute("messaging.message.id", str(result[0].id))
        self._pop(exception)

    def before_ack(self, target: str, items: Sequence[tuple[MessageId, str | None]], hops: int) -> None:
        message_id = str(items[0][0]) if len(items) == 1 else None
        self._push(_span(f"ack {target}", "SERVER", _attributes("ack", target, len(items), message_id)))

    def after_ack(
        self,
        target: str,
        items: Sequence[tuple[MessageId, str | None]],
        hops: int,
        *,
        result: AckResult | None = None,
        exception: BaseException | None = None,
    ) -> None:
        self._pop(exception)


def _carrying_context(drafts: Sequence[MessageDraft]) -> list[MessageDraft]:
    carried: dict[str, str] = {}
    common.inject(carried)
    if not carried:
        return list(drafts)
    out = []
    for d in drafts:
        attrs = d.attributes
        # A message that has its own context keeps it (with_context), and so does one that came
        # through the SQS API: its AWSTraceHeader (an attribute more would show in its SQS
        # message attributes).
        added = attrs if attrs and common.SQS_META in attrs else common.with_context(attrs, carried)
        out.append(d if added is attrs else dataclasses.replace(d, attributes=cast("dict[str, Any] | None", added)))
    return out


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


class StoreSpans:
    """A partition's store write as an INTERNAL span (the engine's :class:`Announcer
    <queues.engine.ports.Announcer>`, set while spans are made)."""

    def storing(self, queue: str, index: int, count: int) -> AbstractContextManager[object]:
        attrs = {
            "messaging.system": common.SYSTEM,
            "messaging.destination.name": queue,
            "messaging.destination.partition.id": str(index),
            "messaging.batch.message_count": count,
        }
        return _span(f"store {queue}", "INTERNAL", attrs)


#: The middleware and the announcer :func:`use` attaches while spans are made.
SPANS = Spans()
STORE_SPANS = StoreSpans()
