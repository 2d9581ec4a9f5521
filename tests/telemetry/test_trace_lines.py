"""The trace writer's lines (orjson, for speed) hold exactly ``to_dict`` of each event,
whatever the event: UTF-8, integer keys as strings as ``json.dumps`` makes them,
and always strict JSON (a NaN is written as null)."""

from __future__ import annotations

import json

import pytest

from minicb import SamplingParams
from minicb.telemetry.events import StepTokens, to_dict
from minicb.telemetry.trace import TraceWriter
from tests.helpers import fake_engine


class CodeTokenizer:
    """Token i decodes to a character far from ASCII, so lines carry escapes."""

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(0x4E00 + i) if i % 3 else "\U0001f389" for i in ids)


def as_json(data: dict):
    """What ``data`` reads back as from any JSON file (integer keys become strings)."""
    return json.loads(json.dumps(data))


def test_every_line_reads_back_as_the_event(tmp_path):
    engine = fake_engine(num_kv_blocks=8, block_size=4, tokenizer=CodeTokenizer())
    seen = []
    engine.bus.subscribe(seen.extend)
    writer = TraceWriter(tmp_path / "t.jsonl", {"type": "header", "note": 'é "q" \\ \n'})
    engine.bus.subscribe(writer)
    for n in (3, 9, 14):  # enough to fill the pool: a preemption's events are in there too
        engine.add_request(list(range(1, n)), SamplingParams(max_tokens=12, stop=["x"]))
    engine.run_until_done()
    writer.close()
    lines = (tmp_path / "t.jsonl").read_text(encoding="utf-8").splitlines()
    assert json.loads(lines[0]) == {"type": "header", "note": 'é "q" \\ \n'}
    assert [json.loads(line) for line in lines[1:]] == [as_json(to_dict(e)) for e in seen]
    assert "é" in lines[0] and chr(0x4E00 + 7) in "".join(lines)  # UTF-8, not \u escapes
    kinds = {e.kind for e in seen}
    assert {"arrived", "admitted", "step", "tokens", "finished", "preempted"} <= kinds


def test_a_nan_is_written_as_null_so_the_file_stays_strict_json(tmp_path):
    writer = TraceWriter(tmp_path / "t.jsonl", {"type": "header"})
    event = StepTokens(
        time=float("nan"), step=1, request_ids=[0], token_ids=[7], indexes=[0], texts=[""]
    )
    writer([event])
    writer.close()
    _, line = (tmp_path / "t.jsonl").read_text(encoding="utf-8").splitlines()
    assert json.loads(line, parse_constant=lambda c: pytest.fail(f"{c} in a trace")) == {
        **to_dict(event),
        "time": None,
    }
