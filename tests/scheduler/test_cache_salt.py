"""cache_salt: the prefix cache scoped per salt, at the engine's API (SamplingParams).

The probe the review ran (issue 54, L1): user A sends a prompt; user B sends a guess that
begins the same way and reads ``num_cached_tokens`` (the API's
``usage.prompt_tokens_details.cached_tokens``). With different salts B learns nothing;
with the same salt, or none, the cache is shared as before.
"""

import pytest

from minicb import LLM, SamplingParams
from minicb.core.scheduler.block_manager import BlockManager
from tests.helpers import fake_engine

SECRET = list(range(100, 140))  # user A's prompt: 40 tokens, 2 full blocks of 16
GUESS = SECRET[:32] + [7] * 8  # user B's guess: the same first 32 tokens


def _cached(engine, prompt: list[int], salt: str | None) -> int:
    """Prompt tokens the engine found cached for ``prompt`` sent with ``salt``."""
    params = SamplingParams(max_tokens=2, temperature=0.0, cache_salt=salt)
    rid = engine.add_request(prompt, params)
    while engine.has_unfinished():
        for out in engine.step().finished:
            if out.request_id == rid:
                return out.metrics.num_cached_tokens
    raise AssertionError("the request never finished")


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize(
    ("salt_a", "salt_b", "seen"),
    [
        ("tenant-a", "tenant-b", 0),  # another salt's blocks are not there for B
        (None, "tenant-b", 0),  # nor the unsalted cache's
        ("tenant-a", None, 0),  # nor a salted prompt's for an unsalted probe
        ("tenant-a", "tenant-a", 32),  # the same salt shares, as before
        (None, None, 32),  # no salt: today's shared cache
    ],
)
def test_the_cross_user_probe_sees_cached_tokens_only_within_a_salt(
    salt_a, salt_b, seen, overlap
):
    engine = fake_engine(
        num_kv_blocks=32, block_size=16, enable_prefix_caching=True, overlap_scheduling=overlap
    )
    assert _cached(engine, SECRET, salt_a) == 0
    assert _cached(engine, GUESS, salt_b) == seen


def test_salted_chains_never_meet_even_where_later_blocks_match():
    bm = BlockManager(num_blocks=16, block_size=4, enable_caching=True)
    tokens = list(range(12))
    hits = bm.lookup(lambda a, b: tokens[a:b], 12, "a")
    bm.allocate_slots(1, 12, hits)
    bm.commit(1, 12, lambda a, b: tokens[a:b], "a")
    assert len(bm.lookup(lambda a, b: tokens[a:b], 12, "a")) == 2
    assert bm.lookup(lambda a, b: tokens[a:b], 12, "b") == []
    assert bm.lookup(lambda a, b: tokens[a:b], 12) == []
    roots = {bm.cache.root_of(s) for s in (None, "a", "b", "A")}
    assert len(roots) == 4 and all(r >= 1 << 64 for r in roots - {bm.cache.root})
    bm.check()


def test_a_salted_prefix_in_the_host_tier_stays_within_its_salt():
    # The device pool of 4 blocks must evict A's 2 cached blocks to host memory for B's
    # prompt: the host tier keys them by the same salted chain.
    engine = fake_engine(
        num_kv_blocks=4, block_size=16, enable_prefix_caching=True, kv_offload_blocks=8
    )
    _cached(engine, SECRET, "a")
    _cached(engine, [3] * 60, "a")  # fills the pool: A's blocks go to the host tier
    assert _cached(engine, GUESS, "b") == 0
    assert _cached(engine, GUESS, "a") == 32


def test_a_salt_changes_no_greedy_token(tiny_llama_dir):
    llm = LLM(model=tiny_llama_dir, dtype="float32", num_kv_blocks=64, block_size=16)
    prompts = [SECRET, GUESS, SECRET]
    greedy = SamplingParams(max_tokens=6, temperature=0)
    plain = [o.token_ids for o in llm.generate(prompts, greedy)]
    # The unsalted run left these prompts' blocks cached: salted requests do not see them.
    salted = [SamplingParams(max_tokens=6, temperature=0, cache_salt=s) for s in "aba"]
    first = llm.generate(prompts[:1], salted[:1])
    rest = llm.generate(prompts[1:], salted[1:])  # "b" finds nothing, "a" finds A's blocks
    outs = first + rest
    assert [o.token_ids for o in outs] == plain
    assert [o.metrics.num_cached_tokens for o in outs] == [0, 0, 32]


@pytest.mark.parametrize("salt", ["", "x" * 257, 5])
def test_a_salt_must_be_a_string_of_1_to_256_characters(salt):
    with pytest.raises(ValueError, match="cache_salt must be None or a string of 1 to 256"):
        SamplingParams(cache_salt=salt)
