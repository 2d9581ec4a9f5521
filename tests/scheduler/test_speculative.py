"""Speculative decoding in the scheduler, over FakeRunner: the n-gram proposer, greedy
acceptance, where drafts come from in the budget and the pool, their reasons, rollback, and
stops inside an accepted draft."""

from __future__ import annotations

import argparse

import pytest

from minicb import SamplingParams
from minicb.core.config import EngineConfig
from minicb.core.engine import LLMEngine
from minicb.core.runner.fake import FakeRunner
from minicb.engine_options import add_engine_options, engine_kwargs
from minicb.speculation.drafter import Draft, DraftRequest, accept_greedy
from minicb.speculation.ngram import NgramProposer
from minicb.speculation.settings import SpeculationSettings
from tests.helpers import fake_engine


class CharTokenizer:
    """One token per character."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(map(chr, ids))


def copying(text: str):
    """A fake model whose n-th output token is the n-th character of ``text``."""
    return lambda rid, i: ord(text[i % len(text)])


# ---- the proposer ------------------------------------------------------------------------
def test_ngram_proposes_what_followed_the_longest_recent_match():
    p = NgramProposer(1, 3)
    #           0  1  2  3  4  5  6  7  8  9
    tokens = [1, 2, 3, 9, 2, 3, 8, 7, 2, 3]
    draft = p.lookup(tokens, 4)
    # suffix [2, 3] occurs at 1..2 and 4..5; [9, 2, 3] / [8? ...] no 3-gram: the latest 2-gram
    assert draft.ngram == [2, 3] and draft.position == 4 and draft.tokens == [8, 7, 2, 3]
    assert p.lookup(tokens, 2).tokens == [8, 7]
    longer = [5, 6, 7, 1, 6, 7, 2, 5, 6, 7]  # [5, 6, 7] at 0 beats the later [6, 7] at 4
    assert p.lookup(longer, 3).tokens == [1, 6, 7] and p.lookup(longer, 3).position == 0


def test_ngram_finds_nothing_below_its_minimum():
    assert NgramProposer(1, 4).lookup([1, 2, 3, 4], 4) is None  # 4 never occurred before
    assert NgramProposer(2, 4).lookup([1, 2, 9, 2], 4) is None  # only a 1-gram matches
    assert NgramProposer(2, 4).lookup([1, 2, 9, 1, 2], 4).tokens == [9, 1, 2]
    assert NgramProposer(1, 4).lookup([3, 3], 0) is None


def test_the_proposer_answers_every_row_it_is_asked_in_order():
    rows = [
        DraftRequest(0, [1, 2, 3, 9, 2, 3, 8, 7, 2, 3], 2),
        DraftRequest(1, [1, 2, 3, 4], 4),  # nothing occurred before
        DraftRequest(2, [5, 6, 7, 1, 6, 7, 2, 5, 6, 7], 3),
    ]
    drafts = NgramProposer(1, 3).propose(rows)
    assert [d and d.tokens for d in drafts] == [[8, 7], None, [1, 6, 7]]


@pytest.mark.parametrize(
    "draft, verified, kept",
    [
        ([4, 5, 6], [4, 5, 6, 7], [4, 5, 6, 7]),  # all accepted, plus the bonus token
        ([4, 5, 6], [4, 9, 6, 7], [4, 9]),  # the second guess is wrong: the model's token
        ([4, 5, 6], [1, 5, 6, 7], [1]),  # nothing accepted: one token, as without drafts
        ([4, 5], [4], [4]),  # a runner that verified nothing
    ],
)
def test_greedy_acceptance(draft, verified, kept):
    assert accept_greedy(draft, verified) == kept


# ---- scheduling ----------------------------------------------------------------------------
def _spec_engine(text: str, **options) -> LLMEngine:
    config = EngineConfig.from_kwargs(speculative="ngram", **options)
    runner = FakeRunner(
        num_kv_blocks=options.get("num_kv_blocks", 64),
        tokenizer=CharTokenizer(),
        token_fn=copying(text),
    )
    return LLMEngine(config=config, runner=runner)


def test_a_copying_request_drafts_and_is_accepted_with_the_reason_in_words():
    engine = _spec_engine("for i in range(3): for i in range(3): pass")
    params = SamplingParams(max_tokens=30, temperature=0.0)
    engine.add_request("x = 0; for i in range(3): pass", params)
    reasons, steps = [], 0
    while engine.has_unfinished():
        plan = engine.step().plan
        reasons += plan.explain()
        steps += 1
    # "f" (the first output token) begins the prompt's "for" at position 7; the n-gram is
    # told by its length, never its text (a reason reaches viewers who may not read it)
    assert reasons[1] == "request 0 drafts 4 tokens: the n-gram of 1 token appeared at position 7"
    assert "request 0 drafts 4 tokens: the n-gram of 4 tokens appeared at position 9" in reasons
    assert not any("'" in r or '"' in r for r in reasons)
    assert steps < 30 / 2  # 30 tokens in far fewer steps than one token a step


def test_drafts_take_only_the_budget_that_running_prompts_and_admissions_leave():
    engine = fake_engine(
        speculative="ngram", max_num_batched_tokens=8, num_speculative_tokens=8, block_size=4
    )
    engine.runner.token_fn = lambda rid, i: 3 + i % 10  # copies its prompt, 3..12, over again
    a = engine.add_request(list(range(3, 13)), SamplingParams(max_tokens=30, temperature=0.0))
    plans = [engine.step().plan for _ in range(3)]  # a prompt of 10 in chunks of 8 and 2
    row = plans[2].scheduled[0]
    assert (row.num_tokens, row.num_draft_tokens, row.num_accepted_tokens) == (8, 7, 7)
    assert plans[2].drafted[0].reason == (
        "drafts 7 tokens: the n-gram of 1 token appeared at position 0; the token budget leaves "
        "room for 7"
    )
    b = engine.add_request([20] * 20, SamplingParams(max_tokens=2, temperature=0.0))
    for _ in range(2):  # b's admission, then b's running chunk: nothing left for drafts
        plan = engine.step().plan
        rows = {r.request_id: r for r in plan.scheduled}
        assert rows[a].num_tokens == 1 and rows[b].num_tokens == 7 and not plan.drafted
    plan = engine.step().plan  # b's last chunk of 6 leaves 1
    rows = {r.request_id: r for r in plan.scheduled}
    assert rows[b].num_tokens == 6 and rows[a].num_draft_tokens == 1 and plan.num_tokens == 8


class EveryOtherProposer:
    """Guesses fives for odd request ids, nothing for even ones; records each call."""

    def __init__(self) -> None:
        self.calls: list[list[tuple[int, int]]] = []

    def propose(self, rows):
        self.calls.append([(row.request_id, row.max_tokens) for row in rows])
        return [Draft([5] * row.max_tokens, [5], 0) if row.request_id % 2 else None for row in rows]


def test_the_proposer_is_asked_once_a_step_and_a_row_without_a_draft_leaves_its_budget():
    engine = fake_engine(max_num_batched_tokens=4, num_speculative_tokens=4, speculative="ngram")
    engine.runner.token_fn = lambda rid, i: 5
    proposer = engine.scheduler.drafter.proposer = EveryOtherProposer()
    a, b = (engine.add_request([5, 5], SamplingParams(max_tokens=9, temperature=0)) for _ in "ab")
    engine.step()  # both prompts: the whole budget
    plan = engine.step().plan  # two decodes leave 2 tokens; each row may ask for both
    assert proposer.calls == [[(a, 2), (b, 2)]]
    rows = {r.request_id: r for r in plan.scheduled}
    assert (rows[a].num_draft_tokens, rows[b].num_draft_tokens) == (0, 2)
    assert rows[b].num_accepted_tokens == 2 and plan.num_tokens == 4
    assert [d.reason for d in plan.drafted] == [
        "drafts 2 tokens: the n-gram of 1 token appeared at position 0; the token budget leaves "
        "room for 2"
    ]


def test_drafts_are_trimmed_to_the_free_blocks_and_never_preempt():
    # 3 blocks of 4: a holds 2 (6 prompt tokens + 1), b holds 1: one free block for drafts.
    engine = fake_engine(
        num_kv_blocks=3, speculative="ngram", num_speculative_tokens=6, block_size=4
    )
    engine.runner.token_fn = lambda rid, i: 5
    a = engine.add_request([5] * 6, SamplingParams(max_tokens=6, temperature=0.0))
    b = engine.add_request([6] * 2, SamplingParams(max_tokens=2, temperature=0.0))
    engine.step()
    plan = engine.step().plan
    rows = {r.request_id: r for r in plan.scheduled}
    assert not plan.preempted
    assert rows[a].num_draft_tokens == 8 - 7  # its second block has one free slot left
    assert plan.drafted[0].reason.endswith("trimmed from 3: the free KV blocks hold 1 more")
    assert rows[b].num_draft_tokens == 0
    assert engine.kv_snapshot().num_used <= 3


def test_drafts_never_evict_a_cached_prefix():
    engine = fake_engine(
        num_kv_blocks=4, speculative="ngram", num_speculative_tokens=8, block_size=4
    )
    engine.add_request([9, 8, 7, 6, 9, 8, 7, 6, 1], SamplingParams(max_tokens=1, temperature=0))
    engine.run_until_done()  # its two full blocks stay cached, evictable
    assert len(engine.kv_snapshot().cached_blocks) == 2
    engine.runner.token_fn = lambda rid, i: [4, 5, 6, 3][i % 4]
    engine.add_request([3, 4, 5, 6, 3], SamplingParams(max_tokens=10, temperature=0.0))
    engine.step()  # 2 blocks; the pool's other 2 are the cached ones
    plan = engine.step().plan  # "3 4" seen at 0: "5 6 3 4" would need a cached block
    assert plan.scheduled[0].num_draft_tokens == 2  # only the room left in its own blocks
    assert "trimmed from 4: the free KV blocks hold 2 more" in plan.drafted[0].reason
    assert len(engine.kv_snapshot().cached_blocks) == 2


def test_sampling_requests_draft_too():
    """A sampled row's draws are kept while they match its draft (rejection sampling for a
    point-mass draft: minicb/speculation/rejection.py), so it drafts like a greedy one."""
    engine = fake_engine(speculative="ngram")
    engine.runner.token_fn = lambda rid, i: 5
    greedy = engine.add_request([5] * 4, SamplingParams(max_tokens=8, temperature=0.0))
    sampled = engine.add_request([5] * 4, SamplingParams(max_tokens=8, temperature=0.8, seed=1))
    drafted, accepted = set(), set()
    while engine.has_unfinished():
        rows = engine.step().plan.scheduled
        drafted |= {r.request_id for r in rows if r.num_draft_tokens}
        accepted |= {r.request_id for r in rows if r.num_accepted_tokens}
    assert drafted == accepted == {greedy, sampled}


def test_rejected_drafts_give_their_blocks_back():
    engine = fake_engine(speculative="ngram", num_speculative_tokens=6, block_size=2)
    engine.runner.token_fn = lambda rid, i: [4, 5][i] if i < 2 else 99  # then off the copy
    rid = engine.add_request(
        [3, 4, 5, 6, 7, 8, 9, 10, 3], SamplingParams(max_tokens=10, temperature=0)
    )
    engine.step()  # the prompt, 5 blocks; token 4
    plan = engine.step().plan  # "3 4" seen at 0: drafts 5 6 7 8 9 10, the model says 5, 99
    row = plan.scheduled[0]
    assert row.num_draft_tokens == 6 and row.num_accepted_tokens == 1
    assert len(row.block_table) == 8  # context 10 + 6 drafts
    # 12 tokens now; the next decode writes position 11: 6 blocks, the other 2 are back
    assert len(engine.block_table(rid)) == 6 and plan.kv_used == 6


# ---- stops inside a draft ------------------------------------------------------------------
def test_a_stop_string_inside_an_accepted_draft_stops_exactly_there():
    text = "abcdefghijklmnop"
    results = {}
    for mode in ("off", "ngram"):
        engine = _spec_engine(text, num_speculative_tokens=6) if mode == "ngram" else None
        if engine is None:
            runner = FakeRunner(tokenizer=CharTokenizer(), token_fn=copying(text))
            engine = LLMEngine(runner=runner)
        rid = engine.add_request(
            "zz " + text, SamplingParams(max_tokens=14, temperature=0.0, stop=["def"])
        )
        deltas, rows = [], []
        while engine.has_unfinished():
            result = engine.step()
            deltas += [d for d in result.new_tokens if d.request_id == rid]
            rows += [r for r in result.plan.scheduled if r.num_draft_tokens]
            done = result.finished
        results[mode] = (done[0].token_ids, done[0].text, done[0].finish_reason)
        assert "".join(d.text for d in deltas) == done[0].text == "abc"
        assert [d.index for d in deltas] == list(range(len(done[0].token_ids)))
    assert results["ngram"] == results["off"]
    assert results["ngram"][0] == [ord(c) for c in "abcdef"]
    # the model agreed with the whole draft "bcdefg" (and would add "h"), but the request
    # stopped at "f": "g" and "h" were never emitted
    assert len(rows) == 1 and rows[0].num_draft_tokens == 6 and rows[0].num_accepted_tokens == 4


def test_max_tokens_and_eos_are_checked_token_by_token():
    engine = fake_engine(speculative="ngram", num_speculative_tokens=5)
    engine.runner.token_fn = lambda rid, i: 5
    engine.runner.output_lengths = {1: 4}  # request 1's 4th token is the stop token
    engine.add_request([5] * 4, SamplingParams(max_tokens=7, temperature=0.0))
    engine.add_request([5] * 4, SamplingParams(max_tokens=9, temperature=0.0))
    outs = {o.request_id: o for o in engine.run_until_done()}
    assert outs[0].token_ids == [5] * 7 and outs[0].finish_reason == "length"
    assert outs[1].token_ids == [5, 5, 5, 2] and outs[1].finish_reason == "stop"


# ---- settings ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "options, words",
    [
        (dict(speculative="eagle"), "unknown speculative 'eagle'; choose one of off, ngram"),
        (dict(num_speculative_tokens=0), "num_speculative_tokens must be a positive integer"),
        (dict(ngram_min=3, ngram_max=2), "ngram_min (3) must not exceed ngram_max (2)"),
    ],
)
def test_bad_settings_name_the_limit(options, words):
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
        EngineConfig.from_kwargs(**options)


def test_command_line_options():
    parser = argparse.ArgumentParser()
    add_engine_options(parser)
    args = parser.parse_args(["--speculative", "ngram", "--num-speculative-tokens", "3"])
    kwargs = engine_kwargs(args)
    assert kwargs["speculative"] == "ngram" and kwargs["num_speculative_tokens"] == 3
    assert SpeculationSettings.of(EngineConfig.from_kwargs(**kwargs)).ngram_max == 4


def test_every_draft_reason_has_a_chinese_pattern():
    from tests.test_i18n import _reason_patterns

    copy_fn = lambda rid, i: [4, 5, 6, 7, 8, 9, 3][i % 7]  # noqa: E731
    fives = lambda rid, i: 5  # noqa: E731
    seen = set()
    # plain, cut by the budget, by max_tokens, trimmed to the free blocks, and nothing at all
    for options, token_fn, prompts, max_tokens in [
        (dict(max_num_batched_tokens=6), copy_fn, [[3, 4, 5, 6, 7, 8, 9, 3]], 12),
        (dict(), copy_fn, [[3, 4, 5, 6, 7, 8, 9, 3]], 3),
        (dict(num_kv_blocks=3, block_size=4), fives, [[5] * 6, [6] * 2], 6),
        (dict(num_kv_blocks=3, block_size=4), fives, [[5] * 7, [6] * 2], 5),
    ]:
        engine = fake_engine(speculative="ngram", num_speculative_tokens=6, **options)
        engine.runner.token_fn = token_fn
        for prompt in prompts:
            engine.add_request(prompt, SamplingParams(max_tokens=max_tokens, temperature=0.0))
        while engine.has_unfinished():
            plan = engine.step().plan
            seen |= {d.reason for d in plan.drafted} | set(plan.explain())
    kinds = ("budget leaves room", "max_tokens leaves", "trimmed from", "drafts nothing")
    assert all(any(k in r for r in seen) for k in kinds), seen
    patterns = _reason_patterns()
    assert sorted(r for r in seen if not any(p.match(r) for p in patterns)) == []


def test_a_reservation_made_at_admission_survives_rejected_drafts():
    engine = fake_engine(
        speculative="ngram", num_speculative_tokens=6, block_size=2, kv_reservation="max"
    )
    engine.runner.token_fn = lambda rid, i: [4, 5][i] if i < 2 else 99
    params = SamplingParams(max_tokens=20, temperature=0.0)
    rid = engine.add_request([3, 4, 5, 6, 7, 8, 9, 10, 3], params)
    engine.step()  # admitted with prompt 9 + max_tokens 20: 15 blocks
    assert len(engine.block_table(rid)) == 15
    plan = engine.step().plan  # drafts 5 6 7 8 9 10, the model says 5, 99
    assert plan.scheduled[0].num_draft_tokens == 6 and plan.scheduled[0].num_accepted_tokens == 1
    assert len(engine.block_table(rid)) == 15  # the drafts fit in it; nothing given back
    notes = [n for _ in range(3) for n in engine.step().plan.notes]
    assert not any("outgrew" in n for n in notes)
