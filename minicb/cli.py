"""The ``minicb`` command: one console script for every way of running the engine.

- ``generate PROMPT...``: complete prompts and print each completion;
- ``replay FILE``: the metrics of a recorded trace (as text or JSON), its Chrome/Perfetto
  export, and ``--serve``: the visualizer fed from the trace, with no model loaded;
- ``demo`` and ``serve`` (minicb.server.demo_command and serve_command) and ``bench``
  (minicb.bench.suite);
- ``scenario list|check|export`` (minicb.scenarios.scenario_command): the classroom's lessons;
- ``lab student|check`` (minicb.graded_labs.lab_command): graded labs, the student
  notebooks and their checker.

Each subcommand's parser sets ``func``, the function that runs it. Building the parser
imports nothing heavy: torch and the model load when a command runs. ``format_summary``
prints a metrics summary (minicb.telemetry.metrics) as a short report for the terminal.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

from minicb.bench import suite
from minicb.engine_options import add_engine_options, describe_choices, engine_kwargs
from minicb.graded_labs import lab_command
from minicb.scenarios import scenario_command
from minicb.server import demo_command, launch, serve_command
from minicb.telemetry.trace import add_trace_option, traced
from minicb.telemetry.trace_reader import read_trace


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="minicb", description=__doc__.splitlines()[0])
    subparsers = parser.add_subparsers(dest="command", required=True)
    _add_generate(subparsers)
    _add_replay(subparsers)
    demo_command.add_parser(subparsers)
    serve_command.add_parser(subparsers)
    suite.register(subparsers)
    scenario_command.register(subparsers)
    lab_command.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ValueError, RuntimeError) as err:  # clear errors, not tracebacks, for bad input
        print(f"minicb {args.command}: error: {err}", file=sys.stderr)
        return 2


# ---- generate --------------------------------------------------------------------------
def _add_generate(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("generate", help="complete prompts and print the completions")
    p.add_argument("prompts", nargs="+", metavar="PROMPT")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--chat", action="store_true", help="wrap each prompt in the chat template")
    add_engine_options(p)
    add_trace_option(p)
    p.set_defaults(func=generate)


def generate(args: argparse.Namespace) -> int:
    from minicb import LLM, SamplingParams

    llm = LLM(model=args.model, **engine_kwargs(args))
    print(f"minicb generate: {describe_choices(llm.engine.describe()['runner'])}", file=sys.stderr)
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


# ---- replay ----------------------------------------------------------------------------
def _add_replay(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("replay", help="print the metrics of a recorded trace")
    p.add_argument("trace", metavar="FILE", help="a JSONL trace written with --trace")
    p.add_argument("--json", action="store_true", help="print the metrics as JSON")
    p.add_argument(
        "--perfetto",
        metavar="OUT.json",
        help="also write a Chrome/Perfetto trace (open it in ui.perfetto.dev)",
    )
    p.add_argument("--ttft-slo", type=float, default=None, metavar="S", help="TTFT target (s)")
    p.add_argument("--tpot-slo", type=float, default=None, metavar="S", help="TPOT target (s)")
    p.add_argument(
        "--serve",
        action="store_true",
        help="open the trace in the visualizer (a demo's FILE.static.jsonl and the other "
        "replicas' FILE.replicaK.jsonl come too)",
    )
    launch.add_server_options(p)
    p.set_defaults(func=replay)


def replay_traces(path: str) -> dict[str, Any]:
    """Panel name -> Trace: the file itself, and its siblings: the static one from
    ``minicb demo`` (FILE.static.jsonl), the other replicas' from ``minicb serve --replicas``
    (FILE.replica1.jsonl, ...)."""
    main = Path(path)
    sibling = re.compile(re.escape(main.stem) + r"\.(static|replica\d+)" + re.escape(main.suffix))
    siblings = sorted(p for p in main.parent.glob(main.stem + ".*") if sibling.fullmatch(p.name))
    traces = {}
    for p in [main] + [s for s in siblings if s != main]:
        trace = read_trace(p)
        name = trace.header.get("panel") or (trace.header.get("config") or {}).get("batching")
        traces[name if name and name not in traces else p.stem] = trace
    return traces


def replay(args: argparse.Namespace) -> int:
    """The metrics of a recorded trace (or the page over it, with ``--serve``). A trace
    is anyone's file: one whose fields hold values of the wrong type ends in one line
    naming the file and the fault, exit status 2, never a traceback."""
    try:
        return _replay(args)
    except (TypeError, KeyError, AttributeError, IndexError) as err:
        raise ValueError(
            f"{args.trace} is not a usable trace: a field holds the wrong type or shape "
            f"({type(err).__name__}: {err})"
        ) from err


def _replay(args: argparse.Namespace) -> int:
    from minicb.telemetry.metrics import compute_metrics
    from minicb.telemetry.perfetto import write_chrome_trace

    if args.serve:
        traces = _read(args.trace, replay_traces)
        for trace in traces.values():  # refused now, not when the first page opens
            compute_metrics(trace.events)
        return launch.serve_replay(traces, args)
    trace = _read(args.trace, read_trace)
    summary = compute_metrics(trace.events, args.ttft_slo, args.tpot_slo)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(f"trace {args.trace}: model {trace.header.get('model')}, {len(trace.events)} events")
        if trace.header.get("simulated"):
            profile = (trace.header.get("hardware") or {}).get("profile")
            print(f"SIMULATED ({profile}): predicted step times, not a measurement")
        print(format_summary(summary))
    if args.perfetto:
        write_chrome_trace(trace.events, args.perfetto, trace.header)
        if not args.json:
            print(f"Perfetto trace written to {args.perfetto} (open it in ui.perfetto.dev)")
    return 0


def _read(path: str, read: Any) -> Any:
    try:
        return read(path)
    except OSError as err:
        raise ValueError(f"cannot read {path}: {err.strerror}") from err


# ---- a metrics summary as text ---------------------------------------------------------
LATENCIES = (
    ("ttft_s", "TTFT"),
    ("tpot_s", "TPOT"),
    ("itl_s", "inter-token"),
    ("e2e_s", "end-to-end"),
    ("queue_s", "queue time"),
)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f}%"


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def format_summary(summary: dict[str, Any]) -> str:
    r, b, kv, p, f = (summary[k] for k in ("requests", "batch", "kv", "preemptions", "fairness"))
    t = summary["throughput"]
    lines = [
        f"requests   {r['arrived']} arrived, {r['finished']} finished, {r['aborted']} aborted, "
        f"{r['rejected']} rejected; {r['tokens_generated']} tokens in "
        f"{summary['duration_s']:.3f} s",
        f"throughput {_num(t['output_tokens_per_s'])} output tok/s, "
        f"{_num(t['total_tokens_per_s'])} total tok/s, {_num(t['requests_per_s'], 2)} req/s",
        "",
        f"{'latency (ms)':<14}{'count':>7}{'mean':>10}{'p50':>10}{'p90':>10}{'p99':>10}{'max':>10}",
    ]
    for key, label in LATENCIES:
        d = summary["latency"][key]
        cells = "".join(f"{_ms(d[k]):>10}" for k in ("mean", "p50", "p90", "p99", "max"))
        lines.append(f"{label:<14}{d['count']:>7}{cells}")
    lines += [
        "",
        f"batch      {b['steps']} steps, {_num(b['mean_rows_per_step'])} rows and "
        f"{_num(b['mean_tokens_per_step'])} tokens per step; slot occupancy "
        f"{_pct(b['slot_occupancy'])}, padding waste {_pct(b['padding_waste'])}, "
        f"token budget use {_pct(b['token_budget_use'])}",
        f"step time  schedule {_ms(b['mean_schedule_s'])} ms, forward "
        f"{_ms(b['mean_forward_s'])} ms, sample {_ms(b['mean_sample_s'])} ms (means)",
        f"KV cache   utilisation {_pct(kv['utilisation'])}, internal fragmentation "
        f"{_pct(kv['internal_fragmentation'])}, reservation waste {_pct(kv['reservation_waste'])}; "
        f"pool usage mean {_pct(kv['mean_pool_usage'])}, peak {_pct(kv['peak_pool_usage'])}",
        f"preemption {p['total']} ({p['recompute']} recompute, {p['swap']} swap); "
        f"{p['swapped_out']} swapped out, {p['swapped_in']} swapped in",
        f"fairness   Jain's index {_num(f['jain_index'], 3)} over normalised latency; longest wait "
        f"{_ms(f['longest_wait_s'])} ms (request {f['longest_wait_request']})",
    ]
    g = summary.get("goodput")
    if g:
        lines.append(
            f"goodput    {g['requests']} requests met TTFT <= {_ms(g['ttft_slo_s'])} ms and "
            f"TPOT <= {_ms(g['tpot_slo_s'])} ms ({_pct(g['fraction'])}), "
            f"{_num(g['requests_per_s'], 2)} req/s"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
