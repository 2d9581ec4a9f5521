"""Each Chinese doc keeps up with its English twin.

The docs are written in English first and translated by hand into docs/zh (and README.md
into README.zh.md). A translation that falls behind is worse than none: a Chinese reader
is told of a schema, a module or a command that no longer matches the code, and nobody
notices because nobody reads both. So this test compares what a translation must carry
over unchanged, whatever the words around it:

- the outline: the same headings, at the same levels, in the same order;
- the tables: as many, each with as many rows, and the same code names (`...`) in each
  row's first column (the field, module, metric or option the row describes);
- the commands in code blocks (comments after ``#`` are translated, the command is not);
- the tests a doc cites as evidence (``tests/...``).

It cannot tell a good translation from a bad one; it tells a missing one from a present
one, which is what drifts when an English doc gains a row.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
# docs/glossary.md holds both languages side by side, so it has no twin.
BILINGUAL = {"glossary.md"}

CODE_BLOCK = re.compile(r"```[^\n]*\n(.*?)```", re.S)
COMMAND_START = r"minicb|make|\.venv/bin/\S+|python3?|PYTHONPATH=\S+|TRITON_INTERPRET=\S+|pytest"
COMMAND = re.compile(rf"^\s*(?:\$ )?((?:{COMMAND_START})\b.*)$")
HEADING = re.compile(r"^(#+) ", re.M)
CODE_NAME = re.compile(r"`([^`]+)`")
TEST_PATH = re.compile(r"tests/[\w/]+\.py(?:::\w+)?")


def twins() -> list[tuple[Path, Path]]:
    pairs = [(ROOT / "README.md", ROOT / "README.zh.md")]
    for english in sorted(DOCS.glob("*.md")):
        if english.name not in BILINGUAL:
            pairs.append((english, DOCS / "zh" / english.name))
    return pairs


def _prose(text: str) -> str:
    return CODE_BLOCK.sub("", text)


def outline(text: str) -> list[int]:
    return [len(m.group(1)) for m in HEADING.finditer(_prose(text))]


def tables(text: str) -> list[list[str]]:
    found: list[list[str]] = []
    rows: list[str] = []
    for line in _prose(text).splitlines() + [""]:
        if line.startswith("|"):
            rows.append(line)
        elif rows:
            found.append(rows)
            rows = []
    return found


def first_column_names(table: list[str]) -> list[list[str]]:
    return [CODE_NAME.findall(row.split("|")[1]) for row in table]


def commands(text: str) -> set[str]:
    found = set()
    for block in CODE_BLOCK.findall(text):
        for line in block.splitlines():
            if m := COMMAND.match(line):
                found.add(m.group(1).split("  #")[0].split(" # ")[0].strip())
    return found


PAIRS = twins()
IDS = [english.relative_to(ROOT).as_posix() for english, _ in PAIRS]


def test_every_english_doc_has_a_chinese_twin() -> None:
    missing = [e.relative_to(ROOT).as_posix() for e, zh in PAIRS if not zh.exists()]
    assert missing == []
    assert re.search(r"[\u4e00-\u9fff]", (DOCS / "glossary.md").read_text())


@pytest.mark.parametrize(("english", "chinese"), PAIRS, ids=IDS)
def test_the_translation_keeps_the_outline_tables_commands_and_evidence(
    english: Path, chinese: Path
) -> None:
    en, zh = english.read_text(), chinese.read_text()
    assert outline(zh) == outline(en), "headings differ in number or level"
    en_tables, zh_tables = tables(en), tables(zh)
    assert [len(t) for t in zh_tables] == [len(t) for t in en_tables], "table rows differ"
    for number, (a, b) in enumerate(zip(en_tables, zh_tables, strict=True)):
        a_names = {n for row in first_column_names(a) for n in row}
        b_names = {n for row in first_column_names(b) for n in row}
        assert a_names - b_names == set(), f"table {number}: rows missing in Chinese"
        assert b_names - a_names == set(), f"table {number}: rows only in Chinese"
    assert commands(zh) == commands(en)
    assert set(TEST_PATH.findall(zh)) == set(TEST_PATH.findall(en))
