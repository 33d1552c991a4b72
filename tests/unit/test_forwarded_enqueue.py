"""Where an enqueue without a partition of its own goes when this node stores none of the
queue's (``queues.cluster.routing.local_or_forward``): to the next node only when the one tried
never got the call."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from queues.cluster import routing
from queues.errors import NotServedHere, PeerUnreachable, RemoteError


def _runtime(others: list[str]) -> SimpleNamespace:
    router = SimpleNamespace(other_nodes=lambda queue_id, queue: list(others), forget=lambda queue_id: None)
    return SimpleNamespace(router=router, heartbeat=1.0, local_managers=lambda queue: [], queues={"q": object()})


def _not_here(even_if_cooling: bool) -> list[str]:
    raise NotServedHere("no partition of 'q' here")


def _forward(answers: dict[str, Exception | list[str]], tried: list[str]):
    def remote(address: str) -> list[str]:
        tried.append(address)
        answer = answers[address]
        if isinstance(answer, Exception):
            raise answer
        return answer

    return remote


CFG = SimpleNamespace(id=1, name="q")


def test_a_node_that_may_have_stored_the_batch_ends_the_call():
    # given two other nodes, the first of which times out (or answers unreadably) after the
    # call reached it
    tried: list[str] = []
    answers = {"a:1": PeerUnreachable("node a:1 did not answer; retry"), "b:2": ["q/0/x/0"]}
    # when an enqueue is forwarded
    with pytest.raises(PeerUnreachable):
        routing.local_or_forward(_runtime(["a:1", "b:2"]), CFG, 0, _not_here, _forward(answers, tried))
    # then it fails there (503: the client decides) rather than being stored again at b
    assert tried == ["a:1"]


@pytest.mark.parametrize(
    "first",
    [
        PeerUnreachable("node a:1 refused the connection; retry", refused=True),
        RemoteError(503, {"error": "unavailable", "detail": "retry"}),
    ],
)
def test_a_node_that_never_stored_the_batch_passes_it_to_the_next(first):
    tried: list[str] = []
    answers = {"a:1": first, "b:2": ["q/0/x/0"]}
    got = routing.local_or_forward(_runtime(["a:1", "b:2"]), CFG, 0, _not_here, _forward(answers, tried))
    assert got == ["q/0/x/0"] and tried == ["a:1", "b:2"]
