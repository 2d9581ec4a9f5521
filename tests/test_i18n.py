"""The teaching material is in English and Chinese: the page's strings and the notebooks.

The page's strings live in ``viz/i18n.js`` (``STRINGS.en`` and ``STRINGS.zh``); a key missing
from ``zh`` silently falls back to English there, so a class in Chinese would see English
labels. Plain Python reads the JS file: the two tables are flat ``key: "text"`` lists.

The scheduler's reasons and the engine's rejections are shown on the page too, translated by
the patterns of ``REASONS`` (JS regular expressions of a syntax Python's ``re`` reads alike):
runs over FakeRunner that provoke every kind of decision (speculative drafts included) check
that each reason they give has a pattern, and that its Chinese leaves no English words
behind (a pattern whose ``(.+)`` swallows English words matches, yet shows them untranslated:
"n-gram of 3 tokens" did). The rendering is checked by the page's own ``translateReason``
under Node where Node is installed, and by the plain-string templates in Python everywhere.

Each notebook is one notebook for both languages, so the code never drifts between two
copies: every English markdown cell is followed by its Chinese translation, a markdown cell
marked ``"lang": "zh"`` in its metadata.
"""

from __future__ import annotations

import functools
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from minicb.core.config import SamplingParams
from minicb.core.scheduler import RequestRejected
from tests.helpers import add, fake_engine

ROOT = Path(__file__).resolve().parent.parent
VIZ = ROOT / "viz"
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
ENTRY = re.compile(r'(\w+): "((?:[^"\\]|\\.)*)"')
CJK = re.compile(r"[\u4e00-\u9fff]")
# Keys whose Chinese text may carry no Chinese character: "token" is the word Chinese
# texts on LLMs use (docs/zh keep it too).
LATIN_OK = {"tokens"}
# The Latin words a translated reason may keep: the units and names docs/zh keep too, the
# API's finish reasons, the KV reservations' names and the settings' own names.
REASON_LATIN_OK = set(
    "token KV CPU id n-gram stop length max pow2 oracle max_tokens max_num_batched_tokens "
    "expected_output_tokens messages".split()
)


def _tables() -> dict[str, dict[str, str]]:
    source = (VIZ / "i18n.js").read_text(encoding="utf-8")
    body = source[source.index("const STRINGS = {") : source.index("// [English pattern")]
    tables = {}
    for lang in ("en", "zh"):
        start = body.index(f"  {lang}: {{")
        end = body.index("\n  },", start)
        tables[lang] = dict(ENTRY.findall(body[start:end]))
    return tables


def _reason_templates() -> list[tuple[re.Pattern, str | None]]:
    """(pattern, Chinese template) in the page's order; None for a template that is code."""
    source = (VIZ / "i18n.js").read_text(encoding="utf-8")
    body = source[source.index("const REASONS = [") : source.index("\n];")]
    found = re.findall(r"^  \[/(.+?)/, (.*)\],$", body, re.M)
    return [
        (re.compile(p), t[1:-1] if t.startswith('"') and t.endswith('"') else None)
        for p, t in found
    ]


def _reason_patterns() -> list[re.Pattern]:
    return [p for p, _ in _reason_templates()]


def _reasons_of_a_run(**options) -> set[str]:
    """Every decision reason and note of a run made to preempt, swap, queue and abort."""
    options = {"num_kv_blocks": 12, "max_num_seqs": 4, "max_num_batched_tokens": 48, **options}
    engine = fake_engine(**options)
    ids = [add(engine, 20 + i, 30, priority=i % 3) for i in range(8)]
    engine.abort_request(ids[-1])
    seen: set[str] = set()
    while engine.has_unfinished():
        plan = engine.step().event.plan
        seen.update(d.reason for d in plan.admitted + plan.preempted + plan.finished)
        seen.update(d.reason for d in plan.swapped_out + plan.swapped_in + plan.drafted)
        seen.update(plan.notes)
    return seen


def _rejections() -> set[str]:
    """Each limit check_request names: empty, context, pool, one iteration's budget; and a
    token id outside the vocabulary."""
    engine = fake_engine(
        num_kv_blocks=4, enable_chunked_prefill=False, max_num_batched_tokens=48
    )  # a pool of 64 tokens in blocks of 16, a context of 256
    asks = [([], 4), ([5] * 256, 4), ([5] * 40, 40), ([5] * 30, 20), ([999], 4)]
    seen = set()
    for prompt, max_tokens in asks:
        with pytest.raises(RequestRejected) as err:
            engine.add_request(prompt, SamplingParams(max_tokens=max_tokens))
        seen.add(str(err.value))
    return seen


@functools.cache
def _all_reasons() -> frozenset[str]:
    seen = _rejections()
    for options in (
        {},
        {"preemption_mode": "swap"},
        {"policy": "priority"},
        {"batching": "static"},
        {"enable_chunked_prefill": False, "max_num_batched_tokens": 64},
        {"speculative": "ngram"},
        {"speculative": "ngram", "num_speculative_tokens": 8, "max_num_batched_tokens": 40},
        {"overlap_scheduling": True},  # a stopped request's row discarded (minicb/overlap/)
    ):
        seen |= _reasons_of_a_run(**options)
    return frozenset(seen)


def _english_left(chinese: str) -> list[str]:
    return [w for w in re.findall(r"[A-Za-z][A-Za-z0-9_-]*", chinese) if w not in REASON_LATIN_OK]


def test_every_reason_and_rejection_has_a_chinese_pattern():
    patterns = _reason_patterns()
    seen = _all_reasons()
    assert len(seen) > 20  # the runs really met many kinds of decision
    assert any(r.startswith("drafts ") for r in seen)  # speculative drafts among them
    untranslated = sorted(r for r in seen if not any(p.match(r) for p in patterns))
    assert untranslated == []


def test_a_translated_reason_leaves_no_english_behind():
    """The first matching pattern's plain-string template, filled as the page fills it,
    leaves only the Latin words docs/zh keep (token, KV, the settings' names)."""
    left = {}
    for reason in sorted(_all_reasons()):
        for pattern, template in _reason_templates():
            m = pattern.match(reason)
            if m:
                if template is not None:
                    out = re.sub(r"\$(\d)", lambda g, m=m: m.group(int(g.group(1))), template)
                    if _english_left(out):
                        left[reason] = out
                break
    assert left == {}


@pytest.mark.skipif(shutil.which("node") is None, reason="Node.js is not installed")
def test_the_pages_own_translation_leaves_no_english_behind():
    """The same, through viz/i18n.js's translateReason itself (the templates that are code,
    and the reasons nested in reasons, included)."""
    script = (
        'globalThis.localStorage = { getItem: () => "zh", setItem() {} };'
        "const { translateReason } = await import(process.argv[1]);"
        'let data = ""; for await (const c of process.stdin) data += c;'
        "process.stdout.write(JSON.stringify(JSON.parse(data).map(translateReason)));"
    )
    reasons = sorted(_all_reasons())
    done = subprocess.run(
        ["node", "--input-type=module", "-e", script, (VIZ / "i18n.js").as_uri()],
        input=json.dumps(reasons),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    chinese = json.loads(done.stdout)
    left = {r: c for r, c in zip(reasons, chinese, strict=True) if _english_left(c)}
    assert left == {}


def test_every_english_string_has_a_chinese_one():
    tables = _tables()
    assert len(tables["en"]) > 50  # the parser really read the table
    assert sorted(set(tables["en"]) - set(tables["zh"])) == []
    assert sorted(set(tables["zh"]) - set(tables["en"])) == []


def test_chinese_strings_are_chinese():
    zh = _tables()["zh"]
    untranslated = [k for k, v in zh.items() if k not in LATIN_OK and not CJK.search(v)]
    assert untranslated == []


def test_every_key_the_page_uses_is_defined():
    en = _tables()["en"]
    html = (VIZ / "index.html").read_text(encoding="utf-8")
    used = set(re.findall(r'data-i18n(?:-ph|-title)?="(\w+)"', html))
    for js in VIZ.glob("*.js"):
        used |= set(re.findall(r'\bt\("(\w+)"\)', js.read_text(encoding="utf-8")))
    assert sorted(used - set(en)) == []


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_notebook_text_cell_is_followed_by_its_chinese(path):
    nbformat = pytest.importorskip("nbformat")
    cells = nbformat.read(path, as_version=4).cells
    missing = []
    for i, cell in enumerate(cells):
        if cell.cell_type != "markdown" or cell.metadata.get("lang") == "zh":
            continue
        nxt = cells[i + 1] if i + 1 < len(cells) else None
        ok = nxt is not None and nxt.cell_type == "markdown" and nxt.metadata.get("lang") == "zh"
        if not (ok and CJK.search(nxt.source)):
            missing.append(cell.source.splitlines()[0])
    assert missing == []
