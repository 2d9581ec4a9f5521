"""How the ranks come to be, each in a fresh interpreter: spawned by minicb itself (and
gone when rank 0 ends), or started by torchrun (every rank runs the script; ranks 1..N-1
turn into workers where the engine is built). Both give the tokens of one process. Under
torchrun the commands are signed with ``MINICB_TP_SECRET``; without it, no group starts.

Marked slow (but the refusal): each starts two or three fresh interpreters that import torch."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest

from minicb import LLM
from tests.helpers import greedy_tokens

PROMPTS = [[5, 6, 7, 8], [9, 10, 11]]
SCRIPT = """
import json, sys
from minicb import LLM
from minicb.parallel import tp_group
from tests.helpers import greedy_tokens

if __name__ == "__main__":
    llm = LLM(dtype="float32", model=sys.argv[1], tensor_parallel_size=2, num_kv_blocks=64)
    tokens = greedy_tokens(llm, json.loads(sys.argv[2]), 5)
    print(json.dumps({"tokens": tokens, "workers": tp_group.worker_pids()}))
"""
HANG_GUARD_S = 300  # a subprocess that has not finished by then has hung


@pytest.fixture(scope="module")
def script(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tp_launch") / "generate.py"
    path.write_text(SCRIPT)
    return path


def _run(argv: list[str], **env_vars: str) -> dict:
    root = Path(__file__).resolve().parents[2]
    env = os.environ | {"PYTHONPATH": str(root), "OMP_NUM_THREADS": "1", **env_vars}
    done = subprocess.run(
        argv, env=env, cwd=root, capture_output=True, text=True, timeout=HANG_GUARD_S
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1, done.stdout  # rank 0 alone prints
    return json.loads(lines[0])


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.slow
def test_spawned_workers_leave_when_rank_0_ends(script, tiny_llama_dir):
    reference = greedy_tokens(
        LLM(dtype="float32", model=tiny_llama_dir, num_kv_blocks=64), PROMPTS, 5
    )
    out = _run([sys.executable, str(script), tiny_llama_dir, json.dumps(PROMPTS)])
    assert out["tokens"] == reference
    (worker,) = out["workers"]
    deadline = time.monotonic() + HANG_GUARD_S  # a guard against a leftover, not a timing
    while not _gone(worker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _gone(worker)


@pytest.mark.slow
def test_under_torchrun_every_rank_runs_the_script(script, tiny_llama_dir):
    reference = greedy_tokens(
        LLM(dtype="float32", model=tiny_llama_dir, num_kv_blocks=64), PROMPTS, 5
    )
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    out = _run(
        [*torchrun, "--nproc-per-node", "2", str(script), tiny_llama_dir, json.dumps(PROMPTS)],
        MINICB_TP_SECRET=secrets.token_hex(32),
    )
    assert out["tokens"] == reference
    assert out["workers"] == []  # torchrun, not minicb, owns the processes


@pytest.mark.parametrize("secret", [None, ""], ids=["unset", "empty"])
def test_under_torchrun_a_group_without_a_secret_refuses_to_start(monkeypatch, secret):
    """An unset (or empty) secret would sign every command with an empty key, which stops
    no one in the rendezvous: refused before any rank joins, saying how to set one."""
    from minicb.parallel.tp_group import TPGroup

    torchrun = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
    for name, value in torchrun.items():
        monkeypatch.setenv(name, value)
    if secret is None:
        monkeypatch.delenv("MINICB_TP_SECRET", raising=False)
    else:
        monkeypatch.setenv("MINICB_TP_SECRET", secret)
    with pytest.raises(ValueError, match="MINICB_TP_SECRET") as refused:
        TPGroup(2, "gloo", timeout_s=1.0)
    assert "export MINICB_TP_SECRET=" in str(refused.value)  # says how
