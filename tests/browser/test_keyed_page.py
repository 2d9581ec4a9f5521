"""A demo behind a key, in Chromium: the page obtains the key (from a shared link's
``?key=``, or by asking once), keeps it for the tab, uses it on every reconnect, asks again
after a wrong one, and a viewer's page shows the timeline without controls or texts."""

import pytest

from tests.browser.conftest import js, server, shot, wait_for

KEY, VIEWER_KEY = "teacher-key", "room-key"
PANELS = "window.minicb.panels"
LIVE = f"{PANELS}.length === 2 && {PANELS}.every(p => p.model.lastStep > 0)"


@pytest.fixture(scope="module")
def keyed_url(tiny_llama_dir):
    args = ["demo", "--model", tiny_llama_dir, "--max-num-seqs", "4", "--num-kv-blocks", "48"]
    args += ["--burst", "6", "--rate", "1.5", "--short", "3", "8", "--long", "12", "24"]
    with server(*args, "--delay", "0.05", "--api-key", KEY, "--viewer-key", VIEWER_KEY) as url:
        yield url


def test_a_shared_link_key_is_kept_for_the_tab_and_opens_the_controls(tab, keyed_url):
    page = tab
    page.goto(keyed_url + "?key=" + KEY)
    wait_for(page, LIVE)
    assert js(page, "window.minicb.role") == "controller"
    assert "key=" not in page.url  # taken out of the address bar
    assert js(page, "sessionStorage.getItem('minicb.key')") == KEY
    page.reload()  # the tab keeps it: no question asked
    wait_for(page, LIVE)
    page.click("#pause")
    wait_for(page, "window.minicb.paused === true")
    page.click("#resume")
    wait_for(page, "window.minicb.paused === false")
    assert not page.errors


def test_the_page_asks_once_again_after_a_wrong_key_and_a_viewer_sees_no_controls(tab, keyed_url):
    page = tab
    answers = ["wrong", VIEWER_KEY]
    asked = []

    def answer(dialog):
        asked.append(dialog.message)
        dialog.accept(answers[len(asked) - 1])

    page.on("dialog", answer)
    page.goto(keyed_url)
    wait_for(page, LIVE)
    assert len(asked) == 2 and "needs a key" in asked[0]
    assert js(page, "window.minicb.role") == "viewer"
    assert not page.is_visible("#pause") and not page.is_visible("#prompt-form")
    wait_for(page, f"{PANELS}.some(p => p.model.order.some(r => r.redacted))")  # tokens came
    texts = js(page, f"{PANELS}.flatMap(p => p.model.order.map(r => [r.prompt, r.tokenIds]))")
    assert texts and all(prompt is None and ids == [] for prompt, ids in texts)
    shot(page, "viewer")
    assert not page.errors
