"""The one record of a request's times: the collector that folds the events
(minicb/telemetry/request_times.py) builds, field for field, the record the engine hands
out with each finished request, plain and with overlap, through preemption and the prefix
cache, with steps of known length on the engine's own clock; and every reader of the
events (metrics, Prometheus, a scenario side, the page's folder) reads those times."""

import dataclasses

import pytest

from minicb import SamplingParams
from minicb.core.events import EngineReset
from minicb.core.request import RequestMetrics
from minicb.scenarios.side_figures import SideRecord
from minicb.server.frames import StepFolder
from minicb.telemetry.kv_state import KVState
from minicb.telemetry.metrics import MetricsCollector
from minicb.telemetry.prometheus import PrometheusMetrics
from minicb.telemetry.request_times import KINDS, RequestTimes, continued
from tests.helpers import add, fake_engine


@pytest.mark.parametrize("overlap", [False, True], ids=["plain", "overlap"])
def test_the_collector_builds_the_record_each_output_carries(overlap):
    engine = fake_engine(
        num_kv_blocks=8, block_size=4, max_num_seqs=3, step_times=[0.1, 0.3, 0.2] * 40,
        overlap_scheduling=overlap,
    )  # fmt: skip
    times = RequestTimes()
    engine.bus.subscribe(times, kinds=KINDS)
    shared = [9] * 8  # two blocks every second request finds cached
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    ids = [engine.add_request(shared + [i] * (1 + i % 3), params) for i in range(4)]
    engine.step()
    ids += [add(engine, 5 + i, 3 + i) for i in range(4)]  # arrive mid-run: busy_s > 0
    outputs = {o.request_id: o.metrics for o in engine.run_until_done()}
    assert sorted(outputs) == ids
    assert sum(m.num_preemptions for m in outputs.values()) > 0  # a small pool preempts
    assert sum(m.num_cached_tokens for m in outputs.values()) > 0
    assert any(m.arrival_busy_s > 0 for m in outputs.values())
    for rid, m in outputs.items():
        assert dataclasses.asdict(times.records[rid]) == dataclasses.asdict(m), rid


def test_the_stamps_keep_the_first_admission_and_the_first_token():
    m = RequestMetrics(1.0, num_prompt_tokens=4)
    m.scheduled(2.0, 16)
    m.scheduled(5.0, 0)  # readmitted after preemption: still queued only once
    m.first_token(3.0, 0.5)
    m.first_token(6.0, 0.9)
    m.ended(7.0)
    assert (m.first_scheduled_time, m.num_cached_tokens) == (2.0, 16)
    assert (m.first_token_time, m.first_token_busy_s, m.finished_time, m.ttft) == (
        3.0, 0.5, 7.0, 2.0
    )  # fmt: skip


def test_a_journey_across_two_engines_keeps_the_first_ones_start():
    prefill = RequestMetrics(1.0, num_prompt_tokens=4, first_scheduled_time=1.5,
                             first_token_time=2.0, num_cached_tokens=4)  # fmt: skip
    decode = RequestMetrics(2.5, num_prompt_tokens=5, first_scheduled_time=2.6,
                            first_token_time=2.7, finished_time=4.0, num_generated_tokens=6,
                            num_preemptions=1)  # fmt: skip
    whole = continued(prefill, decode)
    assert (whole.arrival_time, whole.first_scheduled_time, whole.first_token_time) == (
        1.0, 1.5, 2.0
    )  # fmt: skip
    assert (whole.num_prompt_tokens, whole.num_cached_tokens) == (4, 4)
    assert (whole.finished_time, whole.num_generated_tokens, whole.num_preemptions) == (4.0, 6, 1)


def test_a_reset_starts_an_empty_table_and_a_late_listener_has_no_arrival():
    engine = fake_engine(step_time=0.1)
    first = add(engine, 3, 4)
    engine.step()
    times = RequestTimes()
    engine.bus.subscribe(times, kinds=KINDS)
    engine.run_until_done()
    assert times.records[first].arrival_time is None
    assert times.records[first].finished_time is not None
    times([EngineReset(time=9.0, info={})])
    assert times.records == {}


def test_every_reader_of_the_events_reads_the_engines_times():
    """The metrics summary's records, Prometheus's requests in flight, a scenario side and
    the page's folder all read one record: each request's arrival, first admission, first
    token and end there are its output's, exactly (on a virtual clock with uneven steps)."""
    engine = fake_engine(num_kv_blocks=8, block_size=4, max_num_seqs=3,
                         step_times=[0.1, 0.3, 0.2] * 40)  # fmt: skip
    collector, side, prometheus, heard = MetricsCollector(), SideRecord({}), PrometheusMetrics(), []
    in_flight = {}  # Prometheus's record of each request as its end comes (then forgotten)
    engine.bus.subscribe(
        lambda es: in_flight.update(
            (e.request_id, dataclasses.replace(prometheus.requests.times.records[e.request_id]))
            for e in es
        ),
        kinds=["finished"],
    )  # subscribed first: hears each step before Prometheus does
    for listener in (collector, side, prometheus, heard.extend):
        engine.bus.subscribe(listener)
    folder = StepFolder({"name": "x", **engine.describe(), "requests": []}, KVState())
    ids = [add(engine, 5 + i, 3 + i) for i in range(6)]
    outputs = {o.request_id: o.metrics for o in engine.run_until_done()}
    folder.fold(heard, tokens=False)
    ended = {r["request_id"]: r for r in folder.view()["requests"]}
    assert sorted(outputs) == ids
    for rid, m in outputs.items():
        times = (m.arrival_time, m.first_scheduled_time, m.first_token_time, m.finished_time)
        for record in (collector.requests[(0, rid)].times, side.times.records[rid]):
            assert (record.arrival_time, record.first_scheduled_time, record.first_token_time,
                    record.finished_time) == times  # fmt: skip
        assert (ended[rid]["arrival"], ended[rid]["first_token_time"]) == times[::2]
        live = in_flight[rid]
        assert (live.arrival_time, live.first_scheduled_time, live.first_token_time) == times[:3]
