"""Shared test set-up.

Triton reads TRITON_INTERPRET when it is first imported (loading a transformers model
imports it), so the interpreter switch for machines without a GPU is set here, before
anything else is imported.

Under pytest-xdist (``make test`` runs ``-n 2``) each worker is its own process: torch
gets the cores divided among the workers (two workers with two threads each on two cores
would fight over them), and so do the processes the tests start (servers, notebook
kernels), through OMP_NUM_THREADS. The default model's cache is built once, before the
workers start, so that two of them never build it at the same time.
"""

import os
import shutil

if shutil.which("nvidia-smi") is None:
    os.environ.setdefault("TRITON_INTERPRET", "1")


def _threads_per_worker() -> int:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    return max(1, min(2, (cores or 1) // workers))


os.environ.setdefault("OMP_NUM_THREADS", str(_threads_per_worker()))

import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import settings  # noqa: E402

import minicb.features  # noqa: E402, F401  (every feature registered at its seam)

torch.set_num_threads(_threads_per_worker())

# The state machines' two depths, one machine each: the fast tier (`make test`) runs the
# quick profile, tens of examples; `make test-all` and CI pass --hypothesis-profile=thorough,
# thousands. Tests that set their own max_examples keep them in both.
settings.register_profile("quick", max_examples=40, stateful_step_count=30, deadline=None)
settings.register_profile("thorough", max_examples=3000, stateful_step_count=40, deadline=None)
settings.load_profile("quick")

# The tiers a test can be marked into; a test with none of these is in the fast tier.
NOT_FAST = ("slow", "browser", "perflab")
_SETUP_S = pytest.StashKey[float]()


def pytest_addoption(parser):
    parser.addoption(
        "--fast-test-limit",
        type=float,
        default=None,
        metavar="SECONDS",
        help="fail any fast-tier test whose set-up and call take longer (make test: 5)",
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """The fast tier's duration guard: a passing fast test that took over --fast-test-limit
    seconds (its set-up and its call; the first user of a session fixture pays for building
    it) fails, naming itself and its time, so the tier stays fast as features come."""
    outcome = yield
    report = outcome.get_result()
    limit = item.config.getoption("fast_test_limit")
    if limit is None or any(item.get_closest_marker(m) for m in NOT_FAST):
        return
    if report.when == "setup":
        item.stash[_SETUP_S] = call.duration
    elif report.when == "call" and report.passed:
        took = item.stash.get(_SETUP_S, 0.0) + call.duration
        if took > limit:
            report.outcome = "failed"
            report.longrepr = (
                f"{item.nodeid} took {took:.1f} s (set-up and call), over the fast tier's "
                f"{limit:g} s: make it faster, or mark it slow (pytest.mark.slow)"
            )



def pytest_sessionstart(session):
    """In the main process (xdist's controller, or pytest alone), when slow tests may run:
    the embedded default model's cache, built here if absent (a minute, once per machine),
    so that the workers do not each convert it (they could: the loader is safe for that)."""
    if hasattr(session.config, "workerinput") or "not slow" in session.config.option.markexpr:
        return
    from minicb.core.runner.loader import default_model_dir

    default_model_dir()


# What this session collected before -m deselected anything: (node id, marker names) each,
# for tests/test_tiers.py, which checks that the Makefile's tiers together run every test.
COLLECTED = pytest.StashKey[list]()


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    config.stash[COLLECTED] = [(i.nodeid, {m.name for m in i.iter_markers()}) for i in items]
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory):
    """A tiny random Llama (GQA 4:2) saved as a Hugging Face folder, shared by the session."""
    from minicb.tiny_models import make_tiny_model_dir

    return str(make_tiny_model_dir("llama", tmp_path_factory.mktemp("tiny_llama"), seed=0))


@pytest.fixture(scope="session")
def mixed_reference(tiny_llama_dir):
    """The greedy tokens of tests.helpers.MIXED on the tiny Llama, one request at a time (no
    batching at all): what every run of the same-tokens tests must reproduce. Session-wide,
    as its inputs are; never mutated."""
    from minicb import LLM
    from tests.helpers import MIXED, MIXED_MAX, greedy_tokens

    llm = LLM(
        model=tiny_llama_dir, dtype="float32", max_num_seqs=1, num_kv_blocks=64, block_size=16
    )
    return greedy_tokens(llm, MIXED, MIXED_MAX)


@pytest.fixture(scope="session")
def shared_reference(tiny_llama_dir):
    """The greedy tokens of tests.helpers.SHARED (prompts sharing prefixes) on the tiny
    Llama, one request at a time with prefix caching off: what every prefix-caching run of
    the same-tokens tests must reproduce. Session-wide, as its inputs are; never mutated."""
    from minicb import LLM
    from tests.helpers import SHARED, SHARED_MAX, greedy_tokens

    llm = LLM(
        dtype="float32",
        model=tiny_llama_dir,
        max_num_seqs=1,
        num_kv_blocks=64,
        block_size=16,
        enable_prefix_caching=False,
    )
    return greedy_tokens(llm, SHARED, SHARED_MAX)


@pytest.fixture(scope="session")
def default_llm():
    """The embedded default model in fp32 on CPU, loaded once (the first load builds the cache)."""
    from minicb import LLM

    return LLM(dtype="float32", num_kv_blocks=512, block_size=16)
