"""What a user learns of a queue it has no grant on, and who reads ``/metrics``, against a real
node on PostgreSQL + Redis:

- a queue the caller may not read answers as one that does not exist (REST 404, SQS
  ``QueueDoesNotExist``), but its name is taken in the one namespace every user shares, so a
  create of it is refused (REST 409, SQS ``QueueNameExists``), as the access-control page says;
- ``/metrics`` names every queue: from an allowed address it needs no token, unless a proxy
  forwarded the request (``Forwarded``, ``X-Forwarded-For``, ``X-Real-IP``), which needs it.
"""

from __future__ import annotations

import uuid

import pytest
import requests
from botocore.exceptions import ClientError
from django.contrib.auth.models import User
from rest_framework.authtoken.models import Token

from sqs.models import AccessKey
from tests.integration.test_sqs_boto3 import _client

METRICS_TOKEN = "s3cret-metrics-token"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.cluster,
    pytest.mark.django_db,
    pytest.mark.node(shared=True, env={"METRICS_TOKEN": METRICS_TOKEN}),  # METRICS_ALLOW: loopback, the default
]


def _user(committed, prefix: str) -> tuple[dict[str, str], AccessKey]:
    """A new user with no grant: its REST headers and an SQS access key."""

    def make():
        user = User.objects.create(username=f"{prefix}-{uuid.uuid4().hex[:8]}")
        return Token.objects.create(user=user), AccessKey.issue(user)

    token, key = committed(make)
    return {"Authorization": f"Token {token.key}"}, key


@pytest.fixture(scope="module")
def queue_owner(committed):
    return _user(committed, "owner")


@pytest.fixture(scope="module")
def stranger(committed):
    return _user(committed, "stranger")


def _sqs_code(call) -> str:
    with pytest.raises(ClientError) as exc:
        call()
    return exc.value.response["Error"]["Code"]


def test_a_queue_without_a_grant_does_not_exist_but_its_name_is_taken(node, queue_owner, stranger):
    # given a queue of the owner's, and a name nobody holds
    name, free = f"names-{uuid.uuid4().hex[:8]}", f"names-{uuid.uuid4().hex[:8]}"
    r = requests.post(f"{node.url}/api/v1/queues", json={"name": name}, headers=queue_owner[0], timeout=30)
    assert r.status_code == 201, r.text
    theirs, key = stranger
    # when a user with no grant on it reads it, then tries to create it
    read = requests.get(f"{node.url}/api/v1/queues/{name}", headers=theirs, timeout=30)
    absent = requests.get(f"{node.url}/api/v1/queues/{free}", headers=theirs, timeout=30)
    create = requests.post(f"{node.url}/api/v1/queues", json={"name": name}, headers=theirs, timeout=30)
    # then the read answers as for a queue that does not exist: nothing of it is told
    assert (read.status_code, absent.status_code) == (404, 404)
    assert read.json() == {**absent.json(), "detail": absent.json()["detail"].replace(free, name)}
    assert read.json()["error"] == "queue_not_found"
    # but the name is taken: the create is refused, and so it is known to exist
    assert create.status_code == 409, create.text
    assert create.json()["error"] == "already_exists"
    listed = requests.get(f"{node.url}/api/v1/queues", headers=theirs, timeout=30).json()
    assert name not in str(listed)
    # and over SQS the same: GetQueueUrl does not find it, CreateQueue finds the name taken
    sqs = _client(node, key)
    assert _sqs_code(lambda: sqs.get_queue_url(QueueName=name)) == "AWS.SimpleQueueService.NonExistentQueue"
    assert _sqs_code(lambda: sqs.create_queue(QueueName=name)) == "QueueAlreadyExists"
    assert sqs.list_queues().get("QueueUrls", []) == []
    # the owner's queue is as it was
    mine = requests.get(f"{node.url}/api/v1/queues/{name}", headers=queue_owner[0], timeout=30)
    assert mine.status_code == 200 and mine.json()["name"] == name


@pytest.mark.parametrize(
    "proxied", [{"X-Forwarded-For": "203.0.113.9"}, {"Forwarded": "for=203.0.113.9"}, {"X-Real-IP": "203.0.113.9"}]
)
def test_metrics_a_proxy_forwarded_need_the_token_from_an_allowed_address(node, queue_owner, proxied):
    # given a queue, whose name /metrics shows
    name = f"metrics-{uuid.uuid4().hex[:8]}"
    r = requests.post(f"{node.url}/api/v1/queues", json={"name": name}, headers=queue_owner[0], timeout=30)
    assert r.status_code == 201, r.text
    url = f"{node.url}/metrics"
    # when the node's own host scrapes without a token, it is let in
    plain = requests.get(url, timeout=30)
    assert plain.status_code == 200 and name in plain.text
    # but a request a proxy forwarded from there (a proxy on the node's host) needs the token
    refused = requests.get(url, headers=proxied, timeout=30)
    assert refused.status_code == 403 and name not in refused.text
    assert refused.json()["error"] == "permission_denied"
    token = requests.get(url, headers={**proxied, "Authorization": f"Bearer {METRICS_TOKEN}"}, timeout=30)
    assert token.status_code == 200 and name in token.text
