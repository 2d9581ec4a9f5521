"""A draft drawn from a distribution keeps the target's at temperature 1 (end to end, tiny
Llama, fp32). The draft is the target's first layer of two (its q near p but not p: guesses
kept and rejected; two unrelated random models share no top-3 token, and every guess of
one would be rejected, which tests half the rule). Over N seeds, the pair
(first token, first speculated token) is counted, with speculation on and off, and each is
compared with the exact distribution of that pair computed from the target's logits
(transformers' forward, filtered as the sampler filters). Both must be within the sampling
noise of N draws: the bound is three times the expected total variation of an N-draw
histogram of the exact distribution. The run must both accept and reject guesses, so that
both ways out of the rejection sampler (kept guess, residual draw) are in the counts.
"""

from collections import Counter

import pytest
import torch

from minicb import LLM, SamplingParams
from minicb.core.runner.sampling_filters import filter_logits

N = 400
PROMPT = [5, 17, 33, 42, 99]
PARAMS = dict(temperature=1.0, top_k=3)


def exact_pairs(model_dir: str) -> dict[tuple[int, int], float]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    params = SamplingParams(**PARAMS)

    def dist(ids):
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, -1]
        return filter_logits(logits, params).softmax(-1)

    first = dist(PROMPT)
    out = {}
    for t0 in first.nonzero()[:, 0].tolist():
        second = dist([*PROMPT, t0])
        for t1 in second.nonzero()[:, 0].tolist():
            out[(t0, t1)] = float(first[t0] * second[t1])
    return out


def sampled_pairs(model_dir: str, **options) -> Counter:
    llm = LLM(model=model_dir, dtype="float32", num_kv_blocks=256, block_size=4, **options)
    params = [SamplingParams(max_tokens=3, seed=s, ignore_eos=True, **PARAMS) for s in range(N)]
    outs = llm.generate([PROMPT] * N, params)
    drafted = sum(o.metrics.num_draft_tokens for o in outs)
    accepted = sum(o.metrics.num_accepted_tokens for o in outs)
    return Counter(tuple(o.token_ids[:2]) for o in outs), (drafted, accepted)


def total_variation(counts: Counter, exact: dict) -> float:
    keys = set(counts) | set(exact)
    return 0.5 * sum(abs(counts[k] / N - exact.get(k, 0.0)) for k in keys)


@pytest.mark.slow  # two engines over 400 requests and a transformers reference: ~10 s
def test_first_speculated_token_keeps_the_target_distribution(tiny_llama_dir):
    exact = exact_pairs(tiny_llama_dir)
    noise = sum((2 * p * (1 - p) / (torch.pi * N)) ** 0.5 for p in exact.values()) / 2
    bound = 3 * noise
    off, _ = sampled_pairs(tiny_llama_dir)
    on, (drafted, accepted) = sampled_pairs(
        tiny_llama_dir, speculative="early_exit", draft_layers=1
    )
    tv_off, tv_on = total_variation(off, exact), total_variation(on, exact)
    print(f"bound {bound:.3f}: off {tv_off:.3f}, on {tv_on:.3f}; {accepted}/{drafted} kept")
    assert 0 < accepted < drafted
    assert tv_off < bound
    assert tv_on < bound
