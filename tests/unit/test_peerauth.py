"""The signature of forwarded calls (``queues.cluster.peerauth``), without HTTP."""

from __future__ import annotations

import time

import pytest

from queues.cluster import peerauth


def _environ(headers: dict[str, str], path: str = "/api/v1/queues/q/enqueue", query: str = "") -> dict[str, str]:
    env = {"PATH_INFO": path, "QUERY_STRING": query}
    env.update({peerauth.meta_key(k): v for k, v in headers.items()})
    return env


def test_a_signed_call_verifies_once_and_names_its_user_and_hops():
    body = b'{"body": "x"}'
    headers = peerauth.sign("POST", "/api/v1/queues/q/enqueue", body, 1, "42")
    assert not any(_secret() in v for v in headers.values())  # the secret never travels
    env = _environ(headers)
    call = peerauth.verify(env, "POST", peerauth.request_path(env), body)
    assert call == peerauth.PeerCall("1", "42")
    assert peerauth.verify(env, "POST", peerauth.request_path(env), body) == call  # (one request: checked once)
    replay = _environ(headers)  # the same call sent again: a new request
    with pytest.raises(peerauth.PeerAuthFailed, match="replayed"):
        peerauth.verify(replay, "POST", peerauth.request_path(replay), body)


def test_a_call_without_a_signature_is_not_a_nodes_and_the_old_header_is_refused():
    assert peerauth.verify(_environ({"X-MQ-Hops": "2"}), "POST", "/x", b"") is None
    with pytest.raises(peerauth.PeerAuthFailed, match="X-MQ-Cluster-Secret"):
        peerauth.verify(_environ({"X-MQ-Cluster-Secret": _secret()}), "POST", "/x", b"")


@pytest.mark.parametrize(
    "method, path, query, body",
    [
        ("PUT", "/api/v1/queues/q/enqueue", "", b"{}"),
        ("POST", "/api/v1/queues/r/enqueue", "", b"{}"),
        ("POST", "/api/v1/queues/q/enqueue", "format=api", b"{}"),
        ("POST", "/api/v1/queues/q/enqueue", "", b"{ }"),
    ],
)
def test_a_signature_fits_one_request_only(method, path, query, body):
    headers = peerauth.sign("POST", "/api/v1/queues/q/enqueue", b"{}", 1, None)
    env = _environ(headers, path, query)
    with pytest.raises(peerauth.PeerAuthFailed, match="bad cluster signature"):
        peerauth.verify(env, method, peerauth.request_path(env), body)


@pytest.mark.parametrize("offset", [-31.0, 31.0, float("nan"), float("inf")])
def test_a_timestamp_out_of_the_window_is_refused(offset):
    now = time.time()
    headers = peerauth.sign("POST", "/p", b"", 0, None, now=now + offset)  # signed, but off (or garbled)
    with pytest.raises(peerauth.PeerAuthFailed, match="timestamp"):
        peerauth.verify(_environ(headers, "/p"), "POST", "/p", b"", now=now)


def test_the_replay_guard_forgets_after_its_window_and_refuses_when_full():
    seen = peerauth.SeenSignatures(limit=2)
    assert seen.add("a", 0.0, 60) and not seen.add("a", 59.0, 60)
    assert seen.add("a", 60.0, 60)  # expired: the timestamp check refuses such a replay anyway
    assert seen.add("b", 61.0, 60)
    with pytest.raises(peerauth.PeerAuthBusy):
        seen.add("c", 62.0, 60)
    assert seen.add("c", 120.5, 60)  # "a" expired: room again


def _secret() -> str:
    from django.conf import settings

    return settings.CLUSTER_SECRET


def test_a_call_signed_for_another_node_process_is_refused_there(monkeypatch):
    # A node's processes share its public port: a captured call replayed there could reach a
    # sibling whose replay guard never saw it, so each accepts only calls signed for its address.
    body = b"{}"
    monkeypatch.setattr(peerauth, "ADDRESS", "10.0.0.1:41001")
    for to in ("10.0.0.1:41002", ""):  # a sibling's address, or none
        env = _environ(peerauth.sign("POST", "/p", body, 1, None, to=to), "/p")
        with pytest.raises(peerauth.PeerAuthFailed, match="not this node process"):
            peerauth.verify(env, "POST", "/p", body)
    env = _environ(peerauth.sign("POST", "/p", body, 1, None, to="10.0.0.1:41001"), "/p")
    assert peerauth.verify(env, "POST", "/p", body) == peerauth.PeerCall("1", None)
    # the recipient is under the signature: rewriting the header breaks it
    headers = peerauth.sign("POST", "/p", body, 1, None, to="10.0.0.1:41002")
    headers[peerauth.TO_HEADER] = "10.0.0.1:41001"
    with pytest.raises(peerauth.PeerAuthFailed, match="bad cluster signature"):
        peerauth.verify(_environ(headers, "/p"), "POST", "/p", body)


def test_the_signature_is_checked_before_the_body_and_the_body_against_it():
    body = b'{"messages": []}'
    headers = peerauth.sign("POST", "/p", body, 1, "7")
    # a forged signature (or one without the body's hash) is refused on its headers alone
    for forged in ({**headers, peerauth.SIGNATURE_HEADER: "0" * 64}, {**headers, peerauth.CONTENT_HEADER: ""}):
        with pytest.raises(peerauth.PeerAuthFailed):
            peerauth.verify_headers(_environ(forged, "/p"), "POST", "/p")
    # another body than the one signed is refused once read
    call = peerauth.verify_headers(_environ(headers, "/p"), "POST", "/p")
    assert call == peerauth.PeerCall("1", "7")
    with pytest.raises(peerauth.PeerAuthFailed, match="not the one signed"):
        peerauth.check_body(call, b'{"messages": [1]}')
    peerauth.check_body(call, body)


def test_a_call_signed_before_this_process_started_is_refused(monkeypatch):
    # The replay guard is this process's memory: what was signed before it started may have
    # been accepted by the process before it, at the same address.
    now = time.time()
    monkeypatch.setattr(peerauth, "STARTED", now)
    old = peerauth.sign("POST", "/p", b"", 0, None, now=now - 3.8)
    with pytest.raises(peerauth.PeerAuthFailed, match="before this node process started"):
        peerauth.verify(_environ(old, "/p"), "POST", "/p", b"", now=now)
    fresh = peerauth.sign("POST", "/p", b"", 0, None, now=now + 0.5)
    assert peerauth.verify(_environ(fresh, "/p"), "POST", "/p", b"", now=now + 1) is not None


def test_a_peer_that_refuses_this_node_s_signature_is_a_503_to_the_caller(monkeypatch):
    # The caller's own credentials were accepted here; a peer refusing this node's signature
    # (another cluster secret, a clock outside the window) is the cluster's trouble: retry.
    from queues.api.peers import HttpPeers
    from queues.service import PeerUnreachable

    peers = HttpPeers()
    monkeypatch.setattr(peers, "post", lambda *a, **k: (401, {"error": "authentication_failed", "detail": "..."}))
    with pytest.raises(PeerUnreachable, match="refused this node's call") as caught:
        peers.call("10.0.0.1:1", "q", "enqueue", {}, 0, None, ok=201)
    assert caught.value.refused and caught.value.retry_after
