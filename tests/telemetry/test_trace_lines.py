"""The trace writer's lines are exactly ``json.dumps`` of ``to_dict`` with the trace's
options, whatever the event (the writer reuses one C encoder for speed), and it still
refuses a value strict JSON cannot hold."""

from __future__ import annotations

import json

import pytest

from minicb import SamplingParams
from minicb.telemetry.events import RequestToken, to_dict
from minicb.telemetry.trace import TraceWriter
from tests.helpers import fake_engine


class CodeTokenizer:
    """Token i decodes to a character far from ASCII, so lines carry escapes."""

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(0x4E00 + i) if i % 3 else "\U0001f389" for i in ids)


def dumps(data: dict) -> str:
    return json.dumps(data, separators=(",", ":"), allow_nan=False)


def test_every_line_is_json_dumps_of_the_event(tmp_path):
    engine = fake_engine(num_kv_blocks=8, block_size=4, tokenizer=CodeTokenizer())
    seen = []
    engine.bus.subscribe(seen.append)
    writer = TraceWriter(tmp_path / "t.jsonl", {"type": "header", "note": 'é "q" \\ \n'})
    engine.bus.subscribe(writer)
    for n in (3, 9, 14):  # enough to fill the pool: a preemption's events are in there too
        engine.add_request(list(range(1, n)), SamplingParams(max_tokens=12, stop=["x"]))
    engine.run_until_done()
    writer.close()
    lines = (tmp_path / "t.jsonl").read_text(encoding="utf-8").splitlines()
    assert lines[0] == dumps({"type": "header", "note": 'é "q" \\ \n'})
    assert lines[1:] == [dumps(to_dict(e)) for e in seen]
    kinds = {e.kind for e in seen}
    assert {"arrived", "admitted", "step", "token", "finished", "preempted"} <= kinds


def test_a_nan_is_refused(tmp_path):
    writer = TraceWriter(tmp_path / "t.jsonl", {"type": "header"})
    event = RequestToken(time=float("nan"), request_id=0, step=1, token_id=7, index=0, text="")
    with pytest.raises(ValueError, match="not JSON compliant"):
        writer(event)
    writer.close()
