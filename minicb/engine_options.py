"""The engine's settings on the command line: the options every subcommand that builds an
engine adds (``generate``, ``demo``, ``serve``, ``bench``), how they become an
``EngineConfig``'s keyword arguments, and the line each command prints of what the engine
chose and why.

``EngineConfig`` (minicb/core/config.py) checks the values; this file only spells them as flags.
"""

from __future__ import annotations

import argparse
from typing import Any

import minicb.features  # noqa: F401  (every feature registered at its seam)
from minicb.core.config import (
    ATTENTION_BACKENDS,
    BATCHING_MODES,
    DTYPES,
    POLICIES,
    PREEMPTION_MODES,
    STATIC_ORDERS,
)
from minicb.quant.settings import KV_CACHE_DTYPES, WEIGHT_DTYPES
from minicb.reservation.settings import KV_RESERVATIONS
from minicb.speculation.settings import SPECULATIVE_MODES


def add_engine_options(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("engine")
    g.add_argument(
        "--model",
        default=None,
        help="model folder or hub id (default: embedded SmolLM2-135M-Instruct)",
    )
    g.add_argument("--device", default="auto", help="cpu, cuda, or auto")
    g.add_argument("--dtype", default="auto", choices=DTYPES)
    g.add_argument(
        "--kv-cache-dtype",
        default="auto",
        choices=KV_CACHE_DTYPES,
        help="how the KV cache stores keys and values: auto (the compute dtype), or int8 / "
        "fp8 (8 bits with a scale per token and KV head: about twice the blocks)",
    )
    g.add_argument(
        "--weight-dtype",
        default="auto",
        choices=WEIGHT_DTYPES,
        help="how the decoder's linear weights are held: auto (the compute dtype), or int8 "
        "(weight-only, a scale per output channel: a quarter of fp32's bytes)",
    )
    g.add_argument(
        "--batch-invariant",
        action="store_true",
        help="a token's arithmetic never depends on its batch (fixed tiles; slower): "
        "equal greedy tokens across batch sizes under an 8-bit KV cache",
    )
    g.add_argument("--batching", default="continuous", choices=BATCHING_MODES)
    g.add_argument("--policy", default="fcfs", choices=POLICIES)
    g.add_argument("--max-num-seqs", type=int, default=64)
    g.add_argument("--max-num-batched-tokens", type=int, default=512)
    g.add_argument("--block-size", type=int, default=16)
    g.add_argument("--num-kv-blocks", type=int, default=None)
    g.add_argument("--no-chunked-prefill", action="store_true", help="prefill whole prompts alone")
    g.add_argument(
        "--enable-prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="share the KV blocks of common prompt prefixes (continuous batching; on by default)",
    )
    g.add_argument(
        "--kv-offload-blocks",
        type=int,
        default=0,
        help="host blocks that keep cached prefixes the device pool evicts, copied back on a "
        "hit (a second tier of the prefix cache; 0: off); refused if more than the host's "
        "available memory holds",
    )
    g.add_argument("--preemption-mode", default="recompute", choices=PREEMPTION_MODES)
    g.add_argument(
        "--kv-reservation",
        default="paged",
        choices=KV_RESERVATIONS,
        help="KV cache given at admission: paged (none ahead), or prompt + max_tokens (max), "
        "+ the expected output rounded up to a power of two (pow2), or exactly (oracle)",
    )
    g.add_argument(
        "--static-order",
        default="arrival",
        choices=STATIC_ORDERS,
        help="static batching: form batches in arrival order or sorted by length",
    )
    g.add_argument("--attention-backend", default="auto", choices=ATTENTION_BACKENDS)
    g.add_argument(
        "--packed-weights",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="bfloat16 on CPU: linear layers on oneDNN-packed weights (on by default)",
    )
    g.add_argument(
        "--speculative",
        default="off",
        choices=SPECULATIVE_MODES,
        help="speculative decoding (any temperature): 'ngram' drafts tokens by prompt lookup, "
        "'draft' by a draft model (--draft-model), 'early_exit' by the model's own first "
        "--draft-layers layers",
    )
    g.add_argument("--num-speculative-tokens", type=int, default=4, help="drafts per step, at most")
    g.add_argument("--ngram-min", type=int, default=1, help="shortest n-gram the lookup matches")
    g.add_argument("--ngram-max", type=int, default=4, help="longest n-gram the lookup matches")
    g.add_argument(
        "--draft-model",
        default=None,
        help="--speculative draft: a model folder with the target's tokenizer (or the target's)",
    )
    g.add_argument(
        "--draft-layers",
        type=int,
        default=None,
        help="--speculative early_exit: the target's first layers that draft (default: half)",
    )
    g.add_argument(
        "--measure-utilisation",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="the real model: each step's bandwidth and FLOP utilisation against this "
        "machine's probes (a few seconds at start; on by default in demo and serve)",
    )
    g.add_argument(
        "--overlap-scheduling",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="plan the next iteration while the runner computes this one",
    )
    g.add_argument(
        "--tensor-parallel-size",
        type=int,
        default=1,
        help="split the model over this many processes (gloo on CPU, NCCL on CUDA)",
    )


def engine_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    return dict(
        device=args.device,
        dtype=args.dtype,
        kv_cache_dtype=args.kv_cache_dtype,
        weight_dtype=args.weight_dtype,
        batching=args.batching,
        policy=args.policy,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        block_size=args.block_size,
        num_kv_blocks=args.num_kv_blocks,
        enable_chunked_prefill=not args.no_chunked_prefill,
        enable_prefix_caching=args.enable_prefix_caching,
        kv_offload_blocks=args.kv_offload_blocks,
        preemption_mode=args.preemption_mode,
        kv_reservation=args.kv_reservation,
        static_order=args.static_order,
        attention_backend=args.attention_backend,
        packed_weights=args.packed_weights,
        speculative=args.speculative,
        num_speculative_tokens=args.num_speculative_tokens,
        ngram_min=args.ngram_min,
        ngram_max=args.ngram_max,
        draft_model=args.draft_model,
        draft_layers=args.draft_layers,
        tensor_parallel_size=args.tensor_parallel_size,
        measure_utilisation=args.measure_utilisation,
        overlap_scheduling=args.overlap_scheduling,
        batch_invariant=args.batch_invariant,
    )


def describe_choices(runner: dict[str, Any]) -> str:
    """One line for the terminal: the dtype, attention backend, weight and KV cache formats
    and forward an engine computes with, and why, from its ``runner.describe()``."""
    parts = [f"device {runner.get('device', '-')}"]
    choices = (
        ("dtype", "dtype", "dtype_reason"),
        ("attention", "attention_backend", "attention_reason"),
        ("weights", "weight_dtype", None),  # e.g. "int8 (a scale per output channel)"
        ("kv cache", "kv_cache_dtype", None),  # e.g. "int8 (a scale per token and KV head)"
        ("forward", "compile", None),  # eager, or a wrapper's compiled step (perflab)
    )
    for label, key, why in choices:
        if key in runner:  # a simulated or fake runner has no dtype or kernels
            reason = runner.get(why)
            parts.append(f"{label} {runner[key]}" + (f" ({reason})" if reason else ""))
    return "; ".join(parts)
