"""A replay sent in many pieces (``replay`` messages of a few kB each here) draws in
Chromium what one message drew: every recorded request's row, every step, the slider's
range over the whole run (the page applies each piece's events as it comes)."""

from __future__ import annotations

import json

from minicb.server import replay_view
from minicb.server.app import create_app
from minicb.telemetry.trace_reader import kv_states
from tests.api.live import live_server
from tests.browser.conftest import js, wait_for
from tests.server.test_replay_view import recorded

PANEL = "window.minicb.panels[0]"


def test_a_replay_in_pieces_draws_the_whole_run(tab, monkeypatch):
    trace = recorded(40)
    monkeypatch.setattr(replay_view, "REPLAY_PIECE_BYTES", 4 * 1024)
    app = create_app(None, mode="replay", replay={"continuous": trace})
    steps = [step.plan.step for step, _ in kv_states(trace.events)]
    with live_server(app) as url:
        tab.goto(url + "/")
        wait_for(tab, f"window.minicb.replay && {PANEL}.model.lastStep === {steps[-1]}")
        assert js(tab, f"{PANEL}.model.order.length") == 40  # every request's row
        assert js(tab, f"{PANEL}.model.steps.length") == len(steps)
        # the panel draws on the next animation frames, after the model has the events
        wait_for(tab, f"Number({PANEL}.el.dataset.step) === {steps[-1]}")
    assert app.state.hub.replay_views.builds == 1
    folded = json.dumps(replay_view.replay_events("continuous", trace))
    assert len(folded) > 20 * 4 * 1024  # so it came in more than twenty pieces
    assert not tab.errors
