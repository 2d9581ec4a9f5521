"""The demo's opening: with no workload option, a burst of three times the slots, sent again
each time both engines are done, so the first minute of `make demo` shows continuous
batching keeping its batch fuller than static batching (issue 36). Counted in iterations,
so the lesson holds on any machine; here on a simulated GPU and on fake runners."""

from __future__ import annotations

import argparse
import statistics

from minicb import EngineConfig, FakeRunner, LLMEngine
from minicb.server import demo_command
from minicb.server.demo_feeder import WorkloadFeeder, WorkloadSpec


def demo_args(*extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    demo_command.add_parser(parser.add_subparsers())
    return parser.parse_args(["demo", *extra])


def test_the_default_workload_is_the_looping_opening_and_explicit_options_win():
    args = demo_args()
    demo_command.resolve_demo_defaults(args)
    assert (args.workload, args.repeat, args.burst, args.max_num_seqs) == ("burst", True, 24, 8)
    args = demo_args("--simulate", "H100:llama-3.1-8b")
    demo_command.resolve_demo_defaults(args)
    assert (args.workload, args.repeat, args.burst, args.max_num_seqs) == ("burst", True, 768, 256)
    args = demo_args("--rate", "2")  # a rate asks for Poisson arrivals, as before
    demo_command.resolve_demo_defaults(args)
    assert args.workload == "poisson" and args.rate == 2.0
    args = demo_args("--workload", "off", "--burst", "24")  # the recordings' command: once
    demo_command.resolve_demo_defaults(args)
    assert args.workload == "off" and not getattr(args, "repeat", False)


def fake_engines(slots: int = 8) -> dict[str, LLMEngine]:
    engines = {}
    for batching in ("static", "continuous"):
        config = EngineConfig(
            batching=batching, max_num_seqs=slots, num_kv_blocks=256, max_num_batched_tokens=256
        )
        engines[batching] = LLMEngine(config=config, runner=FakeRunner(num_kv_blocks=256))
    return engines


def run_rounds(engines, feeder, rounds: int) -> dict[str, list[float]]:
    """The engine loop's rounds: the feeder, then one step of each engine with work."""
    occupancy: dict[str, list[float]] = {name: [] for name in engines}
    for _ in range(rounds):
        feeder(engines)
        for name, engine in engines.items():
            if engine.has_unfinished():
                plan = engine.step().plan
                useful = sum(r.phase != "padding" for r in plan.scheduled)
                occupancy[name].append(useful / plan.slots_limit)
    return occupancy


def test_a_repeated_burst_comes_again_once_every_engine_is_done():
    engines = fake_engines()
    feeder = WorkloadFeeder(WorkloadSpec(preset="burst", count=24, repeat=True), seed=1)
    run_rounds(engines, feeder, 1)
    assert feeder.sent == 24
    steps = 0
    while any(e.has_unfinished() for e in engines.values()):
        run_rounds(engines, feeder, 1)
        steps += 1
        assert feeder.sent == 24  # nothing more while either engine still holds a request
    assert steps > 24
    run_rounds(engines, feeder, 1)  # both are done: the next round brings the burst again
    assert feeder.sent == 48
    once = WorkloadFeeder(WorkloadSpec(preset="burst", count=24), seed=1)  # no repeat: once
    engines = fake_engines()
    run_rounds(engines, once, 400)
    assert once.sent == 24


def test_the_opening_keeps_continuous_batching_fuller_than_static():
    """Mean useful slot occupancy per iteration over the first loops of the opening."""
    engines = fake_engines()
    args = demo_args()
    demo_command.resolve_demo_defaults(args)
    spec = WorkloadSpec(preset="burst", count=args.burst, repeat=True, lengths=args.lengths)
    feeder = WorkloadFeeder(spec, short=tuple(args.short), long=tuple(args.long))
    occupancy = run_rounds(engines, feeder, 400)
    static, continuous = (statistics.mean(occupancy[n]) for n in ("static", "continuous"))
    assert feeder.sent >= 48  # the opening came round at least once more
    assert continuous > 1.5 * static, (continuous, static)


def test_the_simulated_demos_opening_shows_it_at_a_gpus_scale():
    """`minicb demo --simulate H100:llama-3.1-8b` as it starts: 256 slots, a burst of 768."""
    loop, _app = demo_command.build_demo(demo_args("--simulate", "H100:llama-3.1-8b"))
    occupancy = run_rounds(loop.engines, loop.feeder, 300)
    static, continuous = (statistics.mean(occupancy[n]) for n in ("static", "continuous"))
    assert loop.feeder.sent == 768
    assert continuous > 1.5 * static, (continuous, static)
