"""Property tests (hypothesis) of speculative decoding, on the real engine over FakeRunner.

A proposer that guesses at random (from a small alphabet that includes the stop token, so
drafts are partly accepted and sometimes run into a stop) under random limits, batching
modes, pools small enough to preempt, and prefix caching on or off, must:

- never exceed the token budget or the slot limit, and never draft in an iteration that
  preempted;
- never leak a block, and after each step hold no block that only rejected drafts needed;
- never key a prefix-cache block by tokens other than the request's own (a rejected draft
  is never committed);
- never let a row attend to a slot that holds anything but its own tokens (a shadow of the
  KV pool, written as the runner writes it, rejected drafts included);
- never emit a token after a stop, nor past max_tokens;
- give every request exactly the tokens it gets with speculation off.
"""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from minicb import SamplingParams
from minicb.core.runner.fake import FAKE_STOP_TOKEN
from minicb.core.scheduler import RequestRejected
from minicb.core.scheduler.block_manager import blocks_needed
from minicb.speculation.drafter import Draft
from tests.helpers import ShadowKV, fake_engine

ALPHABET = [3, 4, 5]  # the fake model's tokens; the proposer also guesses FAKE_STOP_TOKEN


def model_token(request_id: int, index: int) -> int:
    return ALPHABET[(request_id + index // 2) % len(ALPHABET)]


class RandomProposer:
    """Guesses 1..max_tokens tokens at random, or nothing one time in five."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def propose(self, rows):
        return [self._guess(row.token_ids, row.max_tokens) for row in rows]

    def _guess(self, token_ids, max_tokens):
        if self.rng.random() < 0.2:
            return None
        n = self.rng.randint(1, max_tokens)
        guesses = [self.rng.choice([*ALPHABET, FAKE_STOP_TOKEN]) for _ in range(n)]
        return Draft(guesses, [token_ids[-1]], len(token_ids) - 1)


request_st = st.tuples(
    st.lists(st.sampled_from(ALPHABET), min_size=1, max_size=24),  # prompt
    st.integers(1, 14),  # max_tokens
    st.one_of(st.none(), st.integers(1, 14)),  # where the fake model emits its stop token
    st.integers(0, 5),  # arrival step
)

config_st = st.fixed_dictionaries(
    {
        "batching": st.sampled_from(["continuous", "continuous", "static"]),
        "policy": st.sampled_from(["fcfs", "priority"]),
        "max_num_seqs": st.integers(1, 6),
        "max_num_batched_tokens": st.integers(1, 40),
        "block_size": st.sampled_from([1, 2, 4, 16]),
        "enable_chunked_prefill": st.booleans(),
        "enable_prefix_caching": st.booleans(),
        "preemption_mode": st.sampled_from(["recompute", "swap"]),
        "num_swap_blocks": st.integers(0, 40),
        "num_speculative_tokens": st.integers(1, 6),
        "kv_reservation": st.sampled_from(["paged", "paged", "max", "pow2", "oracle"]),
    }
)


def _run(config: dict, pool_tokens: int, requests: list, speculative: bool, seed: int):
    """Run the workload; returns {request id: (token ids, finish reason)} and checks every
    step's invariants along the way."""
    bs = config["block_size"]
    engine = fake_engine(
        num_kv_blocks=max(1, pool_tokens // bs),
        max_model_len=64,
        speculative="ngram" if speculative else "off",
        **config,
    )
    engine.runner.token_fn = model_token
    sched = engine.scheduler
    if speculative:
        sched.drafter.proposer = RandomProposer(seed)
    shadow, seqs, outputs, stopped = ShadowKV(bs), {}, {}, set()
    prompt_len, limit = {}, {}
    pending = sorted(enumerate(requests), key=lambda item: item[1][3])
    while pending or engine.has_unfinished():
        while pending and pending[0][1][3] <= engine.step_count:
            _, (prompt, max_tokens, stop_at, _) = pending.pop(0)
            try:
                rid = engine.add_request(
                    prompt, SamplingParams(max_tokens=max_tokens, temperature=0)
                )
            except RequestRejected:
                continue
            if stop_at is not None:
                engine.runner.output_lengths[rid] = stop_at
            seqs[rid], prompt_len[rid], limit[rid] = list(prompt), len(prompt), max_tokens
        result = engine.step()
        plan = result.plan
        _check_plan(plan, config)
        shadow.run(plan, lambda r: seqs[r.request_id])
        for delta in result.new_tokens:
            rid = delta.request_id
            assert rid not in stopped, f"request {rid} emitted a token after its stop"
            assert delta.index == len(seqs[rid]) - prompt_len[rid] < limit[rid]
            seqs[rid].append(delta.token_id)
            if delta.token_id == FAKE_STOP_TOKEN:
                stopped.add(rid)
        for out in result.finished:
            assert out.token_ids == seqs[out.request_id][prompt_len[out.request_id] :]
            outputs[out.request_id] = (out.token_ids, out.finish_reason)
        _check_blocks(sched, config)
    assert engine.kv_snapshot().num_used == 0
    return outputs


def _check_plan(plan, config: dict) -> None:
    assert plan.num_tokens <= plan.budget_limit
    assert plan.slots_used <= plan.slots_limit
    if plan.preempted:
        assert plan.num_draft_tokens == 0
    for row in plan.scheduled:
        assert 0 <= row.num_accepted_tokens <= row.num_draft_tokens
        assert row.num_draft_tokens <= config["num_speculative_tokens"]


def _check_blocks(sched, config: dict) -> None:
    blocks = sched.blocks
    blocks.check()
    bs = config["block_size"]
    for rid, table in blocks.block_tables.items():
        req = sched.requests[rid]
        if config["batching"] == "continuous" and config["kv_reservation"] == "paged":
            # (static batching and the other modes reserve blocks up front)
            assert len(table) <= blocks_needed(req.num_tokens, bs), "a rejected draft's block"
        for i, key in enumerate(blocks.chains.get(rid, [])):
            info = blocks.cache.info.get(table[i])
            if info is not None and info.key == key:
                assert list(info.tokens) == req.token_slice(i * bs, (i + 1) * bs)


@settings(max_examples=120, deadline=None)
@given(
    config=config_st,
    pool_tokens=st.integers(16, 100),
    requests=st.lists(request_st, min_size=1, max_size=8),
    seed=st.integers(0, 1000),
)
def test_random_drafts_keep_every_invariant_and_the_same_tokens(
    config, pool_tokens, requests, seed
):
    with_drafts = _run(config, pool_tokens, requests, speculative=True, seed=seed)
    without = _run(config, pool_tokens, requests, speculative=False, seed=seed)
    assert with_drafts == without
