"""Lesson 09, the 8-bit KV cache: its pools are one KV memory, and what its narration says
holds when it plays (issue 37).

The scenario fixes each side's pool in blocks (EngineConfig has no byte budget), so the first
test checks those counts against the embedded model's own bytes a block: 72 MiB divided by
them, as perflab.kv_quant_batch sizes its pools for docs/performance.md. The plays run on
the simulated L4 of test_claims.py and (slow) on the tiny random model, through the real
runner and the real int8 store path; neither reads a wall-clock time.
"""

import pytest
import torch

from minicb.core.runner.build_model import model_config
from minicb.core.runner.kv_pool import bytes_per_block
from minicb.core.runner.loader import load_hf_config, resolve_model_path
from minicb.scenarios import load_scenario
from minicb.scenarios.player import build_engines, play
from minicb.scenarios.side_figures import side_metric

NAME = "09-kv-cache-8bit"
KV_MIB = 72


@pytest.fixture(scope="module")
def scenario():
    return load_scenario(NAME)


def test_both_pools_are_the_same_kv_memory_on_the_embedded_model(scenario):
    cfg = model_config(load_hf_config(resolve_model_path(None)))  # no weights read
    sizes = {}
    for side in scenario.sides:
        engine = side.engine
        assert engine["dtype"] == "float32"  # the bytes below are float32's
        block = (16, cfg.num_kv_heads, cfg.head_dim)
        sizes[side.name] = bytes_per_block(
            cfg.num_layers, block, engine["kv_cache_dtype"], torch.float32
        )
        assert engine["num_kv_blocks"] == KV_MIB * 2**20 // sizes[side.name]
    # The narration quotes these bytes: they are the model's.
    text = scenario.narration[0].text["en"]
    assert f"{sizes['auto']:,} bytes" in text and f"{sizes['int8']:,} bytes" in text


def _check_the_narration(records):
    auto, int8 = records["auto"], records["int8"]
    assert side_metric(int8, "kv_blocks") > 3.5 * side_metric(auto, "kv_blocks")
    assert side_metric(int8, "mean_rows") > 1.3 * side_metric(auto, "mean_rows")
    assert side_metric(auto, "preemptions") >= 1 and side_metric(int8, "preemptions") == 0


def test_on_a_simulated_gpu_int8_holds_more_blocks_and_a_larger_batch(scenario):
    result = play(scenario, build_engines(scenario, profile="L4:llama-3.1-8b"))
    _check_the_narration(result.records)
    # The throughput claim, on the simulator's clock (the page's figure on the real model).
    int8, auto = (side_metric(result.records[s], "throughput") for s in ("int8", "auto"))
    assert int8 > auto


@pytest.mark.slow  # 160 real steps with an int8 cache: about a minute on two loaded cores
def test_on_a_real_model_the_int8_cache_runs_the_larger_batch(scenario, tiny_llama_dir):
    engines = build_engines(scenario, model=str(tiny_llama_dir))
    # What the page's panel reads: which format the int8 side's cache is in.
    assert engines["int8"].describe()["config"]["kv_cache_dtype"] == "int8"
    assert engines["int8"].runner.describe()["kv_cache_dtype"].startswith("int8")
    result = play(scenario, engines)
    _check_the_narration(result.records)
    for record in result.records.values():
        assert len(record.requests["finished"]) == 24
    for engine in engines.values():
        assert engine.kv_snapshot().num_used == 0  # every block back in the pool


@pytest.mark.slow  # a simulated H100 lesson run to its end
def test_at_gpu_scale_the_pools_and_batches_are_the_ones_the_narration_quotes():
    """Lesson 09b: the simulated H100's pools come from its memory and the format (no
    block count in the file), and the narration's figures are this run's."""
    from dataclasses import replace

    from minicb.cost_model.catalogue import load_profile

    scenario = load_scenario("09b-kv-cache-8bit-h100")
    assert all("num_kv_blocks" not in side.engine for side in scenario.sides)
    profile = load_profile(scenario.runner)
    first, last = (point.text["en"] for point in scenario.narration)
    result = play(scenario, build_engines(scenario))
    rows = {}
    for side in scenario.sides:
        record = result.records[side.name]
        sized = replace(profile, kv_cache_dtype=side.engine["kv_cache_dtype"]).num_kv_blocks(16)
        assert side_metric(record, "kv_blocks") == sized
        assert f"{sized:,} blocks of {side.name}" in first
        rows[side.name] = int(side_metric(record, "max_rows"))
    assert f"At most {rows['bf16']} requests ran at once in bf16 and {rows['int8']} in int8" in last
