"""The simulated demo draws the idle gaps live (issue 35): ``minicb demo --simulate
H100:llama-3.1-8b`` with the host-time term (minicb/sim/host_time.py, here a given 80 us
per row, so that the check does not depend on this machine's load) draws the host's and the
device's lanes under the continuous panel with a nonzero idle share once its batch is
large; with ``--overlap-scheduling`` (modelled by the simulated GPU: each step lasts the
longer of host and device) the idle share is smaller. Both pages are screenshotted (their
lanes side by side in artifacts/screenshots/simulated-overlap-lanes.png; docs/images/
keeps the one a person looked at).
"""

from __future__ import annotations

from tests.browser.conftest import SHOTS, js, next_frame, server, wait_for

PANELS = "window.minicb.panels"
ARGS = ["demo", "--simulate", "H100:llama-3.1-8b", "--paused", "--workload", "off"]
ARGS += ["--burst", "600", "--speed", "0.5"]  # half speed: the full batch lasts ~10 s
ARGS += ["--short", "32", "96", "--long", "96", "192", "--host-us-per-row", "80"]
FULL = 200  # rows in the continuous batch at the moment of reading
LANES = """() => { const p = window.minicb.panels[1];
  const c = p.el.querySelector('canvas.lanes');
  const px = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
  const half = px.length / 2; let host = 0, device = 0;  // painted pixels per lane (row)
  for (let i = 3; i < px.length; i += 4) if (px[i] > 0) { if (i < half) host++; else device++; }
  return { shown: !c.parentElement.hidden, idle: Number(p.el.dataset.deviceIdle),
           caption: c.parentElement.querySelector('small').innerText, host, device,
           rows: p.model.steps.at(-1).useful };
}"""


def _lanes(page, *extra: str, shot_name: str) -> dict:
    with server(*ARGS, *extra) as url:
        page.goto(url)
        wait_for(page, f"{PANELS}.length === 2")
        page.click("#resume")  # the burst arrives on the first round, with the page watching
        full = f"{PANELS}[1].model.steps.slice(-48).every(s => s.useful >= {FULL})"
        wait_for(page, f"{PANELS}[1].model.steps.length > 60 && {full}", 180)
        wait_for(page, f"{PANELS}[1].el.querySelector('canvas.lanes')", 30)
        next_frame(page)
        lanes = js(page, LANES)
        SHOTS.mkdir(parents=True, exist_ok=True)
        block = page.evaluate_handle(f"{PANELS}[1].el.querySelector('.lanes-block')")
        block.as_element().screenshot(path=str(SHOTS / f"{shot_name}.png"))
        assert not page.errors, page.errors
    return lanes


def test_the_simulated_page_draws_the_idle_gaps_and_what_overlap_recovers(tab):
    serial = _lanes(tab, shot_name="simulated-lanes-serial")
    overlapped = _lanes(tab, "--overlap-scheduling", shot_name="simulated-lanes-overlap")
    for lanes in (serial, overlapped):
        assert lanes["shown"], lanes
        assert lanes["host"] > 200 and lanes["device"] > 200, lanes  # both lanes drawn
        assert "device idle" in lanes["caption"], lanes
    assert serial["idle"] > 0.1, serial
    assert overlapped["idle"] < serial["idle"], (serial, overlapped)
    _side_by_side(tab)


def _side_by_side(page) -> None:
    """Both pages' lanes, one above the other and labelled, in one picture (drawn by the
    browser: no imaging library needed)."""
    import base64

    def img(name: str) -> str:
        data = base64.b64encode((SHOTS / f"{name}.png").read_bytes()).decode()
        return f'<img src="data:image/png;base64,{data}" style="display:block">'

    page.set_viewport_size({"width": 680, "height": 240})
    page.set_content(
        '<body style="margin:8px;font:13px sans-serif;background:#fff">'
        "<p>minicb demo --simulate H100:llama-3.1-8b --host-us-per-row 80, 256 slots: "
        f"without overlap</p>{img('simulated-lanes-serial')}"
        f"<p>with --overlap-scheduling (modelled)</p>{img('simulated-lanes-overlap')}</body>"
    )
    page.screenshot(path=str(SHOTS / "simulated-overlap-lanes.png"), full_page=True)
