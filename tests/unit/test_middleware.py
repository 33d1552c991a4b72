"""The service's middleware registry: an operation lists only the middleware that hook it, so
one that none hooks pays nothing; the node's tracing attaches itself (and the engine's
announcer) while it makes spans, and only then."""

from __future__ import annotations

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from queues import tracing
from queues.engine.ports import ANNOUNCE
from queues.service.middleware import MIDDLEWARE, Metrics, Middleware, Registry


class Acks(Middleware):
    def after_ack(self, target, items, hops, *, result=None, exception=None):
        pass


class Enqueues(Middleware):
    def before_enqueue(self, queue, drafts, hops):
        return drafts


def test_an_operation_lists_only_the_middleware_that_hook_it():
    acks, enqueues = Acks(), Enqueues()
    # given a registry with a middleware that hooks acks, then one that hooks enqueues
    registry = Registry(acks, enqueues)
    # then each operation lists only its own, and an operation none hooks lists none
    assert (registry.ack, registry.enqueue, registry.dequeue, registry.dead_letters) == ((acks,), (enqueues,), (), ())
    # and one attached twice is attached once; one removed is gone from every list
    registry.add(acks)
    assert registry.all == (acks, enqueues)
    registry.remove(acks)
    assert (registry.all, registry.ack, registry.enqueue) == ((enqueues,), (), (enqueues,))


def test_the_metrics_are_always_attached_and_hook_only_the_dead_letter_move():
    assert any(isinstance(m, Metrics) for m in MIDDLEWARE.all)
    assert [type(m) for m in MIDDLEWARE.dead_letters if isinstance(m, Metrics)] == [Metrics]
    assert not any(isinstance(m, Metrics) for m in MIDDLEWARE.enqueue + MIDDLEWARE.dequeue + MIDDLEWARE.ack)


def test_tracing_attaches_its_spans_and_the_store_announcer_only_while_it_makes_spans():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    # given no SDK configured: nothing attached
    assert tracing.use(None) is False
    assert tracing.SPANS not in MIDDLEWARE.all and ANNOUNCE.to is None
    try:
        # when spans are made: the service's calls and the partitions' store writes are heard
        assert tracing.use(provider) is True
        assert tracing.SPANS in MIDDLEWARE.enqueue and tracing.SPANS in MIDDLEWARE.dequeue
        assert tracing.SPANS in MIDDLEWARE.ack and ANNOUNCE.to is tracing.STORE_SPANS
        # and a store write announced makes its span
        with ANNOUNCE.to.storing("orders", 3, 2):
            pass
        (span,) = exporter.get_finished_spans()
        assert span.name == "store orders"
        assert span.attributes["messaging.destination.partition.id"] == "3"
    finally:
        tracing.use(None)
    # then, off again, nothing is attached
    assert tracing.SPANS not in MIDDLEWARE.all and ANNOUNCE.to is None
