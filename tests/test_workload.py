"""The one workload: the request shape, the length and arrival-time generators, and the
arrival loop's queue (the bench's recipes: tests/bench/test_workloads.py; the loop against
an engine: tests/bench/test_systems.py)."""

import math
import statistics

import pytest

from minicb.bench.recipes import fixed_lengths
from minicb.workload import (
    Arrivals,
    RequestSpec,
    arrival_times,
    describe_arrivals,
    exponential_lengths,
    from_lengths,
)

VOCAB = 49152


def test_arrivals_hand_out_requests_as_the_clock_reaches_them():
    reqs = [RequestSpec([5], 1, arrival=t) for t in (0.0, 1.0, 1.0, 2.5)]
    pending = Arrivals(reqs, start=10.0)
    assert pending and pending.next_time == 10.0
    assert pending.due(9.9) == []
    assert pending.due(10.0) == reqs[:1]
    assert pending.due(11.0) == reqs[1:3]  # both at 1.0, in the order given
    assert pending.next_time == 12.5
    assert pending.due(13.0) == reqs[3:] and not pending and pending.next_time is None


def test_arrivals_draw_an_endless_stream_one_request_ahead():
    drawn = []

    def stream():
        t = 0
        while True:
            t += 1
            drawn.append(t)
            yield RequestSpec([5], 1, arrival=t)

    pending = Arrivals(stream())
    assert drawn == [1]  # the next one is known, nothing further
    assert [r.arrival for r in pending.due(3)] == [1, 2, 3] and drawn == [1, 2, 3, 4]


def test_requests_from_lengths_alone():
    reqs = from_lengths([3, 2, 4], [8, 3, 5], max_tokens=8)
    assert [r.prompt for r in reqs] == [[3, 5, 5], [4, 5], [5, 5, 5, 5]]  # first ids differ
    assert [r.max_tokens for r in reqs] == [8, 8, 8]
    assert [r.output_tokens for r in reqs] == [8, 3, 5]
    assert [r.stops_early for r in reqs] == [False, True, True]
    assert reqs[0].params().ignore_eos and not reqs[1].params().ignore_eos
    exact = from_lengths([2], [6])[0]  # max_tokens defaults to the output length
    assert (exact.max_tokens, exact.output_len, exact.params(0.5).temperature) == (6, None, 0.5)


def test_exponential_lengths_are_capped():
    lengths = exponential_lengths(2000, 128, 32, seed=0)
    assert max(lengths) == 32 and min(lengths) >= 1


def test_with_arrivals_and_head():
    w = fixed_lengths(4, 8, 10, VOCAB)
    late = w.with_arrivals([0.0, 0.5, 1.0, 1.5], "by hand")
    assert [r.arrival for r in late.requests] == [0.0, 0.5, 1.0, 1.5]
    assert not late.all_at_once and late.arrivals == "by hand"
    assert late.prompt_lens == w.prompt_lens
    head = late.head(2, max_tokens=3)
    assert head.output_lens == [3, 3] and head.all_at_once
    with pytest.raises(ValueError, match="3 arrival times for 4 requests"):
        w.with_arrivals([0.0, 1.0, 2.0], "short")
    d = late.describe()
    assert d["output_lens"] == [10] * 4 and d["arrival_times"] == [0.0, 0.5, 1.0, 1.5]


def _gaps(times):
    return [b - a for a, b in zip(times, times[1:], strict=False)]


def test_all_at_once_arrivals():
    assert arrival_times(5) == [0.0] * 5
    assert arrival_times(3, math.inf) == [0.0] * 3
    assert describe_arrivals(None) == "all at once"


@pytest.mark.parametrize("burstiness", [1.0, 0.5, 4.0])
def test_gamma_arrivals_have_the_rate_and_burstiness_asked_for(burstiness):
    rate = 5.0
    times = arrival_times(20001, rate, burstiness, seed=1)
    assert times[0] == 0.0 and times == sorted(times)
    gaps = _gaps(times)
    mean = statistics.fmean(gaps)
    assert mean == pytest.approx(1 / rate, rel=0.03)
    cv2 = statistics.pvariance(gaps) / mean**2  # 1 / burstiness for gamma gaps
    assert cv2 == pytest.approx(1 / burstiness, rel=0.08)
    assert arrival_times(50, rate, burstiness, seed=1) == times[:50]


def test_bad_arrival_arguments_are_refused():
    with pytest.raises(ValueError, match="rate must be positive"):
        arrival_times(3, 0.0)
    with pytest.raises(ValueError, match="burstiness must be positive"):
        arrival_times(3, 1.0, 0.0)
    assert describe_arrivals(2.0) == "Poisson at 2 req/s (seed 0)"
    assert "burstiness 0.5" in describe_arrivals(2.0, 0.5)
