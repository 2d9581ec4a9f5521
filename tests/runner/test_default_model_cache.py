"""The default model's safetensors cache can be built by two processes at once (two test
workers, two first commands): both get a complete folder, and no temporary one is left."""

import os
import subprocess
import sys

import pytest

BUILD = "from minicb.core.runner.loader import default_model_dir; print(default_model_dir())"


@pytest.mark.slow  # converts the GGUF file twice
def test_two_processes_build_the_cache_at_once(tmp_path):
    env = {**os.environ, "MINICB_CACHE": str(tmp_path), "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen([sys.executable, "-c", BUILD], env=env, stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=600)[0].strip() for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    target = tmp_path / "SmolLM2-135M-Instruct"
    assert outputs == [str(target)] * 2
    assert [p.name for p in tmp_path.iterdir()] == [target.name]
    assert {"model.safetensors", "config.json"} <= {p.name for p in target.iterdir()}
