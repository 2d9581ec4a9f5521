"""The fleet lesson in Chromium (``minicb demo --scenario 11b-fleet-prefix-aware``, simulated
replicas): the router's decisions are drawn above the two replica panels with their
reasons, and each request is named with its replica ("r1·0"), because each replica numbers
its own requests from 0 and a bare "request 0" would name one on both."""

from minicb.scenarios import load_scenario
from tests.browser.conftest import js, server, wait_for

NAME = "11b-fleet-prefix-aware"
PANELS = "window.minicb.panels"
DECISIONS = "[...document.querySelectorAll('#router li')]"


def test_the_routers_decisions_name_each_request_with_its_replica(tab):
    page, scenario = tab, load_scenario(NAME)
    with server("demo", "--scenario", NAME, "--paused") as url:
        page.goto(url)
        wait_for(page, f"{PANELS}.length === 2")
        js(page, "window.minicb.send({type: 'speed', delay_s: 0})")
        page.click("#lesson-next")  # to the first point: conversation 1's second turn routed
        wait_for(page, "document.querySelector('#lesson-text').dataset.index === '0'", 90)
        wait_for(page, f"{DECISIONS}.length === 4")
        names = js(page, f"{DECISIONS}.map(li => li.querySelector('b').dataset.request)")
        replicas = js(page, f"{DECISIONS}.map(li => li.dataset.replica)")
        texts = js(page, f"{DECISIONS}.map(li => li.textContent)")
        # two replicas each have a request 0: the names tell them apart; newest first, in
        # the router's order: conversation 1's second turn, then the first turns of 3, 2, 1
        assert names == ["r0\u00b72", "r0\u00b71", "r1\u00b70", "r0\u00b70"]
        for name, replica, text in zip(names, replicas, texts, strict=True):
            assert name.startswith(f"r{replica}\u00b7")
            assert text.startswith(f"request {name} \u2192 replica {replica}")
        assert any("384 of 416 prompt tokens cached there" in text for text in texts)
        assert scenario.router in js(page, "document.querySelector('#router h3').textContent")
    assert not page.errors, page.errors
