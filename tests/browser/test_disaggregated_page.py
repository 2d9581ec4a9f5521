"""The disaggregated page in Chromium: ``minicb serve --disaggregate 1:1`` on the tiny
random model; the page shows the prefill engine's and the decode engine's panels, titled by
role, and draws every KV transfer between them (from the prefill engine to the decode
engine: blocks, bytes, milliseconds) as requests come through the API. Its screenshot goes
to artifacts/screenshots/, and to docs/images/ when MINICB_UPDATE_DOC_SCREENSHOTS=1."""

import os
import shutil
from pathlib import Path

import httpx

from tests.browser.conftest import js, next_frame, server, shot, wait_for

PANELS = "window.minicb.panels"
DONE = "document.querySelectorAll('#transfers li[data-status=\"done\"]')"
IMAGES = Path(__file__).resolve().parents[2] / "docs" / "images"


def test_a_transfer_is_drawn_between_the_prefill_and_decode_engines(tab, tiny_llama_dir):
    args = ["serve", "--model", tiny_llama_dir, "--disaggregate", "1:1"]
    args += ["--num-kv-blocks", "64", "--dtype", "float32", "--no-measure-utilisation"]
    with server(*args) as url:
        page = tab
        page.goto(url)
        wait_for(page, f"{PANELS}.length === 2")
        titles = "[...document.querySelectorAll('.panel-title')].map(e => e.textContent)"
        wait_for(page, f"{titles}.sort().join('|') === 'decode engine 0|prefill engine 0'")
        # a served fleet has no workload for the page to set (its loop's feeder is the
        # fleet's own hand-off work, which the page once took for the demo's workload)
        assert js(page, "document.getElementById('workload-form').hidden")
        model = httpx.get(url + "v1/models").json()["data"][0]["id"]
        prompts = [[5 + i] * (20 + 12 * i) for i in range(3)]  # 1, 2 and 4 blocks of KV
        for k, prompt in enumerate(prompts, start=1):
            body = {"model": model, "prompt": prompt, "max_tokens": 12, "ignore_eos": True}
            assert httpx.post(url + "v1/completions", json=body, timeout=60).status_code == 200
            wait_for(page, f"{DONE}.length === {k}")
        # the KV has left the prefill engine: its map shows none held (kv_changes), though
        # it runs no step after the last send
        wait_for(page, f"{PANELS}.find(p => p.name === 'prefill0').model.kv.tables.size === 0")
        rows = js(page, f"[...{DONE}].map(li => li.textContent)")
        assert all(r.startswith("prefill0 \u2192 decode0") for r in rows)
        what = js(page, f"[...{DONE}].map(li => li.querySelector('.transfer-what').textContent)")
        assert [w.split()[0] for w in what] == ["3", "2", "2"]  # blocks, newest first
        assert all(" kB in " in w and w.endswith(" ms") for w in what)
        # the strip stands between the two panels' timelines
        order = js(
            page,
            "[...document.querySelector('#panels').children].map(e => e.id || e.dataset.engine)",
        )
        assert order[1] == "transfers" and len(order) == 3
        legend = "[...document.querySelectorAll('#chart .legendtext')].map(e => e.textContent)"
        wait_for(page, f"{legend}.sort().join('|') === 'decode engine 0|prefill engine 0'")
        next_frame(page)
        path = shot(page, "disaggregated-page")
        assert not page.errors
    if os.environ.get("MINICB_UPDATE_DOC_SCREENSHOTS") == "1":  # else docs/images stays as is
        shutil.copy(path, IMAGES / "disaggregated-page.png")
