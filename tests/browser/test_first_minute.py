"""The first minute of `make demo` teaches the headline (issue 36): a newcomer who opens the
page and does nothing sees continuous batching keep its batch fuller of useful rows than
static batching under the same load, and the latency gap. The default workload is the
looping opening (a burst of three times the slots, again each time both engines are done),
so no option is passed here but the model.

Useful slot occupancy is the occupancy chart's own measure (useful rows / slots, per
iteration), averaged over each panel's iterations of its first minute on its own clock
(`ownEnd`, the seconds of its own steps: the other side's steps, run by the same thread in
between, are not counted)."""

from __future__ import annotations

import os
import shutil

import pytest

from tests.browser.conftest import ROOT, js, next_frame, server, shot, wait_for

PANELS = "window.minicb.panels"
# per panel: [name, mean useful occupancy over its first minute, iterations counted]
FIRST_MINUTE = f"""() => {PANELS}.map(p => {{
  const steps = p.model.steps.filter(s => s.slotsLimit && s.ownEnd <= 60);
  const occ = steps.map(s => s.useful / s.slotsLimit);
  return [p.name, occ.reduce((a, b) => a + b, 0) / Math.max(occ.length, 1), occ.length];
}})"""
TTFT_P50 = f"""() => {PANELS}.map(p => p.el.querySelector('[data-k=ttft50]')?.innerText)"""


def occupancy(page) -> dict[str, float]:
    rows = js(page, FIRST_MINUTE)
    return {name: occ for name, occ, _ in rows}


def test_the_opening_shows_continuous_batching_fuller_than_static(tab, tiny_llama_dir):
    page = tab
    with server("demo", "--model", tiny_llama_dir) as url:
        page.goto(url)
        wait_for(page, f"{PANELS}.length === 2")
        # both sides through the opening at least once (static's 24 take about 130 steps)
        wait_for(page, f"{PANELS}.every(p => p.model.steps.length > 150)", 120)
        wait_for(page, f"{PANELS}.every(p => p.model.order.length >= 48)", 120)
        next_frame(page)
        occ = occupancy(page)
        assert occ["continuous"] > 1.3 * occ["static"], occ
        assert js(page, "!!document.getElementById('chart').data")  # the occupancy chart
        assert not page.errors, page.errors


@pytest.mark.slow
def test_the_first_minute_on_the_default_model_and_its_screenshots(tab):
    """The default model, as `make demo` starts it: after a minute of doing nothing, the
    occupancy and the TTFT gap, and the pictures for docs/images/ (English and Chinese),
    copied there when MINICB_UPDATE_DOC_SCREENSHOTS=1."""
    page = tab
    with server("demo") as url:
        page.goto(url)
        wait_for(page, f"{PANELS}.length === 2", 120)
        wait_for(page, f"{PANELS}.every(p => p.model.steps.length > 0)", 180)
        page.wait_for_timeout(60_000)  # the newcomer's first minute, hands off
        page.click("#pause")
        wait_for(page, "window.minicb.paused === true")
        next_frame(page)
        occ = occupancy(page)
        counted = {name: n for name, _, n in js(page, FIRST_MINUTE)}
        assert all(n > 20 for n in counted.values()), counted
        assert occ["continuous"] > 1.3 * occ["static"], occ
        english = shot(page, "demo-first-minute")
        page.click("#lang")
        wait_for(page, "document.documentElement.lang.startsWith('zh')", 10)
        next_frame(page)
        chinese = shot(page, "demo-first-minute-zh")
        assert not page.errors, page.errors
    print("first minute, mean useful occupancy:", occ, "iterations:", counted)
    if os.environ.get("MINICB_UPDATE_DOC_SCREENSHOTS") == "1":
        for path in (english, chinese):
            assert path.stat().st_size < 600_000, "keep the docs' pictures small"
            shutil.copy(path, ROOT / "docs" / "images" / path.name)
