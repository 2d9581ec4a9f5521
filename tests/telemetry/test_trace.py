"""Traces: record a real run, replay it to the same metrics, refuse what cannot be read,
and export a Chrome/Perfetto trace whose tracks are well formed."""

from __future__ import annotations

import json

import pytest

import minicb.telemetry.trace as trace_mod
from minicb import LLM, SamplingParams
from minicb.cli import main
from minicb.telemetry.bus import attach
from minicb.telemetry.events import SCHEMA_VERSION
from minicb.telemetry.metrics import MetricsCollector, compute_metrics
from minicb.runner.loader import make_tiny_model_dir
from minicb.telemetry.trace import TraceError, read_trace, record_trace
from minicb.telemetry.trace import BATCH, REQUESTS, to_chrome_trace

PROMPTS = [[3, 4, 5, 6, 7, 8, 9, 10, 11], [12, 13, 14], [15] * 12, [16, 17, 18, 19, 20]]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A tiny real model run with a preemption, recorded while metrics are taken live."""
    folder = tmp_path_factory.mktemp("tiny")
    llm = LLM(
        model=str(make_tiny_model_dir("llama", folder / "model")),
        num_kv_blocks=12,
        block_size=4,
        max_num_batched_tokens=16,
        max_num_seqs=4,
    )
    live = MetricsCollector()
    attach(llm.engine).subscribe(live)
    path = folder / "run.jsonl"
    with record_trace(llm.engine, path, workload="test"):
        outs = llm.generate(PROMPTS, SamplingParams(max_tokens=10, temperature=0.0))
        with pytest.raises(ValueError):
            llm.generate([[1] * 600])  # rejected: longer than the context
        rid = llm.engine.add_request([21, 22, 23], SamplingParams(max_tokens=30))
        llm.engine.step()
        llm.engine.abort_request(rid)
        llm.engine.step()
    return path, live, outs


def test_a_trace_replays_to_exactly_the_live_metrics(recorded):
    path, live, _ = recorded
    replayed = compute_metrics(read_trace(path).events, ttft_slo=0.5, tpot_slo=0.05)
    assert replayed == live.summary(ttft_slo=0.5, tpot_slo=0.05)  # equal, not approximately
    assert replayed["requests"] == {
        "arrived": 5,
        "finished": 4,
        "aborted": 1,
        "rejected": 1,
        "tokens_generated": 41,
    }
    assert replayed["preemptions"]["total"] >= 1


def test_the_trace_holds_the_run(recorded):
    path, _, outs = recorded
    trace = read_trace(path)
    h = trace.header
    assert h["format"] == "minicb-trace" and h["schema_version"] == SCHEMA_VERSION
    assert h["config"]["block_size"] == 4 and h["workload"] == "test"
    assert h["hardware"]["device"] == "cpu" and h["hardware"]["num_kv_blocks"] == 12
    assert h["versions"]["torch"] and h["versions"]["python"]
    for out in outs:
        tokens = [
            e.token_id for e in trace.events if e.kind == "token" and e.request_id == out.request_id
        ]
        assert tokens == out.token_ids


def test_replay_command_prints_metrics_and_writes_perfetto(recorded, tmp_path, capsys):
    path, live, _ = recorded
    assert main(["replay", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads(json.dumps(live.summary()))
    out_json = tmp_path / "run.perfetto.json"
    assert main(["replay", str(path), "--perfetto", str(out_json), "--ttft-slo", "1"]) == 0
    text = capsys.readouterr().out
    assert "TTFT" in text and "goodput" in text and "Perfetto trace written" in text
    assert json.loads(out_json.read_text())["traceEvents"]


def test_perfetto_export_has_well_formed_tracks(recorded):
    path, _, outs = recorded
    trace = read_trace(path)
    doc = to_chrome_trace(trace.events, trace.header)
    events = doc["traceEvents"]
    json.dumps(doc, allow_nan=False)
    assert doc["otherData"]["config"]["block_size"] == 4
    for e in events:
        assert e["ph"] in ("X", "i", "C", "M")
        if e["ph"] != "M":
            assert isinstance(e["ts"], int) and e["ts"] >= 0
        if e["ph"] == "X":
            assert isinstance(e["dur"], int) and e["dur"] >= 0
    names = {
        (e["pid"], e.get("tid")): e["args"]["name"] for e in events if e["name"] == "thread_name"
    }
    assert names[(BATCH, 0)] == "steps"
    for out in outs:
        assert names[(REQUESTS, out.request_id)] == f"request {out.request_id}"
    # Slices on one track nest or follow each other; a partial overlap would be drawn wrong.
    tracks: dict[tuple, list] = {}
    for e in events:
        if e["ph"] == "X":
            tracks.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    for spans in tracks.values():
        open_ends: list[int] = []
        for start, end in sorted(spans, key=lambda s: (s[0], -s[1])):
            while open_ends and open_ends[-1] <= start:
                open_ends.pop()
            assert not open_ends or end <= open_ends[-1], "slices overlap without nesting"
            open_ends.append(end)
    labels = {e["name"] for e in events if e["pid"] == REQUESTS}
    assert {"queued", "prefill", "decode", "first token", "finished (length)", "aborted"} <= labels
    assert any(label.startswith("waiting (preempted") for label in labels)


def write_trace(path, version, lines=()):
    header = {"type": "header", "format": "minicb-trace", "schema_version": version}
    path.write_text("\n".join(json.dumps(x) for x in [header, *lines]) + "\n")
    return path


def test_a_trace_from_an_older_schema_is_refused_clearly(tmp_path):
    old = write_trace(tmp_path / "old.jsonl", 0, [{"type": "aborted", "t": 1.0, "id": 3}])
    with pytest.raises(TraceError, match=r"schema version 0, which this minicb can no longer read"):
        read_trace(old)
    new = write_trace(tmp_path / "new.jsonl", SCHEMA_VERSION + 1)
    with pytest.raises(TraceError, match="newer than this minicb understands"):
        read_trace(new)


def test_a_trace_from_an_older_schema_is_read_when_a_migration_exists(tmp_path, monkeypatch):
    # Pretend the schema moved on to a version where "aborted" was called differently.
    def rename_fields(data):
        data = dict(data)
        if "t" in data:
            data["time"], data["request_id"] = data.pop("t"), data.pop("id")
            data["num_output_tokens"] = 0
        return data

    monkeypatch.setattr(trace_mod, "SCHEMA_VERSION", 1)
    monkeypatch.setattr(trace_mod, "MIGRATIONS", {0: rename_fields})
    old = write_trace(tmp_path / "old.jsonl", 0, [{"type": "aborted", "t": 1.0, "id": 3}])
    (event,) = read_trace(old).events
    assert event.kind == "aborted" and event.request_id == 3


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "not a minicb trace"),
        ('{"type": "header", "format": "other"}\n', "not a minicb trace"),
        ("not json\n", "line 1: not valid JSON"),
        ('{"type":"header","format":"minicb-trace","schema_version":1}\n{"type":"x"}\n', "line 2"),
    ],
)
def test_broken_files_are_refused_with_the_line(tmp_path, content, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(TraceError, match=message):
        read_trace(path)
    assert main(["replay", str(path)]) == 2  # a clear error, not a traceback


def test_replay_of_a_missing_file_is_a_clear_error(tmp_path, capsys):
    assert main(["replay", str(tmp_path / "nope.jsonl")]) == 2
    assert "cannot read" in capsys.readouterr().err


@pytest.mark.slow
def test_generate_writes_a_trace(tmp_path, capsys):
    path = tmp_path / "gen.jsonl"
    assert (
        main(
            [
                "generate",
                "Hello",
                "--max-tokens",
                "3",
                "--num-kv-blocks",
                "32",
                "--trace",
                str(path),
            ]
        )
        == 0
    )
    trace = read_trace(path)
    assert trace.header["model"] and trace.header["command"] == "generate"
    (arrived,) = [e for e in trace.events if e.kind == "arrived"]
    assert arrived.prompt == "Hello"  # the prompt text travels with the arrival
    tokens = [e for e in trace.events if e.kind == "token"]
    assert 1 <= len(tokens) <= 3 and "".join(t.text for t in tokens) in capsys.readouterr().out
