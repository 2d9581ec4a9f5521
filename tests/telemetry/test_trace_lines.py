"""The trace writer's lines (orjson, for speed) hold exactly ``to_dict`` of each event,
whatever the event: UTF-8, integer keys as strings as ``json.dumps`` makes them,
and always strict JSON (a NaN is written as null); a file that fails (a full disk) is told
in one line, never a traceback at exit."""

from __future__ import annotations

import errno
import io
import json
import logging

import pytest

from minicb import SamplingParams
from minicb.core.request_events import StepTokens
from minicb.telemetry import trace
from minicb.telemetry.event_json import to_dict
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


@pytest.mark.parametrize(
    "options",
    [
        {"preemption_mode": "swap", "num_swap_blocks": 16},
        {"overlap_scheduling": True},
        {"speculative": "ngram", "num_speculative_tokens": 3},
    ],
    ids=["swap", "overlap", "speculative"],
)
def test_lines_written_by_the_writers_thread_say_what_the_events_said_when_published(
    tmp_path, options
):
    """The writer's thread turns events into lines after the engine has moved on: a line
    must still be the event as it was published (nothing the engine does later shows)."""
    engine = fake_engine(num_kv_blocks=10, block_size=4, max_num_batched_tokens=16, **options)
    at_publish: list[str] = []
    engine.bus.subscribe(lambda es: at_publish.extend(json.dumps(to_dict(e)) for e in es))
    writer = TraceWriter(tmp_path / "t.jsonl", {"type": "header"}, engine.kv_snapshot_event)
    engine.bus.subscribe(writer)
    prompts = [[1, 2, 3, 1, 2, 3, 1, 2], [4] * 9, [1, 2, 3, 1, 2, 3, 5], [6, 7] * 5]
    for prompt in prompts:  # repeats for the n-gram drafts; a pool too small for all four
        engine.add_request(prompt, SamplingParams(max_tokens=10, ignore_eos=True))
    engine.run_until_done()
    writer.close()
    lines = (tmp_path / "t.jsonl").read_text(encoding="utf-8").splitlines()[1:]
    written = [json.loads(line) for line in lines if '"type":"kv_snapshot"' not in line]
    assert written == [json.loads(line) for line in at_publish]
    assert writer.num_events == len(lines) and not writer._lines.thread.is_alive()


def test_a_failing_file_is_told_to_the_bus_which_unsubscribes_the_writer(tmp_path, caplog):
    engine = fake_engine()
    writer = TraceWriter(tmp_path / "t.jsonl", {"type": "header"})
    engine.bus.subscribe(writer)
    writer._lines.file.close()  # as a full disk would: every write raises from now on
    engine.add_request([1, 2, 3], SamplingParams(max_tokens=30, ignore_eos=True))
    while engine.has_unfinished() and writer._lines.error is None:
        engine.step()
        writer._lines.thread.join(0.05)  # give its thread a turn
    assert isinstance(writer._lines.error, ValueError)
    engine.run_until_done()
    assert not engine.bus.listening  # the next call raised: the bus let the writer go
    assert "the trace stops here" in caplog.text and "hears no more events" in caplog.text
    writer.close()


class FullDisk(io.RawIOBase):
    """A file on a full disk: every write fails with ENOSPC (as /dev/full's do)."""

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.parametrize("steps", [1, 400], ids=["fails-at-close", "fails-in-the-thread"])
def test_a_full_disk_is_one_error_line_at_close_not_a_traceback(
    tmp_path, monkeypatch, caplog, steps
):
    """A few lines stay in the file's buffer until close() flushes them (the error comes
    there); many fill it and a write of the writer's thread fails first: one line either
    way, and close() returns."""
    monkeypatch.setattr(trace, "open", lambda *_: io.BufferedWriter(FullDisk()), raising=False)
    writer = TraceWriter(tmp_path / "t.jsonl", {"type": "header"})
    for step in range(steps):
        writer(
            [
                StepTokens(
                    time=0.0,
                    step=step,
                    request_ids=[0],
                    token_ids=[7],
                    indexes=[0],
                    texts=["x" * 40],
                )
            ]
        )
    with caplog.at_level(logging.ERROR, logger=trace.__name__):
        writer.close()
    (record,) = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert "t.jsonl" in record.getMessage() and "No space left on device" in record.getMessage()
    assert record.exc_info is None and "\n" not in record.getMessage()
    writer.close()  # a second close is quiet
