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
        assert js(page, notes).startswith("1:29")
    page.click("#lang")  # the button switches language in place
    wait_for(page, "window.deck.lang === 'en'")
    assert not outside, outside
    assert not page.errors, page.errors


def test_every_slide_fits_a_projector_and_its_diagrams_are_drawn(chromium):
    """At 1280x720 (a projector), each slide's content ends above the navigation bar, its
    drawn diagrams have a size and their text is not smaller than 11 px on screen, and its
    screenshots are crops shown at three quarters of their pixels or more (a whole page
    shrunk to a third, as before, cannot be read from the back of a room); a screenshot of
    every slide in both languages."""
    context = chromium.new_context(viewport={"width": 1280, "height": 720})
    page = context.new_page()
    try:
        for lang in ("en", "zh"):
            page.goto(f"{DECK}?lang={lang}#1")
            wait_for(page, "window.deck && window.deck.slides.length > 0")
            for i in range(js(page, "window.deck.slides.length")):
                page.evaluate(f"window.deck.show({i})")
                sizes = js(page, SVG_TEXT_PX)
                assert all(px >= 11 for px in sizes), (lang, i + 1, min(sizes, default=None))
                scales = js(page, IMAGE_SCALE)
                assert all(scale >= 0.75 for _, scale in scales), (lang, i + 1, scales)
                bottom, nav = js(page, CONTENT_BOTTOM)
                assert bottom <= nav, (lang, i + 1, f"content ends at {bottom} px, nav at {nav}")
                next_frame(page)
                shot(page, f"lecture-{lang}-{i + 1:02d}")
    finally:
        context.close()


# each shown diagram's text, as the font size it has on screen (viewBox scaling included)
SVG_TEXT_PX = """() => [...document.querySelectorAll('section.slide:not([hidden]) svg text')]
  .filter(t => t.getBoundingClientRect().height > 0)
  .map(t => t.getBoundingClientRect().height * 0.8)"""

# each shown image's displayed width over its own width in pixels
IMAGE_SCALE = """() => [...document.querySelectorAll('section.slide:not([hidden]) img')]
  .filter(i => i.offsetParent !== null)
  .map(i => [i.getAttribute('src'), i.getBoundingClientRect().width / i.naturalWidth])"""
# the lowest edge of the shown slide's content (speaker notes aside), and the nav bar's top
CONTENT_BOTTOM = """() => {
  const shown = [...document.querySelectorAll('section.slide:not([hidden]) *')]
    .filter(e => e.offsetParent !== null && !e.closest('aside'));
  const bottom = Math.max(0, ...shown.map(e => e.getBoundingClientRect().bottom));
  const nav = document.querySelector('nav').getBoundingClientRect().top;
  return [Math.round(bottom), Math.round(nav)];
}"""
