"""The host's and the device's lanes (viz/lanes.js, issue 35): the demo on the tiny model
with overlap scheduling draws both lanes under each engine's timeline, with the device's
idle share beside them, in both languages."""

from __future__ import annotations

from tests.browser.conftest import js, next_frame, server, shot, wait_for

PANELS = "window.minicb.panels"
ARGS = ["demo", "--max-num-seqs", "4", "--num-kv-blocks", "48", "--burst", "4"]
ARGS += ["--short", "3", "6", "--long", "10", "16", "--delay", "0.02"]
ARGS += ["--no-measure-utilisation", "--overlap-scheduling"]
# Each panel's lanes: shown, its idle share, and how many of its canvas's pixels are painted.
LANES = """() => window.minicb.panels.map(p => {
  const c = p.el.querySelector('canvas.lanes');
  const px = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
  let painted = 0;
  for (let i = 3; i < px.length; i += 4) painted += px[i] > 0;
  return { shown: !c.parentElement.hidden, idle: p.el.dataset.deviceIdle,
           caption: c.parentElement.querySelector('small').innerText, painted };
})"""


def test_the_demo_draws_the_host_and_device_lanes(tab, tiny_llama_dir):
    page = tab
    with server(*ARGS, "--model", tiny_llama_dir) as url:
        page.goto(url)
        wait_for(page, f"{PANELS}.length === 2 && {PANELS}.every(p => p.model.steps.length > 5)")
        wait_for(page, f"{PANELS}.every(p => p.el.querySelector('canvas.lanes'))", 30)
        next_frame(page)
        shot(page, "lanes-overlap-tiny")
        lanes = js(page, LANES)
        for lane in lanes:
            assert lane["shown"] and lane["painted"] > 100, lane
            assert 0 <= float(lane["idle"]) <= 1, lane
            assert "device idle" in lane["caption"], lane
        page.click("#lang")
        wait_for(page, f"({LANES})().every(l => l.caption.includes('设备空闲'))")
        assert not page.errors, page.errors
