"""Lesson 10 in Chromium: at its first point the host tier's side of the KV map says how
many prefix blocks wait in host memory and the device-only side says nothing of it.

The lesson is written for the embedded model; here the same file is played on a simulated
L4 (its runner changed, nothing else), so the test needs no weights and takes seconds."""

import json

from minicb.scenarios.scenario import HERE
from tests.browser.conftest import js, server, wait_for

PANELS = "window.minicb.panels"


def test_the_kv_map_shows_the_prefixes_in_host_memory(tab, tmp_path):
    data = json.loads((HERE / "10-prefix-host-tier.json").read_text(encoding="utf-8"))
    data["runner"] = "L4:llama-3.1-8b"
    path = tmp_path / "10-prefix-host-tier.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    page = tab
    with server("demo", "--scenario", str(path), "--paused") as url:
        page.goto(url)
        wait_for(page, f"{PANELS}.length === 2")
        js(page, "window.minicb.send({type: 'speed', delay_s: 0})")
        page.click("#lesson-next")
        wait_for(page, "document.querySelector('#lesson-text').dataset.index === '0'", 90)
        figures = f"{PANELS}.map(p => p.el.querySelector('.kv-figures').textContent)"
        wait_for(page, f"{figures}[1].includes('prefixes in host memory')")
        device_only, host_tier = js(page, figures)
        assert "host memory" not in device_only
        held = int(host_tier.split("prefixes in host memory")[1].split()[0])
        assert held >= 28  # at least one 448-token history (28 blocks) waits there
    assert not page.errors, page.errors
