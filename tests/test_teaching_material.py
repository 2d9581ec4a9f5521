"""Checks a teacher relies on: the answer key covers every exercise, exercises are numbered
from 1 in each notebook, and the notebooks draw each phase in the page's colour."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def cells(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def exercises(path: Path) -> list[int]:
    """The exercise numbers of a notebook, from its English markdown."""
    text = "\n".join("".join(c["source"]) for c in cells(path) if c["cell_type"] == "markdown")
    return [int(n) for n in re.findall(r"\*\*Exercise (\d+)\.\*\*", text)]


def answer_key(doc: Path) -> set[tuple[int, int]]:
    text = doc.read_text(encoding="utf-8")
    rows = re.findall(r"^\| (\d+) \| (\d+) \|", text, flags=re.M)
    return {(int(nb), int(ex)) for nb, ex in rows}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_exercises_are_numbered_from_one(path):
    numbers = exercises(path)
    assert numbers == list(range(1, len(numbers) + 1)), (path.name, numbers)
    zh = "\n".join("".join(c["source"]) for c in cells(path) if c["cell_type"] == "markdown")
    assert [int(n) for n in re.findall(r"\*\*练习 (\d+)\.\*\*", zh)] == numbers


@pytest.mark.parametrize("doc", ["docs/teaching.md", "docs/zh/teaching.md"])
def test_the_answer_key_covers_every_exercise(doc):
    wanted = {(int(p.name[:2]), n) for p in NOTEBOOKS for n in exercises(p)}
    assert answer_key(ROOT / doc) == wanted


def page_colours() -> dict[str, str]:
    timeline = (ROOT / "viz" / "timeline.js").read_text()
    chart = (ROOT / "viz" / "chart.js").read_text()
    colours = dict(re.findall(r"\[PHASE\.(\w+)\]: \"(#[0-9a-fA-F]{6})\"", timeline))
    line = re.search(r"const LINE = \{ static: \"(#\w+)\", continuous: \"(#\w+)\" \}", chart)
    colours.update(static=line[1], continuous=line[2])
    return colours


def meaning(label: str) -> str | None:
    """What a plotted series stands for, from its label."""
    for word, phase in (
        ("padding", "padding"),
        ("prefill", "prefill"),
        ("decode", "decode"),
        ("useful", "decode"),
        ("preempt", "preempted"),
        ("swap", "swapped"),
        ("waiting", "waiting"),
    ):
        if word in label:
            return phase
    return label if label in ("static", "continuous") else None


def coloured_series(path: Path) -> list[tuple[str, str]]:
    found = []
    for c in cells(path):
        if c["cell_type"] != "code":
            continue
        for line in "".join(c["source"]).splitlines():
            found += re.findall(r"\"([^\"]*)\"\s*[:,]\s*\"(#[0-9a-fA-F]{6})\"", line)
            found += re.findall(r"name=f?\"([^\"]*)\".*?color=\"(#[0-9a-fA-F]{6})\"", line)
    return found


def test_the_page_has_a_colour_per_phase_and_engine():
    assert set(page_colours()) >= {"prefill", "decode", "padding", "static", "continuous"}


def test_the_host_and_device_lanes_borrow_no_phase_or_engine_colour():
    lanes = (ROOT / "viz" / "lanes.js").read_text()
    table = re.search(r"const COLORS = \{([^}]*)\}", lanes)[1]
    colours = [c.lower() for c in re.findall(r"#[0-9a-fA-F]{6}", table)]
    assert len(colours) == len(set(colours)) == 4, colours
    assert not set(colours) & set(page_colours().values()), colours


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebooks_draw_each_phase_and_engine_in_the_pages_colour(path):
    page = page_colours()
    for label, colour in coloured_series(path):
        what = meaning(label)
        if what is not None:
            assert colour.lower() == page[what], (path.name, label, colour, page[what])
        else:  # another series must not borrow a phase's or an engine's colour
            assert colour.lower() not in page.values(), (path.name, label, colour)
    text = "\n".join("".join(c["source"]) for c in cells(path) if c["cell_type"] == "markdown")
    assert not re.search(r"[Oo]range (rows|cells|bars) (are|mean) padding", text)
    assert "橙色的行是填充" not in text


def test_the_colour_check_can_fail(tmp_path):
    bad = tmp_path / "01_x.ipynb"
    source = 'fig.add_bar(x=x, y=p, name="static: padding rows", marker_color="#f58518")\n'
    bad.write_text(json.dumps({"cells": [{"cell_type": "code", "source": [source]}]}))
    ((label, colour),) = coloured_series(bad)
    assert meaning(label) == "padding" and colour != page_colours()["padding"]


@pytest.mark.parametrize(
    "doc, parts",
    [
        ("docs/drill.md", ("**Rubric.**", "**Follow-ups.**", "**Model answer.**")),
        ("docs/zh/drill.md", ("**评分标准**", "**追问链**", "**参考回答。**")),
    ],
)
def test_the_drill_has_the_seeds_four_questions_each_with_rubric_follow_ups_and_answer(doc, parts):
    text = (ROOT / doc).read_text(encoding="utf-8")
    questions = re.split(r"^## \d\. ", text, flags=re.M)[1:]
    assert len(questions) == 4, doc
    for q in questions:
        for part in parts:
            assert q.count(part) == 1, (doc, q.splitlines()[0], part)
    # routing quotes the fleet (issue 33): the real replicas' option and the router's figures
    assert "--replicas" in questions[3] and "prefix-aware" in questions[3], doc
