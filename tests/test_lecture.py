"""The lecture deck (docs/lecture/index.html): 90 minutes in timed slides, every slide in
both languages with notes, every figure present, the words defined before they are used,
and every live step either a command minicb takes or a lesson picked in the page's lesson
menu, naming a shipped scenario (whose claims tests/scenarios/test_claims.py checks): one
server for the lecture, the other commands marked optional."""

from __future__ import annotations

import re
import shlex
from html.parser import HTMLParser
from pathlib import Path

from minicb.cli import build_parser
from minicb.scenarios import scenario_names

DECK = Path(__file__).resolve().parent.parent / "docs" / "lecture" / "index.html"


class Slides(HTMLParser):
    """Each slide's attributes, its text by language, its images and its live commands."""

    def __init__(self) -> None:
        super().__init__()
        self.slides: list[dict] = []
        self.stack: list[tuple[str, dict]] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "section" and "slide" in attrs.get("class", ""):
            empty = {"en": "", "zh": ""}
            self.slides.append({**attrs, "text": dict(empty), "notes": dict(empty),
                                "images": [], "svgs": 0, "live": [], "optional": []})  # fmt: skip
        if tag == "img" and self.slides:
            self.slides[-1]["images"].append(attrs["src"])
        if tag == "svg" and self.slides:
            self.slides[-1]["svgs"] += 1
        if tag == "p" and "live" in attrs.get("class", "") and self.slides:
            self.slides[-1]["live"].append("")
            self.slides[-1]["optional"].append("optional" in attrs["class"])
        if tag not in ("img", "br", "meta", "sup"):
            self.stack.append((tag, attrs))

    def handle_endtag(self, tag):
        while self.stack:
            if self.stack.pop()[0] == tag:
                break

    def handle_data(self, data):
        if not self.slides or not data.strip():
            return
        slide = self.slides[-1]
        langs = [a["lang"] for _, a in self.stack if "lang" in a]
        in_notes = any(t == "aside" for t, _ in self.stack)
        if any("live" in a.get("class", "") for _, a in self.stack):
            slide["live"][-1] += data
        for lang in langs[-1:] or ("en", "zh"):
            (slide["notes"] if in_notes else slide["text"])[lang] += data


def slides() -> list[dict]:
    parser = Slides()
    parser.feed(DECK.read_text(encoding="utf-8"))
    return parser.slides


def minutes(at: str) -> int:
    h, m = at.split(":")
    return 60 * int(h) + int(m)


def test_the_deck_takes_ninety_minutes_in_order():
    deck = slides()
    assert len(deck) >= 12
    clock = 0
    for s in deck:
        assert minutes(s["data-at"]) == clock, s["data-at"]
        clock += int(s["data-minutes"])
    assert clock == 90


def test_every_slide_speaks_both_languages_and_has_timed_notes():
    for s in slides():
        for lang in ("en", "zh"):
            assert len(s["text"][lang].strip()) > 5, (s["data-at"], lang)
            assert s["notes"][lang].strip().startswith(s["data-at"]), (s["data-at"], lang)
        assert re.search(r"[\u4e00-\u9fff]", s["text"]["zh"]), s["data-at"]


def test_every_slide_has_a_figure_or_a_live_step_and_the_figures_exist():
    for s in slides():
        assert s["images"] or s["svgs"] or s["live"] or s["data-at"] == "0:47", s["data-at"]
        for src in s["images"]:
            assert (DECK.parent / src).resolve().is_file(), src


def test_the_words_are_defined_before_the_slides_that_use_them():
    """A basics slide (prefill, decode, the KV cache, TTFT/TPOT/ITL) comes before any other
    slide names them, and draws them."""
    deck = slides()
    basics = next(i for i, s in enumerate(deck) if "TPOT" in s["text"]["en"])
    assert deck[basics]["svgs"], "the basics slide draws a request's timeline"
    for word in ("Prefill", "decode", "KV cache", "TTFT", "ITL", "TPOT"):
        assert word in deck[basics]["text"]["en"], word
    for s in deck[:basics]:
        for word in ("prefill", "KV cache", "TTFT", "TPOT", "ITL"):
            assert word not in s["text"]["en"], (s["data-at"], word)


def test_the_mechanisms_are_drawn():
    """Static against continuous, the block table, a chunked iteration, the packed batch's
    attention mask, a draft verified in one step and the KV crossing to a decode GPU are
    diagrams drawn in the page, not screenshots, labelled in both languages; a slide says
    what each later idea buys."""
    deck = slides()
    drawn = {lang: " ".join(s["text"][lang] for s in deck if s["svgs"]) for lang in ("en", "zh")}
    labels = {
        "padding": "填充",
        "block tables": "块表",
        "budget 128": "预算 128",
        "one packed batch": "一个打包的批",
        "a key read from the KV cache": "从 KV 缓存读出的键",
        "one forward pass, 5 positions": "一次前向，5 个位置",
        "2 guesses +": "2 个草稿 +",
        "decode GPU": "解码 GPU",
        "the KV blocks cross a link": "KV 块经过一条链路过去",
    }
    for en, zh in labels.items():
        assert en in drawn["en"] and zh in drawn["zh"], (en, zh)
    beyond = [s for s in deck if "Beyond the batch" in s["text"]["en"]]
    assert len(beyond) == 1
    for idea in (
        "prefix caching",
        "speculative decoding",
        "8-bit KV cache",
        "overlap scheduling",
        "PD disaggregation",
        "fleet",
    ):
        assert idea in beyond[0]["text"]["en"], idea


LESSON = re.compile(r"^\s*(?:lesson menu|课程菜单)[:：]")


def test_every_live_step_is_a_lesson_or_a_command_minicb_takes():
    """A lesson step names shipped scenarios; a command parses. The lecture starts one
    server; every other command that would start another is marked optional."""
    parser = build_parser()
    names = set(scenario_names())
    steps = [
        (t.strip(), o) for s in slides() for t, o in zip(s["live"], s["optional"], strict=True)
    ]
    lessons = [text for text, _ in steps if LESSON.match(text)]
    assert len(lessons) >= 10
    for text in lessons:
        named = re.findall(r"\b\d\d[a-z]?-[a-z0-9-]+", text)
        assert named and set(named) <= names, text
    servers = []
    for cmd, optional in steps:
        if LESSON.match(cmd):
            continue
        argv = shlex.split(cmd)
        assert argv[0] == "minicb", cmd
        args = parser.parse_args(argv[1:])  # exits (fails the test) on an unknown option
        if getattr(args, "scenario", None):
            assert args.scenario in names, cmd
        files = [p for p in argv[2:] if p.endswith((".ipynb", ".jsonl"))]
        assert all(Path(DECK.parents[2], p).is_file() for p in files), cmd
        if argv[1] in ("demo", "serve", "replay") and not optional:
            servers.append(cmd)
    assert len(servers) == 1, servers


def test_the_recorded_live_step_replays(capsys):
    """The deck's recording opens in `minicb replay` (here without --serve: its figures)."""
    from minicb.cli import main

    live = [cmd for s in slides() for cmd in s["live"] if cmd.startswith("minicb replay")]
    assert live
    for cmd in live:
        argv = [a for a in shlex.split(cmd)[1:] if a != "--serve"]
        assert main(argv) == 0, cmd
    assert "TTFT" in capsys.readouterr().out
