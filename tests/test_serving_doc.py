"""docs/serving.md backs each statement with a test it names (`tests/FILE.py::NAME`): every
name must exist, and the limits it quotes must be the code's."""

from __future__ import annotations

import re
from pathlib import Path

from minicb.server import guard, openai_params

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "serving.md").read_text()


def test_every_test_the_page_names_exists():
    named = re.findall(r"`(tests/[\w/]+\.py)::(\w+)`", DOC)
    assert len(named) >= 30
    missing = [
        f"{path}::{name}"
        for path, name in named
        if not re.search(rf"^(async )?def {name}\(", (ROOT / path).read_text(), re.M)
    ]
    assert missing == []


def test_the_limits_it_quotes_are_the_codes():
    assert f"More than {openai_params.MAX_STOP_STRINGS} stop strings" in DOC
    assert f"longer than {openai_params.MAX_STOP_CHARS} characters" in DOC
    assert f"shows {guard.GUESS_BURST} wrong keys" in DOC
