"""Traces: record a real run, replay it to the same metrics, refuse what cannot be read,
and export a Chrome/Perfetto trace whose tracks are well formed."""

from __future__ import annotations

import json
import platform
from importlib import metadata

import pytest

from minicb import LLM, SamplingParams
from minicb.cli import main
from minicb.core.config import EngineConfig
from minicb.core.events import SCHEMA_VERSION
from minicb.telemetry.metrics import MetricsCollector, compute_metrics
from minicb.telemetry.perfetto import BATCH, REQUESTS, to_chrome_trace
from minicb.telemetry.trace import record_trace
from minicb.telemetry.trace_reader import TraceError, read_trace
from minicb.tiny_models import make_tiny_model_dir
from tests.helpers import add, fake_engine

PROMPTS = [[3, 4, 5, 6, 7, 8, 9, 10, 11], [12, 13, 14], [15] * 12, [16, 17, 18, 19, 20]]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A tiny real model run with a preemption, recorded while metrics are taken live; with
    the engine's own description, so that the header is checked against the device it ran on."""
    folder = tmp_path_factory.mktemp("tiny")
    llm = LLM(
        model=str(make_tiny_model_dir("llama", folder / "model")),
        num_kv_blocks=12,
        block_size=4,
        max_num_batched_tokens=16,
        max_num_seqs=4,
    )
    live = MetricsCollector()
    llm.engine.bus.subscribe(live)
    path = folder / "run.jsonl"
    with record_trace(llm.engine, path, workload="test"):
        outs = llm.generate(PROMPTS, SamplingParams(max_tokens=10, temperature=0.0))
        with pytest.raises(ValueError):
            llm.generate([[1] * 600])  # rejected: longer than the context
        rid = llm.engine.add_request([21, 22, 23], SamplingParams(max_tokens=30))
        llm.engine.step()
        llm.engine.abort_request(rid)
        llm.engine.step()
    return path, live, outs, llm.engine.describe()


def test_a_trace_replays_to_exactly_the_live_metrics(recorded):
    path, live, outs, _ = recorded
    replayed = compute_metrics(read_trace(path).events, ttft_slo=0.5, tpot_slo=0.05)
    assert replayed == live.summary(ttft_slo=0.5, tpot_slo=0.05)  # equal, not approximately
    assert replayed["requests"] == {
        "arrived": 5,
        "finished": 4,
        "aborted": 1,
        "rejected": 1,
        "tokens_generated": 41,
    }
    # the requests' own counts (the aborted one ran one step alone: never preempted)
    assert replayed["preemptions"]["total"] == sum(o.metrics.num_preemptions for o in outs) >= 1


def test_the_trace_holds_the_run(recorded):
    path, _, outs, described = recorded
    trace = read_trace(path)
    h = trace.header
    assert h["format"] == "minicb-trace" and h["schema_version"] == SCHEMA_VERSION
    assert h["config"]["block_size"] == 4 and h["workload"] == "test"
    assert h["hardware"]["device"] == described["runner"]["device"]
    assert h["hardware"]["num_kv_blocks"] == 12
    assert h["versions"]["torch"] == metadata.version("torch")
    assert h["versions"]["python"] == platform.python_version()
    for out in outs:
        tokens = [
            token
            for e in trace.events
            if e.kind == "tokens"
            for rid, token in zip(e.request_ids, e.token_ids, strict=True)
            if rid == out.request_id
        ]
        assert tokens == out.token_ids


def test_replay_command_prints_metrics_and_writes_perfetto(recorded, tmp_path, capsys):
    path, live, _, _ = recorded
    assert main(["replay", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads(json.dumps(live.summary()))
    out_json = tmp_path / "run.perfetto.json"
    assert main(["replay", str(path), "--perfetto", str(out_json), "--ttft-slo", "1"]) == 0
    text = capsys.readouterr().out
    assert "TTFT" in text and "goodput" in text and "Perfetto trace written" in text
    trace = read_trace(path)  # the file holds the export of the trace, nothing else
    expected = json.loads(json.dumps(to_chrome_trace(trace.events, trace.header)))
    assert json.loads(out_json.read_text()) == expected


def test_perfetto_export_has_well_formed_tracks(recorded):
    path, _, outs, _ = recorded
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


def test_a_trace_from_another_schema_is_refused_naming_both_versions(tmp_path):
    # A hand-written v1 trace: its step events had block counts, not block ids.
    v1_step = {"type": "step", "index": 1, "scheduled": [{"request_id": 0, "num_blocks": 2}]}
    old = write_trace(tmp_path / "old.jsonl", 1, [v1_step])
    with pytest.raises(TraceError, match=r"schema version 1; this minicb reads version 4"):
        read_trace(old)
    assert main(["replay", str(old)]) == 2  # a clear error, not a traceback
    new = write_trace(tmp_path / "new.jsonl", SCHEMA_VERSION + 1)
    with pytest.raises(
        TraceError,
        match=rf"version {SCHEMA_VERSION + 1}; this minicb reads version {SCHEMA_VERSION}",
    ):
        read_trace(new)


def test_a_version_3_trace_reads_as_the_same_run(recorded, tmp_path):
    """Version 3 wrote a line per token, each after its first-token line; read, they are
    the step's one tokens event again, after the step's first-token events."""
    path = recorded[0]
    header, *lines = [json.loads(line) for line in path.read_text("utf-8").splitlines()]
    old = []
    for line in lines:
        if line["type"] != "tokens":
            if line["type"] != "first_token":  # v3 wrote these beside their token lines
                old.append(line)
            continue
        columns = zip(line["request_ids"], line["token_ids"], line["indexes"], line["texts"],
                      strict=True)  # fmt: skip
        for rid, token, index, text in columns:
            at = {"time": line["time"], "request_id": rid, "step": line["step"]}
            if index == 0:
                old.append({"type": "first_token", **at})
            old.append({"type": "token", **at, "token_id": token, "index": index, "text": text})
    v3 = tmp_path / "v3.jsonl"
    v3.write_text("\n".join(json.dumps(x) for x in [{**header, "schema_version": 3}, *old]) + "\n")
    converted, now = read_trace(v3), read_trace(path)
    assert converted.header["converted_from"] == 3
    assert converted.header["schema_version"] == SCHEMA_VERSION
    assert converted.events == now.events
    assert sum(e.kind == "tokens" for e in now.events) > 5  # the run had tokens to fold


def test_a_reset_event_round_trips_through_a_trace(tmp_path):
    engine = fake_engine(block_size=4)
    path = tmp_path / "reset.jsonl"
    with record_trace(engine, path):
        add(engine, 3, 2)
        engine.step()
        engine = engine.rebuilt(EngineConfig(block_size=8, batching="static"))
        add(engine, 3, 2)
        engine.run_until_done()
    trace = read_trace(path)
    (reset,) = [e for e in trace.events if e.kind == "reset"]
    assert reset.info["batching"] == "static" and reset.info["block_size"] == 8
    assert [e.kind for e in trace.events].count("aborted") == 1
    compute_metrics(trace.events)  # a reset mid-trace does not trip the metrics up
    to_chrome_trace(trace.events, trace.header)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "not a minicb trace"),
        ('{"type": "header", "format": "other"}\n', "not a minicb trace"),
        ("not json\n", "line 1: not valid JSON"),
        ('{"type":"header","format":"minicb-trace","schema_version":2}\n{"type":"x"}\n', "line 2"),
    ],
)
def test_broken_files_are_refused_with_the_line(tmp_path, content, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(TraceError, match=message):
        read_trace(path)
    assert main(["replay", str(path)]) == 2  # a clear error, not a traceback


HEADER = json.dumps({"type": "header", "format": "minicb-trace", "schema_version": SCHEMA_VERSION})
TOKENS = '{"type": "tokens", "time": %s, "step": 1, "request_ids": [0], "token_ids": [7], '
TOKENS += '"indexes": [0], "texts": [""], "extra": {"deep": [1.5, %s]}}'


@pytest.mark.parametrize(
    ("time", "deep", "field", "value"),
    [
        ("NaN", "2", "time", "NaN"),
        ("1.0", "-Infinity", "extra.deep[1]", "-Infinity"),
        ("1e400", "2", "time", "1e400"),
        ("2.0", "Infinity", "extra.deep[1]", "Infinity"),
    ],
)
def test_a_number_json_cannot_carry_is_refused_naming_line_and_field(
    tmp_path, capsys, time, deep, field, value
):
    """NaN and the infinities are no JSON (a page's JSON.parse refuses the replay that
    carries them) and no time or count: refused as the file is read, in one line."""
    path = tmp_path / "nan.jsonl"
    path.write_text(HEADER + "\n\n" + TOKENS % (time, deep) + "\n")
    with pytest.raises(TraceError) as refused:
        read_trace(path)
    said = str(refused.value)
    assert said.startswith(f"{path}, line 3: ") and said.count("line 3") == 1
    assert f"field {field!r}" in said and value in said
    assert main(["replay", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"field {field!r}" in err and "Traceback" not in err


def test_a_malformed_line_is_named_once(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(HEADER + "\n{not json\n")
    with pytest.raises(TraceError) as refused:
        read_trace(path)
    assert str(refused.value).count("line 2") == 1 and "not valid JSON" in str(refused.value)


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
    texts = [text for e in trace.events if e.kind == "tokens" for text in e.texts]
    assert 1 <= len(texts) <= 3 and "".join(texts) in capsys.readouterr().out
