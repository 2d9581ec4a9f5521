"""The Chinese page renders Chinese characters, not empty boxes ("tofu").

Without a CJK font (Debian's fonts-noto-cjk, which ``make browser`` installs beside
Chromium) every Chinese character is drawn as the same missing-glyph box, and a screenshot
of the Chinese page shows rows of boxes. Two different characters drawn in the page's own
font are therefore pixel-identical exactly when they are tofu: the test draws a few on a
canvas and compares them with each other and with a codepoint no font has.
"""

from __future__ import annotations

import re

from tests.browser.conftest import ROOT

# Characters of the page's labels (静态批处理, 连续批处理, 槽位占用率)
CHARS = ["静", "态", "批", "连", "续", "槽"]
NO_GLYPH = "\U000e01ef"  # a variation selector supplement codepoint: unassigned in fonts

DRAW = """([chars, font]) => {
  const canvas = document.createElement("canvas");
  canvas.width = 64; canvas.height = 64;
  const ctx = canvas.getContext("2d", { willReadFrequently: true });
  ctx.font = font;
  const glyph = (c) => {
    ctx.clearRect(0, 0, 64, 64);
    ctx.fillText(c, 8, 40);
    return Array.from(ctx.getImageData(0, 0, 64, 64).data.filter((_, i) => i % 4 === 3)).join(",");
  };
  return chars.map(glyph);
}"""


def _page_font() -> str:
    """The body font family of the page's stylesheet, at a size where glyphs differ."""
    css = (ROOT / "viz" / "style.css").read_text(encoding="utf-8")
    rule = re.search(r"body \{[^}]*font: ([^;]+);", css).group(1)
    family = re.match(r"\d+px(?:/[\d.]+)? (.+)", rule).group(1)
    return f"32px {family}"


def test_chinese_text_is_drawn_with_a_cjk_font(tab):
    tab.set_content('<html lang="zh-CN"><body></body></html>')
    got = tab.evaluate(DRAW, [CHARS + [NO_GLYPH], _page_font()])
    glyphs, box = got[:-1], got[-1]
    assert len(set(glyphs)) == len(CHARS), "Chinese characters render as identical boxes (tofu)"
    assert all(g != box for g in glyphs)
    assert not tab.errors
