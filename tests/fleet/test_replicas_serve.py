"""Two real replicas (processes) of the tiny model behind the OpenAI API, as
``minicb serve --replicas 2`` builds them: the tokens through the API equal one engine's
under every router, each decision is a ``routed`` event with its reason, a client that
hangs up frees KV on the replica that holds its request, /metrics labels each replica's
figures, and the KV map a joining page starts from is the replica's. One fleet for the
module: two process starts."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import time

import httpx
import pytest

from minicb import LLM, SamplingParams
from minicb.fleet.fleet import FLEET
from minicb.fleet.router import POLICIES, Router
from minicb.server.serve_command import build_serve
from tests.api.live import live_server, metric
from tests.helpers import wait_for

# Its module fixture starts replicas in their own processes: seconds before the first test.
pytestmark = pytest.mark.slow

PROMPTS = [[5, 6, 7, 8], [9, 10], [11] * 40, [5, 6, 7, 8, 1, 2]]
MAX_TOKENS = 6
OPTIONS = dict(dtype="float32", num_kv_blocks=64)


@pytest.fixture(scope="module")
def expected(tiny_llama_dir):
    llm = LLM(tiny_llama_dir, **OPTIONS)
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    return [out.token_ids for out in llm.generate(PROMPTS, params)]


@pytest.fixture(scope="module")
def served(tiny_llama_dir):
    """``build_serve`` on ``serve --replicas 2`` options: the app, its loop, the fleet."""
    from minicb.cli import build_parser

    argv = ["serve", "--model", tiny_llama_dir, "--replicas", "2", "--dtype", "float32"]
    argv += ["--num-kv-blocks", "64", "--no-measure-utilisation"]
    args: argparse.Namespace = build_parser().parse_args(argv)
    app, loop, fleet, name = build_serve(args)
    assert name == fleet.model_name
    loop.start()
    try:
        with live_server(app) as url:
            yield url, loop, fleet, name
    finally:
        fleet.close()


def complete(url: str, model: str, prompt: list[int], **extra) -> httpx.Response:
    body = {"model": model, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0}
    body.update(ignore_eos=True, return_token_ids=True, **extra)
    return httpx.post(url + "/v1/completions", json=body, timeout=60)


@pytest.mark.parametrize("policy", POLICIES)
def test_tokens_through_the_api_equal_one_engines_under_every_router(served, expected, policy):
    url, loop, fleet, model = served
    loop.call(lambda: fleet.set_policy(policy)).result(10)
    routed: list = []
    fleet.bus.subscribe(routed.extend, kinds=["routed"])
    replies = [complete(url, model, p) for p in PROMPTS]
    fleet.bus.unsubscribe(routed.extend)
    assert [r.status_code for r in replies] == [200] * len(PROMPTS)
    assert [r.json()["choices"][0]["token_ids"] for r in replies] == expected
    for reply in replies:  # the usage a client sums to see what the prefix cache saved
        assert "cached_tokens" in reply.json()["usage"]["prompt_tokens_details"]
    assert [e.policy for e in routed] == [policy] * len(PROMPTS)
    assert all(e.reason.startswith(f"replica {e.replica}: ") for e in routed)
    if policy == "round-robin":
        assert [e.replica for e in routed] == [0, 1, 0, 1]
    ids = [int(r.headers["X-Minicb-Request-Id"]) for r in replies]
    assert [e.request_id for e in routed] == ids  # the id the replica gave the request


def test_the_real_fleet_decides_as_the_router_does_from_the_same_loads(served):
    """The same code decides for real and simulated replicas: what the real fleet's router
    was told (each request's ids and the replicas' loads) replayed into a fresh Router gives
    the same decisions, as tests/fleet/test_simulated_fleet.py checks for simulated ones."""
    url, loop, fleet, model = served
    loop.call(lambda: fleet.set_policy("prefix-aware")).result(10)
    router, told, routes = fleet.router, [], []

    def recorded(request_id, ids, loads):
        told.append((request_id, list(ids), list(loads)))
        routes.append(Router.route(router, request_id, ids, loads))
        return routes[-1]

    router.route = recorded
    for prompt in PROMPTS + PROMPTS[::-1]:  # later ones find their prefixes somewhere
        assert complete(url, model, prompt).status_code == 200
    replay = Router("prefix-aware", len(fleet.replicas), block_size=fleet.config.block_size)
    assert [replay.route(*call) for call in told] == routes
    assert any(r.cached_tokens > 0 for r in routes)  # prefixes were followed, not only loads


def test_a_client_that_hangs_up_frees_kv_on_the_replica_that_holds_its_request(served):
    url, loop, fleet, model = served
    loop.call(lambda: fleet.set_policy("round-robin")).result(10)
    complete(url, model, PROMPTS[1])  # to replica 0: the one cut goes to replica 1
    routed, aborted = [], {name: [] for name in fleet.replicas}
    fleet.bus.subscribe(routed.extend, kinds=["routed"])
    for name, replica in fleet.replicas.items():
        replica.bus.subscribe(aborted[name].extend, kinds=["aborted"])
    body = {"model": model, "prompt": PROMPTS[2], "max_tokens": 50, "stream": True}
    body["ignore_eos"] = True
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as reply:
        next(reply.iter_lines())  # a first chunk: it is running and holds blocks
    holder = f"replica{routed[0].replica}"
    assert holder == "replica1"
    wait_for(lambda: aborted[holder])
    assert [e.request_id for e in aborted[holder]] == [routed[0].request_id]
    assert aborted["replica0"] == []

    def used(name: str) -> int:
        return loop.call(fleet.replicas[name].kv_snapshot).result(10).num_used

    wait_for(lambda: used(holder) == 0)
    assert used("replica0") == 0


def test_metrics_label_each_replica_and_health_is_ok(served):
    url, loop, fleet, model = served
    text = httpx.get(url + "/metrics").text
    for name in fleet.replicas:
        labels = f'model_name="{model}",replica="{name}"'
        assert metric(text, f"minicb:num_requests_running{{{labels}}}") == 0
        assert metric(text, f"minicb:iterations_total{{{labels}}}") > 0
    assert httpx.get(url + "/health").json()["status"] == "ok"
    assert FLEET in loop.fleets


def test_the_map_a_joining_page_starts_from_is_each_replicas_own(served):
    """The KV map a browser's view starts from is kept from the published events (a step
    carries the changes an abort made between steps); once each replica has stepped again
    it equals the replica's own pool, tables and cached blocks."""
    url, loop, fleet, model = served
    loop.call(lambda: fleet.set_policy("round-robin")).result(10)
    for prompt in PROMPTS[:2]:  # a step on each replica, after the abort above
        assert complete(url, model, prompt).status_code == 200
    for replica in fleet.replicas.values():
        mirror = loop.call(replica.kv_snapshot_event).result(10)
        real = loop.call(replica.kv_snapshot).result(10)
        assert mirror.block_tables == real.block_tables
        assert sorted(mirror.cached_blocks) == sorted(real.cached_blocks)
        assert real.cached_blocks  # the prompts above left prefixes cached: a real check


def test_a_prompt_typed_on_the_page_goes_through_the_router(served):
    """The page's prompt box is routed as an API request is: one replica gets it, with a
    routed event, and the page's reply names that replica (no target to choose)."""
    from tests.server.conftest import replies, ws_connect

    url, loop, fleet, model = served
    heard = []
    listener = heard.extend
    for replica in fleet.replicas.values():
        loop.call(lambda r=replica: r.bus.subscribe(listener, ["routed"])).result(10)
    with ws_connect("ws" + url.removeprefix("http") + "/ws") as ws:
        ws.send('{"type": "prompt", "text": "hello", "max_tokens": 2}')
        reply = replies(ws, 1)[0]
        while reply.get("control") != "prompt":  # the hello and views come first
            reply = replies(ws, 1)[0]
    assert reply["type"] != "error", reply
    ((name, rid),) = reply["ids"].items()
    assert name in fleet.replicas
    wait_for(lambda: any(e.request_id == rid for e in heard))
    assert [e.replica for e in heard if e.request_id == rid] == [fleet.replicas[name].index]


def test_generate_from_inside_a_running_event_loop(served, expected):
    """Fleet.generate, the Python API, from a coroutine (as in a Jupyter cell), on the
    fleet the server routes for: the same tokens."""
    url, loop, fleet, model = served
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)

    async def inside() -> list:
        return fleet.generate(PROMPTS[:2], params)

    assert [o.token_ids for o in asyncio.run(inside())] == expected[:2]


def test_serve_trace_records_one_file_per_replica_and_replay_opens_them_all(
    served, expected, tmp_path
):
    """``serve --replicas 2 --trace FILE``: each replica's events in a trace of its own
    (each numbers its own requests), its routing decisions in it, and ``minicb replay
    --serve FILE`` finds the other replica's file beside it."""
    from minicb.cli import replay_traces
    from minicb.telemetry.metrics import compute_metrics
    from minicb.telemetry.trace_files import record_traces, replica_trace_paths

    url, loop, fleet, model = served
    loop.call(lambda: fleet.set_policy("round-robin")).result(10)
    files = replica_trace_paths(str(tmp_path / "fleet.jsonl"), list(fleet.replicas))
    assert [f.name for f in files.values()] == ["fleet.jsonl", "fleet.replica1.jsonl"]
    close = loop.call(lambda: record_traces(dict(fleet.replicas), files, "serve")).result(10)
    replies = [complete(url, model, p) for p in PROMPTS]
    loop.call(close).result(10)  # in the engine thread: never during a delivery to a writer
    assert [r.json()["choices"][0]["token_ids"] for r in replies] == expected
    traces = replay_traces(str(files["replica0"]))
    assert sorted(traces) == ["replica0", "replica1"]
    for index, (name, trace) in enumerate(sorted(traces.items())):
        assert trace.header["panel"] == name and trace.header["model"] == model
        routed = [e for e in trace.events if e.kind == "routed"]
        assert [e.replica for e in routed] == [index, index]  # round-robin: two each
        finished = [e for e in trace.events if e.kind == "finished"]
        assert {e.request_id for e in finished} == {e.request_id for e in routed}
        assert compute_metrics(trace.events)["requests"]["finished"] == 2


def test_a_killed_replica_is_an_error_for_its_client_and_the_server_goes_on(served, expected):
    """Last in the module (it kills replica 1): a streaming client of the killed replica
    gets an error event that names it, within a bounded time; /health stays 200 and names
    it ("degraded"), /metrics counts the failure on that replica, the next requests are
    served, and the replica is restarted (the default) and serves again."""
    url, loop, fleet, model = served
    loop.call(lambda: fleet.set_policy("round-robin")).result(10)
    assert complete(url, model, PROMPTS[0]).status_code == 200  # to replica 0
    victim = fleet.replicas["replica1"]
    body = {"model": model, "prompt": PROMPTS[1], "max_tokens": 500, "stream": True}
    body["ignore_eos"] = True
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as reply:
        lines = reply.iter_lines()
        next(lines)  # a first chunk: replica 1 is mid-run
        os.kill(victim.process.pid, signal.SIGKILL)
        killed = time.monotonic()
        rest = "\n".join(lines)
    assert time.monotonic() - killed < 10
    assert '"code": "engine_error"' in rest or '"code":"engine_error"' in rest
    assert "replica1" in rest and "killed by signal 9" in rest
    health = httpx.get(url + "/health")
    assert health.status_code == 200 and health.json()["status"] == "degraded"
    assert "killed by signal 9" in health.json()["replicas"]["replica1"]
    text = httpx.get(url + "/metrics").text
    failed = f'minicb:engine_failed_steps_total{{model_name="{model}",replica="replica1"}}'
    assert metric(text, failed) == 1
    replies = [complete(url, model, p) for p in PROMPTS[:2]]
    assert [r.json()["choices"][0]["token_ids"] for r in replies] == expected[:2]
    wait_for(lambda: fleet.health()["replica1"] == "ok", timeout=120)  # restarted
    assert victim.restarts == 1 and 1 not in fleet.router.removed
    replies = [complete(url, model, p) for p in PROMPTS]
    assert [r.json()["choices"][0]["token_ids"] for r in replies] == expected
