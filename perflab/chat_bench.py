"""The router bench on real replicas: multi-turn chat through the OpenAI API, one fleet per
policy, and the prompt tokens each policy made the replicas compute.

    python -m perflab.chat_bench --replicas 2 --policies round-robin prefix-aware

For each policy a fresh fleet (``serve --replicas N --router POLICY``, so no policy finds
another's cache) serves the same conversations (``minicb.workload.chat_conversations``:
shared system prompts, every turn extending the previous one), released as a closed loop
(``ChatSessions``: a turn after the previous turn's answer, with the answer the model gave
in its prompt, as a chat client sends it back). Every request goes through the
API's ``/v1/completions`` as token ids, and the bench sums what the replies say:
``usage.prompt_tokens`` and ``usage.prompt_tokens_details.cached_tokens``, the prompt tokens
a replica found in its prefix cache and did not compute. A prefix-aware router sends each
turn where its conversation's earlier turns (and its system prompt) are cached; round-robin
scatters them, so each replica recomputes what the other holds.

The replies are measured, not simulated; the wall time is printed too, but on a shared
two-core machine it says little (both replicas share the cores); the computed tokens are
the figure.

It lives in the performance lab, outside the package, because it drives the whole of it:
the command line's ``serve`` options and the server it builds sit above the fleet.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from minicb.fleet.router import POLICIES
from minicb.workload import ChatSessions, Conversation, RequestSpec, chat_conversations


@dataclass
class PolicyRun:
    """What one policy's run measured, summed over every reply."""

    policy: str
    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    wall_s: float = 0.0
    per_replica: dict[int, int] = field(default_factory=dict)  # requests routed to each

    @property
    def computed_tokens(self) -> int:
        return self.prompt_tokens - self.cached_tokens

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def serve_args(policy: str, args: argparse.Namespace) -> argparse.Namespace:
    """The options of ``minicb serve --replicas N --router POLICY`` for this run."""
    from minicb.cli import build_parser

    argv = ["serve", "--replicas", str(args.replicas), "--router", policy]
    argv += ["--dtype", args.dtype, "--no-measure-utilisation"]
    argv += ["--model", args.model] if args.model else []
    argv += ["--num-kv-blocks", str(args.num_kv_blocks)] if args.num_kv_blocks else []
    return build_parser().parse_args(argv)


async def _drive(app: Any, model: str, conversations: list[Conversation], run: PolicyRun) -> None:
    """Release the turns as ChatSessions says, each one a POST; sum the replies' usage."""
    import httpx

    transport = httpx.ASGITransport(app=app)
    start = time.monotonic()
    sessions = ChatSessions(conversations, start=start)
    pending: dict[asyncio.Task, RequestSpec] = {}
    async with httpx.AsyncClient(
        transport=transport, base_url="http://127.0.0.1", timeout=600
    ) as client:
        while sessions or pending:
            for spec in sessions.due(time.monotonic()):
                body = {"model": model, "prompt": spec.prompt, "max_tokens": spec.max_tokens}
                body.update(temperature=0, ignore_eos=True, return_token_ids=True)
                pending[asyncio.create_task(client.post("/v1/completions", json=body))] = spec
            nxt = sessions.next_time
            wait = 0.05 if nxt is None else max(0.0, min(0.05, nxt - time.monotonic()))
            if not pending:
                await asyncio.sleep(wait)
                continue
            done, _ = await asyncio.wait(pending, timeout=wait, return_when="FIRST_COMPLETED")
            for task in done:
                spec = pending.pop(task)
                reply = task.result()
                reply.raise_for_status()
                usage = reply.json()["usage"]
                run.requests += 1
                run.prompt_tokens += usage["prompt_tokens"]
                run.cached_tokens += usage["prompt_tokens_details"]["cached_tokens"]
                answer = reply.json()["choices"][0]["token_ids"]  # sent back, as a chat does
                sessions.answered(spec, time.monotonic(), answer)
    run.wall_s = time.monotonic() - start


def run_policy(policy: str, args: argparse.Namespace) -> PolicyRun:
    """A fresh fleet for ``policy``, the conversations through its API, then stopped."""
    from minicb.server.serve_command import build_serve

    app, loop, fleet, model = build_serve(serve_args(policy, args))
    run = PolicyRun(policy)

    def count(events: list) -> None:
        for e in events:
            run.per_replica[e.replica] = run.per_replica.get(e.replica, 0) + 1

    fleet.bus.subscribe(count, kinds=["routed"])
    loop.start()
    try:
        asyncio.run(_drive(app, model, conversations(args), run))
    finally:
        loop.stop()
        fleet.close()
    return run


def conversations(args: argparse.Namespace) -> list[Conversation]:
    return chat_conversations(
        args.conversations,
        turns=args.turns,
        system_len=args.system_len,
        num_system_prompts=args.system_prompts,
        user_mean=args.user_mean,
        answer_mean=args.answer_mean,
        think_mean_s=args.think_s,
        seed=args.seed,
        vocab=args.vocab,
    )


def report(runs: list[PolicyRun], args: argparse.Namespace) -> str:
    lines = [
        f"{args.replicas} real replicas, {args.conversations} conversations x {args.turns} "
        f"turns, {args.system_prompts} shared system prompts of {args.system_len} tokens "
        f"(seed {args.seed}); usage summed over the OpenAI replies",
        f"{'policy':<14}{'requests':>9}{'prompt':>9}{'cached':>9}{'computed':>10}"
        f"{'hit rate':>10}{'wall s':>8}  routed per replica",
    ]
    for r in runs:
        spread = ", ".join(f"{k}: {v}" for k, v in sorted(r.per_replica.items()))
        lines.append(
            f"{r.policy:<14}{r.requests:>9}{r.prompt_tokens:>9}{r.cached_tokens:>9}"
            f"{r.computed_tokens:>10}{r.hit_rate:>10.1%}{r.wall_s:>8.1f}  {spread}"
        )
    base = next((r for r in runs if r.policy == "round-robin"), None)
    for r in runs:
        if base is not None and r is not base and r.computed_tokens:
            ratio = base.computed_tokens / r.computed_tokens
            lines.append(f"{r.policy} computes {ratio:.2f}x fewer prompt tokens than round-robin")
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m perflab.chat_bench", description=__doc__)
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--policies", nargs="+", choices=POLICIES, default=list(POLICIES))
    p.add_argument("--model", default=None, help="default: the embedded SmolLM2-135M")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--num-kv-blocks", type=int, default=256, help="per replica")
    p.add_argument("--conversations", type=int, default=12)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--system-prompts", type=int, default=3)
    p.add_argument("--system-len", type=int, default=256)
    p.add_argument("--user-mean", type=float, default=32)
    p.add_argument("--answer-mean", type=float, default=8)
    p.add_argument("--think-s", type=float, default=0.1, help="mean pause between turns")
    p.add_argument("--vocab", type=int, default=32000, help="token ids drawn below this")
    p.add_argument("--seed", type=int, default=0)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    runs = []
    for policy in args.policies:
        print(f"chat_bench: {policy}: starting {args.replicas} replicas ...", flush=True)
        runs.append(run_policy(policy, args))
    print(report(runs, args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
