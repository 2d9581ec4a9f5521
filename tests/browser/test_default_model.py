"""The demo on the embedded default model in Chromium: a typed prompt joins both batches and
its real text streams in. Also takes the README's screenshot: it lands in
artifacts/screenshots/ on every run, and replaces docs/images/demo.png when
MINICB_UPDATE_README_SCREENSHOT=1 (so a plain test run leaves the tracked picture alone)."""

import os
import shutil

import pytest

from tests.browser.conftest import ROOT, js, next_frame, server, shot, wait_for

PANELS = "window.minicb.panels"
MINE = f"{PANELS}.map(p => p.model.order.filter(r => r.mine))"


@pytest.mark.slow
def test_a_typed_prompt_streams_real_text_and_the_readme_screenshot(tab):
    page = tab
    args = ["demo", "--max-num-seqs", "4", "--num-kv-blocks", "64", "--burst", "10"]
    args += ["--workload", "off", "--short", "3", "6", "--long", "10", "16"]
    # float32, where greedy tokens do not depend on the batch (bfloat16's can, at near-ties):
    # the typed prompt must read the same in both panels
    args += ["--dtype", "float32"]
    with server(*args) as url:
        page.goto(url)
        wait_for(page, f"{PANELS}.length === 2")
        page.fill("#prompt-text", "What is the capital of France?")
        page.fill("#prompt-max", "8")
        page.click("#prompt-form button[type=submit]")
        wait_for(page, f"{MINE}.every(l => l.length === 1)", 120)
        # the text streams: part of it first, then all of it
        wait_for(page, f"{MINE}[1][0].textAt(1e9).trim().length > 0", 240)
        partial = js(page, f"{MINE}[1][0].tokenIds.length")
        wait_for(page, f"{MINE}[1][0].endStep != null", 300)
        # pause while static batching still works through its queue: the picture for README
        page.click("#pause")
        wait_for(page, "window.minicb.paused === true")
        next_frame(page)
        # hover the typed prompt's row on the continuous panel: its text, TTFT and reasons
        row = js(page, f"{PANELS}[1].timeline.rows.findIndex(r => r.mine)")
        row_h = js(page, f"{PANELS}[1].timeline.rowH")
        box = page.locator("article[data-engine=continuous] canvas.timeline").bounding_box()
        page.mouse.move(box["x"] + box["width"] * 0.55, box["y"] + (row + 0.5) * row_h)
        wait_for(page, "document.querySelector('#tooltip').innerText.includes('France')", 10)
        path = shot(page, "demo-default-model")
        page.click("#resume")
        wait_for(page, f"{MINE}.every(l => l[0].endStep != null)", 300)
        texts = js(page, f"{MINE}.map(l => l[0].textAt(1e9))")
        assert partial >= 1 and all(t.strip() for t in texts)
        assert texts[0] == texts[1]  # greedy: the same words whichever batching ran it
        assert texts[1] in page.inner_text("#mine")
        assert not page.errors
    if os.environ.get("MINICB_UPDATE_README_SCREENSHOT") == "1":
        assert path.stat().st_size < 500_000, "the README's picture should stay small"
        images = ROOT / "docs" / "images"
        images.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, images / "demo.png")
