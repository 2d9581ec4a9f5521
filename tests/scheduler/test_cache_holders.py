"""The admission reason for a prefix-cache hit names a few holders and counts the rest,
from the first block's reference count (no scan of every block table per admission)."""

from minicb import SamplingParams
from tests.helpers import fake_engine
from tests.test_i18n import _reason_patterns

GREEDY = SamplingParams(max_tokens=50, temperature=0.0)  # all still running at the end
SHARED = list(range(10, 42))  # two full blocks of 16 that every prompt below starts with


def _admit(engine, prompt):
    engine.add_request(prompt, GREEDY)
    return engine.step().plan.admitted


def test_the_reason_names_three_holders_and_counts_the_others():
    engine = fake_engine(num_kv_blocks=64, block_size=16, enable_prefix_caching=True)
    _admit(engine, SHARED + [1] * 8)  # request 0 writes and keys the shared blocks
    for i in range(1, 6):  # requests 1..5 hit them while every earlier one still runs
        (admitted,) = _admit(engine, SHARED + [i + 1] * 8)
    assert admitted.reason.endswith(
        "32 of 40 prompt tokens found in the cache: 2 blocks shared with requests 0, 1, 2"
        " and 2 more"
    )
    assert any(p.match(admitted.reason) for p in _reason_patterns())


def test_two_holders_are_both_named():
    engine = fake_engine(num_kv_blocks=64, block_size=16, enable_prefix_caching=True)
    _admit(engine, SHARED + [1] * 8)
    _admit(engine, SHARED + [2] * 8)
    (admitted,) = _admit(engine, SHARED + [3] * 8)
    assert admitted.reason.endswith("2 blocks shared with requests 0, 1")
