"""Every figure the lecture deck and the interview drill quote is found in the file they cite.

A student quotes the deck and the drill; a figure copied by hand from a run that has since
been superseded is the error that creeps in (the review of round 4 found four different
step timings for "notebook 1"). So both follow one citation convention, and this test
holds them to it:

- **The unit.** In the drill (docs/drill.md, docs/zh/drill.md) a unit is a paragraph or
  one list item; in the deck (docs/lecture/index.html) it is one slide in one language,
  its speaker notes included.
- **The citation.** A unit cites a file by linking it (``[performance.md](performance.md)``
  in Markdown, ``<a href="../performance.md">`` in the deck) or by naming a notebook
  ("notebook 4", which means its committed rendering, docs/notebooks/04_*.md, with the
  run's date and machine at its top).
- **The figure.** A number with a decimal point or a thousands comma, a number followed by
  a unit (%, x, ms, s, GB, tok/s, 倍 ...), or any whole number of 100 or more. Numbers in
  `code` (commands, formulas) and years are not figures.

Every figure of a unit must appear, as the same number, in one of the files the unit
cites, and a unit with a figure must cite something. The teaching plan (docs/teaching.md,
docs/zh/teaching.md) is a teacher's script, full of settings to type (port 8000, a pool of
128 blocks, zoom to 150 %), so it is held a little differently: a paragraph that cites a file
is held to it like the drill's, and one that cites nothing may carry settings but no
measurement (a number with a decimal point, or a time or a ratio: ms, s, x, 倍 ...).
A figure derived by arithmetic (a ratio of two quoted figures) is not quoted: give the two
figures, or cite the file that states the derived one.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
DECK = DOCS / "lecture" / "index.html"

UNIT = r"(?:\s?(?:%|x\b|×|ms\b|µs\b|s\b|GB\b|MB\b|GiB\b|MiB\b|TB/s|TFLOP/s|tok/s|req/s|倍|秒|毫秒))"
NUMBER = re.compile(rf"(?<![\w.,/-])(\d{{1,3}}(?:,\d{{3}})+|\d+(?:\.\d+)?)({UNIT}?)")
CODE = re.compile(r"`[^`]*`|<code>.*?</code>", re.S)
NOTEBOOK = re.compile(r"\b[Nn]otebook (\d{1,2})\b")
LINK_MD = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
LINK_HTML = re.compile(r'href="([^"#]+)(?:#[^"]*)?"')


def figures(text: str) -> list[str]:
    """The figures of a text, each as its digits (thousands commas dropped)."""
    found = []
    for m in NUMBER.finditer(CODE.sub(" ", text)):
        number, unit = m.group(1), m.group(2)
        plain = number.replace(",", "")
        if re.fullmatch(r"(19|20)\d\d", number) and not unit:
            continue  # a year
        if unit or "." in number or "," in number or int(float(plain)) >= 100:
            found.append(plain)
    return found


def notebook_rendering(n: int) -> Path:
    (page,) = (DOCS / "notebooks").glob(f"{n:02d}_*.md")
    return page


def cited(text: str, base: Path, links: re.Pattern) -> list[Path]:
    """The files a unit cites: its links to files in the repository, its notebooks."""
    files = []
    for target in links.findall(text):
        if "://" in target:
            continue
        path = (base / target).resolve()
        if path.suffix == ".md" and path.is_file():
            files.append(path)
    files += [notebook_rendering(int(n)) for n in NOTEBOOK.findall(text)]
    return files


def appears(figure: str, source: str) -> bool:
    pattern = rf"(?<![\d.]){re.escape(figure)}(?![\d]|\.\d)"
    return re.search(pattern, source) is not None


def unsupported(unit: str, files: list[Path]) -> list[str]:
    """The unit's figures that none of its cited files contains."""
    wanted = figures(unit)
    if not wanted:
        return []
    if not files:
        return [f"{wanted} cites no file"]
    sources = [p.read_text(encoding="utf-8").replace(",", "") for p in files]
    # "1,024" and "1024" are the same figure; a source's thousands commas are dropped too
    return [f for f in wanted if not any(appears(f, s) for s in sources)]


# --- the drill: paragraphs and list items ---------------------------------------------


def markdown_units(text: str) -> list[str]:
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    units, current = [], []
    for line in text.splitlines() + [""]:
        starts_item = re.match(r"\s*(\d+\.|-)\s", line)
        if not line.strip() or line.startswith(("#", "|")) or starts_item:
            if current:
                units.append("\n".join(current))
            current = [line] if line.strip() and not line.startswith(("#", "|")) else []
        else:
            current.append(line)
    return units


DRILLS = [DOCS / "drill.md", DOCS / "zh" / "drill.md"]


@pytest.mark.parametrize("doc", DRILLS, ids=lambda p: str(p.relative_to(DOCS)))
def test_every_figure_in_the_drill_is_in_the_file_it_cites(doc):
    problems = []
    for unit in markdown_units(doc.read_text(encoding="utf-8")):
        for bad in unsupported(unit, cited(unit, doc.parent, LINK_MD)):
            problems.append(f"{bad!r} in: {unit[:90]!r}")
    assert not problems, "\n".join(problems)


# --- the deck: one slide in one language ----------------------------------------------


class DeckText(HTMLParser):
    """Each slide's text and links by language (an element without lang is in both)."""

    def __init__(self) -> None:
        super().__init__()
        self.slides: list[dict[str, str]] = []
        self.langs: list[str | None] = []
        self.in_code = 0

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "section":
            self.slides.append({"en": "", "zh": ""})
        if tag in ("img", "br", "meta", "sup", "source"):
            return
        self.langs.append(attrs.get("lang"))
        self.in_code += tag == "code"
        if tag == "a" and self.slides:
            for lang in self._langs():
                self.slides[-1][lang] += f' href="{attrs.get("href", "")}" '

    def handle_endtag(self, tag):
        if tag in ("img", "br", "meta", "sup", "source"):
            return
        if self.langs:
            self.langs.pop()
        self.in_code -= tag == "code" and self.in_code > 0

    def _langs(self) -> tuple[str, ...]:
        marked = [lang for lang in self.langs if lang]
        return (marked[-1],) if marked else ("en", "zh")

    def handle_data(self, data):
        if self.slides and not self.in_code:
            for lang in self._langs():
                self.slides[-1][lang] += " " + data


def deck_units() -> list[tuple[int, str, str]]:
    parser = DeckText()
    parser.feed(DECK.read_text(encoding="utf-8"))
    return [(i + 1, lang, s[lang]) for i, s in enumerate(parser.slides) for lang in ("en", "zh")]


def test_every_figure_on_the_deck_is_in_the_file_its_slide_cites():
    problems = []
    for number, lang, text in deck_units():
        for bad in unsupported(text, cited(text, DECK.parent, LINK_HTML)):
            problems.append(f"slide {number} ({lang}): {bad!r}")
    assert not problems, "\n".join(problems)


# --- the teaching plan: cited paragraphs held to their files, no loose measurement -----

TEACHING = [DOCS / "teaching.md", DOCS / "zh" / "teaching.md"]
TIME_OR_RATIO = {"ms", "µs", "s", "x", "×", "tok/s", "req/s", "倍", "秒", "毫秒"}


def measurements(text: str) -> list[str]:
    """The figures of a text that were measured: a decimal point, or a time or a ratio."""
    found = []
    for m in NUMBER.finditer(CODE.sub(" ", text)):
        number, unit = m.group(1), m.group(2).strip()
        if "." in number or unit in TIME_OR_RATIO:
            found.append(number.replace(",", ""))
    return found


def plan_problems(unit: str, base: Path) -> list[str]:
    files = cited(unit, base, LINK_MD)
    if files:
        return unsupported(unit, files)
    loose = measurements(unit)
    return [f"{loose} cites no file"] if loose else []


@pytest.mark.parametrize("doc", TEACHING, ids=lambda p: str(p.relative_to(DOCS)))
def test_every_measurement_in_the_teaching_plan_is_in_the_file_it_cites(doc):
    problems = []
    for unit in markdown_units(doc.read_text(encoding="utf-8")):
        for bad in plan_problems(unit, doc.parent):
            problems.append(f"{bad!r} in: {unit[:90]!r}")
    assert not problems, "\n".join(problems)


# --- the check itself can fail ------------------------------------------------------------


def test_the_convention_finds_figures_and_leaves_code_and_years_alone():
    text = "In 2024, 8 slots gave 2.03x and 46.9 % in 137 steps, `--budget 512`, 3,389 tokens."
    assert figures(text) == ["2.03", "46.9", "137", "3389"]
    assert figures("首 token 延迟 p50 1.88 秒，3.12 倍") == ["1.88", "3.12"]


def test_a_figure_not_in_its_source_is_found(tmp_path):
    source = tmp_path / "report.md"
    source.write_text("| static | 3197 | 44.8 | 14 ms |\nratio 3.12x\n", encoding="utf-8")
    good = "Static gave 3,197 tok/s, 3.12x less ([report](report.md))."
    bad = "Static gave 3,197 tok/s, 2.03x less ([report](report.md))."
    uncited = "Static gave 3,197 tok/s."
    assert unsupported(good, cited(good, tmp_path, LINK_MD)) == []
    assert unsupported(bad, cited(bad, tmp_path, LINK_MD)) == ["2.03"]
    assert unsupported(uncited, cited(uncited, tmp_path, LINK_MD)) == ["['3197'] cites no file"]
    # a digit run inside a longer figure does not count: 3.1 is not found in 3.12
    assert not appears("3.1", source.read_text())


def test_a_notebook_named_is_its_committed_rendering():
    (path,) = cited("as notebook 1 shows", DOCS, LINK_MD)
    assert path == notebook_rendering(1) and path.parent.name == "notebooks"


def test_the_teaching_plan_allows_settings_but_not_a_loose_or_stale_measurement(tmp_path):
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "performance.md").write_text("| 1 | 39.3 | 48 |\n| 8 | 44.1 | 44 |\n")
    setting = "Zoom the browser to 125 to 150 %, KV pool 128 blocks, port 8000."
    loose = "One decode step took 39.3 ms with 1 row."
    stale = "It took 68 ms with 1 row, 28 % of the ceiling ([perf](performance.md))."
    fresh = "It took 39.3 ms with 1 row, 48 % of the ceiling ([perf](performance.md))."
    assert plan_problems(setting, tmp_path) == []
    assert plan_problems(loose, tmp_path) == ["['39.3'] cites no file"]
    assert plan_problems(stale, tmp_path) == ["68", "28"]
    assert plan_problems(fresh, tmp_path) == []
