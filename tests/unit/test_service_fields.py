"""The typed fields the service's create and update calls take are the models' settings, no
more and no fewer: a setting added to a model and not to its fields (or the reverse) fails here."""

from __future__ import annotations

from queues import service
from queues.models import QUEUE_SETTINGS, Queue, Subscription
from queues.service.descriptions import SUBSCRIPTION_SETTINGS
from sqs.models import QueueSettings


def _keys(typed: type) -> set[str]:
    return set(typed.__required_keys__ | typed.__optional_keys__)  # type: ignore[attr-defined]


def test_a_queues_fields_are_its_settings():
    assert _keys(service.QueueFields) == set(QUEUE_SETTINGS)
    assert service.QueueFields.__required_keys__ == frozenset()  # an update names what it changes


# (``name`` is Required in both New* fields: mypy holds the callers to it; under postponed
# annotations the class at run time cannot tell.)
def test_a_new_queue_names_itself_and_may_say_its_kind_and_creator():
    assert _keys(service.NewQueueFields) - set(QUEUE_SETTINGS) == {"name", "kind", "created_by_id"}


def test_a_subscriptions_fields_are_its_settings():
    assert _keys(service.SubscriptionFields) == set(SUBSCRIPTION_SETTINGS)
    assert _keys(service.NewSubscriptionFields) - set(SUBSCRIPTION_SETTINGS) == {"name", "start"}


def test_every_field_is_a_model_field():
    queue = {f.attname for f in Queue._meta.concrete_fields} | {f.name for f in Queue._meta.concrete_fields}
    assert _keys(service.NewQueueFields) <= queue
    sub = {f.name for f in Subscription._meta.concrete_fields}
    assert _keys(service.NewSubscriptionFields) <= sub


def test_a_queues_sqs_fields_are_its_sqs_settings():
    from sqs.service import SETTINGS, SQSSettingsFields

    assert _keys(SQSSettingsFields) == set(SETTINGS)
    assert {f.name for f in QueueSettings._meta.concrete_fields} >= set(SETTINGS)
