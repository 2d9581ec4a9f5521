"""A prototype, not in the engine: one frozen Inductor graph for a whole decode step.

    PYTHONPATH=. python scripts/frozen_decode_cpu_time.py [--dtype bfloat16]
        [--batches 1 32] [--rounds 3] [--onednn-fusions]

``EngineConfig.compile="on"`` compiles the two halves of every decoder layer and calls them
60 times a step; it measured slower than eager (docs/performance.md, "Forward pass"). This
script tries the other way round: the whole decode forward (embedding to final norm, 30
layers, the paged attention traced) as one ``torch.compile`` graph with Inductor's
*freezing*, which treats the weights as constants, lays each linear layer's weight out for
oneDNN itself and calls the products from generated code, with the elementwise work fused
into C++ loops between them. Two choices make the graph possible:

- The KV cache is read, never written, inside the graph (Inductor turned an in-graph store
  into a copy of the whole cache in every layer: 0.6 s a layer). Each layer gathers the
  context as the torch backend does, puts the new token's key and value into the gathered
  copy at the last position, and returns them; one write after the graph stores all layers'.
- The residual adds are written as fp32 adds rounded once to the dtype, and SiLU as
  ``g * sigmoid(g)`` in fp32: the same rounding as eager. Written plainly, Inductor fuses
  each residual add and each SiLU into the oneDNN product before it (post-ops on the fp32
  accumulator), which skips one bf16 rounding and changes greedy tokens.
  ``--onednn-fusions`` writes them plainly, to measure what the fusions are worth.

Prints one JSON line: per batch, eager and frozen step CPU milliseconds (thread time,
median over rounds of each round's median pure-decode step, rounds alternated), the
fraction of the ceiling each reaches (the ceiling of scripts/decode_cpu_time.py), whether
their greedy tokens are equal, and the build time of the graphs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F
from decode_cpu_time import copy_bandwidth, matmul_flops, probe_engine

from minicb import SamplingParams
from minicb.bench import roofline
from minicb.engine import LLMEngine
from minicb.kernels.torch_attention import DecodeIndex
from minicb.runner import probes
from minicb.runner.catalogue import model_shape
from minicb.runner.llama import apply_rope
from minicb.runner.packed import PACKED_FOR_ROWS
from minicb.scheduler.plan import DECODE

PROMPT, STEPS, WARM = 32, 10, 2


def decode_forward(model, onednn_fusions: bool):
    """The pure function of one decode step that the graph is made of."""

    def linear(m, x):  # the plain weight: freezing lays it out for oneDNN itself
        return F.linear(x, m.weight, m.bias)

    def project(attn, x, rope):  # as llama.Attention.project
        batch, head_dim = x.shape[0], attn.cfg.head_dim
        q, k, v = (
            linear(p, x).view(batch, -1, head_dim) for p in (attn.q_proj, attn.k_proj, attn.v_proj)
        )
        if attn.cfg.qk_norm:
            q, k = attn.q_norm(q), attn.k_norm(k)
        return apply_rope(q, rope), apply_rope(k, rope), v

    def residual(x, y):
        return x + y if onednn_fusions else (x.float() + y.float()).to(x.dtype)

    def mlp(m, x):
        g, up = linear(m.gate_proj, x), linear(m.up_proj, x)
        if onednn_fusions:
            return linear(m.down_proj, F.silu(g) * up)
        g = g.float()
        return linear(m.down_proj, (g * torch.sigmoid(g)).to(x.dtype) * up)

    def forward(ids, positions, slots, visible, last, kv_cache):
        x = model.model.embed_tokens(ids)
        rope = model.rope.tables(positions, x.dtype)
        batch, length = visible.shape[0], visible.shape[-1]
        rows = torch.arange(batch)
        new_kv = []
        for i, layer in enumerate(model.model.layers):
            attn = layer.self_attn
            q, k, v = project(attn, layer.input_layernorm(x), rope)
            context = []
            for cache, new in ((kv_cache[i, 0], k), (kv_cache[i, 1], v)):
                gathered = cache.flatten(0, 1).index_select(0, slots)
                gathered = gathered.view(batch, length, *cache.shape[2:])
                context.append(gathered.index_put((rows, last), new).transpose(1, 2))
            out = F.scaled_dot_product_attention(
                q.unsqueeze(2), *context, attn_mask=visible, scale=attn.scale, enable_gqa=True
            )
            new_kv.append(torch.stack([k, v]))
            x = residual(x, linear(attn.o_proj, out.reshape(batch, -1)))
            x = residual(x, mlp(layer.mlp, layer.post_attention_layernorm(x)))
        return model.model.norm(x), torch.stack(new_kv)  # (layers, 2, B, kv_heads, head_dim)

    return forward


class FrozenDecode:
    """The runner's ``_forward`` for decode-only steps through the frozen graph."""

    def __init__(self, runner, onednn_fusions: bool) -> None:
        self.runner, self.eager_forward = runner, runner._forward
        self.graph = torch.compile(
            decode_forward(runner.model, onednn_fusions), fullgraph=True, dynamic=True,
            options={"emulate_precision_casts": True},
        )  # fmt: skip
        self.build_s: dict[int, float] = {}
        # Freezing lays each weight out for the batch size of the first call that builds a
        # graph; a layout decides the order of the sums, so build on eager's layout.
        for batch in (1, PACKED_FOR_ROWS):
            t0 = time.perf_counter()
            with torch.inference_mode():  # inference tensors, as the runner's: no recompile
                self._call(*self._dummy(batch))
            self.build_s[batch] = time.perf_counter() - t0

    def _dummy(self, batch: int, length: int = 40):
        zeros = torch.zeros(batch, dtype=torch.long)
        slots = torch.zeros(batch * length, dtype=torch.long)
        return zeros, zeros, slots, torch.ones(batch, 1, 1, length, dtype=torch.bool), zeros

    @torch.inference_mode()
    def _call(self, ids, positions, slots, visible, last):
        import torch._inductor.config as inductor_config

        with inductor_config.patch(freezing=True):
            return self.graph(ids, positions, slots, visible, last, self.runner.kv_cache)

    def forward(self, plan):
        r = self.runner
        ids, positions, meta, sample_rows = r._prepare(plan)
        if not meta.is_decode_only or bool((meta.slot_mapping < 0).any()):
            return self.eager_forward(plan)
        index = DecodeIndex.build(meta, r.config.block_size)
        last = meta.context_lens.long() - 1
        hidden, new_kv = self._call(ids, positions, index.slots, index.visible, last)
        flat = r.kv_cache.flatten(2, 3)  # (layers, 2, slots, kv_heads, head_dim)
        flat[:, :, meta.slot_mapping] = new_kv
        return hidden, sample_rows


def decode_round(engine: LLMEngine, batch: int) -> tuple[float, float, list[list[int]]]:
    """Median CPU seconds of the pure decode steps, the mean context, the tokens."""
    params = SamplingParams(max_tokens=1 + WARM + STEPS, temperature=0.0, ignore_eos=True)
    prompts = roofline.decode_prompts(batch, PROMPT)
    ids = [engine.add_request(p[: PROMPT - i % 8], params) for i, p in enumerate(prompts)]
    tokens: dict[int, list[int]] = {i: [] for i in ids}
    cpu, context = [], []
    while engine.has_unfinished():
        c0 = time.thread_time()
        result = engine.step()
        c1 = time.thread_time()
        rows = result.event.plan.scheduled
        for delta in result.new_tokens:
            tokens[delta.request_id].append(delta.token_id)
        if len(rows) == batch and all(r.phase == DECODE for r in rows):
            cpu.append(c1 - c0)
            context.append(statistics.fmean(r.context_len for r in rows))
    return statistics.median(cpu[WARM:]), statistics.fmean(context), [tokens[i] for i in ids]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    p.add_argument("--batches", type=int, nargs="+", default=[1, 32])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--onednn-fusions", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(1)  # as minicb bench does by default
    engine = probe_engine(args.dtype, max(args.batches))
    runner = engine.runner
    frozen = FrozenDecode(runner, args.onednn_fusions)
    modes = {"eager": frozen.eager_forward, "frozen": frozen.forward}
    results = {(b, m): [] for b in args.batches for m in modes}
    for i in range(args.rounds):
        for b in args.batches:
            for m in list(modes) if i % 2 == 0 else list(modes)[::-1]:
                runner._forward = modes[m]
                results[b, m].append(decode_round(engine, b))
    runner._forward = frozen.eager_forward
    shape, elem = model_shape(str(runner.files.path)), runner.dtype.itemsize
    bw, _ = copy_bandwidth(probes.copy_bytes(roofline.model_sizes(shape, elem)["weight_bytes"]))
    flops, _ = matmul_flops(runner.dtype, probes.matmul_size(runner.dtype))
    out = {"dtype": args.dtype, "onednn_fusions": args.onednn_fusions,
           "build_s": frozen.build_s, "copy_GBps_cpu": bw / 1e9, "points": []}  # fmt: skip
    for b in args.batches:
        point = {"batch": b}
        for m in modes:
            step = statistics.median(r[0] for r in results[b, m])
            context = statistics.fmean(r[1] for r in results[b, m])
            t_min, _ = roofline.ceiling(*roofline.decode_cost(shape, elem, b, context), bw, flops)
            point[f"{m}_ms"], point[f"{m}_fraction"] = step * 1e3, t_min / step
        point["same_tokens"] = all(
            e[2] == f[2] for e, f in zip(results[b, "eager"], results[b, "frozen"], strict=True)
        )
        out["points"].append(point)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
