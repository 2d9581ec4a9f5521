"""One replica stopped with SIGSTOP cannot hold the others hostage (``serve --replicas 2``,
real replica processes on the tiny model, through the HTTP API).

Before, one engine thread waited on every round trip for up to the 120 s stall timeout:
with one replica stopped, every request (and /metrics) waited for it and /health said ok.
Now, from the moment replica 1 is stopped:

- requests answer within BOUND_S with one engine's greedy tokens (those routed to the
  stopped replica while it is not yet known to be silent go to the other);
- a stream that was running on it ends with an error naming it, within BOUND_S;
- /health names it (200 "degraded") and /metrics says ``replica_up`` 0 for it, within
  BOUND_S;
- it is killed and restarted (the default): it serves again, and requests go to both.

BOUND_S is the replica's silence bound (SILENT_AFTER_S, 3 s) plus room for a loaded
two-core machine; nothing here waits anywhere near the 120 s stall timeout. Slow: two
replica processes start, and one restarts (about 30 s on the shared machine).
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from minicb import LLM, SamplingParams
from minicb.fleet.replica import SILENT_AFTER_S
from minicb.server.serve_command import build_serve
from tests.api.live import live_server, metric

pytestmark = pytest.mark.slow

PROMPTS = [[5, 6, 7, 8], [9, 10], [11] * 40, [5, 6, 7, 8, 1, 2]]
MAX_TOKENS = 6
BOUND_S = SILENT_AFTER_S + 7.0  # seconds, against the old 120 s stall timeout
RESTART_BOUND_S = 120.0  # a fresh process loads the tiny model (bounds a hang only)


@pytest.fixture(scope="module")
def expected(tiny_llama_dir):
    llm = LLM(tiny_llama_dir, dtype="float32", num_kv_blocks=64)
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    return [out.token_ids for out in llm.generate(PROMPTS, params)]


@pytest.fixture(scope="module")
def served(tiny_llama_dir):
    from minicb.cli import build_parser

    argv = ["serve", "--model", tiny_llama_dir, "--replicas", "2", "--dtype", "float32"]
    argv += ["--num-kv-blocks", "64", "--no-measure-utilisation"]
    args: argparse.Namespace = build_parser().parse_args(argv)
    app, loop, fleet, name = build_serve(args)
    loop.start()
    try:
        with live_server(app) as url:
            yield url, fleet, name
    finally:
        for replica in fleet.replicas.values():  # never leave a stopped process behind
            if replica.process.is_alive():
                os.kill(replica.process.pid, signal.SIGCONT)
        fleet.close()


def complete(url: str, model: str, prompt: list[int], timeout: float) -> httpx.Response:
    body = {"model": model, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0}
    body.update(ignore_eos=True, return_token_ids=True)
    return httpx.post(url + "/v1/completions", json=body, timeout=timeout)


def tokens(reply: httpx.Response) -> list[int]:
    assert reply.status_code == 200, reply.text
    return reply.json()["choices"][0]["token_ids"]


def first_named(url: str, model: str, stopped: float) -> tuple[float, dict, float]:
    """Poll /health and /metrics until each says replica 1 is out: the seconds each took
    after the stop, and the /health body then."""
    labels = f'model_name="{model}",replica="replica1"'
    health = metrics = None
    while health is None or metrics is None:
        assert time.monotonic() - stopped < BOUND_S, "replica1 was not named in time"
        if health is None:
            body = httpx.get(url + "/health", timeout=BOUND_S).json()
            if body["replicas"]["replica1"] != "ok":
                health, named = time.monotonic() - stopped, body
        if metrics is None:
            text = httpx.get(url + "/metrics", timeout=BOUND_S).text
            if metric(text, f"minicb:replica_up{{{labels}}}") == 0:
                metrics = time.monotonic() - stopped
        time.sleep(0.05)
    return health, named, metrics


def test_a_stopped_replica_holds_no_one_and_comes_back(served, expected):
    url, fleet, model = served
    # both up; round-robin's next turn is replica 1's
    assert [tokens(complete(url, model, p, 60)) for p in PROMPTS[:3]] == expected[:3]
    victim = fleet.replicas["replica1"]
    routed: list = []
    fleet.bus.subscribe(routed.extend, kinds=["routed"])
    body = {"model": model, "prompt": PROMPTS[1], "max_tokens": 400, "stream": True}
    body["ignore_eos"] = True
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as running:
        lines = running.iter_lines()
        assert next(lines).startswith("data: {")  # its first chunk: it runs on replica 1
        assert [e.replica for e in routed] == [1]
        os.kill(victim.process.pid, signal.SIGSTOP)
        stopped = time.monotonic()
        with ThreadPoolExecutor(len(PROMPTS) + 1) as pool:  # some are routed to replica 1
            watch = pool.submit(first_named, url, model, stopped)
            replies = list(pool.map(lambda p: complete(url, model, p, BOUND_S), PROMPTS))
            answered = time.monotonic() - stopped
            health_s, health, metrics_s = watch.result()
        rest = "\n".join(lines)
    ended = time.monotonic() - stopped
    assert [tokens(r) for r in replies] == expected
    assert answered < BOUND_S
    assert ended < BOUND_S and "replica1" in rest and "engine_error" in rest
    assert health_s < BOUND_S and metrics_s < BOUND_S
    assert health["status"] == "degraded" and health["replicas"]["replica0"] == "ok"
    assert "replica1" in health["replicas"]["replica1"]

    # killed and restarted (the default): it serves again, and gets its turns
    deadline = time.monotonic() + RESTART_BOUND_S
    while httpx.get(url + "/health").json()["replicas"]["replica1"] != "ok":
        assert time.monotonic() < deadline, httpx.get(url + "/health").json()
        time.sleep(0.2)
    assert victim.restarts == 1
    routed.clear()
    assert [tokens(complete(url, model, p, 60)) for p in PROMPTS] == expected
    assert {e.replica for e in routed} == {0, 1}
    text = httpx.get(url + "/metrics").text
    labels = f'model_name="{model}",replica="replica1"'
    assert metric(text, f"minicb:replica_up{{{labels}}}") == 1
    assert metric(text, f"minicb:replica_restarts_total{{{labels}}}") == 1


def test_health_names_a_stopped_idle_replica_within_the_bound(served):
    """Idle, nothing routed to it: it is still named (its heartbeats stop), and taken out
    of rotation before any request could wait on it."""
    url, fleet, model = served
    victim = fleet.replicas["replica0"]
    os.kill(victim.process.pid, signal.SIGSTOP)
    stopped = time.monotonic()
    while httpx.get(url + "/health").json()["replicas"]["replica0"] == "ok":
        assert time.monotonic() - stopped < BOUND_S
        time.sleep(0.1)
    assert time.monotonic() - stopped > SILENT_AFTER_S - 0.5  # a silence, not a guess
    began = time.monotonic()
    assert tokens(complete(url, model, PROMPTS[0], BOUND_S))  # replica 1 answers
    assert time.monotonic() - began < BOUND_S
