"""The SQS endpoint on a node of settings of its own, started for the test: the per-user rate
(the REST API's, answered with SQS's throttling error) and a key-value store out of reach (503,
never a 500); and a key revoked on one node of two, refused by the other from its next call.
The other SQS modules share one node per module; these tests start nodes of their own, with
no shared node beside them, so that nothing is forwarded to one."""

from __future__ import annotations

import re
import time
import uuid

import boto3
import pytest
import requests
from botocore.config import Config
from botocore.exceptions import ClientError
from django.contrib.auth.models import User
from rest_framework.authtoken.models import Token

from queues import service
from queues.models import Partition, Queue
from sqs import keys
from sqs.models import AccessKey
from tests.integration.nodes import Client, in_cluster_of
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
def test_the_per_user_rate_applies_to_sqs_calls_as_to_rest(node_factory):
    node = node_factory()
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


def test_a_store_outage_is_service_unavailable_never_500(node_factory):
    # given a node whose key-value store is unreachable (nothing listens on its Redis port)
    node = node_factory(KV_URL=f"redis://127.0.0.1:{free_port()}/5")
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


def _admin(node, username: str, password: str) -> requests.Session:
    """A session logged in to ``node``'s admin."""
    session = requests.Session()
    page = session.get(f"{node.url}/admin/login/", timeout=10)
    r = session.post(
        f"{node.url}/admin/login/?next=/admin/",
        data={"csrfmiddlewaretoken": _csrf(page.text), "username": username, "password": password, "next": "/admin/"},
        timeout=10,
    )
    assert r.status_code == 200 and "/admin/login/" not in r.url, r.text[:300]
    return session


def _csrf(html: str) -> str:
    found = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', html)
    assert found is not None, html[:300]
    return found[1]


#: each node's lease on the credentials stamp in the test below: longer than the revoke's own
#: round trip, so that a node that did not wait for the other's lease would be caught.
_LEASE = 2.0


@pytest.mark.node(env={"SQS_KEY_LEASE": str(_LEASE)})
def test_a_key_revoked_on_one_node_is_refused_by_another_from_the_next_call(node_factory):
    # given two nodes of one cluster, each holding the credentials stamp on a lease of 2 s
    a, b = node_factory(), node_factory()
    with in_cluster_of(a):  # (a stamp that lets them hold it 2 s, whatever wrote the last one)
        service.announce_credentials_change(keys.STAMP, b"v2 %d %s" % (_LEASE * 1000, uuid.uuid4().hex.encode()))
    password = uuid.uuid4().hex
    owner = User.objects.create_user(_name(), password=password, is_staff=True, is_superuser=True)
    key = AccessKey.issue(owner)
    on_a, on_b = _client(a, key), _client(b, key)
    url = on_a.create_queue(QueueName=_name())["QueueUrl"]
    admin = _admin(a, owner.username, password)
    listing = admin.get(f"{a.url}/admin/sqs/accesskey/", timeout=10)
    # ... both of which have just served a call with a key (each holds the key, its user, the
    # queue, and a lease on the stamp it read them under)
    for client in (on_a, on_b):
        client.send_message_batch(QueueUrl=url, Entries=[{"Id": "a", "MessageBody": "before"}])
    served = time.monotonic()
    # when its holder revokes it in node a's admin
    r = admin.post(
        f"{a.url}/admin/sqs/accesskey/",
        data={"csrfmiddlewaretoken": _csrf(listing.text), "action": "revoke", "_selected_action": [key.pk]},
        timeout=10,
    )
    assert r.status_code == 200 and not AccessKey.objects.get(pk=key.pk).active
    # (the revoke returned once b's lease had run out: it waited for it)
    assert time.monotonic() - served >= _LEASE
    # then node b refuses the very next call with it, and so does node a
    for client in (on_b, on_a):
        with pytest.raises(ClientError) as exc:
            client.send_message_batch(QueueUrl=url, Entries=[{"Id": "a", "MessageBody": "after"}])
        assert _code(exc.value) == "InvalidClientTokenId"
