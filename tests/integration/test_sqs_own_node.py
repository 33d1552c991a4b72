"""The SQS endpoint on a node of settings of its own, started for the test: the per-user rate
(the REST API's, answered with SQS's throttling error) and a key-value store out of reach (503,
never a 500). The other SQS modules share one node per module; these nodes are each test's
only one, so that nothing is forwarded to another."""

from __future__ import annotations

import time
import uuid

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from django.contrib.auth.models import User
from rest_framework.authtoken.models import Token

from queues.models import Partition, Queue
from sqs.models import AccessKey
from tests.integration.nodes import Client
from tests.launcher import free_port

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def _user() -> User:
    return User.objects.create(username=f"own-{uuid.uuid4().hex[:8]}")


def _client(node, key: AccessKey):
    return boto3.client(
        "sqs",
        endpoint_url=f"{node.url}/sqs",
        region_name="eu-west-1",
        aws_access_key_id=key.access_key_id,
        aws_secret_access_key=key.secret,
        config=Config(retries={"max_attempts": 1}),
    )


def _name() -> str:
    return f"own-{uuid.uuid4().hex[:8]}"


def _code(exc: ClientError) -> str:
    return exc.response["Error"]["Code"]


@pytest.mark.node(env={"API_THROTTLE_USER": "6/m"})
def test_the_per_user_rate_applies_to_sqs_calls_as_to_rest(nodes):
    node = nodes.start()
    user, other = _user(), _user()
    sqs = _client(node, AccessKey.issue(user))
    # when one user calls more than its rate (6 a minute: 14 calls span at most two windows)
    answers = []
    for _ in range(14):
        try:
            sqs.list_queues()
            answers.append("ok")
        except ClientError as exc:
            answers.append(_code(exc))
            refused, window = exc.response, int(time.time() // 60)
    # then the calls past it are refused with SQS's throttling error, 400 with Retry-After
    assert answers[0] == "ok" and set(answers) == {"ok", "RequestThrottled"}, answers
    assert refused["ResponseMetadata"]["HTTPStatusCode"] == 400
    assert int(refused["ResponseMetadata"]["HTTPHeaders"]["retry-after"]) >= 1
    # counted with the REST API's calls: the same user's token is refused in the same window
    status = Client(node.url, Token.objects.create(user=user).key).get("queues").status_code
    if int(time.time() // 60) == window:
        assert status == 429
    # and another user is not
    assert "ResponseMetadata" in _client(node, AccessKey.issue(other)).list_queues()


def test_a_store_outage_is_service_unavailable_never_500(nodes):
    # given a node whose key-value store is unreachable (nothing listens on its Redis port)
    node = nodes.start(KV_URL=f"redis://127.0.0.1:{free_port()}/5")
    key = AccessKey.issue(_user())
    raw = _client(node, key)
    # a queue its rows describe (the node cannot create one: a new partition reads the store)
    name = _name()
    q = Queue.objects.create(name=name, partitions=1, created_by=key.user)
    Partition.objects.create(queue=q, index=0)
    url = f"{node.url}/sqs/000000000000/{name}"
    # when a queue is created or a message sent, then the answer is 503 with Retry-After
    for call in (
        lambda: raw.create_queue(QueueName=_name()),
        lambda: raw.send_message(QueueUrl=url, MessageBody="x"),
        lambda: raw.send_message_batch(QueueUrl=url, Entries=[{"Id": "a", "MessageBody": "x"}]),
    ):
        with pytest.raises(ClientError) as exc:
            call()
        meta = exc.value.response["ResponseMetadata"]
        assert meta["HTTPStatusCode"] == 503, exc.value.response
        assert _code(exc.value) == "ServiceUnavailable"
        assert meta["HTTPHeaders"]["retry-after"]
    # a receive finds no partition served: an empty answer, as the REST API's dequeue
    assert "Messages" not in raw.receive_message(QueueUrl=url)
