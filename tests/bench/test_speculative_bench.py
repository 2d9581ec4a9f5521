"""The speculative-decoding benchmark runs end to end on a tiny model and reports paired
ratios and the break-even rule (no timing is asserted: the figures are the benchmark's, not
the test's), and refuses figures no correct run gives."""

from dataclasses import replace

import pytest

from minicb import LLM
from minicb.bench.sanity import ImplausibleFigure
from minicb.bench.speculative import check_figures, compare, copy_workload, render


def test_compare_reports_both_modes_and_paired_ratios(tiny_llama_dir):
    engine = LLM(dtype="float32", model=tiny_llama_dir, num_kv_blocks=128, num_swap_blocks=0).engine
    w = copy_workload(engine, 2, 12)
    assert len(w.requests) == 2 and all(r.max_tokens == 12 for r in w.requests)
    result = compare(engine, w, slots=2, repeats=2, on={"speculative": "ngram"})
    figures = result["figures"]
    assert figures["off"]["output_tok_s"]["n"] == figures["on"]["output_tok_s"]["n"] == 2
    assert figures["off"]["acceptance_rate"] is None  # nothing drafted without speculation
    assert figures["off"]["tokens_per_decode_row"]["median"] == 1.0
    assert figures["on"]["tokens_per_decode_row"]["median"] >= 1.0
    assert result["throughput_on_over_off"]["n"] == 2 and result["tpot_on_over_off"]["n"] == 2
    rule = result["break_even"]
    assert rule["tokens_per_round"]["n"] == rule["round_cost_steps"]["n"] == 2
    assert rule["tokens_per_round"]["median"] == figures["on"]["tokens_per_decode_row"]["median"]
    assert rule["round_cost_steps"]["median"] > 0
    table = render({"workloads": {"copy": {"batch_1": result, "batch_4": result}}})
    assert table.count("\n| copy |") == 2 and "round cost (steps)" in table
    assert "| yes |" in table or "| no |" in table
    # a round cheaper than a plain step is the machine's load, and the line says so
    cheap = {**result, "break_even": {**rule, "round_cost_steps": {"median": 0.5}}}
    cheap_table = render({"workloads": {"copy": {"batch_1": cheap}}})
    assert "0.50 (under 1: the machine's load)" in cheap_table


def test_a_step_time_outside_the_run_is_refused_before_any_ratio(tiny_llama_dir):
    from minicb.bench import run_minicb

    engine = LLM(dtype="float32", model=tiny_llama_dir, num_kv_blocks=128, num_swap_blocks=0).engine
    rec = run_minicb(engine, copy_workload(engine, 2, 8), "minicb-spec-off")
    check_figures(rec)  # a real run passes
    # a step said to last longer than the whole run (not the run shortened: a tiny model's
    # steps on a fast machine can add up to less than the clock's slack)
    long_step = {**rec.summary["batch"], "mean_forward_s": rec.wall_s + 1.0}
    with pytest.raises(ImplausibleFigure, match="outside the run"):
        check_figures(replace(rec, summary={**rec.summary, "batch": long_step}))
    batch = {**rec.summary["batch"], "mean_forward_s": 0.0, "mean_schedule_s": 0.0,
             "mean_sample_s": 0.0}  # fmt: skip
    with pytest.raises(ImplausibleFigure, match="no step to price"):
        check_figures(replace(rec, summary={**rec.summary, "batch": batch}))


def test_the_bench_measures_any_proposer_early_exit_with_every_layer_keeps_every_guess(
    tiny_llama_dir,
):
    """--proposer early_exit with all of the tiny model's layers is the target itself: every
    guess is kept, so each round gives a decode row more than one token."""
    engine = LLM(dtype="float32", model=tiny_llama_dir, num_kv_blocks=128, num_swap_blocks=0).engine
    w = copy_workload(engine, 2, 12)
    layers = engine.runner.files.hf_config.num_hidden_layers
    on = {"speculative": "early_exit", "draft_layers": layers}
    result = compare(engine, w, slots=2, repeats=1, on=on)
    assert result["figures"]["on"]["acceptance_rate"]["median"] == 1.0
    assert result["break_even"]["tokens_per_round"]["median"] > 1.0


def test_minicb_bench_speculative_hands_its_options_to_the_speculation_bench(monkeypatch, tmp_path):
    from minicb.bench import speculative, suite
    from minicb.cli import build_parser

    seen = []
    monkeypatch.setattr(speculative, "main", lambda argv: seen.append(argv) or 0)
    args = build_parser().parse_args(
        ["bench", "--speculative", "draft", "--draft-model", "m", "--quick",
         "--out-dir", str(tmp_path)]  # fmt: skip
    )
    assert suite.run(args) == 0
    (argv,) = seen
    assert argv[:2] == ["--proposer", "draft"] and argv[-1] == "--quick"
    assert argv[argv.index("--draft-model") + 1] == "m" and "--draft-layers" not in argv
