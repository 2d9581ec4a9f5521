"""Engine options shared by every subcommand that builds an engine."""

from __future__ import annotations

import argparse
from typing import Any

from minicb.config import ATTENTION_BACKENDS, BATCHING_MODES, DTYPES, POLICIES, PREEMPTION_MODES


def add_engine_options(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("engine")
    g.add_argument(
        "--model",
        default=None,
        help="model folder or hub id (default: embedded SmolLM2-135M-Instruct)",
    )
    g.add_argument("--device", default="auto", help="cpu, cuda, or auto")
    g.add_argument("--dtype", default="auto", choices=DTYPES)
    g.add_argument("--batching", default="continuous", choices=BATCHING_MODES)
    g.add_argument("--policy", default="fcfs", choices=POLICIES)
    g.add_argument("--max-num-seqs", type=int, default=64)
    g.add_argument("--max-num-batched-tokens", type=int, default=512)
    g.add_argument("--block-size", type=int, default=16)
    g.add_argument("--num-kv-blocks", type=int, default=None)
    g.add_argument("--no-chunked-prefill", action="store_true", help="prefill whole prompts alone")
    g.add_argument("--preemption-mode", default="recompute", choices=PREEMPTION_MODES)
    g.add_argument("--attention-backend", default="auto", choices=ATTENTION_BACKENDS)


def engine_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    return dict(
        device=args.device,
        dtype=args.dtype,
        batching=args.batching,
        policy=args.policy,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        block_size=args.block_size,
        num_kv_blocks=args.num_kv_blocks,
        enable_chunked_prefill=not args.no_chunked_prefill,
        preemption_mode=args.preemption_mode,
        attention_backend=args.attention_backend,
    )
