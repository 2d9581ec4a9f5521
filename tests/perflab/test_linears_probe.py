"""The roofline's third probe (perflab/roofline.py): a decode step's linear layers alone, on
the real model code."""

import pytest
import torch

from minicb import EngineConfig
from minicb.core.engine import LLMEngine
from perflab import roofline


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])  # bf16 on CPU: packed layers
def test_time_linears_runs_every_linear_layer_once_per_run_on_batch_rows(tiny_llama_dir, dtype):
    engine = LLMEngine(tiny_llama_dir, EngineConfig(dtype=dtype, device="cpu", num_kv_blocks=8))
    model = engine.runner.model
    layers = model.cfg.num_layers
    seen: list[tuple[str, tuple[int, ...]]] = []
    names = {m: n for n, m in model.named_modules()}
    for m in names:
        if hasattr(m, "weight") and not isinstance(m, torch.nn.Embedding) and m.weight.dim() == 2:
            m.register_forward_hook(lambda mod, args, out: seen.append((names[mod], out.shape)))
    seconds = roofline.time_linears(model, batch=3, repeats=2)
    assert seconds > 0
    # 7 products a layer (q, k, v, o, gate, up, down) and the lm_head, in forward order, once
    # per run: a warm-up and two timed runs.
    per_run = 7 * layers + 1
    assert len(seen) == 3 * per_run
    first = [n for n, _ in seen[:per_run]]
    assert first[:7] == [f"model.layers.0.{p}" for p in (
        "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
        "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")]  # fmt: skip
    assert first[-1] == "lm_head" and seen[per_run - 1][1] == (3, model.cfg.vocab_size)
    assert all(shape[0] == 3 for _, shape in seen)
