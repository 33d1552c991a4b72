"""The CPU accounting and the summary of bench/throughput.py: the /proc and Redis parsers, the
per-message arithmetic of a round, the options, and the closing summary's ratios and goals."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

import throughput  # noqa: E402
import throughput_cpu as cpu  # noqa: E402
from throughput_report import closing_summary, ours_pairs, summarize  # noqa: E402
from throughput_rounds import add_cycle  # noqa: E402

# /proc/<pid>/stat of a process whose name holds ") (" and spaces: session 4242, utime 150,
# stime 50, cutime 7, cstime 3 (fields 6 and 14..17)
STAT = "1234 (we) ird (name) S 1 1234 4242 0 -1 4194560 900 0 0 0 150 50 7 3 20 0 5 0 123 4096 300 0"


def test_parse_proc_stat_counts_fields_after_the_last_parenthesis():
    assert cpu.parse_proc_stat(STAT) == (4242, 150 + 50 + 7 + 3)


def test_parse_proc_stat_rejects_a_truncated_line():
    with pytest.raises(ValueError):
        cpu.parse_proc_stat("1234 (x) S 1 2 3")


def test_this_process_reads_its_own_session_and_cpu():
    session, ticks0 = cpu.read_proc_stat(os.getpid())
    assert session == os.getsid(0)
    t = time.process_time()
    while time.process_time() - t < 0.05:  # burn 5 ticks
        pass
    assert cpu.read_proc_stat(os.getpid())[1] > ticks0
    assert os.getpid() in cpu.session_pids(session)
    assert cpu.session_cpu_seconds(session) >= cpu.proc_cpu_seconds(os.getpid())


def test_a_session_whose_leader_is_out_of_sight_still_adds_up(monkeypatch):
    # under a CI runner the tests' session is 0 (its leader lives outside the PID namespace)
    stats = {7: (0, 30), 8: (0, 20), 9: (5, 1000)}
    monkeypatch.setattr(cpu.os, "listdir", lambda path: ["7", "8", "9", "self", "stat"])
    monkeypatch.setattr(cpu, "read_proc_stat", stats.get)
    assert cpu.session_pids(0) == [7, 8]
    assert cpu.session_cpu_seconds(0) == pytest.approx(50 / cpu.CLK_TCK)
    assert cpu.session_cpu_seconds(6) != cpu.session_cpu_seconds(6)  # NaN: nothing of it is left


def test_a_gone_process_reads_as_unknown():
    assert cpu.read_proc_stat(2**22 + 1) is None  # above the kernel's pid_max
    assert cpu.session_cpu_seconds(2**22 + 1) != cpu.session_cpu_seconds(2**22 + 1)  # NaN


def test_parse_cluster_nodes_lists_live_addresses():
    text = (
        "a1 127.0.0.1:7001@17001 myself,master - 0 0 1 connected 0-5460\n"
        "b2 127.0.0.1:7002@17002,host-b master - 0 1 2 connected 5461-10922\n"
        "c3 127.0.0.1:7003@17003 master,fail - 0 1 3 disconnected\n"
        "d4 :0@0 master,noaddr - 0 1 4 disconnected\n"
    )
    assert cpu.parse_cluster_nodes(text) == [("127.0.0.1", 7001), ("127.0.0.1", 7002)]
    parsed = {  # as redis-py hands it over
        "127.0.0.1:7001@17001": {"node_id": "a1", "flags": "myself,master", "connected": True},
        "127.0.0.1:7003@17003": {"node_id": "c3", "flags": "master,fail", "connected": False},
    }
    assert cpu.parse_cluster_nodes(parsed) == [("127.0.0.1", 7001)]
    assert cpu.parse_cluster_nodes(text.encode()) == cpu.parse_cluster_nodes(text)


def test_parse_cluster_url():
    url = "redis-cluster://127.0.0.1:7001,127.0.0.1:7002,localhost:7003/0"
    assert cpu.parse_cluster_url(url) == [("127.0.0.1", 7001), ("127.0.0.1", 7002), ("localhost", 7003)]
    with pytest.raises(ValueError):
        cpu.parse_cluster_url("redis://127.0.0.1:6379/0")
    with pytest.raises(ValueError):
        cpu.parse_cluster_url("redis-cluster://127.0.0.1")


def test_per_message_us():
    assert cpu.per_message_us(0.5, 1000) == pytest.approx(500.0)
    assert cpu.per_message_us(None, 1000) is None
    assert cpu.per_message_us(float("nan"), 1000) is None
    assert cpu.per_message_us(0.5, 0) is None


def test_summed_is_unknown_when_any_part_is():
    assert cpu.summed(lambda: 1.5, lambda: 2.0) == 3.5
    assert cpu.summed(lambda: 1.5, lambda: None) is None


def test_parse_forwarded_calls_sums_every_call_label():
    text = (
        "# HELP mq_forwarded_calls_total Calls this process forwarded to another node, by call\n"
        "# TYPE mq_forwarded_calls_total counter\n"
        'mq_forwarded_calls_total{call="enqueue"} 12.0\n'
        'mq_forwarded_calls_total{call="ack"} 3.0\n'
        'mq_forwarded_calls_created{call="ack"} 1.7e+09\n'
        "# TYPE mq_node_processes_missing gauge\nmq_node_processes_missing 0.0\n"
    )
    assert cpu.parse_forwarded_calls(text) == 15.0
    assert cpu.parse_forwarded_calls("# TYPE mq_node_processes_missing gauge\nmq_node_processes_missing 0.0\n") == 0


def phase(wall, count, calls, server, client=0.1, store=None, box=1.0, forwarded=None):
    return {
        "wall": wall,
        "count": count,
        "calls": calls,
        "client_cpu_s": client,
        "server_cpu_s": server,
        "store_cpu_s": store,
        "box_cpu_s": box,
        "forwarded": forwarded,
    }


def test_add_cycle_gives_cpu_per_message_and_per_call():
    phases = {
        "enqueue": phase(1.0, 1000, 10, 0.02),
        "dequeue": phase(2.0, 1000, 12, 0.05),
        "ack": phase(1.0, 1000, 10, 0.03),
    }
    add_cycle(phases, 1000)
    c = phases["cycle"]
    assert c["rate"] == pytest.approx(250.0)
    assert c["calls"] == 32
    assert c["server_cpu_us_msg"] == pytest.approx(100.0)  # 0.1 s over 1,000 messages
    assert c["server_cpu_us_call"] == pytest.approx(0.1 / 32 * 1e6)
    assert c["server_cpu_cores"] == pytest.approx(0.025)
    assert phases["dequeue"]["server_cpu_us_msg"] == pytest.approx(50.0)
    assert c["store_cpu_us_msg"] is None  # a system without a store
    assert c["forwarded_per_msg"] is None  # nor a count of forwarded calls


def test_add_cycle_gives_forwarded_calls_per_message():
    phases = {
        "enqueue": phase(1.0, 1000, 10, 0.02, forwarded=5),
        "dequeue": phase(2.0, 1000, 12, 0.05, forwarded=0),
        "ack": phase(1.0, 800, 8, 0.03, forwarded=4),
    }
    add_cycle(phases, 800)
    assert phases["cycle"]["forwarded"] == 9
    assert phases["cycle"]["forwarded_per_msg"] == pytest.approx(9 / 800)
    assert phases["enqueue"]["forwarded_per_msg"] == pytest.approx(0.005)
    assert phases["dequeue"]["forwarded_per_msg"] == 0


def test_parse_counts():
    assert throughput.parse_counts(None) == [None]
    assert throughput.parse_counts("1,2,2") == [1, 2]
    for bad in ("0", "x", "1,-2"):
        with pytest.raises(ValueError):
            throughput.parse_counts(bad)


def test_find_cluster_url():
    out = "export MQ_TEST_REDIS_URL=redis://127.0.0.1:1\nexport MQ_TEST_REDIS_CLUSTER_URL=redis-cluster://127.0.0.1:7001,127.0.0.1:7002\n"
    assert throughput.find_cluster_url(out) == "redis-cluster://127.0.0.1:7001,127.0.0.1:7002"
    assert throughput.find_cluster_url("redis-cluster: running") is None


def system(name, backend=None, processes=None):
    return SimpleNamespace(name=name, is_ours=backend is not None, backend=backend or "", processes=processes)


def medians(cycle, us_msg, us_call=None, fwd=None):
    return {
        "cycle": cycle,
        "server_cpu_us_msg": us_msg,
        "server_cpu_us_call": us_call,
        "server_cpu_cores": 0.9,
        "forwarded_per_msg": fwd,
    }


def test_closing_summary_quotes_rates_ratios_and_goals():
    ours, pgq, streams = system("ours[redis]", "redis", 1), system("pgqueuer"), system("redis-streams")
    two = system("ours[redis,p2]", "redis", 2)
    summary = {
        "single": {
            "ours[redis]": medians(600, 480, 160),
            "ours[redis,p2]": medians(700, 500, 170, fwd=0.5),
            "pgqueuer": medians(400, 900),
            "redis-streams": medians(1700, 30),
            "_ratios": {"ours[redis] / redis-streams": {"cycle": 600 / 1700}},
        },
        "batch100": {
            "ours[redis]": medians(9000, 100, 3000),
            "pgqueuer": medians(10000, 80),
            "redis-streams": medians(40000, 10),
            "_ratios": {
                "ours[redis] / pgqueuer": {"cycle": 0.9},
                "ours[redis] / redis-streams": {"cycle": 0.55},
            },
        },
    }
    modes = [("single", 1, 2000), ("batch100", 100, 20000)]
    text = "\n".join(closing_summary(modes, [ours, two, pgq, streams], summary))
    assert "| full cycle, msg/s (server µs/msg) | ours[redis] | ours[redis,p2] | pgqueuer | redis-streams |" in text
    assert "| one message per call (single) | 600 (480) | 700 (500) | 400 (900) | 1,700 (30.0) |" in text
    assert "| 100 per call (batch100) | 9,000 (100) | n/a | 10,000 (80.0) | 40,000 (10.0) |" in text
    assert "vs redis-streams 0.353x (goal >= 0.6: NOT met)" in text
    assert "vs pgqueuer 0.900x (goal >= 2: NOT met)" in text
    assert "vs redis-streams 0.550x (goal >= 0.5: met)" in text
    assert "100 µs/msg (goal <= 40: NOT met)" in text
    assert "160 µs/call (goal <= 200: met)" in text
    assert "ours[redis,p2] / ours[redis]: cycle 1.167x" in text
    assert "single    ours[redis,p2]: 500 µs/msg" in text and "0.500 forwarded calls/msg" in text
    assert "µs/msg; - forwarded calls/msg" in text  # a node whose count is unknown


def test_the_ceiling_is_the_thin_queue_over_redis_streams_in_the_same_rounds():
    def sample(cycle: float) -> dict:
        phases = {f: {"rate": cycle} for f in ("enqueue", "dequeue", "ack", "cycle")}
        return {"phases": phases, "group": "g"}

    thin, streams = system("thin[wsgi]"), system("redis-streams")
    results = {
        "single": {
            "thin[wsgi]": {"samples": [sample(600), sample(500), sample(700)]},
            "redis-streams": {"samples": [sample(1000), sample(1200), sample(1100)]},
        }
    }
    modes = [("single", 1, 2000)]
    summary = summarize(results, modes, [thin, streams])
    assert summary["single"]["_ceiling"] == {"thin[wsgi]": 600 / 1100}
    ours = system("ours[redis]", "redis", 1)
    summary["single"]["ours[redis]"] = medians(300, 480, 160)
    text = "\n".join(closing_summary(modes, [ours, thin, streams], summary))
    assert "  single    thin[wsgi] 0.545x" in text
    # without Redis Streams in the run there is no ceiling to print
    del results["single"]["redis-streams"]
    assert summarize(results, modes, [thin])["single"]["_ceiling"] == {}


def test_ours_pairs_compare_processes_and_cluster():
    r1, r2 = system("r1", "redis", 1), system("r2", "redis", 2)
    c1, p1 = system("c1", "redis-cluster", 1), system("p1", "postgres", 1)
    assert ours_pairs([r1, r2, c1, p1]) == [(r2, r1), (c1, r1)]


def test_box_speed_times_the_loop_and_says_when_redis_does_not_answer(capsys):
    from common import box_speed, fmt_box_speed

    from tests.launcher import free_port

    speed = box_speed(f"redis://127.0.0.1:{free_port()}/0")  # nothing listens there
    assert set(speed) == {"python_us"} and speed["python_us"] > 0
    assert "box speed: no PING to redis://127.0.0.1:" in capsys.readouterr().err
    assert fmt_box_speed(speed) == f"Python loop {speed['python_us'] / 1000:.2f} ms"
    with_ping = speed | {"ping_cpu_us": 41.4, "ping_wall_us": 60.6}
    assert fmt_box_speed(with_ping).endswith(", Redis PING 41 µs thread CPU (61 µs wall)")


def test_box_speed_pings_a_real_redis(redis_client):
    from common import box_speed

    kwargs = redis_client.connection_pool.connection_kwargs
    speed = box_speed(f"redis://{kwargs['host']}:{kwargs['port']}/5")
    assert set(speed) == {"python_us", "ping_cpu_us", "ping_wall_us"}
    assert speed["ping_cpu_us"] > 0 and 0 < speed["ping_wall_us"] < 1_000_000
