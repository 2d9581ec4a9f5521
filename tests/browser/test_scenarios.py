"""Every scenario in Chromium: ``minicb demo --scenario NAME`` loads, runs to its first
narration point, highlights the rows that point names, shows its text in English and in
Chinese, and goes on through every point to the end with no error in the console.

Scenarios on a simulated GPU run here by default (no weights, a few seconds each); those
on the embedded model load it and are marked slow. A screenshot of each first point goes
to artifacts/screenshots/scenario-NAME.png (docs/images/ holds copies, see teaching.md).
"""

from __future__ import annotations

import pytest

from minicb.scenarios import load_scenario, scenario_names
from tests.browser.conftest import js, next_frame, server, shot, wait_for

PANELS = "window.minicb.panels"


def cases() -> list:
    return [
        pytest.param(
            name, id=name, marks=[] if load_scenario(name).simulated else [pytest.mark.slow]
        )
        for name in scenario_names()
    ]


def text_shown(page) -> str:
    return page.locator("#lesson-text").inner_text().strip()


@pytest.mark.parametrize("name", cases())
def test_scenario_runs_its_lesson_in_both_languages(tab, name):
    page, scenario = tab, load_scenario(name)
    console: list[str] = []
    page.on("console", lambda m: console.append(m.text) if m.type == "error" else None)
    with server("demo", "--scenario", name, "--paused") as url:
        page.goto(url)
        wait_for(page, f"{PANELS}.length === 2")
        js(page, "window.minicb.send({type: 'speed', delay_s: 0})")  # no time to watch here
        assert page.locator("#lesson").is_visible()
        assert not page.locator("#sim-picker").is_visible()  # the scenario fixes the runner
        assert page.locator("#lesson-title").inner_text() == scenario.title["en"]
        labels = [page.locator(".panel-title").nth(i).inner_text() for i in range(2)]
        assert labels == [s.label["en"] for s in scenario.sides]
        page.click("#lesson-next")  # runs to the first point
        wait_for(page, "document.querySelector('#lesson-text').dataset.index === '0'", 90)
        first = scenario.narration[0]
        assert text_shown(page) == first.text["en"]
        assert js(page, "window.minicb.paused")
        lit_sides = [s.name for s in scenario.sides if first.highlight.side in (None, s.name)]
        for i, side in enumerate(scenario.sides):
            lit = js(page, f"{PANELS}[{i}].el.dataset.lit || ''")
            if first.highlight.requests and side.name in lit_sides:
                assert lit.strip(), f"{side.name}: no row highlighted"
                drawn = js(page, f"{PANELS}[{i}].model.order.filter(r => r.lit).length")
                assert drawn == len(lit.split())
            else:
                assert not lit.strip()
        # the occupancy chart redraws a few times a second: the picture waits for its lines
        wait_for(page, "(document.querySelector('#chart').data || []).some(t => t.x.length)")
        next_frame(page)
        shot(page, f"scenario-{name}")
        page.click("#lang")
        assert text_shown(page) == first.text["zh"]
        assert page.locator("#lesson-title").inner_text() == scenario.title["zh"]
        page.click("#lang")
        assert text_shown(page) == first.text["en"]
        for k in range(1, len(scenario.narration)):
            page.click("#lesson-next")
            wait_for(page, f"document.querySelector('#lesson-text').dataset.index === '{k}'", 120)
            assert text_shown(page) == scenario.narration[k].text["en"]
        count = page.locator("#lesson-count").inner_text()
        assert count == f"{len(scenario.narration)} / {len(scenario.narration)}"
        page.click("#lesson-back")
        assert (
            text_shown(page)
            == scenario.narration[-2 if len(scenario.narration) > 1 else 0].text["en"]
        )
    assert not page.errors, page.errors
    assert not console, console


SIMULATED = "04b-recompute-vs-swap"  # its first point fires within a few rounds


def run_to_first_point(page, name: str, timeout_s: float = 90, start: bool = True) -> None:
    """With lesson ``name`` just loaded: its title and panels shown, then run to point 0
    (``start``: press Next; a lesson chosen from the menu starts by itself)."""
    scenario = load_scenario(name)
    wait_for(
        page, f"document.querySelector('#lesson-title').textContent === {scenario.title['en']!r}"
    )
    labels = [s.label["en"] for s in scenario.sides]
    wait_for(page, f"[...document.querySelectorAll('.panel-title')].map(e => e.textContent)"
                   f".join('|') === {'|'.join(labels)!r}")  # fmt: skip
    wait_for(
        page, f"{PANELS}.every(p => p.model.info.simulated === {str(scenario.simulated).lower()})"
    )
    assert not page.locator("#sim-picker").is_visible()
    if start:
        page.click("#lesson-next")
    wait_for(page, "document.querySelector('#lesson-text').dataset.index === '0'", timeout_s)
    assert text_shown(page) == scenario.narration[0].text["en"]


def test_a_simulated_lesson_hides_the_gpu_picker_a_free_demo_shows_it(tab):
    page = tab
    with server("demo", "--scenario", SIMULATED, "--paused") as url:
        page.goto(url)
        wait_for(page, f"{PANELS}.length === 2")
        assert js(page, f"{PANELS}.every(p => p.model.info.simulated)")
        run_to_first_point(page, SIMULATED)
    free = ["demo", "--simulate", "H100:llama-3.1-8b", "--paused", "--workload", "off"]
    with server(*free) as url:  # leaving the lesson for a free simulated demo
        page.goto(url)
        wait_for(page, f"{PANELS}.length === 2")
        assert page.locator("#sim-picker").is_visible()
        assert not page.locator("#lesson").is_visible()
    assert not page.errors, page.errors


@pytest.mark.slow
def test_the_menu_switches_real_then_simulated_then_real(tab):
    """The model is loaded once: the second real lesson plays on it again."""
    page = tab
    console: list[str] = []
    page.on("console", lambda m: console.append(m.text) if m.type == "error" else None)
    with server("demo", "--scenario", "01-static-vs-continuous", "--paused") as url:
        page.goto(url)
        wait_for(page, f"{PANELS}.length === 2")
        js(page, "window.minicb.send({type: 'speed', delay_s: 0})")
        run_to_first_point(page, "01-static-vs-continuous")
        for name in (SIMULATED, "03-chunked-prefill"):
            page.select_option("#lesson-pick", name)
            run_to_first_point(page, name, timeout_s=180, start=False)
            assert js(page, "document.querySelector('#lesson-pick').value") == name
    assert not page.errors, page.errors
    assert not console, console


def test_the_disaggregated_lesson_draws_each_transfer_and_leaves_no_strip_behind(tab):
    """Lesson 12b: the strip between the prefill and the decode engine lists the first
    chat's KV transfer (its blocks, bytes and time); the menu's next lesson, colocated,
    has no transfers and the strip is gone."""
    page, done = tab, "document.querySelectorAll('#transfers li[data-status=\"done\"]')"
    with server("demo", "--scenario", "12b-disaggregated-prefill-decode", "--paused") as url:
        page.goto(url)
        wait_for(page, f"{PANELS}.length === 2")
        js(page, "window.minicb.send({type: 'speed', delay_s: 0})")
        run_to_first_point(page, "12b-disaggregated-prefill-decode")
        assert js(page, "document.querySelector('#settings-form').hidden")  # refused here
        wait_for(page, f"{done}.length >= 1")
        first = js(page, f"{done}[{done}.length - 1].textContent")
        assert first.startswith("prefill0 \u2192 decode0")
        assert first.endswith("5 blocks, 8.39 MB in 0.027 ms")  # 64 tokens of KV over NVLink 4
        order = js(page, "[...document.querySelector('#panels').children].map(e => e.id)")
        assert order[1] == "transfers"
        for k in (1, 2):  # to the end: every KV has left the prefill engine's map
            page.click("#lesson-next")
            wait_for(page, f"document.querySelector('#lesson-text').dataset.index === '{k}'")
        assert js(page, f"{PANELS}[0].model.kv.tables.size") == 0
        assert js(page, f"{done}.length") == 10
        page.select_option("#lesson-pick", "12-colocated-prefill-decode")
        run_to_first_point(page, "12-colocated-prefill-decode", start=False)
        assert js(page, "document.querySelector('#transfers') === null")
        assert not js(page, "document.querySelector('#settings-form').hidden")
    assert not page.errors, page.errors
