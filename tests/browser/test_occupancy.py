"""GPU occupancy on the page: beside slot occupancy, a chart of each iteration's bandwidth
and FLOP utilisation, one line per engine and measure. A simulated GPU's steps carry them
(the step-time model's), so the chart appears with values in (0, 1]; a real model runner's
carry them measured against this machine's probes (the demo's default), drawn at most at
100 % and labelled with the probed rates; with --no-measure-utilisation the card stays
hidden."""

from __future__ import annotations

from minicb import LLMEngine, SamplingParams
from minicb.core.config import EngineConfig
from minicb.core.runner.model_runner import ModelRunner
from minicb.telemetry.trace import TraceWriter, trace_header
from minicb.utilisation.occupancy import UtilisationRunner
from minicb.utilisation.probes import MachineRates
from tests.browser.conftest import js, next_frame, server, shot, wait_for

PANELS = "window.minicb.panels"
ARGS = ["demo", "--simulate", "H100:llama-3.1-8b", "--paused", "--workload", "off"]
ARGS += ["--burst", "64", "--short", "8", "32", "--long", "32", "96"]
# each utilisation trace: its name and the values it draws (in %; null where unknown)
TRACES = """() => (document.getElementById('util-chart').data || [])
  .map(t => ({ name: t.name, y: t.y.filter(v => v != null) }))"""
CARD_SHOWN = "!document.getElementById('util-card').hidden"


def test_a_simulated_gpus_utilisation_is_charted_for_both_engines(tab):
    page = tab
    with server(*ARGS) as url:
        page.goto(url)
        wait_for(page, f"{PANELS}.length === 2")
        assert not js(page, CARD_SHOWN)  # no step yet: nothing to chart
        page.click("#resume")
        wait_for(page, f"{PANELS}.every(p => p.model.steps.length > 20)", 120)
        wait_for(page, f"{CARD_SHOWN} && ({TRACES})().length === 4", 60)
        next_frame(page)
        traces = js(page, TRACES)
        shot(page, "occupancy-simulated")
        names = [t["name"] for t in traces]
        for engine in ("static", "continuous"):  # en labels: "static · memory bandwidth", ...
            assert sum(n.lower().startswith(engine) for n in names) == 2, names
        for trace in traces:
            assert trace["y"], trace["name"]
            assert all(0 < v / 100 <= 1 for v in trace["y"]), trace
        assert page.locator("#util-card h3").inner_text().startswith("GPU utilisation")
        page.click("#lang")  # both languages label it
        wait_for(page, "document.querySelector('#util-card h3').innerText.includes('利用率')")
        assert not page.errors, page.errors


REAL = ["demo", "--max-num-seqs", "4", "--num-kv-blocks", "48", "--burst", "4"]
REAL += ["--short", "3", "6", "--long", "10", "16", "--delay", "0.02"]
# each utilisation trace's drawn values and the measured ones kept for the hover (in %)
DRAWN = """() => document.getElementById('util-chart').data.map(t => ({
  y: t.y.filter(v => v != null), raw: t.customdata.filter(v => v != null) }))"""


def test_the_real_engines_utilisation_is_measured_against_the_probes(tab, tiny_llama_dir):
    page = tab
    with server(*REAL, "--model", tiny_llama_dir) as url:
        page.goto(url)
        wait_for(page, f"{PANELS}.length === 2 && {PANELS}.every(p => p.model.steps.length > 5)")
        # Each side's traces draw once its first measured step has come in, not with the card.
        drawn = f"({TRACES})().length === 4 && ({TRACES})().every(t => t.y.length > 0)"
        wait_for(page, f"{CARD_SHOWN} && {drawn}", 60)
        next_frame(page)
        shot(page, "occupancy-real")
        assert (
            page.locator("#util-title")
            .inner_text()
            .startswith("Utilisation per iteration, measured")
        )
        rates = page.locator("#util-rates").inner_text()
        assert "GB/s" in rates and "GFLOP/s" in rates, rates
        traces = js(page, DRAWN)
        assert all(t["y"] and all(0 < v <= 100 for v in t["y"]) for t in traces), traces
        above = any(v > 100 for t in traces for v in t["raw"])  # a tiny model: in cache
        assert js(page, "!document.querySelector('#util-card .cap-note').hidden") == above
        page.click("#lang")
        wait_for(page, "document.getElementById('util-title').innerText.includes('实测')")
        assert "本机探测" in page.locator("#util-rates").inner_text()
        assert not page.errors, page.errors


def test_a_runner_that_does_not_know_it_shows_no_chart(tab, tiny_llama_dir):
    page = tab
    args = [*REAL, "--model", tiny_llama_dir, "--no-measure-utilisation"]
    with server(*args) as url:
        page.goto(url)
        wait_for(page, f"{PANELS}.length === 2 && {PANELS}.every(p => p.model.steps.length > 5)")
        next_frame(page)
        assert js(page, "!!document.getElementById('chart').data")  # slot occupancy is drawn
        assert not js(page, CARD_SHOWN)
        assert not page.errors, page.errors


def test_a_step_above_the_probed_roofline_is_drawn_at_100_and_explained(
    tab, tiny_llama_dir, tmp_path
):
    # A probe that read very low (1 MB/s, 1 MFLOP/s: a machine busy at start-up) puts every
    # step of the tiny model far above it; replayed, the page caps the line and says why.
    config = EngineConfig.from_kwargs(
        device="cpu", dtype="float32", num_kv_blocks=32, measure_utilisation=True
    )
    rates = MachineRates(copy_bandwidth=1e6, matmul_flops=1e6)
    runner = UtilisationRunner(ModelRunner(tiny_llama_dir, config), rates)
    engine = LLMEngine(config=config, runner=runner)
    path = tmp_path / "above.jsonl"
    writer = TraceWriter(path, trace_header(engine, command="demo", panel="continuous"))
    engine.bus.subscribe(writer)
    engine.add_request([5, 6, 7, 8], SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True))
    engine.run_until_done()
    writer.close()
    page = tab
    with server("replay", str(path), "--serve") as url:
        page.goto(url)
        wait_for(page, f"{PANELS}.length === 1 && window.minicb.replay !== null")
        wait_for(page, f"{CARD_SHOWN} && ({TRACES})().length === 2", 60)
        next_frame(page)
        traces = js(page, DRAWN)
        assert all(max(t["raw"]) > 100 and max(t["y"]) == 100 for t in traces), traces
        assert js(page, "!document.querySelector('#util-card .cap-note').hidden")
        rates_text = page.locator("#util-rates").inner_text()  # the trace's header names them
        assert rates_text.startswith("Probed on this machine") and "GFLOP/s" in rates_text
        assert not page.errors, page.errors
