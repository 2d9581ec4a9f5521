"""The glossary (docs/glossary.md) is applied everywhere a student reads.

Its tables name, for each idea, one English and one Chinese term, and in the last column
the wordings to avoid (Python regular expressions in backticks). This test reads that
column and fails on any of those wordings in the docs, the READMEs, the notebooks, the
scenarios and the page's text, naming the file and line; the glossary itself is the one
place they may appear (it glosses the other industry names once).

A line is scanned as a reader sees it: emphasis marks (``**``, ``*``, backticks) taken out
and the spaces between two Chinese characters closed, so that ``*连续*分配器`` or
``**连续** 的内存`` cannot hide a leak behind the markup.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
GLOSSARY = ROOT / "docs" / "glossary.md"


def avoid_patterns(text: str) -> dict[str, str]:
    """{pattern: preferred term} from the glossary's tables (avoid is the last column)."""
    patterns = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 4 or not line.lstrip().startswith("|"):
            continue
        for pattern in re.findall(r"`([^`]+)`", cells[-1]):
            patterns[pattern] = f"{cells[0]} / {cells[1]}"
    return patterns


def student_files() -> list[Path]:
    files = [
        *(ROOT / "docs").rglob("*.md"),
        *(ROOT / "docs").rglob("*.html"),
        ROOT / "README.md",
        ROOT / "README.zh.md",
        *(ROOT / "notebooks").rglob("*.ipynb"),
        *(ROOT / "minicb" / "scenarios").glob("*.json"),
        ROOT / "viz" / "i18n.js",
    ]
    return sorted(p for p in files if p != GLOSSARY)


def readable_lines(path: Path) -> list[str]:
    """The lines a reader sees: a notebook's cell sources, any other file as it is."""
    if path.suffix == ".ipynb":
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        return [line for c in cells for line in "".join(c["source"]).splitlines()]
    return path.read_text(encoding="utf-8").splitlines()


EMPHASIS = re.compile(r"\*+|`")
CJK_GAP = re.compile(r"(?<=[\u3400-\u9fff])\s+(?=[\u3400-\u9fff])")


def as_read(line: str) -> str:
    """A line without its emphasis marks and the spaces between Chinese characters."""
    return CJK_GAP.sub("", EMPHASIS.sub("", line))


def offences(patterns: dict[str, str], files: list[Path]) -> list[str]:
    found = []
    for path in files:
        for n, line in enumerate(readable_lines(path), 1):
            for pattern, preferred in patterns.items():
                for m in re.finditer(pattern, as_read(line)):
                    found.append(
                        f"{path.relative_to(ROOT)}:{n}: {m.group(0)!r} "
                        f"(the glossary says {preferred})"
                    )
    return found


def test_the_glossary_names_wordings_to_avoid():
    patterns = avoid_patterns(GLOSSARY.read_text(encoding="utf-8"))
    for must in ("投机解码", "分块预填充", "预填充块", "连续的?预留", "连续的?分配", "不是连续的",
                 r"笔记本(?!电脑)", "(?<!随机)种子(?!词条)", "接缝", "成反比地"):
        assert must in patterns, must
    for pattern in patterns:
        re.compile(pattern)


def test_no_file_uses_a_wording_the_glossary_avoids():
    patterns = avoid_patterns(GLOSSARY.read_text(encoding="utf-8"))
    found = offences(patterns, student_files())
    assert not found, "\n".join(found)


@pytest.mark.parametrize(
    "text, bad",
    [
        ("在这台笔记本上", True),
        ("在这台笔记本电脑上", False),
        ("投机解码很快", True),
        ("分段预填充", False),
        ("不分块时", True),
        ("GPU utilization", True),
        ("gpu_memory_utilization", False),
        ("GPU utilisation", False),
        # contiguous is not continuous, whatever the markup or a word between
        ("*连续*分配器（每个请求一整段）", True),
        ("**连续**的内存", True),
        ("连续 的 内存区域", True),
        ("块不是连续的，所以没有外部碎片", True),
        ("**连续批处理**", False),
        ("拆成几条连续的 `frame` 消息", False),
        # a random seed is 随机种子; 种子 alone is the seed entry
        ("种子 0 到 3", True),
        ("带**种子**的负载", True),
        ("随机种子 0 到 3", False),
        ("种子词条的四道题", False),
        # calques
        ("`Runner.execute(plan)` 就是那个接缝", True),
        ("离开了不量化模型的结果", True),
        ("请求一完成就离开了批", False),
        ("与每秒 token 数成反比地下降", True),
        ("与每秒 token 数成反比", False),
    ],
)
def test_the_scan_catches_what_it_should(tmp_path, text, bad):
    """The check itself can fail: a planted wording is found, the preferred one is not."""
    patterns = avoid_patterns(GLOSSARY.read_text(encoding="utf-8"))
    planted = tmp_path / "doc.md"
    planted.write_text(f"line one\n{text}\n", encoding="utf-8")
    old_root = globals()["ROOT"]
    globals()["ROOT"] = tmp_path
    try:
        assert bool(offences(patterns, [planted])) is bad
    finally:
        globals()["ROOT"] = old_root
