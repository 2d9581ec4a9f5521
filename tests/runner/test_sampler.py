"""Sampling: filters, per-request seeds that ignore the batch, stop tokens and strings."""

import pytest
import torch

from minicb import LLM, SamplingParams
from minicb.core.runner.sampler import sample
from minicb.core.runner.sampling_filters import filter_logits, filter_rows


def test_top_k_and_top_p_keep_the_right_tokens():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    kept = filter_logits(logits, SamplingParams(temperature=1.0, top_k=2)).isfinite()
    assert kept.tolist() == [True, True, False, False]
    kept = filter_logits(logits, SamplingParams(temperature=1.0, top_p=0.75)).isfinite()
    assert kept.tolist() == [True, True, False, False]
    kept = filter_logits(logits, SamplingParams(temperature=1.0, top_p=0.5)).isfinite()
    assert kept.tolist() == [True, False, False, False]


def test_greedy_rows_take_the_argmax_and_seeded_rows_repeat():
    logits = torch.randn(3, 50)
    params = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=1.0, seed=11),
        SamplingParams(temperature=1.0, seed=11),
    ]
    gen = torch.Generator().manual_seed(0)
    a = sample(logits, params, [0, 4, 4], gen)
    b = sample(logits, params, [0, 4, 4], gen)
    assert a[0] == int(logits[0].argmax())
    assert a[1:] == b[1:]


MIXED = [
    SamplingParams(temperature=0.7),
    SamplingParams(temperature=1.0, top_k=5),
    SamplingParams(temperature=1.3, top_p=0.6),
    SamplingParams(temperature=0.9, top_k=40, top_p=0.8, seed=3),
    SamplingParams(temperature=0.0),
    SamplingParams(temperature=1.0, top_k=1),
]


def test_filter_rows_equals_the_one_row_reference_on_every_row():
    logits = torch.randn(len(MIXED) - 1, 1000, generator=torch.Generator().manual_seed(1)) * 3
    params = [p for p in MIXED if not p.greedy]
    batched = filter_rows(logits, params)
    for i, p in enumerate(params):
        assert torch.equal(batched[i], filter_logits(logits[i], p))


def test_vectorised_sample_keeps_greedy_exact_seeded_rows_alone_and_draws_in_the_filter():
    logits = torch.randn(len(MIXED), 1000, generator=torch.Generator().manual_seed(2)) * 3
    counts = list(range(len(MIXED)))
    tokens = sample(logits, MIXED, counts, torch.Generator().manual_seed(0))
    assert tokens[4] == int(logits[4].argmax()) and tokens[5] == int(logits[5].argmax())
    # The seeded row: what it draws alone, whatever the shared generator's state.
    alone = sample(logits[3:4], MIXED[3:4], counts[3:4], torch.Generator().manual_seed(99))
    assert tokens[3] == alone[0]
    # Every sampled row: a token the row's own filter keeps.
    for i in (0, 1, 2, 3):
        assert filter_logits(logits[i], MIXED[i])[tokens[i]].isfinite()
    assert tokens[1] in torch.topk(logits[1], 5).indices.tolist()


def test_inverse_cdf_never_draws_a_filtered_token_and_follows_the_distribution():
    # Three tokens at 1:0:3 odds behind zeros: token 1 and the zeros are never drawn.
    logits = torch.full((4000, 6), float("-inf"))
    logits[:, 2], logits[:, 4] = 0.0, float(torch.log(torch.tensor(3.0)))
    params = [SamplingParams(temperature=1.0)] * 4000
    tokens = sample(logits, params, [0] * 4000, torch.Generator().manual_seed(5))
    assert set(tokens) == {2, 4}
    assert 0.72 < tokens.count(4) / 4000 < 0.78  # 0.75, 5 standard deviations either side


def test_greedy_argmax_on_bf16_logits_needs_no_fp32_copy_and_picks_the_first_maximum():
    logits = torch.randn(4, 300).bfloat16()
    logits[2, 7] = logits[2, 250] = 50.0  # a tie: the first index wins, as in argmax
    tokens = sample(logits, [SamplingParams(temperature=0.0)] * 4, [0] * 4, torch.Generator())
    assert tokens == logits.float().argmax(-1).tolist() and tokens[2] == 7


def test_seeded_request_gets_the_same_tokens_whatever_shares_its_batch(tiny_llama_dir):
    # float32: in bf16 the batch's shape changes the logits' rounding (see sampler.py).
    llm = LLM(model=tiny_llama_dir, num_kv_blocks=64, dtype="float32")
    seeded = SamplingParams(max_tokens=12, temperature=1.0, top_p=0.9, seed=1234, ignore_eos=True)
    alone = llm.generate([[5, 6, 7]], seeded)[0].token_ids
    others = SamplingParams(max_tokens=12, temperature=1.0, ignore_eos=True)
    crowded = llm.generate([[9, 9], [5, 6, 7], [3] * 20], [others, seeded, others])[1].token_ids
    assert alone == crowded


def test_stop_token_ids_and_max_tokens(tiny_llama_dir):
    llm = LLM(model=tiny_llama_dir, num_kv_blocks=64)
    free = llm.generate(
        [[5, 6, 7]], SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
    )[0]
    assert free.finish_reason == "length" and len(free.token_ids) == 10
    stop_at = free.token_ids[3]
    first = free.token_ids.index(stop_at)
    out = llm.generate(
        [[5, 6, 7]], SamplingParams(max_tokens=10, temperature=0.0, stop_token_ids=[stop_at])
    )[0]
    assert out.finish_reason == "stop" and out.token_ids == free.token_ids[: first + 1]


@pytest.mark.slow  # loads the default model
def test_stop_string_cuts_the_text(default_llm):
    params = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)
    full = default_llm.generate(["1, 2, 3, 4,"], params)[0]
    assert " 7" in full.text
    cut = default_llm.generate(
        ["1, 2, 3, 4,"], SamplingParams(max_tokens=30, temperature=0.0, stop=[" 7"])
    )[0]
    assert cut.finish_reason == "stop"
    assert cut.text == full.text[: full.text.index(" 7")]


@pytest.mark.slow  # loads the default model
def test_eos_stops_unless_ignored(default_llm):
    chat = [{"role": "user", "content": "Say hi."}]
    out = default_llm.chat(chat, SamplingParams(max_tokens=64, temperature=0.0))
    assert out.finish_reason == "stop" and out.token_ids[-1] in default_llm.engine.eos_token_ids
    out = default_llm.chat(chat, SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True))
    assert out.finish_reason == "length" and len(out.token_ids) == 64


@pytest.mark.parametrize("temperature", [1e-46, 1e-40, 1e-6])
def test_a_temperature_under_1e_5_is_greedy_not_the_last_vocabulary_id(temperature):
    # 1e-46 is 0 in float32: dividing by it made every logit inf or NaN, and the draw
    # then fell to the last id (the review's [999, 999, 999]).
    logits = torch.randn(3, 1000, generator=torch.Generator().manual_seed(4))
    params = [SamplingParams(temperature=temperature, seed=s) for s in range(3)]
    assert all(p.greedy for p in params)
    tokens = sample(logits, params, [0, 1, 2], torch.Generator().manual_seed(0))
    assert tokens == logits.argmax(-1).tolist()
    assert not SamplingParams(temperature=1e-5).greedy  # the threshold itself samples


def test_a_top_p_below_float32_keeps_the_most_likely_token():
    logits = torch.randn(2, 1000, generator=torch.Generator().manual_seed(6))
    params = [SamplingParams(temperature=1.0, top_p=1e-46, seed=1)] * 2
    kept = filter_rows(logits, params).isfinite()
    assert kept.sum(-1).tolist() == [1, 1]
    assert kept.float().argmax(-1).tolist() == logits.argmax(-1).tolist()
    assert filter_logits(logits[0], params[0]).isfinite().sum() == 1  # the reference too
    tokens = sample(logits, params, [0, 0], torch.Generator())
    assert tokens == logits.argmax(-1).tolist()


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_a_row_of_nan_logits_is_refused_by_name_never_sampled(temperature):
    logits = torch.randn(3, 100)
    logits[1, 5] = float("nan")
    params = [SamplingParams(temperature=temperature)] * 3
    with pytest.raises(ValueError, match=r"row 1 .*NaN"):
        sample(logits, params, [0, 0, 0], torch.Generator())
