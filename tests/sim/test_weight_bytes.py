"""The simulator's 8-bit weights: bytes per parameter from ``weight_dtype`` (one byte each
and a scale per output channel, minicb/quant/weights.py's format), so the pool sized from
what the weights leave and the memory-bound decode step follow. The expected figures are
counted here from the catalogue's shape (matrix by matrix), not taken from the code under
test."""

from __future__ import annotations

from dataclasses import replace

import pytest

from minicb.core.config import EngineConfig
from minicb.core.runner import VirtualClock
from minicb.cost_model.catalogue import read_catalogue
from minicb.cost_model.step_time import GIB
from minicb.sim.simulated_runner import GPU_MEMORY_UTILIZATION, SimulatedRunner


def llama_8b_bytes(weights: str) -> tuple[int, int]:
    """(all weight bytes, bytes a step streams) of Llama-3.1-8B at bf16 compute, counted
    from the catalogue entry: each decoder matrix (out, in) in bf16, or int8 plus a bf16
    scale per output row; the embedding table and the untied LM head always bf16."""
    m = read_catalogue()["models"]["llama-3.1-8b"]
    h, d, inter = m["hidden_size"], m["head_dim"], m["intermediate_size"]
    matrices = [  # (out, in) of q, k, v, o, gate, up, down
        (m["num_heads"] * d, h),
        (m["num_kv_heads"] * d, h),
        (m["num_kv_heads"] * d, h),
        (h, m["num_heads"] * d),
        (inter, h),
        (inter, h),
        (h, inter),
    ]
    per_row = {"auto": lambda n_in: 2 * n_in, "int8": lambda n_in: n_in + 2}[weights]
    layer = sum(out * per_row(n_in) for out, n_in in matrices)
    table = 2 * m["vocab_size"] * h
    assert not m.get("tie_word_embeddings", False)  # two tables: embedding and LM head
    layers = m["num_layers"] * layer
    return layers + 2 * table, layers + table


def runners(kv: str = "auto") -> dict[str, SimulatedRunner]:
    return {
        w: SimulatedRunner(
            "H100:llama-3.1-8b",
            EngineConfig.from_kwargs(weight_dtype=w, kv_cache_dtype=kv),
            clock=VirtualClock(),
        )
        for w in ("auto", "int8")
    }


@pytest.mark.parametrize("kv", ["auto", "int8"])
def test_int8_weights_leave_room_for_more_blocks(kv):
    """The same 90 % of an H100: the pool is what the weights leave, in blocks of the KV
    format's size, so int8 weights (6.5 GiB saved) give that many more blocks."""
    sim = runners(kv)
    for w, runner in sim.items():
        assert runner.profile.weight_bytes == llama_8b_bytes(w)[0]
        assert runner.describe()["weight_dtype"] == w
    block = sim["auto"].describe()["bytes_per_block"]
    assert sim["int8"].describe()["bytes_per_block"] == block  # weights leave the KV alone
    room = 80 * GIB * GPU_MEMORY_UTILIZATION
    for w, runner in sim.items():
        assert runner.num_kv_blocks == int((room - llama_8b_bytes(w)[0]) // block)
    saved = llama_8b_bytes("auto")[0] - llama_8b_bytes("int8")[0]
    assert sim["int8"].num_kv_blocks - sim["auto"].num_kv_blocks == pytest.approx(
        saved / block, abs=1
    )
    assert sim["int8"].num_kv_blocks > 1.1 * sim["auto"].num_kv_blocks  # 63.5 GiB vs 57.0


def test_a_memory_bound_decode_step_shrinks_by_the_byte_ratio():
    """Decode rows at batch 8 and 1,000 tokens of context on an H100 are memory-bound: the
    step's memory term is the streamed bytes over the bandwidth, so int8 weights shorten it
    by the ratio of (weights + KV) bytes, and the whole step by the same seconds."""
    sim = runners()
    decode = [(1, 1000, True)] * 8
    terms = {w: r.profile.terms(decode) for w, r in sim.items()}
    assert all(t["memory_s"] > t["compute_s"] for t in terms.values())  # memory-bound
    kv = 8 * 1000 * sim["auto"].profile.model.kv_bytes_per_token(2)
    read = {w: llama_8b_bytes(w)[1] + kv for w in sim}
    assert terms["int8"]["memory_s"] / terms["auto"]["memory_s"] == pytest.approx(
        read["int8"] / read["auto"]
    )
    assert read["int8"] / read["auto"] < 0.6  # about half: the weights dominate at batch 8
    assert terms["auto"]["step_s"] - terms["int8"]["step_s"] == pytest.approx(
        terms["auto"]["memory_s"] - terms["int8"]["memory_s"]
    )
    # Compute is unchanged: weight-only quantisation dequantises to bf16 and multiplies there.
    assert terms["int8"]["compute_s"] == terms["auto"]["compute_s"]


def test_a_compute_bound_prefill_is_not_shortened():
    """A 4,096-token prompt chunk is compute-bound: the same FLOPs, the same step."""
    bf16 = runners()["auto"].profile
    int8 = replace(bf16, weight_dtype="int8")
    prefill = [(4096, 4096, True)]
    assert bf16.terms(prefill)["compute_s"] > bf16.terms(prefill)["memory_s"]
    assert int8.terms(prefill)["step_s"] == bf16.terms(prefill)["step_s"]
