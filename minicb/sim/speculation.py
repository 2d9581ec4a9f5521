"""Speculative decoding at GPU scale, simulated: off against on at several batch sizes.

``python -m minicb.sim.speculation [--profile H100:llama-3.1-8b] [--proposer draft]
[--draft-model llama-3.2-1b] [--alpha 0.7]`` prints, for batch 1, 4, 16, 64 and 256, what
one round costs off and on, the tokens a row gets a round, the break-even rule (a round
pays when its tokens exceed its cost in plain steps) and the predicted speed-up, from the
step-time model (minicb/cost_model/speculation.py) and an acceptance probability
``alpha``. Every line says *simulated*: it is arithmetic on published GPU figures, not a
measurement; ``minicb.bench.speculative`` measures the same rule on this machine.
"""

from __future__ import annotations

import argparse
from typing import Any

from minicb.cost_model.catalogue import load_profile
from minicb.cost_model.speculation import PROPOSERS, SpeculationCost
from minicb.sim.markdown_table import markdown_table

BATCHES = (1, 4, 16, 64, 256)


def predict(
    cost: SpeculationCost, k: int, alpha: float, context: int, batches=BATCHES
) -> dict[str, Any]:
    """Each batch's round off and on, and the alpha at which it breaks even."""
    rows = []
    for b in batches:
        r = cost.round(b, context, k, alpha)
        r["break_even_alpha"] = cost.break_even_alpha(b, context, k)
        rows.append(r)
    return {
        "simulated": True,
        "profile": cost.target.name,
        "proposer": cost.proposer,
        "draft": None if cost.draft is None else cost.draft.model.name,
        "num_speculative_tokens": k,
        "alpha": alpha,
        "context": context,
        "rounds": rows,
    }


def render(p: dict[str, Any]) -> str:
    """A markdown table, its title saying what was simulated."""
    draft = f" drafting with {p['draft']}" if p["draft"] else ""
    title = (
        f"Simulated (not measured): {p['profile']}, proposer {p['proposer']}{draft}, "
        f"k = {p['num_speculative_tokens']}, alpha = {p['alpha']}, context {p['context']}"
    )
    header = ["batch", "step off (ms)", "draft (ms)", "round on (ms)", "round cost (steps)",
              "tokens a row a round", "pays?", "speed-up", "break-even alpha"]  # fmt: skip
    rows = []
    for r in p["rounds"]:
        even = r["break_even_alpha"]
        rows.append([
            str(r["batch"]), f"{r['step_off_s'] * 1000:.2f}", f"{r['draft_s'] * 1000:.2f}",
            f"{r['round_on_s'] * 1000:.2f}", f"{r['round_cost_steps']:.2f}",
            f"{r['tokens_per_round']:.2f}",
            "yes" if r["tokens_per_round"] > r["round_cost_steps"] else "no",
            f"{r['speedup']:.2f}x", "never" if even is None else f"{even:.2f}",
        ])  # fmt: skip
    return "\n".join([title, "", *markdown_table(header, rows)])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m minicb.sim.speculation", description=__doc__)
    p.add_argument("--profile", default="H100:llama-3.1-8b", help="GPU:MODEL of the target")
    p.add_argument("--proposer", default="draft", choices=PROPOSERS)
    p.add_argument("--draft-model", default="llama-3.2-1b", help="catalogue name or folder")
    p.add_argument("--draft-layers", type=int, default=8, help="early_exit: the layers run")
    p.add_argument("--num-speculative-tokens", type=int, default=4)
    p.add_argument("--alpha", type=float, default=0.7, help="chance each guess is accepted")
    p.add_argument("--context", type=int, default=1024, help="tokens of context a row")
    args = p.parse_args(argv)
    cost = SpeculationCost.build(
        load_profile(args.profile), args.proposer, args.draft_model, args.draft_layers
    )
    print(render(predict(cost, args.num_speculative_tokens, args.alpha, args.context)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
