"""The speculative-decoding benchmark runs end to end on a tiny model and reports paired
ratios (no timing is asserted: the figures are the benchmark's, not the test's)."""

from minicb import LLM
from minicb.bench.speculative import compare, copy_workload, render


def test_compare_reports_both_modes_and_paired_ratios(tiny_llama_dir):
    engine = LLM(dtype="float32", model=tiny_llama_dir, num_kv_blocks=128, num_swap_blocks=0).engine
    w = copy_workload(engine, 2, 12)
    assert len(w.requests) == 2 and all(r.max_tokens == 12 for r in w.requests)
    result = compare(engine, w, slots=2, repeats=2)
    figures = result["figures"]
    assert figures["off"]["output_tok_s"]["n"] == figures["on"]["output_tok_s"]["n"] == 2
    assert figures["off"]["acceptance_rate"] is None  # nothing drafted without speculation
    assert figures["off"]["tokens_per_decode_row"]["median"] == 1.0
    assert figures["on"]["tokens_per_decode_row"]["median"] >= 1.0
    assert result["throughput_on_over_off"]["n"] == 2 and result["tpot_on_over_off"]["n"] == 2
    table = render({"workloads": {"copy": {"batch_1": result, "full_batch": result}}})
    assert table.count("\n| copy |") == 2 and "2 slots, all at once" in table
