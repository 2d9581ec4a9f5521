"""The fleet page in Chromium: ``minicb serve --replicas 2 --router prefix-aware`` on the
tiny random model; the page shows one panel per replica, side by side, and the router's
decisions with their reasons above them as requests come through the API. Its screenshot
goes to artifacts/screenshots/, and to docs/images/ when MINICB_UPDATE_DOC_SCREENSHOTS=1."""

import os
import shutil
from pathlib import Path

import httpx

from tests.browser.conftest import js, next_frame, server, shot, wait_for

PANELS = "window.minicb.panels"
DECISIONS = "document.querySelectorAll('#router li')"
LEGEND = "[...document.querySelectorAll('#chart .legendtext')].map(e => e.textContent).join('|')"
IMAGES = Path(__file__).resolve().parents[2] / "docs" / "images"
SYSTEM = [7] * 16  # one block of 16 both conversations share: under half of a prompt


def test_two_replicas_side_by_side_with_the_routers_reasons(tab, tiny_llama_dir):
    args = ["serve", "--model", tiny_llama_dir, "--replicas", "2", "--router", "prefix-aware"]
    args += ["--num-kv-blocks", "64", "--dtype", "float32", "--no-measure-utilisation"]
    with server(*args) as url:
        page = tab
        page.goto(url)
        wait_for(page, f"{PANELS}.length === 2")
        titles = "[...document.querySelectorAll('.panel-title')].map(e => e.textContent)"
        wait_for(page, f"{titles}.join('|') === 'replica 0|replica 1'")  # on the next frame
        model = httpx.get(url + "v1/models").json()["data"][0]["id"]
        prompts = [SYSTEM + [20 + i] * 40 for i in range(2)]  # two conversations
        prompts += [p + [30] * 12 for p in prompts]  # and their next turns
        for k, prompt in enumerate(prompts, start=1):  # one at a time, each drawn before the next
            body = {"model": model, "prompt": prompt, "max_tokens": 12, "ignore_eos": True}
            assert httpx.post(url + "v1/completions", json=body, timeout=60).status_code == 200
            wait_for(page, f"{DECISIONS}.length === {k}")
        reasons = js(page, f"[...{DECISIONS}].map(li => li.textContent)")
        assert all("\u2192 replica" in r for r in reasons)
        # newest first: the second conversation started a new prefix on the other replica,
        # and each later turn went where its conversation's prefix is cached
        replicas = js(page, f"[...{DECISIONS}].map(li => li.dataset.replica)")
        assert replicas == ["1", "0", "1", "0"]
        assert all("prompt tokens cached there" in r for r in reasons[:2])
        assert all("a new prefix" in r for r in reasons[2:])
        heading = js(page, "document.querySelector('#router h3').textContent")
        assert heading.startswith("Router: prefix-aware")
        wait_for(page, f"{PANELS}.every(p => p.model.order.length >= 1)")
        # the occupancy chart names its lines as the panels are titled, not "continuous
        # batching" twice (and, drawn up to date, the screenshot shows the lines)
        wait_for(page, f"{LEGEND} === 'replica 0|replica 1'")
        next_frame(page)
        path = shot(page, "fleet-page")
        assert not page.errors
    if os.environ.get("MINICB_UPDATE_DOC_SCREENSHOTS") == "1":  # else docs/images stays as is
        shutil.copy(path, IMAGES / "fleet-page.png")
