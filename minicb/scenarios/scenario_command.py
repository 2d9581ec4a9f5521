"""``minicb scenario``: the lessons from the command line, with no browser.

    minicb scenario list                          the shipped scenarios and their titles
    minicb scenario check FILE_OR_NAME            load it, play it headless, check its claims
    minicb scenario export NAME --trace FILE      play it and write one trace per side

An exported trace is what ``minicb replay FILE --serve`` plays: FILE holds the right-hand
side (the ``right`` panel), FILE's stem + ``.static.jsonl`` the left (the name the replay
already looks for beside a demo trace), and each header carries the scenario: its title,
labels and every narration point with the round it fired at and the request ids to
highlight. A real-model scenario plays on the embedded model (or ``--model``), on the
wall clock; ``--profile GPU:MODEL`` plays it on a simulated GPU instead.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

PANELS = ("left", "right")  # as server/lesson.py names the demo's panels


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("scenario", help="list, check or export the classroom's lessons")
    sub = p.add_subparsers(dest="action", required=True)
    sub.add_parser("list", help="the shipped scenarios").set_defaults(func=run_list)
    for name, func, what in (
        ("check", run_check, "play a scenario headless and check its narration's claims"),
        ("export", run_export, "play a scenario and write its traces for minicb replay"),
    ):
        q = sub.add_parser(name, help=what)
        q.add_argument("scenario", metavar="NAME_OR_FILE")
        q.add_argument("--model", default=None, help="model folder for a real-model scenario")
        q.add_argument("--profile", default=None, metavar="GPU:MODEL",
                       help="play a real-model scenario on this simulated GPU")  # fmt: skip
        if name == "export":
            q.add_argument("--trace", required=True, metavar="FILE", help="the right side's trace")
        q.set_defaults(func=func)


def run_list(args: argparse.Namespace) -> int:
    from minicb.scenarios import load_scenario, scenario_names

    for name in scenario_names():
        scenario = load_scenario(name)
        print(f"{name:28} {scenario.runner:24} {scenario.title['en']}")
    return 0


def _play(args: argparse.Namespace, listeners: dict[str, Any] | None = None) -> Any:
    """Play ``args.scenario`` headless; ``listeners``: side name -> a listener of its bus."""
    from minicb.scenarios import load_scenario
    from minicb.scenarios.player import build_engines, play

    scenario = load_scenario(args.scenario)
    engines = build_engines(scenario, args.model, args.profile)
    for side, listener in (listeners or {}).items():
        engines[side].bus.subscribe(listener)
    return scenario, play(scenario, engines)


def run_check(args: argparse.Namespace) -> int:
    from minicb.scenarios.side_figures import check_claim

    scenario, result = _play(args)
    failed = 0
    for i, point in enumerate(scenario.narration):
        fired = result.fired.get(i)
        print(f"[{i}] " + (f"fired after round {fired}" if fired is not None else "NEVER FIRED"))
        failed += fired is None
        for claim in point.claims:
            holds, said = check_claim(result.records, claim)
            print(f"    {'ok  ' if holds else 'FAIL'} {said}")
            failed += not holds
    print(f"{scenario.name}: {result.rounds} rounds, {failed} problem(s)")
    return 1 if failed else 0


def run_export(args: argparse.Namespace) -> int:
    from minicb.scenarios import load_scenario
    from minicb.scenarios.player import narration_point
    from minicb.telemetry.trace import TraceWriter, trace_header
    from minicb.telemetry.trace_files import trace_paths

    main = Path(args.trace)
    main.parent.mkdir(parents=True, exist_ok=True)
    paths = trace_paths(str(main))
    files = {PANELS[0]: paths["static"], PANELS[1]: paths["continuous"]}
    sides = [s.name for s in load_scenario(args.scenario).sides]
    events: dict[str, list[Any]] = {side: [] for side in sides}  # in the order they came
    scenario, result = _play(args, {side: events[side].extend for side in sides})
    points = [narration_point(scenario, i, result.feeder, PANELS) for i in sorted(result.fired)]
    about = {
        "name": scenario.name,
        "title": scenario.title,
        "summary": scenario.summary,
        "runner": scenario.runner,
        "panels": {
            p: {"side": s.name, "label": s.label}
            for p, s in zip(PANELS, scenario.sides, strict=True)
        },
        "points": len(scenario.narration),
        "fired": points,
    }
    for panel, side in zip(PANELS, sides, strict=True):
        engine = result.engines[side]
        header = trace_header(engine, command="scenario export", panel=panel, scenario=about)
        writer = TraceWriter(files[panel], header)
        writer(events[side])
        writer.close()
        print(f"{panel} ({side}): {writer.num_events} events -> {files[panel]}")
    print(f"replay it: minicb replay {main} --serve")
    return 0
