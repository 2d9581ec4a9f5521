"""Lessons 12 and 12b, prefill and decode on the same GPUs or apart: the disaggregated
scenario moves every request's KV from the prefill engine to the decode engine as the
data-centre cluster does, frees both pools, keeps each side's time in order, and the
figures both lessons' narration quotes are the run's (issue 34).

Both play the same requests on two simulated H100s (virtual time, under a second each).
"""

import copy
import json

import pytest

from minicb.fleet.kv_transfer import link
from minicb.scenarios import ScenarioError, load_scenario
from minicb.scenarios.handoff import ROLES
from minicb.scenarios.player import arrivals, build_engines, play
from minicb.scenarios.scenario import HERE, Scenario
from minicb.scenarios.side_figures import request_metric, side_metric
from minicb.telemetry.kv_state import KVState

COLOCATED, APART = "12-colocated-prefill-decode", "12b-disaggregated-prefill-decode"


@pytest.fixture(scope="module")
def runs():
    out = {}
    for name in (COLOCATED, APART):
        scenario = load_scenario(name)
        engines = build_engines(scenario)
        out[name] = scenario, play(scenario, engines), engines
    return out


def test_both_lessons_play_the_same_requests_on_the_same_gpus():
    colocated, apart = load_scenario(COLOCATED), load_scenario(APART)
    assert arrivals(colocated) == arrivals(apart)
    assert colocated.runner == apart.runner
    assert [s.engine for s in colocated.sides] == [s.engine for s in apart.sides]
    assert colocated.router == "least-loaded" and apart.link == "NVLink 4"


def test_every_kv_cache_crosses_once_with_the_links_bytes_and_time(runs):
    scenario, result, engines = runs[APART]
    decode = engines["decode0"]
    per_token = decode.runner.profile.model.kv_bytes_per_token(decode.runner.profile.elem_bytes)
    moved = result.records["decode0"].requests["kv_transfer"]
    receiving = [e.request_id for e in moved if e.status == "receiving"]
    done = [e for e in moved if e.status == "done"]
    assert sorted(receiving) == sorted(e.request_id for e in done)
    assert len(done) == len(arrivals(scenario)) == len(set(receiving))
    finished = result.records["decode0"].requests["finished"]
    prompts = {e.request_id: e.num_prompt_tokens for e in finished}
    for e in done:
        tokens = prompts[e.request_id] - 1  # the decode side's prompt holds the first token
        assert e.bytes == tokens * per_token
        assert e.seconds == pytest.approx(link("NVLink 4").seconds(e.bytes))
        assert (e.from_engine, e.to_engine) == ("prefill0", "decode0")


def test_each_side_does_only_its_phase_and_every_request_gets_all_its_tokens(runs):
    scenario, result, _ = runs[APART]
    prefill, decode = result.records["prefill0"], result.records["decode0"]
    assert side_metric(decode, "prefill_tokens") == 0
    assert side_metric(prefill, "prefill_tokens") == sum(len(a.prompt) for a in arrivals(scenario))
    assert all(e.num_output_tokens == 1 for e in prefill.requests["finished"])
    wanted = sorted(a.max_tokens for a in arrivals(scenario))
    assert sorted(e.num_output_tokens + 1 for e in decode.requests["finished"]) == wanted


def test_both_pools_are_free_at_the_end(runs):
    _, _, engines = runs[APART]
    for engine in engines.values():
        kv = engine.kv_snapshot()
        assert not kv.block_tables and kv.num_free == kv.num_blocks
    assert not ROLES[engines["prefill0"]].held


def test_no_request_reaches_the_decode_engine_before_its_prefill_ended(runs):
    _, result, _ = runs[APART]
    ended = sorted(e.time for e in result.records["prefill0"].requests["finished"])
    handed = sorted(e.time for e in result.records["decode0"].requests["arrived"])
    assert len(ended) == len(handed)
    assert all(h >= e for h, e in zip(handed, ended, strict=True))


def test_the_figures_the_narration_quotes_are_the_runs(runs):
    colocated, apart = runs[COLOCATED][1].records, runs[APART][1].records
    mixed_gap = side_metric(colocated["replica-0"], "max_tbt")
    apart_gap = side_metric(apart["decode0"], "max_tbt")
    assert mixed_gap > 4 * apart_gap  # the lesson: prompts stall decodes only when mixed
    together = sum(side_metric(r, "throughput") for r in colocated.values())
    text = runs[APART][0].narration[-1].text["en"]
    assert f"{apart_gap * 1e3:.1f} ms, against {mixed_gap * 1e3:.1f} ms colocated" in text
    assert f"at most {side_metric(apart['decode0'], 'max_ttft') * 1e3:.1f} ms" in text
    assert (f"{side_metric(apart['decode0'], 'throughput'):.0f} on the decode engine against "
            f"{together:.0f} for the two colocated replicas") in text  # fmt: skip
    busy = (apart["prefill0"].steps[-1].busy_s, apart["decode0"].steps[-1].busy_s)
    steps = int(side_metric(apart["prefill0"], "steps"))
    said = f"ran {steps} iterations, busy {busy[0]:.2f} s of the decode engine's {busy[1]:.2f} s"
    assert said in text
    first = runs[COLOCATED][0].narration[0].text["en"]
    chat_gap = request_metric(colocated["replica-0"], "max_tbt", "chat")
    step = side_metric(colocated["replica-0"], "decode_step_s")
    assert f"takes {step * 1e3:.1f} ms here" in first
    assert f"is {chat_gap * 1e3:.1f} ms, {chat_gap / step:.1f} times that" in first


def broken(change: dict) -> dict:
    data = copy.deepcopy(json.loads((HERE / f"{APART}.json").read_text(encoding="utf-8")))
    data.update(change)
    return data


@pytest.mark.parametrize(
    "change, message",
    [
        ({"disaggregated": {"link": "pigeon"}}, "disaggregated.link: link 'pigeon' is not"),
        ({"disaggregated": {"link": "NVLink 4", "hops": 2}}, "disaggregated: unknown field"),
        ({"runner": "real"}, "disaggregated needs a simulated runner"),
        ({"router": "least-loaded"}, "disaggregated and router do not go together"),
        (
            {
                "sides": [
                    {"name": "decode0", "label": {"en": "d", "zh": "d"}},
                    {"name": "prefill0", "label": {"en": "p", "zh": "p"}},
                ]
            },
            "the sides must be named prefill0 then decode0",
        ),
    ],
)
def test_a_broken_disaggregated_scenario_is_named(change, message):
    with pytest.raises(ScenarioError, match=message):
        Scenario.from_dict(broken(change))


def test_the_prefill_engines_map_loses_each_kv_when_it_has_left():
    """Drawn from the prefill engine's events, its KV map ends empty: each release is a
    kv_changes event when the KV has arrived, not left for a step that may never come."""
    scenario = load_scenario(APART)
    engines = build_engines(scenario)
    prefill = engines["prefill0"]
    snapshot, seen = prefill.kv_snapshot_event(), []
    prefill.bus.subscribe(seen.extend, kinds=["step", "kv_changes"])
    play(scenario, engines)
    state = KVState.from_snapshot(snapshot)
    for e in seen:
        state.apply(e.plan.kv_ops if e.kind == "step" else e.kv_ops)
    assert not state.block_tables and not prefill.kv_snapshot().block_tables
    freed = [op[1] for e in seen if e.kind == "kv_changes" for op in e.kv_ops if op[0] == "free"]
    assert sorted(freed) == list(range(len(arrivals(scenario))))  # each prompt's, once
