"""The live demo in Chromium, on the tiny random model: rows come and go on both panels,
counters move, single step advances exactly one iteration and lists its decisions, the KV
map changes, a typed prompt becomes a row whose tokens stream in, the language switches."""

import time
from urllib.parse import urlparse

import pytest

from tests.browser.conftest import SHOTS, js, next_frame, server, shot, wait_for

PANELS = "window.minicb.panels"
PANELS_TEXT = "document.querySelector('#panels').innerText"
DONE = "(p => Number(p.el.querySelector('dd[data-c=done]').textContent))"


@pytest.fixture(scope="module")
def demo_url(tiny_llama_dir):
    args = ["demo", "--model", tiny_llama_dir, "--max-num-seqs", "4", "--num-kv-blocks", "48"]
    args += ["--burst", "8", "--rate", "1.5", "--short", "3", "8", "--long", "12", "24"]
    SHOTS.mkdir(parents=True, exist_ok=True)  # the server's terminal goes to a log beside it
    with server(*args, "--delay", "0.05") as url:
        yield url


def terminal(url: str) -> list[str]:
    """What the demo at ``url`` has printed so far (conftest.server's log of it)."""
    path = SHOTS.parent / f"server-{urlparse(url).port}.log"
    return path.read_text().splitlines()


def panel_state(page):
    return js(
        page,
        f"""{PANELS}.map(p => ({{
            name: p.name, step: p.model.lastStep, rows: p.model.order.length,
            left: p.model.order.filter(r => r.endStep != null).length,
            done: p.el.querySelector('dd[data-c=done]').textContent,
            toks: p.el.querySelector('dd[data-c=toks]').textContent,
            kvUsed: Number(p.el.dataset.kvUsed || 0),
            kv: p.el.querySelector('canvas.kvmap').toDataURL(),
        }}))""",
    )


def test_rows_appear_and_leave_on_both_panels_and_counters_move(tab, demo_url):
    page = tab
    page.goto(demo_url)
    wait_for(page, f"{PANELS}.length === 2")
    assert js(page, f"{PANELS}.map(p => p.name)") == ["static", "continuous"]
    wait_for(page, f"{PANELS}.every(p => p.model.order.filter(r => r.endStep != null).length >= 3)")
    first = panel_state(page)
    wait_for(page, f"{PANELS}.every(p => p.model.lastStep > {max(s['step'] for s in first)} + 5)")
    # the counters refresh a few times a second: wait until one shows more requests done
    done_before = [int(s["done"]) for s in first]
    wait_for(page, f"{PANELS}.some((p, i) => {DONE}(p) > {done_before}[i])")
    later = panel_state(page)
    for a, b in zip(first, later, strict=True):
        assert b["rows"] >= a["rows"] and b["left"] > 0
        assert int(b["done"]) >= 3 and b["toks"] != "0.0"
    assert any(int(b["done"]) > int(a["done"]) for a, b in zip(first, later, strict=True))
    # the static panel pads, the continuous one never does
    assert js(page, f"{PANELS}[0].model.steps.some(s => s.padding > 0)")
    assert not js(page, f"{PANELS}[1].model.steps.some(s => s.padding > 0)")
    shot(page, "live-demo")
    assert not page.errors


# Each panel's ended requests as this page draws them: id -> [end step, {step: phase}] from
# the first step the page knows; and its "finished" count.
ENDED_ROWS = f"""{PANELS}.map(p => {{
  const m = p.model, rows = {{}};
  for (const r of m.order) {{
    if (r.endStep == null) continue;
    const cells = {{}};
    for (let k = Math.max(m.firstKnown, r.startStep); k <= r.endStep; k++) cells[k] = r.cellAt(k);
    rows[r.id] = [r.endStep, cells];
  }}
  return {{ rows, done: m.order.filter(r => r.endStep != null).length + m.forgotten }};
}})"""


def test_a_page_opened_late_draws_the_rows_that_already_ended(tab, demo_url):
    """A joining page's view carries the latest ended requests and the phases their rows
    went through (docs/events.md, hello): a tab opened late draws the ended rows an early
    tab drew, cell for cell, and counts as many finished."""
    early = tab
    early.goto(demo_url)
    ended = "p => p.model.order.filter(r => r.endStep != null).length >= 3"
    wait_for(early, f"{PANELS}.length === 2 && {PANELS}.every({ended})")
    early.click("#pause")
    wait_for(early, "window.minicb.paused === true")
    try:
        late = early.context.new_page()
        late.goto(demo_url)
        wait_for(late, f"{PANELS}.length === 2")
        # the engines stop at the step they were in: both pages at its end, the same one
        steps = f"{PANELS}.map(p => p.model.lastStep).join()"
        for _ in range(100):
            if js(early, steps) == js(late, steps):
                break
            late.wait_for_timeout(200)
        before, after = js(early, ENDED_ROWS), js(late, ENDED_ROWS)
        assert js(early, steps) == js(late, steps)
    finally:  # never leave the shared demo paused for the tests after this one
        early.click("#resume")
        wait_for(early, "window.minicb.paused === false")
    for side, (a, b) in enumerate(zip(before, after, strict=True)):
        assert b["done"] == a["done"] > 0, (side, a["done"], b["done"])
        compared = 0
        for rid, (end, cells) in b["rows"].items():
            if rid not in a["rows"]:
                continue  # ended before the early tab's own first step
            assert a["rows"][rid][0] == end, (side, rid, a["rows"][rid], [end, cells])
            both = cells.keys() & a["rows"][rid][1].keys()
            assert {k: cells[k] for k in both} == {k: a["rows"][rid][1][k] for k in both}, rid
            compared += sum(cells[k] != 0 for k in both)  # cells that ran, not only waited
        assert compared > 0, (side, b["rows"])
    assert not early.errors


# Each panel's steps on its own clock (PanelModel.ownNow: the step events' busy_s), and the
# counters' TTFT p50 recomputed here from the requests' times, on that clock and on the wall.
# Null until both panels hold steps and three finished requests: read in the same evaluation
# that finds them ready, since the looping demo may start a panel afresh at any moment.
OWN_CLOCK = """(() => {
  const countersAt = window.countersAtForTest, panels = window.minicb?.panels || [];
  const ready = (p) => p.model.steps.length > 1
      && p.model.order.filter(r => r.endStep != null).length >= 3;
  return panels.length === 2 && panels.every(ready) && panels.map(p => {
    const st = p.model.steps, last = st.at(-1);
    const grows = st.slice(1).every((s, i) =>
        Math.abs(s.ownEnd - st[i].ownEnd - (s.wallEnd - s.wallStart)) < 1e-6);
    const seen = p.model.order.filter(r => r.startStep <= last.step
        && (r.endStep == null || r.firstTokenStep != null));
    const p50 = (f) => {
        const v = seen.map(f).sort((a, b) => a - b);
        return v[Math.ceil(v.length / 2) - 1];
    };
    const first = (r) => r.firstTokenStep != null && r.firstTokenStep <= last.step;
    return { own: st.every(s => s.hasOwn), grows, start: st[0].wallStart, end: last.wallEnd,
             span: last.ownEnd - st[0].ownStart, shown: countersAt(p.model, last.step).ttft50,
             ownP50: p50(r => (first(r) ? r.firstTokenOwn : last.ownEnd) - r.arrivalOwn),
             wallP50: p50(r => (first(r) ? r.firstTokenTime : last.wallEnd) - r.arrival) };
  });
})()"""


def test_the_counters_charge_each_side_only_its_own_steps(tab, demo_url):
    page = tab
    page.goto(demo_url)
    page.evaluate(
        "import('/viz/counters.js').then(m => { window.countersAtForTest = m.countersAt; })"
    )
    # One synchronous read, the one that found both panels ready: no event lands in between.
    sides = page.wait_for_function(OWN_CLOCK, timeout=60_000).json_value()
    for side in sides:
        assert side["own"] and side["grows"], side
        assert abs(side["shown"] - side["ownP50"]) < 1e-9, side
    # one thread ran both: their own times do not overlap, so together they fit in the wall
    # time they shared (on the wall clock each side would be charged nearly all of it)
    wall = max(s["end"] for s in sides) - min(s["start"] for s in sides)
    assert sum(s["span"] for s in sides) <= wall + 1e-6, sides
    assert any(s["shown"] < s["wallP50"] for s in sides), sides
    assert not page.errors


def test_single_step_advances_exactly_one_iteration_and_the_kv_map_changes(tab, demo_url):
    page = tab
    page.goto(demo_url)
    wait_for(page, f"{PANELS}.length === 2 && {PANELS}.every(p => p.model.lastStep > 0)")
    page.click("#pause")
    wait_for(page, "window.minicb.paused === true")
    try:
        _single_steps(page)
    finally:  # never leave the shared demo paused for the tests after this one
        page.click("#resume")
        wait_for(page, "window.minicb.paused === false")
    assert not page.errors


def _type_prompt(page, count: int) -> None:
    """Type a prompt and wait until both panels show ``count`` typed rows: the engine thread
    took it, and every event it sent before the arrivals has come over the socket."""
    page.fill("#prompt-text", "one step at a time")
    page.fill("#prompt-max", "12")
    page.click("#prompt-form button[type=submit]")
    wait_for(page, f"{PANELS}.every(p => p.model.order.filter(r => r.mine).length === {count})")


def _single_steps(page) -> None:
    # a prompt typed while paused waits in both engines, so both have work for the step
    # (a workload burst is not enough: the feeder skips arrivals while an engine is full)
    _type_prompt(page, 1)
    held = panel_state(page)
    _type_prompt(page, 2)  # the engine thread went round between the two prompts
    assert [s["step"] for s in panel_state(page)] == [s["step"] for s in held]  # pause holds
    page.click("#step")
    wait_for(page, "document.querySelector('#decisions h4') !== null")
    base = [s["step"] for s in held]
    wait_for(page, f"{PANELS}.every((p, i) => p.model.lastStep === {base}[i] + 1)")
    # (exactly one: each click below must then land on exactly base + n, never beyond)
    decisions = page.inner_text("#decisions")
    assert "static batching" in decisions and "continuous batching" in decisions
    shot(page, "single-step")
    # keep stepping, one iteration per click, until requests finish or grow: the map changes
    for n in range(2, 40):
        page.click("#step")
        wait_for(page, f"{PANELS}.every((p, i) => p.model.lastStep === {base}[i] + {n})")
        next_frame(page)  # the KV map is drawn on the next frame
        now = panel_state(page)
        if any(a["kv"] != b["kv"] for a, b in zip(held, now, strict=True)):
            break
    else:
        raise AssertionError("the KV map never changed")
    assert [s["step"] for s in now] == [b + n for b in base]
    shot(page, "kv-map-changed")


def test_a_typed_prompt_becomes_a_row_and_streams(tab, demo_url):
    page = tab
    page.goto(demo_url)
    wait_for(page, f"{PANELS}.length === 2")
    page.fill("#prompt-text", "Hello from the front row")
    page.fill("#prompt-max", "12")
    page.click("#prompt-form button[type=submit]")
    mine = f"{PANELS}.map(p => p.model.order.filter(r => r.mine))"
    wait_for(page, f"{mine}.every(list => list.length === 1)")
    wait_for(page, "document.querySelectorAll('#mine li').length === 2")
    # the tiny model has no tokenizer: its "text" is the token ids, streaming in
    for i in range(2):  # each panel sees its tokens part-way, then all of them
        wait_for(page, f"{mine}[{i}][0].tokenIds.length > 0", 90)
        partial = js(page, f"{mine}[{i}][0].tokenIds.length")
        assert partial < 12 or js(page, f"{mine}[{i}][0].endStep") is not None
    wait_for(page, f"{mine}.every(l => l[0].tokenIds.length === 12 && l[0].endStep != null)", 90)
    text = page.inner_text("#mine")
    assert text.count("[") == 2 and "#" in text
    shot(page, "typed-prompt-tiny")
    assert not page.errors


def test_the_language_toggle_changes_the_labels(tab, demo_url):
    page = tab
    page.goto(demo_url)
    wait_for(page, f"{PANELS}.length === 2")
    assert page.inner_text("#pause") == "Pause"
    page.click("#lang")
    assert page.inner_text("#pause") == "暂停"
    assert "连续批处理" in page.inner_text("h1")
    # panel titles are drawn on the next animation frame: wait for it, then look
    wait_for(page, f"{PANELS_TEXT}.includes('静态批处理')", 5)
    assert "槽位占用率" in page.inner_text("#panels")
    next_frame(page)
    shot(page, "live-demo-zh")
    page.click("#lang")
    assert page.inner_text("#pause") == "Pause"
    wait_for(page, f"{PANELS_TEXT}.includes('static batching')", 5)
    assert not page.errors


def test_the_settings_form_switches_speculative_decoding_on_and_off(tab, demo_url):
    page = tab
    page.goto(demo_url)
    wait_for(page, f"{PANELS}.length === 2")
    configs = f"{PANELS}.map(p => p.model.info.config.speculative)"
    assert js(page, configs) == ["off", "off"]
    assert page.locator("#st-speculative").input_value() == "off"
    page.click("#lang")  # its label and choices in Chinese too
    assert "推测解码" in page.inner_text("#settings-form")
    assert "n-gram 草稿" in page.inner_text("#st-speculative")
    page.click("#lang")
    try:
        page.select_option("#st-speculative", "ngram")
        page.click("#settings-form button[type=submit]")
        wait_for(page, f"{configs}.every(s => s === 'ngram')", 60)  # both engines rebuilt
    finally:  # the demo is shared with the tests after this one: leave it as it was
        page.select_option("#st-speculative", "off")
        page.click("#settings-form button[type=submit]")
        wait_for(page, f"{configs}.every(s => s === 'off')", 60)
    assert not page.errors


def test_a_pool_of_two_blocks_is_refused_on_the_page_and_the_terminal_stays_quiet(tab, demo_url):
    """Issue 52: two blocks were accepted, both panels stayed silently empty and the terminal
    printed thousands of "refused" lines; now the page answers, naming the limit, the
    engines are not rebuilt and the terminal prints nothing more."""
    page = tab
    page.goto(demo_url)
    wait_for(page, f"{PANELS}.length === 2 && {PANELS}.every(p => p.model.lastStep > 0)")
    printed = len(terminal(demo_url))
    pools = f"{PANELS}.map(p => p.model.info.config.num_kv_blocks)"
    assert js(page, pools) == [48, 48]
    page.fill("#st-num_kv_blocks", "2")
    page.click("#settings-form button[type=submit]")
    wait_for(page, "document.querySelector('#message').classList.contains('error')", 30)
    message = page.inner_text("#message")
    assert "the whole pool holds 32 (2 blocks of 16)" in message, message
    assert "nothing was rebuilt" in message
    steps = js(page, f"{PANELS}.map(p => p.model.lastStep)")
    time.sleep(3)  # the old flood: thousands of lines in ten seconds
    wait_for(page, f"{PANELS}.every((p, i) => p.model.lastStep > {steps}[i])")  # still running
    assert js(page, pools) == [48, 48]  # the same engines, never rebuilt
    shot(page, "two-blocks-refused")
    later = terminal(demo_url)
    assert len(later) - printed <= 3, later[printed:][:10]
    assert not page.errors


def test_a_rebuild_empties_the_last_single_steps_decisions(tab, demo_url):
    """The "Scheduler decisions" card belongs to the engines that took the step: after a
    rebuild it no longer shows a step of the old ones."""
    page = tab
    page.goto(demo_url)
    wait_for(page, f"{PANELS}.length === 2 && {PANELS}.every(p => p.model.lastStep > 0)")
    page.click("#pause")
    wait_for(page, "window.minicb.paused === true")
    try:
        _type_prompt(page, 1)  # work for the step on both engines
        page.click("#step")
        wait_for(page, "document.querySelector('#decisions h4') !== null")
        resets = f"{PANELS}.map(p => p.model.info.config.max_num_seqs)"
        page.click("#settings-form button[type=submit]")  # the same settings: rebuilt
        wait_for(page, f"{PANELS}.every(p => p.model.lastStep === 0) && {resets}.join() == '4,4'")
        wait_for(page, "document.querySelector('#decisions h4') === null", 10)
        assert page.inner_text("#decisions").strip() == "–"
    finally:  # never leave the shared demo paused for the tests after this one
        page.click("#resume")
        wait_for(page, "window.minicb.paused === false")
    assert not page.errors
