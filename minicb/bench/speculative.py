"""Speculative decoding's benchmark: where n-gram drafts help, and where they cost.

``python -m minicb.bench.speculative [--quick]`` runs two workloads on minicb continuous,
each with speculation off and on, at batch 1, 4 and 16 (``max_num_seqs``) in the same run:
at one slot a decode step is all weight reads and drafts ride along almost free; the
bigger the batch, the busier the step, the more drafts lengthen every row, and the gain
shrinks or turns into a cost:

- ``copy``: rewrite or repeat code and text given in the prompt (chat-templated when the
  model has a tokenizer): the output copies much of the input, the case prompt lookup is
  for;
- ``capped-exp``: the suite's headline workload (random token ids): drafts are rarely
  accepted, so this is what speculation costs when it does not pay.

Each repeat runs off and on back to back, in an order that alternates, on siblings that
share the weights (a fresh KV pool each); figures are medians over the repeats and the
on/off ratios are paired repeat by repeat, so a slow spell on a shared machine falls on both.
Greedy, ``ignore_eos``, exact lengths: both modes do the same work and, by the oracle, emit
the same tokens. Prints markdown; ``--out`` also writes the figures as JSON.

**The break-even rule**, printed beside each batch: a round (one step with drafts) gives a
row ``tokens a row a round`` (``tokens_per_decode_row``, 1 + accepted guesses) and costs
``round cost`` plain steps (a step's seconds on over off: schedule, forward and sample);
speculation pays when the first exceeds the second, and the rule's speed-up is their ratio
(the measured one also carries the prefill steps, which speculation does not shorten).
minicb/sim/speculation.py predicts the same rule at GPU scale. Before a ratio is made the
figures are checked (``check_figures``): every run passed the suite's checks (its events
within the run, exact token counts: minicb.bench.sanity), its steps' seconds add up to no
more than the run, and no ratio is taken over a zero.
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import replace
from pathlib import Path
from typing import Any

from minicb.bench import RunRecord, paired_ratio, run_minicb, spread
from minicb.bench.recipes import FULL, QUICK, make_workloads
from minicb.bench.sanity import CLOCK_SLACK, CLOCK_SLACK_S, ImplausibleFigure
from minicb.bench.systems import sibling
from minicb.core.engine import LLMEngine
from minicb.sim.markdown_table import markdown_table
from minicb.workload import RequestSpec, Workload

SNIPPETS = [
    'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n    a, b = 0, 1\n'
    "    for i in range(n):\n        a, b = b, a + b\n    return a\n",
    "for i in range(len(items)):\n    if items[i] > best:\n        best = items[i]\n"
    "        index = i\nprint(best, index)\n",
    "The quick brown fox jumps over the lazy dog. The dog does not move; the fox jumps "
    "again, higher this time, and lands on the other side of the fence.",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, x):\n"
    "        self.items.append(x)\n\n    def pop(self):\n        return self.items.pop()\n",
]
ASKS = [
    "Repeat the following text exactly, with no comment:\n\n",
    "Rewrite the following, keeping every line, and add nothing:\n\n",
]
FIGURES = (
    "output_tok_s", "tpot_p50", "steps", "mean_forward_s", "mean_step_s", "acceptance_rate",
    "tokens_per_decode_row",
)  # fmt: skip
BATCHES = (1, 4, 16)  # max_num_seqs of each comparison


def copy_workload(engine: LLMEngine, n: int, max_tokens: int) -> Workload:
    """``n`` requests to copy a snippet (cycling through SNIPPETS and ASKS)."""
    reqs = []
    for i in range(n):
        text = ASKS[i % len(ASKS)] + SNIPPETS[i % len(SNIPPETS)]
        if engine.tokenizer is not None and getattr(engine.tokenizer, "chat_template", None):
            ids = engine.apply_chat_template([{"role": "user", "content": text}])
        elif engine.tokenizer is not None:
            ids = engine.tokenize(text)
        else:  # a model without a tokenizer (tests): a prompt that repeats itself
            ids = [3 + (i * 7 + j) % 50 for j in range(24)] * 2
        reqs.append(RequestSpec(ids, max_tokens))
    description = (
        f"{n} requests to repeat or rewrite one of {len(SNIPPETS)} code and text snippets "
        f"given in the prompt, {max_tokens} output tokens each"
    )
    return Workload("copy", description, reqs, params=dict(n=n, max_tokens=max_tokens))


def _figures(record: RunRecord) -> dict[str, float | None]:
    spec, batch = record.summary.get("speculative", {}), record.summary.get("batch", {})
    parts = [batch.get(k) for k in ("mean_schedule_s", "mean_forward_s", "mean_sample_s")]
    return {
        "output_tok_s": record.figures.get("output_tok_s"),
        "tpot_p50": record.figures.get("tpot_p50"),
        "steps": batch.get("steps"),  # iterations: exact, whatever the machine's load
        "mean_forward_s": batch.get("mean_forward_s"),  # the price of one (longer) step
        # a step's own seconds: what a round costs (None when the run had no step)
        "mean_step_s": None if None in parts else sum(parts),
        "acceptance_rate": spec.get("acceptance_rate"),
        "tokens_per_decode_row": spec.get("tokens_per_decode_row"),
    }


def check_figures(rec: RunRecord) -> None:
    """Raise ``ImplausibleFigure`` where a figure the rule reads cannot be right: steps whose
    seconds add up to more than the run lasted, a step of no time, a row with no token."""
    f = _figures(rec)
    steps, step_s, tokens = f["steps"], f["mean_step_s"], f["tokens_per_decode_row"]
    where = f"{rec.system} on {rec.workload}"
    if not steps or not step_s or step_s <= 0:
        raise ImplausibleFigure(f"{where}: {steps} steps of {step_s} s each: no step to price")
    if steps * step_s > rec.wall_s * (1 + CLOCK_SLACK) + CLOCK_SLACK_S:
        raise ImplausibleFigure(
            f"{where}: {steps} steps of {step_s:.3g} s add up to more than the run's "
            f"{rec.wall_s:.3g} s: a duration outside the run"
        )
    if tokens is None or tokens < 1:
        raise ImplausibleFigure(f"{where}: {tokens} tokens a decode row: every row gives one")


def break_even(runs: dict[str, list[RunRecord]]) -> dict[str, Any]:
    """The rule, repeat by repeat: tokens a row a round (on), a round's cost in plain steps
    (a step's seconds, on over off) and the speed-up the rule gives (tokens over cost)."""
    tokens, cost, rule = [], [], []
    for on, off in zip(runs["on"], runs["off"], strict=True):
        t = _figures(on)["tokens_per_decode_row"]
        c = _figures(on)["mean_step_s"] / _figures(off)["mean_step_s"]  # both checked > 0
        tokens.append(t)
        cost.append(c)
        rule.append(t / c)
    return {"tokens_per_round": spread(tokens), "round_cost_steps": spread(cost),
            "rule_speedup": spread(rule)}  # fmt: skip


def compare(
    engine: LLMEngine,
    workload: Workload,
    slots: int,
    repeats: int,
    on: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """``workload`` with speculation off and on (``on``: the proposer's settings; default
    n-gram prompt lookup), ``slots`` requests at a time; every run's figures are checked
    (``check_figures``) before a ratio is made of them."""
    on = on or {"speculative": "ngram"}
    runs: dict[str, list[RunRecord]] = {"off": [], "on": []}
    for r in range(repeats):
        for mode in ("off", "on") if r % 2 == 0 else ("on", "off"):
            spec = on if mode == "on" else {"speculative": "off"}
            eng = sibling(engine, **spec, max_num_seqs=slots)
            runs[mode].append(run_minicb(eng, workload, f"minicb-spec-{mode}"))
    for rec in runs["off"] + runs["on"]:
        check_figures(rec)
    figures = {
        mode: {k: spread(_figures(rec)[k] for rec in recs) for k in FIGURES}
        for mode, recs in runs.items()
    }
    return {
        "slots": slots,
        "figures": figures,
        "throughput_on_over_off": paired_ratio(runs["on"], runs["off"], "output_tok_s"),
        "tpot_on_over_off": paired_ratio(runs["on"], runs["off"], "tpot_p50"),
        "break_even": break_even(runs),
    }


def run_bench(
    engine: LLMEngine, quick: bool, repeats: int | None = None, on: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Both workloads at each of BATCHES slots (16 requests: the last batch holds them all),
    speculation ``on`` with the proposer's settings (default: n-gram prompt lookup)."""
    on = on or {"speculative": "ngram"}
    plan = QUICK if quick else FULL
    n, max_tokens = (16, 32) if quick else (16, 96)
    headline = make_workloads(plan, engine.runner.vocab_size)[0]
    # as many requests as the copy workload, under the headline's own name
    headline = replace(headline.head(n, max_tokens=max_tokens), name=headline.name)
    repeats = repeats or plan.repeats
    results: dict[str, Any] = {"repeats": repeats, "workloads": {}}
    warm = copy_workload(engine, 1, 4)
    for spec in ({"speculative": "off"}, on):  # first touches of weights and allocator
        run_minicb(sibling(engine, **spec), warm, "warm-up")
    for w in (copy_workload(engine, n, max_tokens), headline):
        results["workloads"][w.name] = {
            "definition": w.describe(),
            **{f"batch_{b}": compare(engine, w, b, repeats, on) for b in BATCHES},
        }
    return results


def _median(value: dict[str, float] | None, fmt: str) -> str:
    return "–" if not value else format(value["median"], fmt)


def _ms(value: dict[str, float] | None) -> str:
    return "–" if not value else f"{value['median'] * 1000:.0f}"


def _cost(cost: float) -> str:
    """A round's cost in plain steps. A round does a plain step's work and more, so a cost
    under 1 is not the engine's: it is other load on the machine moving between the paired
    runs (not an error: a busy machine gives it), and the line says so."""
    return f"{cost:.2f}" if cost >= 1 else f"{cost:.2f} (under 1: the machine's load)"


def render(results: dict[str, Any]) -> str:
    """A markdown table: one line per workload and batch, off against on, with the rule."""
    header = ["workload", "batch", "tok/s off", "tok/s on", "on / off", "TPOT p50 off (s)",
              "TPOT p50 on (s)", "on / off", "steps off -> on",
              "forward per step off -> on (ms)", "acceptance", "tokens a row a round",
              "round cost (steps)", "rule: pays?", "rule's speed-up"]  # fmt: skip
    rows = []
    for name, w in results["workloads"].items():
        for load in (k for k in w if k.startswith("batch_")):
            c = w[load]
            off, on, rule = c["figures"]["off"], c["figures"]["on"], c["break_even"]
            tokens, cost = rule["tokens_per_round"]["median"], rule["round_cost_steps"]["median"]
            rows.append([
                name, str(c["slots"]), _median(off["output_tok_s"], ".1f"),
                _median(on["output_tok_s"], ".1f"),
                f"{_median(c['throughput_on_over_off'], '.2f')}x",
                _median(off["tpot_p50"], ".3f"), _median(on["tpot_p50"], ".3f"),
                f"{_median(c['tpot_on_over_off'], '.2f')}x",
                f"{_median(off['steps'], '.0f')} -> {_median(on['steps'], '.0f')}",
                f"{_ms(off['mean_forward_s'])} -> {_ms(on['mean_forward_s'])}",
                _median(on["acceptance_rate"], ".0%"), f"{tokens:.2f}", _cost(cost),
                "yes" if tokens > cost else "no", f"{_median(rule['rule_speedup'], '.2f')}x",
            ])  # fmt: skip
    return "\n".join(markdown_table(header, rows))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m minicb.bench.speculative", description=__doc__)
    p.add_argument("--quick", action="store_true", help="16 requests of 32 tokens, one repeat")
    p.add_argument("--model", default=None, help="model folder (default: embedded SmolLM2-135M)")
    p.add_argument("--device", default="auto", help="cpu, cuda, or auto")
    p.add_argument("--dtype", default="auto", help="float32, bfloat16, float16 or auto")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--repeats", type=int, default=None, help="measured repeats")
    p.add_argument("--num-speculative-tokens", type=int, default=4)
    p.add_argument("--proposer", default="ngram", choices=("ngram", "draft", "early_exit"))
    p.add_argument("--draft-model", default=None, help="--proposer draft: its model folder")
    p.add_argument("--draft-layers", type=int, default=None, help="--proposer early_exit")
    p.add_argument("--out", default=None, help="also write the figures to this JSON file")
    args = p.parse_args(argv)
    import torch

    from minicb.core.config import EngineConfig

    torch.set_num_threads(args.threads)
    config = EngineConfig.from_kwargs(
        device=args.device,
        dtype=args.dtype,
        num_kv_blocks=512,
        num_swap_blocks=0,
        num_speculative_tokens=args.num_speculative_tokens,
    )
    engine = LLMEngine(args.model, config)
    on = {"speculative": args.proposer, "draft_model": args.draft_model,
          "draft_layers": args.draft_layers}  # fmt: skip
    results = run_bench(engine, args.quick, args.repeats, on)
    results["meta"] = {
        "model": engine.model_name,
        "runner": engine.runner.describe(),
        "num_speculative_tokens": args.num_speculative_tokens,
        "speculation_on": on,
        "threads": args.threads,
        "median_prompt_len": {
            k: statistics.median(w["definition"]["prompt_lens"])
            for k, w in results["workloads"].items()
        },
    }
    print(render(results))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
