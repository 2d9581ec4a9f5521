"""The demo's workload sends each arrival to both engines or to neither: it skips one while
either engine holds ``--max-outstanding`` requests, so both keep the same workload. The
engine that keeps up then shows gaps in its timeline that it did not cause, and the page
says so beside the legend with the feeder's own counts, in English and in Chinese; while
nothing was skipped the line is hidden. The tiny model, loopback, bounded waits."""

from __future__ import annotations

import re

from tests.browser.conftest import js, server, wait_for

PANELS = "window.minicb.panels"
SHOWN = "!document.getElementById('arrivals').hidden"
TINY = ["--dtype", "float32", "--short", "4", "8", "--long", "16", "24"]


def test_the_page_says_when_arrivals_were_skipped_for_both_engines(tab, tiny_llama_dir):
    page = tab
    args = ["demo", "--model", tiny_llama_dir, *TINY, "--workload", "poisson", "--rate", "40"]
    with server(*args, "--max-outstanding", "2") as url:  # two requests: skipping at once
        page.goto(url)
        wait_for(page, f"{PANELS}.length === 2")
        wait_for(page, SHOWN, 60)
        text = page.locator("#arrivals").inner_text()
        found = re.fullmatch(
            r"arrivals skipped: ([\d,]+) of ([\d,]+), for both engines while either held 2 "
            r"requests \(both keep the same workload; the other's timeline has gaps\)",
            text,
        )
        assert found, text
        skipped, total = (int(g.replace(",", "")) for g in found.groups())
        assert 0 < skipped < total
        page.click("#lang")
        wait_for(page, "document.getElementById('arrivals').textContent.startsWith('跳过')", 10)
        assert "任一引擎持有 2 个请求时" in page.locator("#arrivals").inner_text()
        assert not page.errors, page.errors


def test_the_line_stays_hidden_while_nothing_is_skipped(tab, tiny_llama_dir):
    page = tab
    args = ["demo", "--model", tiny_llama_dir, *TINY, "--workload", "off", "--burst", "4"]
    with server(*args) as url:  # four requests against the default limit of 48
        page.goto(url)
        wait_for(page, f"{PANELS}.length === 2")
        ended = "p.model.order.filter(r => r.endStep != null).length === 4"
        wait_for(page, f"{PANELS}.every(p => {ended})", 60)
        # the frames carried the feeder's counts (written, hidden): none skipped of 4
        text = js(page, "document.getElementById('arrivals').textContent")
        assert text.startswith("arrivals skipped: 0 of 4,"), text
        assert not js(page, SHOWN)
        assert not page.errors, page.errors
