"""The lecture deck opens offline in Chromium, in English and in Chinese: straight from the
file (no server, every request other than a file refused), every slide's figures loaded,
the keys and the notes working, no script error. Screenshots of both languages."""

from __future__ import annotations

from tests.browser.conftest import ROOT, js, next_frame, shot, wait_for

DECK = (ROOT / "docs" / "lecture" / "index.html").as_uri()
# the images of the slide on show that the page displays, and whether each has loaded
SHOWN_IMAGES = """() => [...document.querySelectorAll('section.slide:not([hidden]) img')]
  .filter(i => i.offsetParent !== null).map(i => [i.getAttribute('src'), i.naturalWidth])"""
SHOWN_TEXT = "document.querySelector('section.slide:not([hidden])').innerText"


def test_the_deck_opens_offline_in_both_languages(tab):
    page = tab
    outside = []

    def refuse(route):
        if route.request.url.startswith("file:"):
            return route.continue_()
        outside.append(route.request.url)
        return route.abort()

    page.route("**/*", refuse)
    for lang in ("en", "zh"):
        page.goto(f"{DECK}?lang={lang}#1")
        wait_for(page, "window.deck && window.deck.slides.length > 0")
        count = js(page, "window.deck.slides.length")
        assert js(page, "window.deck.lang") == lang
        assert js(page, "document.documentElement.lang").startswith(lang)
        for i in range(count):
            wait_for(page, f"window.deck.index === {i}")
            images = js(page, SHOWN_IMAGES)
            assert all(width > 0 for _, width in images), (lang, i, images)
            text = js(page, SHOWN_TEXT)
            has_chinese = any("\u4e00" <= ch <= "\u9fff" for ch in text)
            assert has_chinese == (lang == "zh"), (lang, i, text[:80])
            if i == 0:
                next_frame(page)
                shot(page, f"lecture-{lang}")
            page.keyboard.press("ArrowRight")
        assert js(page, "window.deck.index") == count - 1  # it stops at the last slide
        page.keyboard.press("n")  # the speaker notes, with their timing
        notes = "document.querySelector('section.slide:not([hidden]) aside.notes').innerText"
        assert js(page, notes).startswith("1:28")
    page.click("#lang")  # the button switches language in place
    wait_for(page, "window.deck.lang === 'en'")
    assert not outside, outside
    assert not page.errors, page.errors
