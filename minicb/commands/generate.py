"""``minicb generate PROMPT...``: complete prompts and print each completion."""

from __future__ import annotations

import argparse
import time

from minicb.config import add_engine_options, engine_kwargs
from minicb.telemetry.trace import add_trace_option, traced


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("generate", help="complete prompts and print the completions")
    p.add_argument("prompts", nargs="+", metavar="PROMPT")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--chat", action="store_true", help="wrap each prompt in the chat template")
    add_engine_options(p)
    add_trace_option(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from minicb import LLM, SamplingParams

    llm = LLM(model=args.model, **engine_kwargs(args))
    params = SamplingParams(
        max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed
    )
    prompts = args.prompts
    if args.chat:
        prompts = [llm.apply_chat_template([{"role": "user", "content": p}]) for p in prompts]
    start = time.perf_counter()
    with traced(llm.engine, args):
        outputs = llm.generate(prompts, params)
    elapsed = time.perf_counter() - start
    for prompt, out in zip(args.prompts, outputs, strict=True):
        print(
            f"### {prompt}\n{out.text}\n"
            f"[{len(out.token_ids)} tokens, finish_reason={out.finish_reason}]"
        )
    total = sum(len(o.token_ids) for o in outputs)
    print(f"--- {total} tokens in {elapsed:.2f} s ({total / elapsed:.1f} tokens/s)")
    return 0
