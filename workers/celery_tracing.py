"""W3C trace context through Celery's own tasks: a task continues the trace it was sent in.

Whatever the broker (Redis, the filesystem, this service's SQS API with ``sqs://``), a task
message carries headers of its own: when a task is sent inside a span, Celery's
``before_task_publish`` receiver here writes that span's ``traceparent`` (and ``tracestate``)
into them, and in the worker its ``task_prerun`` receiver starts the task's ``process`` span (a
CONSUMER span) as their child, current while the task runs and ended at ``task_postrun``; a task
that raises marks it failed (``task_failure``). Tasks that come with no trace context start a
trace of their own.

Off, and free, unless an OpenTelemetry SDK is configured: :func:`use` decides, as
:mod:`queues.tracing` does, whether the process makes spans (:data:`ON`), and connects the
receivers only then; with no SDK no receiver is connected, and a connected one returns at its
``if not ON`` when :func:`use` turned tracing off again. This project's processes call
:func:`use` when the workers app is ready (after the nodes' ``TRACES_EXPORT`` has installed its
exporter); a Celery app of its own calls it once its SDK is configured, in the producer and in
each worker process (Celery's ``worker_process_init``).

Imports neither Django nor the project's apps: only Celery and :mod:`mq_client.tracing`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mq_client import tracing as common

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer, TracerProvider

#: Whether this process makes the spans of Celery's tasks (:func:`use`).
ON = False
_tracer: Tracer | None = None
#: the spans of the tasks under way in this process, with their context tokens, by task ID
_running: dict[str, tuple[Any, object]] = {}
_connected = False


def use(provider: TracerProvider | None = None) -> bool:
    """Make the tasks' spans with ``provider``; None: with the global provider if it is a real
    one (an SDK is configured), else make none. Connects the receivers the first time tracing
    is on. Whether spans are made."""
    global ON, _tracer
    if provider is None and not common.enabled():
        ON, _tracer = False, None
    else:
        ON, _tracer = True, common.tracer(provider)
        _connect()
    return ON


def _connect() -> None:
    global _connected
    if _connected:
        return
    from celery import signals

    signals.before_task_publish.connect(_publishing, weak=False, dispatch_uid="mq.tracing.publish")
    signals.task_prerun.connect(_started, weak=False, dispatch_uid="mq.tracing.prerun")
    signals.task_failure.connect(_failed, weak=False, dispatch_uid="mq.tracing.failure")
    signals.task_postrun.connect(_finished, weak=False, dispatch_uid="mq.tracing.postrun")
    _connected = True


def _publishing(sender: Any = None, headers: dict[str, Any] | None = None, **kwargs: Any) -> None:
    """The current span's context into the task message's headers (Celery's message protocol
    2 keeps them beside the task's ``id`` and ``task``); a message that has one keeps it."""
    if not ON or headers is None or common.TRACEPARENT in headers:
        return
    common.inject(headers)


def _started(task_id: str | None = None, task: Any = None, **kwargs: Any) -> None:
    if not ON or task is None or task_id is None:
        return
    from opentelemetry import context, trace
    from opentelemetry.trace import SpanKind

    assert _tracer is not None
    request = task.request
    parent = common.extract(
        {common.TRACEPARENT: request.get(common.TRACEPARENT), common.TRACESTATE: request.get(common.TRACESTATE)}
    )
    delivery = request.get("delivery_info") or {}
    queue = delivery.get("routing_key") or delivery.get("exchange") or ""
    attributes = common.messaging_attributes("process", "process", queue, message_id=task_id)
    attributes["celery.task.name"] = task.name
    if request.get("retries"):
        attributes["celery.task.retries"] = request.get("retries")
    span = _tracer.start_span(
        f"process {queue or task.name}", context=parent, kind=SpanKind.CONSUMER, attributes=attributes
    )
    _running[task_id] = (span, context.attach(trace.set_span_in_context(span)))


def _failed(task_id: str | None = None, exception: BaseException | None = None, **kwargs: Any) -> None:
    if not ON or task_id is None or exception is None:
        return
    found = _running.get(task_id)
    if found is not None:
        common.record_error(found[0], exception)


def _finished(task_id: str | None = None, state: str | None = None, **kwargs: Any) -> None:
    # (whatever ON is now: a span begun while it was on is ended, its context detached)
    if task_id is None:
        return
    found = _running.pop(task_id, None)
    if found is None:
        return
    from opentelemetry import context

    span, token = found
    if state:
        span.set_attribute("celery.task.state", state)
    context.detach(token)  # type: ignore[arg-type]  # the token attach gave
    span.end()
