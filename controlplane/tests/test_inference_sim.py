"""controlplane.lab.inference (sim-inference): completions, queueing and every knob, over
real sockets on 127.0.0.1 (the OS picks the ports), and the heartbeat agent it starts, sending
real UDP to a socket of the test. The command line and its options are test_inference_sim_cli.py's.

Every server, connection, thread and process a test starts is stopped by the test; every wait
polls a condition with a bound. Timing is asserted only as lower bounds the model guarantees.
"""

from __future__ import annotations

import http.client
import json
import socket
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from controlplane import abi
from controlplane.lab.inference import (
    Handle,
    KnobError,
    Knobs,
    Options,
    heartbeat_command,
    run_in_thread,
)
from controlplane.lab.traffic import wait_until

REPO = Path(__file__).resolve().parents[2]
LOOPBACK = "127.0.0.1"
TIMEOUT_S = 5.0
METRIC_NAMES = {
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:generation_tokens_total",
    "vllm:request_success_total",
    "vllm:prompt_tokens_total",
}


@pytest.fixture
def sim() -> Iterator[Callable[..., Handle]]:
    """start(**options) -> a server in a thread; all of them are stopped after the test."""
    started: list[Handle] = []

    def start(**kw: Any) -> Handle:
        kw.setdefault("name", "s0")
        kw.setdefault("host", LOOPBACK)
        handle = run_in_thread(Options(**kw))
        started.append(handle)
        return handle

    yield start
    for handle in started:
        handle.stop()


# ------------------------------------------------------------ a small client


def request(
    h: Handle, method: str, path: str, doc: Any = None, timeout_s: float = TIMEOUT_S
) -> tuple[int, dict[str, str], bytes]:
    """One request on a new connection: (status, lower-cased headers, body)."""
    conn = http.client.HTTPConnection(*h.address, timeout=timeout_s)
    try:
        body = None if doc is None else json.dumps(doc).encode()
        conn.request(method, path, body=body, headers={"Content-Type": "application/json"} if body else {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def post(h: Handle, path: str, doc: Any, timeout_s: float = TIMEOUT_S) -> tuple[int, Any]:
    status, _, body = request(h, "POST", path, doc, timeout_s)
    return status, json.loads(body)


def complete(h: Handle, max_tokens: int, prompt: str = "one two three", **extra: Any) -> dict:
    status, doc = post(h, "/v1/completions", {"prompt": prompt, "max_tokens": max_tokens, **extra})
    assert status == 200, doc
    return doc


def metrics(h: Handle) -> dict[str, float]:
    """Sample name -> value, after checking every sample carries the model_name label."""
    status, headers, body = request(h, "GET", "/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain; version=0.0.4")
    out = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            assert sample.labels == {"model_name": h.server.opts.model}
            out[sample.name] = sample.value
    return out


def stream_events(h: Handle, path: str, doc: dict) -> tuple[dict[str, str], list[tuple[float, Any]]]:
    """POST with stream: true; (headers, [(seconds since the request, event)]), "[DONE]" as a string."""
    conn = http.client.HTTPConnection(*h.address, timeout=TIMEOUT_S)
    try:
        t0 = time.monotonic()
        conn.request("POST", path, body=json.dumps({**doc, "stream": True}).encode())
        resp = conn.getresponse()
        events = []
        for raw in resp:  # bounded: the server ends the stream, the socket has a timeout
            line = raw.decode().rstrip("\n")
            if line.startswith("data: "):
                data = line[len("data: ") :]
                events.append((time.monotonic() - t0, data if data == "[DONE]" else json.loads(data)))
        return {k.lower(): v for k, v in resp.getheaders()}, events
    finally:
        conn.close()


def refused(h: Handle) -> bool:
    try:
        socket.create_connection(h.address, timeout=1.0).close()
    except ConnectionRefusedError:
        return True
    return False


# ------------------------------------------------------------ completions


def test_a_completion_answers_max_tokens_tokens_no_sooner_than_ttft_plus_tpots(sim):
    h = sim(name="b7", ttft_ms=30, tpot_ms=10)

    t0 = time.monotonic()
    doc = complete(h, max_tokens=5, prompt="count these four words")
    elapsed = time.monotonic() - t0

    assert doc["backend"] == "b7" and doc["object"] == "text_completion"
    assert len(doc["choices"][0]["text"].split()) == 5
    assert doc["choices"][0]["finish_reason"] == "length"
    assert doc["usage"] == {"prompt_tokens": 4, "completion_tokens": 5, "total_tokens": 9}
    assert elapsed >= 0.030 + 4 * 0.010  # first token after ttft, four more one tpot apart
    m = metrics(h)
    assert m["vllm:generation_tokens_total"] == 5
    assert m["vllm:prompt_tokens_total"] == 4
    assert m["vllm:request_success_total"] == 1


def test_a_chat_completion_answers_an_assistant_message(sim):
    h = sim(name="b1")

    status, doc = post(
        h, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hello there"}], "max_tokens": 3}
    )

    assert status == 200 and doc["backend"] == "b1" and doc["object"] == "chat.completion"
    assert doc["choices"][0]["message"]["role"] == "assistant"
    assert len(doc["choices"][0]["message"]["content"].split()) == 3
    assert doc["usage"]["completion_tokens"] == 3 and doc["usage"]["prompt_tokens"] == 2


@pytest.mark.parametrize(
    "path, body, text_of",
    [
        ("/v1/completions", {"prompt": "hi"}, lambda c: c["text"]),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}, lambda c: c["delta"]["content"]),
    ],
    ids=["completions", "chat"],
)
def test_a_stream_sends_one_event_per_token_then_done(sim, path, body, text_of):
    h = sim(name="b2", ttft_ms=40, tpot_ms=5)

    headers, events = stream_events(h, path, {**body, "max_tokens": 6})

    assert headers["content-type"] == "text/event-stream"
    assert headers["transfer-encoding"] == "chunked"
    tokens, done = events[:-1], events[-1]
    assert done[1] == "[DONE]"
    assert len(tokens) == 6  # one event per token
    assert all(event["backend"] == "b2" and len(text_of(event["choices"][0]).split()) == 1 for _, event in tokens)
    assert [event["choices"][0]["finish_reason"] for _, event in tokens] == [None] * 5 + ["length"]
    assert tokens[0][0] >= 0.040  # the first token comes after ttft


def test_a_stream_can_end_with_a_usage_event(sim):
    h = sim()

    _, events = stream_events(
        h, "/v1/completions", {"prompt": "a b", "max_tokens": 2, "stream_options": {"include_usage": True}}
    )

    assert events[-2][1]["usage"] == {"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4}
    assert events[-2][1]["choices"] == []


def test_requests_share_one_kept_alive_connection(sim):
    h = sim(name="b3")
    conn = http.client.HTTPConnection(*h.address, timeout=TIMEOUT_S)
    try:
        peers = set()
        for path in ("/", "/health", "/anything"):
            conn.request("GET", path)
            resp = conn.getresponse()
            body = resp.read()
            assert resp.status == 200
            if body:
                peers.add(json.loads(body)["peer"])
                assert json.loads(body)["backend"] == "b3"
        conn.request("POST", "/v1/completions", body=json.dumps({"prompt": "x", "max_tokens": 2}).encode())
        assert json.loads(conn.getresponse().read())["usage"]["completion_tokens"] == 2
    finally:
        conn.close()
    assert len(peers) == 1  # one client port: the connection was reused


@pytest.mark.parametrize(
    "path, body, field",
    [
        ("/v1/completions", {"prompt": "x", "max_tokens": 0}, "max_tokens"),
        ("/v1/completions", {"max_tokens": 3}, "prompt"),
        ("/v1/chat/completions", {"prompt": "x"}, "messages"),
        ("/v1/completions", {"prompt": "x", "stream": "yes"}, "stream"),
        ("/v1/completions", [1, 2], "body"),
    ],
)
def test_a_bad_completion_request_gets_400_naming_the_field(sim, path, body, field):
    h = sim()

    status, doc = post(h, path, body)

    assert status == 400 and doc["error"]["message"].startswith(f"{field}:")


# ------------------------------------------------------------ queueing


def test_requests_beyond_max_running_wait_in_arrival_order(sim):
    h = sim(max_running=1, ttft_ms=300, tpot_ms=1)
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(complete, h, 2)
        wait_until(lambda: metrics(h)["vllm:num_requests_running"] == 1, TIMEOUT_S, "first request running")
        second = pool.submit(complete, h, 2)

        # The first is inside its 300 ms ttft, so the second can only wait.
        m = wait_until(
            lambda: (m := metrics(h))["vllm:num_requests_waiting"] == 1 and m,
            TIMEOUT_S,
            "second request waiting",
            observe=lambda: metrics(h),
        )
        assert m["vllm:num_requests_running"] == 1

        a, b = first.result(TIMEOUT_S), second.result(TIMEOUT_S)
    assert int(a["id"].rsplit("-", 1)[1]) < int(b["id"].rsplit("-", 1)[1])  # admitted in order
    m = metrics(h)
    assert (m["vllm:num_requests_running"], m["vllm:num_requests_waiting"]) == (0, 0)
    assert m["vllm:request_success_total"] == 2


def test_a_client_that_goes_away_frees_its_slot(sim):
    h = sim(max_running=1, ttft_ms=1, tpot_ms=5)
    sock = socket.create_connection(h.address, timeout=TIMEOUT_S)
    try:
        body = json.dumps({"prompt": "x", "max_tokens": 100000, "stream": True}).encode()
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        wait_until(lambda: metrics(h)["vllm:generation_tokens_total"] > 0, TIMEOUT_S, "tokens streaming")
    finally:
        sock.close()

    wait_until(
        lambda: metrics(h)["vllm:num_requests_running"] == 0,
        TIMEOUT_S,
        "aborted request gone",
        observe=lambda: metrics(h),
    )
    assert complete(h, 1)["usage"]["completion_tokens"] == 1  # the slot is free again
    assert metrics(h)["vllm:request_success_total"] == 1  # the aborted one did not succeed


# ------------------------------------------------------------ metrics and health


def test_metrics_parse_as_prometheus_text_with_vllm_names(sim):
    h = sim(model="llama-sim")
    status, _, body = request(h, "GET", "/metrics")

    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    text = body.decode()

    assert status == 200
    # The parser names a counter family without its _total suffix.
    assert {name.removesuffix("_total") for name in METRIC_NAMES} == set(families)
    for name in METRIC_NAMES:
        assert f"# HELP {name} " in text and f"# TYPE {name} " in text
    assert families["vllm:generation_tokens"].type == "counter"
    assert families["vllm:num_requests_waiting"].type == "gauge"
    assert all(s.labels == {"model_name": "llama-sim"} for f in families.values() for s in f.samples)


def test_health_endpoints_answer_200_when_alive(sim):
    h = sim()
    for path in ("/health", "/v2/health/live", "/v2/health/ready", "/v1/models"):
        assert request(h, "GET", path)[0] == 200, path


# ------------------------------------------------------------ knobs


def test_added_latency_delays_health_and_metrics_by_at_least_that(sim):
    h = sim()
    status, doc = post(h, "/sim/degrade", {"added_latency_ms": 150})
    assert status == 200 and doc["knobs"]["added_latency_ms"] == 150

    for path in ("/health", "/metrics"):
        t0 = time.monotonic()
        assert request(h, "GET", path)[0] == 200
        assert time.monotonic() - t0 >= 0.150, path


def test_tpot_factor_slows_every_token_after_the_first_by_that_factor(sim):
    h = sim(ttft_ms=10, tpot_ms=20)
    status, doc = post(h, "/sim/degrade", {"tpot_factor": 3})
    assert status == 200 and doc["knobs"]["tpot_factor"] == 3

    t0 = time.monotonic()
    complete(h, max_tokens=6)
    assert time.monotonic() - t0 >= 0.010 + 5 * 0.060  # a thermal throttle: tpot x 3, ttft as before
    assert post(h, "/sim/degrade", {"tpot_factor": 0})[0] == 400


def test_hang_stops_tokens_and_admission_while_health_stays_200(sim):
    h = sim(max_running=2, ttft_ms=1, tpot_ms=2)
    with ThreadPoolExecutor(2) as pool:
        running = pool.submit(stream_events, h, "/v1/completions", {"prompt": "x", "max_tokens": 40})
        wait_until(lambda: metrics(h)["vllm:generation_tokens_total"] > 0, TIMEOUT_S, "tokens flowing")
        assert post(h, "/sim/degrade", {"hang": True})[0] == 200
        frozen = metrics(h)["vllm:generation_tokens_total"]

        queued = pool.submit(complete, h, 3)  # a free slot, but a hung engine admits nobody
        wait_until(lambda: metrics(h)["vllm:num_requests_waiting"] == 1, TIMEOUT_S, "new request waiting")
        for path in ("/health", "/v2/health/live", "/v2/health/ready"):
            assert request(h, "GET", path)[0] == 200, path
        time.sleep(0.1)  # 50 tpots: long enough for tokens to show if any were produced
        assert metrics(h)["vllm:generation_tokens_total"] == frozen
        assert not running.done() and not queued.done()

        assert post(h, "/sim/degrade", {"hang": False})[0] == 200
        assert len(running.result(TIMEOUT_S)[1]) == 40 + 1  # all tokens, then [DONE]
        assert queued.result(TIMEOUT_S)["usage"]["completion_tokens"] == 3
    assert metrics(h)["vllm:request_success_total"] == 2


def test_not_ready_makes_only_the_readiness_endpoint_503(sim):
    h = sim()
    post(h, "/sim/degrade", {"not_ready": True})

    assert request(h, "GET", "/v2/health/ready")[0] == 503
    assert request(h, "GET", "/v2/health/live")[0] == 200
    assert request(h, "GET", "/health")[0] == 200

    post(h, "/sim/degrade", {"not_ready": False})
    assert request(h, "GET", "/v2/health/ready")[0] == 200


def test_metrics_off_makes_metrics_disappear(sim):
    h = sim()
    post(h, "/sim/degrade", {"metrics_off": True})
    assert request(h, "GET", "/metrics")[0] == 404

    post(h, "/sim/degrade", {"metrics_off": False})
    assert request(h, "GET", "/metrics")[0] == 200


def test_fill_queue_counts_as_waiting_and_delays_new_requests(sim):
    h = sim(ttft_ms=50, tpot_ms=1, max_waiting=10)
    post(h, "/sim/degrade", {"fill_queue": 3})
    assert metrics(h)["vllm:num_requests_waiting"] == 3

    t0 = time.monotonic()
    complete(h, 1)
    assert time.monotonic() - t0 >= 3 * 0.050 + 0.050  # three phantom prefills, then its own ttft

    post(h, "/sim/degrade", {"fill_queue": 10})  # the queue is at --max-waiting
    status, doc = post(h, "/v1/completions", {"prompt": "x", "max_tokens": 1})
    assert status == 503 and "queue full" in doc["error"]["message"]


def test_kv_usage_is_modelled_from_running_tokens_unless_overridden(sim):
    h = sim(kv_capacity_tokens=1000, ttft_ms=1, tpot_ms=20)
    assert metrics(h)["vllm:kv_cache_usage_perc"] == 0
    with ThreadPoolExecutor(1) as pool:
        busy = pool.submit(complete, h, 20, prompt=" ".join(["w"] * 200))
        # 200 prompt tokens and a few generated ones over a 1000-token cache
        kv = wait_until(lambda: metrics(h)["vllm:kv_cache_usage_perc"], TIMEOUT_S, "kv in use")
        assert 0.2 <= kv <= 0.22

        post(h, "/sim/degrade", {"kv_usage": 0.875})
        assert metrics(h)["vllm:kv_cache_usage_perc"] == 0.875
        post(h, "/sim/degrade", {"kv_usage": None})
        busy.result(TIMEOUT_S)
    assert metrics(h)["vllm:kv_cache_usage_perc"] == 0


def test_die_answers_then_closes_the_server(sim):
    h = sim()
    status, doc = post(h, "/sim/degrade", {"die": True})

    assert status == 200 and doc["knobs"]["die"] is True
    wait_until(lambda: not h.running, TIMEOUT_S, "server thread ended")
    assert refused(h)


@pytest.mark.parametrize(
    "body, field",
    [
        ({"added_latency_ms": -1}, "added_latency_ms"),
        ({"added_latency_ms": "5"}, "added_latency_ms"),
        ({"fill_queue": 1.5}, "fill_queue"),
        ({"fill_queue": True}, "fill_queue"),
        ({"kv_usage": 1.5}, "kv_usage"),
        ({"hang": "yes"}, "hang"),
        ({"not_ready": 1}, "not_ready"),
        ({"metrics_off": None}, "metrics_off"),
        ({"die": 0}, "die"),
        ({"colour": "red"}, "colour"),
        ({"hang": True, "kv_usage": -0.1}, "kv_usage"),  # all or nothing: hang stays off
        ([], "body"),
    ],
)
def test_a_bad_knob_gets_400_naming_it_and_changes_nothing(sim, body, field):
    h = sim()
    before = post(h, "/sim/degrade", {})[1]["knobs"]

    status, doc = post(h, "/sim/degrade", body)

    assert status == 400 and doc["error"].startswith(f"{field}: ")
    assert "\n" not in doc["error"]
    assert json.loads(request(h, "GET", "/sim/state")[2])["knobs"] == before


def test_the_python_api_sets_knobs_like_the_endpoint(sim):
    h = sim(knobs=Knobs(fill_queue=2))
    assert h.state()["engine"]["waiting"] == 2

    assert h.degrade(fill_queue=0, not_ready=True)["knobs"]["not_ready"] is True
    assert request(h, "GET", "/v2/health/ready")[0] == 503
    with pytest.raises(KnobError, match="^fill_queue: "):
        h.degrade(fill_queue=-3)


# ------------------------------------------------------------ heartbeats


def test_the_heartbeat_agent_checks_this_servers_health_and_sends_from_its_address():
    opts = Options(host="198.18.1.2", heartbeat="198.18.1.1:7946", token="0x5eed0001", hb_interval_ms=1)

    cmd = heartbeat_command(opts, 8000, "/run/token")

    assert cmd[:3] == [sys.executable, "-m", "controlplane.agent"]
    args = dict(zip(cmd[3::2], cmd[4::2]))
    assert args == {
        "--router": "198.18.1.1:7946",
        "--service-port": "8000",
        "--token-file": "/run/token",
        "--interval-ms": "1",
        "--check": "http",
        "--check-url": "http://198.18.1.2:8000/health",
        "--source": "198.18.1.2",
    }


def test_heartbeats_flow_to_the_router_while_health_passes_and_stop_with_the_server(sim):
    router = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        router.bind((LOOPBACK, 0))
        router.settimeout(TIMEOUT_S)
        h = sim(heartbeat=f"{LOOPBACK}:{router.getsockname()[1]}", token="0x5eed0001", hb_interval_ms=5)
        agent = h.server.agent

        data, (source, _) = router.recvfrom(64)  # the first beat follows the first passing check
        magic, _, port, seq, epoch, _ = abi.HEARTBEAT.unpack(data)
        assert (magic, port, source) == (abi.HB_MAGIC, h.address[1], LOOPBACK)
        assert data == abi.heartbeat(port, seq, 0x5EED0001, epoch)  # MACed under the backend's key

        h.stop()
        assert agent.poll() is not None  # stopped by its pid with the server
    finally:
        router.close()
