"""The transport of forwarded calls (``queues.api.peers``: libcurl through pycurl), against a
stand-in peer on loopback: one kept-alive connection for many calls and one per peer, answers in
the service's types, no proxy from the environment, no 100-continue wait before a large body,
never a call sent twice, and every way a peer can fail to answer (refused, silent, gone
mid-call, a 2xx without what the call needs) turned into PeerUnreachable (for an enqueue, 503
with Retry-After to the client), never a hang, a 500 or IDs that name the wrong messages."""

from __future__ import annotations

import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pycurl
import pytest

from queues.access import Caller
from queues.api import peers
from queues.cluster import peerauth
from queues.engine.ids import MessageId
from queues.service import MessageDraft, PeerUnreachable, RemoteError

CALLER = Caller(7, "seven")


class StandIn:
    """A peer that keeps connections alive (HTTP/1.1), counts the connections it accepted,
    records each call's headers and body, and answers ``answer(path, body)``: (status, bytes),
    or None to close the connection without answering."""

    def __init__(self, answer) -> None:
        self.connections = 0
        self.close_after = self.announce_close = False
        self.calls: list[tuple[str, dict[str, str], bytes]] = []
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self):
                super().setup()
                with lock:
                    stand_in.connections += 1

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with lock:
                    stand_in.calls.append((self.path, dict(self.headers.items()), body))
                answered = answer(self.path, body)
                if answered is None:  # it ran the call, then the connection went without a word
                    self.close_connection = True
                    return
                status, raw = answered
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                if stand_in.close_after and stand_in.announce_close:
                    self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(raw)
                if stand_in.close_after:
                    self.close_connection = True

            def log_message(self, *args):
                pass

        class Server(ThreadingHTTPServer):
            # socketserver's listen backlog is 5: eight threads connecting at once could
            # overflow it, and a dropped SYN is sent again only after a second, past the
            # transport's 1 s connect timeout (a node's own server listens with a long backlog)
            request_queue_size = 128

        lock = threading.Lock()
        self.server = Server(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _acks(path: str, body: bytes) -> tuple[int, bytes]:
    n = len(json.loads(body).get("messages", ()))
    return 200, json.dumps({"acked": n, "not_found": 0}).encode()


@pytest.fixture
def stand_in():
    made: list[StandIn] = []

    def make(answer=_acks) -> StandIn:
        made.append(StandIn(answer))
        return made[-1]

    yield make
    for s in made:
        s.close()


def _ack(p: peers.HttpPeers, address: str, n: int = 1):
    items = [(MessageId("orders", 0, "00000000-0000000000000000", i), "r") for i in range(n)]
    return p.ack(address, "orders", items, 0, CALLER)


def test_calls_from_one_thread_share_one_kept_alive_connection(stand_in):
    # given a peer and the node's transport
    peer, p = stand_in(), peers.HttpPeers()
    # when one thread forwards 20 acks
    results = [_ack(p, peer.address, 3) for _ in range(20)]
    # then each came back in the service's types, and all went over one connection
    assert {(r.acked, r.not_found) for r in results} == {(3, 0)}
    assert len(peer.calls) == 20
    assert peer.connections == 1
    # and each call was signed for this peer, with its hop count, and no Expect header
    path, headers, body = peer.calls[-1]
    assert path == "/api/v1/queues/orders/ack"
    assert headers[peerauth.TO_HEADER] == peer.address and headers[peerauth.HOPS_HEADER] == "1"
    assert headers[peerauth.ON_BEHALF_HEADER] == "7" and headers[peerauth.SIGNATURE_HEADER]
    assert "Expect" not in headers
    assert json.loads(body)["messages"][0] == {"id": "orders/0/00000000-0000000000000000/0", "receipt": "r"}


def test_calls_from_many_threads_at_once_each_get_their_own_answer(stand_in):
    # given a peer that answers each enqueue with the body it got back as the ID
    def echo(path, body):
        return 201, json.dumps({"ids": [m["body"] for m in json.loads(body)["messages"]]}).encode()

    peer, p = stand_in(echo), peers.HttpPeers()

    # when 8 threads forward 25 enqueues each, at once
    def run(t):
        return [p.enqueue(peer.address, "orders", [MessageDraft(f"{t}-{i}")], 0, CALLER)[0] for i in range(25)]

    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(run, range(8)))
    # then no answer went to the wrong call, and the 200 calls kept to a connection a handle
    assert got == [[f"{t}-{i}" for i in range(25)] for t in range(8)]
    assert 1 <= len(p.handles(peer.address)._free) <= 8
    assert peer.connections <= 8


def test_calls_to_several_peers_keep_a_connection_to_each(stand_in):
    # given six peers (more than the 5 connections one libcurl handle keeps)
    six, p = [stand_in() for _ in range(6)], peers.HttpPeers()
    # when one thread forwards 10 rounds of an ack to each in turn
    for _ in range(10):
        for peer in six:
            assert _ack(p, peer.address).acked == 1
    # then each peer saw its 10 calls on one connection
    assert [(len(peer.calls), peer.connections) for peer in six] == [(10, 1)] * 6


def test_handles_past_the_kept_number_are_closed():
    # given a pool that keeps 2 handles, and 4 taken at once
    handles = peers.CurlHandles(kept=2)
    taken = [handles.take() for _ in range(4)]
    # when all 4 come back
    for c in taken:
        handles.give_back(c)
    # then 2 wait for reuse and the other 2 are closed
    assert handles._free == taken[:2]
    for c in taken[2:]:
        with pytest.raises(pycurl.error):
            c.setopt(pycurl.URL, "http://127.0.0.1:1/")
    # and a closed pool keeps none
    handles.close()
    handles.give_back(handles.take())
    assert handles._free == []


def test_a_large_body_goes_whole_without_expect(stand_in):
    # given a peer
    peer, p = stand_in(lambda path, body: (201, b'{"ids": ["big"]}')), peers.HttpPeers()
    body = "x" * (2 * 1024 * 1024)
    # when a 2 MiB message is forwarded
    ids = p.enqueue(peer.address, "orders", [MessageDraft(body)], 0, CALLER)
    # then it arrived whole, as JSON, without "Expect: 100-continue" (libcurl would send it for
    # a body over 1 MiB and wait up to a second for a peer that does not answer it)
    assert ids == ["big"]
    _, headers, raw = peer.calls[0]
    assert json.loads(raw)["messages"][0]["body"] == body
    assert "Expect" not in headers and headers["Content-Type"] == "application/json"


def test_a_proxy_in_the_environment_is_not_used(stand_in, monkeypatch):
    # given proxy variables naming a port where nothing listens
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))
    proxy = f"http://127.0.0.1:{dead.getsockname()[1]}"
    dead.close()
    for name in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.setenv(name, proxy)
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    peer = stand_in()
    # when a call is forwarded
    result = _ack(peers.HttpPeers(), peer.address)
    # then it went straight to the peer
    assert result.acked == 1 and len(peer.calls) == 1


def test_a_peer_that_refuses_is_unreachable():
    # given an address where nothing listens
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    address = f"127.0.0.1:{s.getsockname()[1]}"
    s.close()
    # when a call is forwarded there, then PeerUnreachable (503, retry) says which node
    with pytest.raises(PeerUnreachable, match=address):
        _ack(peers.HttpPeers(), address)


def test_a_peer_that_never_answers_is_unreachable_after_the_timeout(monkeypatch):
    # given a peer that accepts the connection and the request, then says nothing
    monkeypatch.setattr(peers, "TIMEOUT", 1)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    held: list[socket.socket] = []
    threading.Thread(target=lambda: held.append(listener.accept()[0]), daemon=True).start()
    address = f"127.0.0.1:{listener.getsockname()[1]}"
    try:
        # when a call is forwarded there
        started = time.monotonic()
        with pytest.raises(PeerUnreachable, match=address):
            _ack(peers.HttpPeers(), address)
        # then it ends after the timeout, not at the peer's leisure
        assert 0.9 <= time.monotonic() - started < 5
    finally:
        for c in held:
            c.close()
        listener.close()


@pytest.mark.parametrize("announced", [True, False], ids=["connection-close", "silent-close"])
def test_a_connection_the_peer_closed_is_replaced(stand_in, announced):
    # given a peer that closes the connection after each answer, saying so ("Connection:
    # close", as a node shedding a connection does) or not (an idle keep-alive it dropped)
    peer = stand_in()
    peer.close_after, peer.announce_close = True, announced
    p = peers.HttpPeers()
    # when 10 calls are forwarded one after the other, a moment apart (the close reaches
    # this side first, as a kept-alive connection's does when the peer drops it idle)
    results = []
    for _ in range(10):
        results.append(_ack(p, peer.address).acked)
        time.sleep(0.05)
    # then every one was answered, each on a connection of its own
    assert results == [1] * 10
    assert peer.connections == 10


def test_a_call_the_peer_ran_without_answering_is_not_sent_again(stand_in):
    # given a kept-alive connection to a peer that will run the next call and then drop the
    # connection without a word (a process killed after its commit)
    seen = []

    def answer(path, body):
        seen.append(body)
        return None if len(seen) == 2 else _acks(path, body)

    peer, p = stand_in(answer), peers.HttpPeers()
    assert _ack(p, peer.address).acked == 1
    # when the next call is forwarded on that connection
    with pytest.raises(PeerUnreachable, match=peer.address):
        _ack(p, peer.address, 2)
    # then it failed (503: the client decides whether to retry) instead of being sent again
    # on a new connection, where the peer would have run it twice
    time.sleep(0.2)
    assert len(seen) == 2
    # and the next call gets a fresh connection
    assert _ack(p, peer.address).acked == 1 and peer.connections == 2


def test_a_refusal_comes_back_as_the_peers_answer(stand_in):
    # given a peer that refuses the ack (409) and one that answers without JSON
    refusing = stand_in(lambda path, body: (409, b'{"error": "receipt_mismatch", "detail": "stale"}'))
    garbled = stand_in(lambda path, body: (502, b"<html>bad gateway</html>"))
    p = peers.HttpPeers()
    # when acks are forwarded to them
    with pytest.raises(RemoteError) as refused:
        _ack(p, refusing.address)
    with pytest.raises(RemoteError) as bad:
        _ack(p, garbled.address)
    # then the refusal is passed on as it is, and the answer without JSON says so
    assert (refused.value.status, refused.value.payload["error"]) == (409, "receipt_mismatch")
    assert (bad.value.status, bad.value.payload["error"]) == (502, "bad_gateway")


@pytest.mark.parametrize(
    "answer",
    [
        {"ids": ["orders/0/00000000-0000000000000000/0"]},  # one ID for two messages
        {"ids": ["orders/0/00000000-0000000000000000/0", 7]},
        {"ids": ["orders/0/00000000-0000000000000000/0", ""]},
        {"id": "orders/0/00000000-0000000000000000/0"},
        ["orders/0/00000000-0000000000000000/0", "orders/0/00000000-0000000000000000/1"],
    ],
)
def test_an_enqueue_answered_without_an_id_for_each_message_is_unreachable(stand_in, answer):
    # given a peer that stores an enqueue of two messages and answers 201 without their two IDs
    peer = stand_in(lambda path, body: (201, json.dumps(answer).encode()))
    # when an enqueue is forwarded to it
    with pytest.raises(PeerUnreachable, match="may have run") as failed:
        peers.HttpPeers().enqueue(peer.address, "orders", [MessageDraft("a"), MessageDraft("b")], 0, CALLER)
    # then it fails as a call that may have run (503: the client decides), not as a KeyError
    # (500) or an answer that names the caller's messages with the wrong IDs
    assert not failed.value.refused and len(peer.calls) == 1


@pytest.mark.parametrize(
    "answer",
    [
        {"messages": [{"id": "orders/0/00000000-0000000000000000/0", "body": "b"}]},  # no receipt, no time
        {"messages": [{"id": "x", "receipt": "r", "receive_count": 1, "body": "b", "enqueued_at": "yesterday"}]},
        {"messages": "none"},
        {
            "messages": [
                {"id": "x", "receipt": "r", "receive_count": 1, "body": "b", "enqueued_at": "2026-01-01T00:00:00Z"}
            ]
            * 3
        },  # more than asked for
    ],
)
def test_a_dequeue_answered_with_unreadable_messages_is_unreachable(stand_in, answer):
    peer = stand_in(lambda path, body: (200, json.dumps(answer).encode()))
    with pytest.raises(PeerUnreachable, match="may have run"):
        peers.HttpPeers().dequeue(peer.address, "orders", 2, None, 0, CALLER)
