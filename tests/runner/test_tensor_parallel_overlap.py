"""Overlap scheduling under tensor parallelism: two processes (gloo, fp32, spawn), rank 0
running each plan on the engine's worker thread while the next is planned, give the greedy
tokens of one process without overlap, with drafts too.

A module of its own: one process holds one two-rank group, started on first use and shut
down when the module ends (as tests/runner/test_tensor_parallel.py does).
"""

from __future__ import annotations

import pytest

from minicb import LLM
from minicb.parallel import tp_group
from minicb.tiny_models import make_tiny_model_dir
from tests.helpers import greedy_tokens
from tests.runner.test_tensor_parallel import MAX_TOKENS, PROMPTS, SPEC_MAX_TOKENS, SPEC_PROMPTS

# Two spawned ranks per case.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def _one_group_per_module():
    yield
    tp_group.shutdown_group()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(make_tiny_model_dir("llama", tmp_path_factory.mktemp("tp_overlap"), seed=1))


def _tokens(path: str, tp: int, overlap: bool, prompts, max_tokens, **options):
    llm = LLM(
        dtype="float32",
        model=path,
        tensor_parallel_size=tp,
        overlap_scheduling=overlap,
        **({"num_kv_blocks": 64} | options),
    )
    steps = []
    llm.engine.bus.subscribe(steps.extend, kinds=["step"])
    tokens = greedy_tokens(llm, prompts, max_tokens)
    assert (llm.engine.strategy is not None) == overlap
    assert llm.engine.describe()["runner"]["tensor_parallel_size"] == tp
    assert llm.engine.kv_snapshot().num_used == 0
    return tokens, [e.plan for e in steps]


@pytest.mark.parametrize(
    "options",
    [
        dict(max_num_batched_tokens=8),
        pytest.param(
            dict(num_kv_blocks=10, block_size=4, max_num_batched_tokens=16),
            marks=pytest.mark.slow,  # 17 s more here
        ),
    ],
    ids=["chunked-prefill", "recompute"],
)
def test_two_ranks_with_overlap_give_the_tokens_of_one_without(options, model_dir):
    reference, _ = _tokens(model_dir, 1, False, PROMPTS, MAX_TOKENS, **options)
    tokens, plans = _tokens(model_dir, 2, True, PROMPTS, MAX_TOKENS, **options)
    assert tokens == reference
    if "num_kv_blocks" in options:
        assert any(p.preempted for p in plans)


def test_two_ranks_with_overlap_and_speculation(model_dir):
    reference, _ = _tokens(model_dir, 1, False, SPEC_PROMPTS, SPEC_MAX_TOKENS)
    spec = dict(speculative="ngram", num_speculative_tokens=4)
    tokens, plans = _tokens(model_dir, 2, True, SPEC_PROMPTS, SPEC_MAX_TOKENS, **spec)
    assert tokens == reference
    assert sum(p.num_accepted_tokens for p in plans) > 0
