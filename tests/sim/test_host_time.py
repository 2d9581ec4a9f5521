"""The host-time term (minicb/sim/host_time.py): without overlap a step takes host + device,
with it max(host, device); the published split gives back its own idle share."""

from __future__ import annotations

import pytest

from minicb.sim.host_time import (
    HostTime,
    _line,
    measure_engine_host_time,
    published_host_time,
    replay,
)


def test_replay_adds_the_host_without_overlap_and_hides_it_with():
    host = HostTime("test", per_step_s=0.001, per_row_s=0.0001, source="by hand")
    steps = [(0.010, 10), (0.001, 90), (0.004, 20)]  # host: 0.002, 0.010, 0.003
    r = replay(steps, host)
    assert r["device_s"] == pytest.approx(0.015) and r["host_s"] == pytest.approx(0.015)
    assert r["serial_s"] == pytest.approx(0.030)
    # max per step (0.010 + 0.010 + 0.004), and the first step's host, hidden behind nothing
    assert r["overlapped_s"] == pytest.approx(0.024 + 0.002)
    assert r["idle_serial"] == pytest.approx(0.5)
    assert r["speedup"] == pytest.approx(0.030 / 0.026)


def test_the_published_split_leaves_the_device_idle_62_percent_without_overlap():
    steps = [(0.02, 100)] * 50
    r = replay(steps, published_host_time(0.02, 100))
    assert r["idle_serial"] == pytest.approx(0.62)
    assert r["speedup"] > 1  # the device's 38 % hides behind the host's 62 %


def test_the_line_through_the_measurements_is_least_squares():
    assert _line([(8, 0.001), (64, 0.0038), (256, 0.0134)]) == pytest.approx((5e-5, 0.0006))


def test_this_engines_host_time_is_measured_from_its_own_step_events():
    host = measure_engine_host_time(batches=(4, 32), steps=3)  # no timing asserted
    assert host.per_step_s >= 0 and "measured" in host.source and "4, 32" in host.source
