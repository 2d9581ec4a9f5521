"""Every error path names its limit, and the engine goes on serving the other requests."""

import json

import pytest

from minicb import LLM, EngineConfig, SamplingParams
from minicb.core.runner.loader import ModelLoadError, open_model, resolve_model_path
from minicb.tiny_models import make_tiny_model_dir


# ---- loading -----------------------------------------------------------------------------
def test_unsupported_architecture(tmp_path):
    path = make_tiny_model_dir("llama", tmp_path)
    cfg = json.loads((path / "config.json").read_text())
    cfg["architectures"] = ["GPT2LMHeadModel"]
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(
        ModelLoadError,
        match="unsupported architecture.*GPT2LMHeadModel.*minicb runs LlamaForCausalLM",
    ):
        open_model(str(path))


def test_missing_folder_and_missing_files(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        resolve_model_path(str(tmp_path / "nope"))
    with pytest.raises(ModelLoadError, match="has no config.json"):
        resolve_model_path(str(tmp_path))
    path = make_tiny_model_dir("llama", tmp_path / "m")
    for f in path.glob("*.safetensors"):
        f.unlink()
    with pytest.raises(ModelLoadError, match="no .safetensors weight files"):
        LLM(model=str(path))


def test_hub_id_without_network():
    with pytest.raises(
        ModelLoadError, match="could not download 'someorg/somemodel'.*pass a local model folder"
    ):
        resolve_model_path("someorg/somemodel")


# ---- configuration -----------------------------------------------------------------------
@pytest.mark.parametrize(
    "options, message",
    [
        (dict(policy="lottery"), "unknown policy 'lottery'; choose one of fcfs, priority"),
        (dict(batching="dynamic"), "unknown batching 'dynamic'; choose one of continuous, static"),
        (
            dict(preemption_mode="drop"),
            "unknown preemption_mode 'drop'; choose one of recompute, swap",
        ),
        (dict(max_num_seqs=0), "max_num_seqs must be a positive integer, got 0"),
        (dict(block_size=-4), "block_size must be a positive integer, got -4"),
    ],
)
def test_bad_engine_options(options, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig.from_kwargs(**options)


def test_unknown_engine_option_is_named():
    with pytest.raises(TypeError, match="unknown engine option\\(s\\): max_batch"):
        EngineConfig.from_kwargs(max_batch=4)


# ---- requests ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def llm(tiny_llama_dir):
    # Context of 512 tokens; a pool of 8 blocks of 16 = 128 tokens.
    return LLM(model=tiny_llama_dir, num_kv_blocks=8, block_size=16)


@pytest.mark.parametrize(
    "prompt, params, message",
    [
        (
            [1] * 600,
            SamplingParams(max_tokens=4),
            "prompt of 600 tokens does not fit the model's context of 512",
        ),
        (
            [1] * 100,
            SamplingParams(max_tokens=40),
            "needs up to 140 tokens of KV cache .* whole pool holds 128",
        ),
        ([], SamplingParams(max_tokens=4), "the prompt is empty"),
        ([1, 999], SamplingParams(max_tokens=4), "token id 999 is outside the vocabulary of 256"),
        ("hello", SamplingParams(max_tokens=4), "no tokenizer; give token ids"),
    ],
)
def test_bad_request_is_refused_and_others_continue(llm, prompt, params, message):
    engine = llm.engine
    good = engine.add_request([5, 6, 7], SamplingParams(max_tokens=3, temperature=0.0))
    with pytest.raises(ValueError, match=message):
        engine.add_request(prompt, params)
    outs = engine.run_until_done()
    assert [o.request_id for o in outs] == [good] and len(outs[0].token_ids) == 3
    assert engine.kv_snapshot().num_used == 0


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(max_tokens=0), "max_tokens must be at least 1, got 0"),
        (dict(max_tokens=-3), "max_tokens must be at least 1, got -3"),
        (dict(temperature=-1.0), "temperature must be in \\[0, 100\\]"),
        (dict(top_p=0.0), "top_p must be in \\(0, 1\\]"),
        (dict(top_k=-1), "top_k must be 0 \\(off\\) or positive"),
    ],
)
def test_bad_sampling_params(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_without_chunked_prefill_a_request_must_fit_the_budget(tiny_llama_dir):
    llm = LLM(
        model=tiny_llama_dir,
        num_kv_blocks=16,
        enable_chunked_prefill=False,
        max_num_batched_tokens=32,
    )
    with pytest.raises(ValueError, match="exceeds max_num_batched_tokens=32"):
        llm.generate([[1] * 30], SamplingParams(max_tokens=8))


def test_generate_leaves_nothing_behind_when_one_prompt_is_bad(llm):
    with pytest.raises(ValueError, match="outside the vocabulary"):
        llm.generate([[5, 6], [7, 8], [1000]], SamplingParams(max_tokens=2))
    assert not llm.engine.has_unfinished()
    assert llm.engine.kv_snapshot().num_used == 0


def test_abort_frees_blocks_at_once(llm):
    engine = llm.engine
    rid = engine.add_request([5] * 40, SamplingParams(max_tokens=20))
    engine.step()
    assert engine.kv_snapshot().num_used > 0
    assert engine.abort_request(rid)
    assert engine.kv_snapshot().num_used == 0
    assert not engine.abort_request(rid)
    assert [d.reason for d in engine.step().plan.finished] == ["aborted by the client"]


@pytest.mark.parametrize("serve", [False, True])
def test_a_trace_with_fields_of_the_wrong_type_is_one_error_line(tmp_path, capsys, serve):
    from minicb.cli import main
    from minicb.telemetry.trace import TraceWriter, trace_header
    from tests.helpers import add, fake_engine

    engine = fake_engine()
    path = tmp_path / "t.jsonl"
    writer = TraceWriter(path, trace_header(engine, command="test"))
    engine.bus.subscribe(writer)
    add(engine, 5, 4)
    engine.run_until_done()
    writer.close()
    lines = path.read_text().splitlines()
    broken = [json.loads(line) for line in lines]
    for event in broken:
        if event.get("type") == "step":
            event["kv_used"] = "many"
        if event.get("type") == "tokens":
            event["time"] = "soon"
    path.write_text("\n".join(json.dumps(e) for e in broken) + "\n")
    argv = ["replay", str(path)] + (["--serve", "--port", "1"] if serve else [])
    assert main(argv) == 2  # before serving anything
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"minicb replay: error: {path} is not a usable trace" in err
