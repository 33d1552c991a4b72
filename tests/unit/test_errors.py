"""One error tree: every exception the service defines derives from ``queues.errors.ServiceError``
and carries its answer (``code``, ``status``, ``detail``); the REST API and the SQS API answer by
that base, as they answered the lists of types before it."""

from __future__ import annotations

import importlib
import inspect
import io
import pkgutil
import sys

import orjson
import pytest

from archive.replay import PartialReplay
from queues import service
from queues.access import Caller, Forbidden
from queues.cluster.leases import LeaseLost
from queues.cluster.peerauth import PeerAuthBusy, PeerAuthFailed
from queues.engine.tree import CorruptTree
from queues.errors import PayloadTooLarge, Refused, ServiceError, Unavailable
from queues.http import bodies
from queues.http.bodies import ReadersBusy
from queues.http.errors import domain_error
from queues.kv import KVError
from sqs.context import sqs_error
from sqs.errors import SQSError
from sqs.sigv4 import SignatureError
from workers.services import InvalidAttempt, LimitOutOfRange, TooManyConsumers, TooManyHeld

#: The packages of the service (``config`` composes them and defines no errors; importing its
#: modules starts a node's process machinery).
#: (The client SDK, ``mq_client``, is not among them: its errors are a client's own, and it
#: imports nothing of ``queues``.)
PACKAGES = ("queues", "sqs", "workers", "archive", "consoles")


def _exception_classes() -> list[type[BaseException]]:
    for package in PACKAGES:
        for info in pkgutil.walk_packages(importlib.import_module(package).__path__, f"{package}."):
            importlib.import_module(info.name)
    found = []
    for name, module in sorted(sys.modules.items()):
        if name.split(".")[0] not in PACKAGES:
            continue
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, BaseException) and cls.__module__ == name:
                found.append(cls)
    return found


def test_every_exception_the_service_defines_derives_from_the_base_with_a_code_and_a_status():
    classes = _exception_classes()
    names = {c.__name__ for c in classes}
    # the discovery sees the modules where errors are defined, not only queues.errors
    assert {"Forbidden", "KVError", "LeaseLost", "RemoteError", "SQSError", "PartialReplay"} <= names
    outside = [f"{c.__module__}.{c.__qualname__}" for c in classes if not issubclass(c, ServiceError)]
    assert outside == []
    for cls in classes:
        if issubclass(cls, ServiceError):
            assert isinstance(cls.code, str) and cls.code, cls
            assert isinstance(cls.status, int) and 400 <= cls.status <= 599, cls


def test_outages_are_one_branch_and_refusals_another():
    for cls in (service.PartitionUnavailable, service.NotServedHere, service.PeerUnreachable, KVError, LeaseLost):
        assert issubclass(cls, Unavailable) and cls.status == 503
    for cls in (Forbidden, service.QueueNotFound, service.SubscriptionNotFound, service.InvalidRequest):
        assert issubclass(cls, Refused) and 400 <= cls.status < 500


ALICE = Caller(1, "alice")


#: (error, its REST answer: status, body, headers), each as the API answered before one base.
ANSWERS = [
    (service.QueueNotFound("q"), 404, {"error": "queue_not_found", "detail": "no queue named 'q'"}, {}),
    (
        service.SubscriptionNotFound("t/s"),
        404,
        {"error": "subscription_not_found", "detail": "no subscription 't/s'"},
        {},
    ),
    (
        Forbidden(ALICE, "consume", "q"),
        403,
        {
            "error": "permission_denied",
            "detail": "alice may not consume 'q': it needs the 'consume' permission on it",
            "missing": "consume",
        },
        {},
    ),
    (service.InvalidRequest("bad", "batch_too_large"), 400, {"error": "batch_too_large", "detail": "bad"}, {}),
    (service.InvalidRequest("a topic", "is_a_topic"), 404, {"error": "is_a_topic", "detail": "a topic"}, {}),
    (service.InvalidRequest("past", "no_such_partition"), 404, {"error": "no_such_partition", "detail": "past"}, {}),
    (service.InvalidRequest("plain"), 400, {"error": "invalid", "detail": "plain"}, {}),
    (
        PayloadTooLarge("request body is over this call's limit of 10 bytes"),
        413,
        {"error": "payload_too_large", "detail": "request body is over this call's limit of 10 bytes"},
        {},
    ),
    (service.Conflict("taken", "already_exists"), 409, {"error": "already_exists", "detail": "taken"}, {}),
    (
        service.ReceiptMismatch("q/0/b/1", "not in flight"),
        409,
        {"error": "receipt_mismatch", "detail": "q/0/b/1: not in flight", "id": "q/0/b/1"},
        {},
    ),
    (
        service.TooManyWaits("too many", retry_after=3),
        429,
        {"error": "too_many_waits", "detail": "too many"},
        {"Retry-After": "3"},
    ),
    (
        service.PartitionUnavailable("lease lost"),
        503,
        {"error": "unavailable", "detail": "lease lost"},
        {"Retry-After": "1"},
    ),
    (service.NotServedHere("not here"), 503, {"error": "unavailable", "detail": "not here"}, {"Retry-After": "1"}),
    (service.PeerUnreachable("refused"), 503, {"error": "unavailable", "detail": "refused"}, {"Retry-After": "1"}),
    (KVError("store down"), 503, {"error": "unavailable", "detail": "store down"}, {"Retry-After": "1"}),
    (PeerAuthBusy("guard full"), 503, {"error": "unavailable", "detail": "guard full"}, {"Retry-After": "1"}),
    (
        service.RemoteError(503, {"error": "unavailable", "detail": "x"}),
        503,
        {"error": "unavailable", "detail": "x"},
        {"Retry-After": "1"},
    ),
    (
        service.RemoteError(404, {"error": "queue_not_found", "detail": "y"}),
        404,
        {"error": "queue_not_found", "detail": "y"},
        {},
    ),
    # errors that had no answer of their own: now that of their branch
    (LeaseLost("epoch 3 lost"), 503, {"error": "unavailable", "detail": "epoch 3 lost"}, {"Retry-After": "1"}),
    (PeerAuthFailed("bad signature"), 401, {"error": "authentication_failed", "detail": "bad signature"}, {}),
    (ReadersBusy("9 read"), 503, {"error": "unavailable", "detail": "9 read; retry"}, {"Retry-After": "1"}),
    (TooManyHeld("too many held"), 400, {"error": "too_many_held", "detail": "too many held"}, {}),
    (LimitOutOfRange("limit"), 400, {"error": "out_of_range", "detail": "limit"}, {}),
    (InvalidAttempt("not an ID"), 400, {"error": "invalid", "detail": "not an ID"}, {}),
    (TooManyConsumers("busy"), 429, {"error": "throttled", "detail": "busy"}, {"Retry-After": "60"}),
    (
        PartialReplay(KVError("down"), 2, ["a", "b"], queue="q", into="r"),
        503,
        {
            "error": "unavailable",
            "detail": "stopped part-way, retry the rest: down",
            "queue": "q",
            "into": "r",
            "replayed": 2,
            "ids": ["a", "b"],
        },
        {"Retry-After": "1"},
    ),
]


@pytest.mark.parametrize(("exc", "status", "body", "headers"), ANSWERS, ids=lambda v: type(v).__name__)
def test_the_rest_api_answers_each_error_by_its_class(exc, status, body, headers):
    assert domain_error(exc) == (status, body, headers)


def test_a_fault_is_answered_as_any_bug_without_its_words():
    assert domain_error(CorruptTree("head block b1 is missing")) is None


#: (error, its SQS error: code, message, status, Retry-After), as the SQS mapping answered before.
SQS_ANSWERS = [
    (service.QueueNotFound("q"), "QueueDoesNotExist", "The specified queue does not exist.", 400, None),
    (service.SubscriptionNotFound("t/s"), "QueueDoesNotExist", "The specified queue does not exist.", 400, None),
    (
        Forbidden(ALICE, "produce", "q"),
        "AccessDenied",
        "alice may not produce 'q': it needs the 'produce' permission on it",
        403,
        None,
    ),
    (
        service.ReceiptMismatch("q/0/b/1", "not in flight"),
        "ReceiptHandleIsInvalid",
        "The receipt handle is not valid now: q/0/b/1: not in flight",
        404,
        None,
    ),
    (service.InvalidRequest("bad", "batch_too_large"), "InvalidParameterValue", "bad", 400, None),
    (service.InvalidRequest("a topic", "is_a_topic"), "InvalidParameterValue", "a topic", 400, None),
    (service.Conflict("no live node", "not_owned"), "ServiceUnavailable", "no live node; retry", 503, 1),
    (service.TooManyWaits("too many", retry_after=2), "RequestThrottled", "too many", 400, 2),
    (service.PartitionUnavailable("lease lost"), "ServiceUnavailable", "unavailable now, retry: lease lost", 503, 1),
    (KVError("down"), "ServiceUnavailable", "unavailable now, retry: down", 503, 1),
    (
        service.RemoteError(404, {"detail": "gone"}),
        "QueueDoesNotExist",
        "The specified queue does not exist.",
        400,
        None,
    ),
    (service.RemoteError(403, {"detail": "no"}), "AccessDenied", "no", 403, None),
    (service.RemoteError(409, {"detail": "again"}), "ReceiptHandleIsInvalid", "again", 404, None),
    (service.RemoteError(429, {"detail": "slow"}), "RequestThrottled", "slow", 400, 1),
    (service.RemoteError(400, {"detail": "bad"}), "InvalidParameterValue", "bad", 400, None),
    (service.RemoteError(503, {"detail": "later"}), "ServiceUnavailable", "later", 503, 1),
]


@pytest.mark.parametrize(
    ("exc", "code", "message", "status", "retry_after"), SQS_ANSWERS, ids=lambda v: type(v).__name__
)
def test_the_sqs_api_answers_each_error_by_its_class(exc, code, message, status, retry_after):
    err = sqs_error(exc)
    assert err is not None
    assert (err.code, err.message, err.status, err.retry_after) == (code, message, status, retry_after)


def test_sqs_errors_pass_through_the_sqs_mapping_and_faults_are_bugs():
    own = SQSError("MissingParameter", "needs QueueUrl")
    assert sqs_error(own) is own
    signature = SignatureError("SignatureDoesNotMatch", "no match")
    assert sqs_error(signature) is signature
    assert (signature.query_code, signature.status, signature.sender_fault) == ("SignatureDoesNotMatch", 403, True)
    assert sqs_error(CorruptTree("head block b1 is missing")) is None
    assert sqs_error(ValueError("a bug")) is None


def test_the_body_gate_answers_busy_readers_as_the_error_says(settings):
    # given the one reader of anonymous bodies busy
    settings.API_ANONYMOUS_BODY_READERS = 1
    readers = bodies.readers()
    assert readers._free.acquire(blocking=False)
    got: dict = {}

    def start_response(status, headers):
        got.update(status=status, headers=dict(headers))

    environ = {"REQUEST_METHOD": "POST", "PATH_INFO": "/admin/login/", "CONTENT_LENGTH": "5"}
    try:
        # when an anonymous body comes
        answer = bodies.BodyGate(lambda *_: pytest.fail("the body was read"))(
            {**environ, "wsgi.input": io.BytesIO(b"hello")}, start_response
        )
    finally:
        readers._free.release()
    # then it is refused unread, with the answer ReadersBusy carries (that of the views)
    assert got["status"] == "503 Service Unavailable" and got["headers"]["Retry-After"] == "1"
    detail = "1 bodies of callers not authenticated are being read already; retry"
    assert orjson.loads(b"".join(answer)) == {"error": "unavailable", "detail": detail}
