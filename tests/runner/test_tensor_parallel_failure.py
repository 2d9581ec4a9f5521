"""A tensor-parallel worker that dies: rank 0 raises an error naming the rank (between steps
and in the middle of one), every later step fails at once with the same words, and a new
engine starts a new group. Each test kills its group, so each starts its own.

No test here times anything: a thread runs the failing step, and the only bound is a guard
against a hang (the join's timeout), after which the test fails rather than waits forever.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from datetime import timedelta

import httpx
import pytest
import torch

from minicb import LLM, EngineConfig, LLMEngine, SamplingParams
from minicb.parallel import tp_group
from minicb.parallel.tp_group import TensorParallelError
from tests.api.live import api_server
from tests.helpers import greedy_tokens

# Each test spawns ranks and waits out a failure or a timeout: tens of seconds each.
pytestmark = pytest.mark.slow

HANG_GUARD_S = 120  # far beyond the few seconds a failure takes; only a hang reaches it
PARAMS = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)


@pytest.fixture(autouse=True)
def _fresh_group():
    tp_group.shutdown_group()
    yield
    tp_group.shutdown_group()


def _engine(path: str):
    engine = LLM(dtype="float32", model=path, tensor_parallel_size=2, num_kv_blocks=64).engine
    engine.add_request([5, 6, 7], PARAMS)
    engine.step()  # the workers are up and have run a step
    return engine


def _step_in_thread(engine) -> tuple[list[BaseException], threading.Thread]:
    errors: list[BaseException] = []

    def step():
        try:
            engine.step()
        except BaseException as err:  # noqa: BLE001 - handed to the test's thread
            errors.append(err)

    thread = threading.Thread(target=step, daemon=True)
    thread.start()
    return errors, thread


def test_a_worker_killed_between_steps_is_named_and_a_new_engine_starts_anew(tiny_llama_dir):
    engine = _engine(tiny_llama_dir)
    (pid,) = tp_group.worker_pids()
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(
        TensorParallelError, match=r"worker rank 1 \(pid \d+\) was killed by signal 9"
    ):
        for _ in range(PARAMS.max_tokens):  # the next step, at the latest once it is reaped
            engine.step()
    with pytest.raises(TensorParallelError, match="rank 1"):  # and at once after that
        engine.step()
    reference = greedy_tokens(
        LLM(dtype="float32", model=tiny_llama_dir, num_kv_blocks=64), [[5, 6, 7]], 6
    )
    llm = LLM(
        dtype="float32", model=tiny_llama_dir, tensor_parallel_size=2, num_kv_blocks=64
    )  # a new group
    assert greedy_tokens(llm, [[5, 6, 7]], 6) == reference


def test_a_worker_that_dies_mid_step_is_named_within_a_bounded_time(tiny_llama_dir):
    engine = _engine(tiny_llama_dir)
    (pid,) = tp_group.worker_pids()
    os.kill(pid, signal.SIGSTOP)  # alive but silent: rank 0 waits inside the step's collectives
    errors, thread = _step_in_thread(engine)
    time.sleep(0.5)  # not a measurement: only lets rank 0 reach the all-reduce first
    os.kill(pid, signal.SIGKILL)
    thread.join(HANG_GUARD_S)
    assert not thread.is_alive(), "rank 0 hung on a dead worker"
    assert len(errors) == 1 and isinstance(errors[0], TensorParallelError)
    assert "worker rank 1" in str(errors[0])


def test_a_worker_that_hangs_is_named_once_the_timeout_passes(tiny_llama_dir):
    group = tp_group.get_group(2, torch.device("cpu"))  # the engine below joins it
    engine = _engine(tiny_llama_dir)
    # Short from now on (a loaded machine may well be slower than this during start-up):
    # how long rank 0 waits for a worker to take the next command.
    group.timeout = timedelta(seconds=2)
    (pid,) = tp_group.worker_pids()
    os.kill(pid, signal.SIGSTOP)  # alive, never answers: only the timeout can tell
    try:
        errors, thread = _step_in_thread(engine)
        thread.join(HANG_GUARD_S)
        assert not thread.is_alive(), "rank 0 hung on a silent worker"
    finally:
        os.kill(pid, signal.SIGKILL)
    assert len(errors) == 1 and isinstance(errors[0], TensorParallelError)
    assert "rank(s) 1: a collective failed or timed out" in str(errors[0])


def test_the_server_answers_with_the_error_instead_of_hanging(tiny_llama_dir):
    config = EngineConfig.from_kwargs(tensor_parallel_size=2, num_kv_blocks=64)
    engine = LLMEngine(tiny_llama_dir, config)
    body = {"model": "tiny", "prompt": [5, 6], "max_tokens": 4, "ignore_eos": True}
    with api_server(engine, "tiny") as live:
        url = live.url + "/v1/completions"
        served = httpx.post(url, json=body, timeout=HANG_GUARD_S).json()
        assert served["usage"]["completion_tokens"] == 4
        os.kill(tp_group.worker_pids()[0], signal.SIGKILL)
        for _ in range(2):  # the request that meets the failure, and the next one
            answer = httpx.post(url, json=body, timeout=HANG_GUARD_S)
            assert answer.status_code == 500
            assert "worker rank 1" in answer.json()["error"]["message"]
        stream = httpx.post(url, json={**body, "stream": True}, timeout=HANG_GUARD_S).text
        assert "worker rank 1" in stream and stream.rstrip().endswith("data: [DONE]")
