"""The runner seam (seam 3, minicb/core/runner/wrappers.py): a plain model runner loads no
feature; registering a wrapper or a weight form loads no torch; a config that asks for one
no package registered gets an error saying what to import; the registered ones wrap in
order and a sibling built by ``with_config`` is wrapped as its own config asks.

The import checks run in a fresh interpreter, since this one imported every feature
(tests/conftest.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from minicb import EngineConfig
from minicb.core.runner.model_runner import ModelRunner, build_runner
from minicb.utilisation.occupancy import UtilisationRunner
from minicb.utilisation.probes import MachineRates

REGISTER = """
import sys
import minicb.cuda_graphs, minicb.kernels, minicb.packing, minicb.parallel, minicb.utilisation
assert "torch" not in sys.modules, "registering imported torch"
"""

UNREGISTERED = """
import sys
from minicb.core.config import EngineConfig
from minicb.core.runner.model_runner import build_runner

config = EngineConfig(device="cpu", dtype="float32", num_kv_blocks=8)
runner = build_runner({path!r}, config)  # use_cuda_graphs is on, but this is a CPU
assert type(runner).__name__ == "ModelRunner", runner
for option in (dict(measure_utilisation=True), dict(weight_dtype="int8"),
               dict(batch_invariant=True)):
    try:
        build_runner({path!r}, config.with_(**option))
    except ValueError as err:
        assert "import minicb.features" in str(err), err
    else:
        raise AssertionError(f"{{option}} without its package: no error")
loaded = [m for m in sys.modules if m.startswith("minicb.") and m.split(".")[1] in
          ("parallel", "cuda_graphs", "utilisation", "packing", "kernels", "quant")]
assert not loaded, loaded
"""


def test_registering_loads_no_torch():
    done = subprocess.run([sys.executable, "-c", REGISTER], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@pytest.mark.slow  # a fresh interpreter imports torch and builds a model: 7 s here, idle
def test_a_plain_runner_needs_no_feature_and_a_missing_one_names_its_import(tiny_llama_dir):
    code = UNREGISTERED.format(path=str(tiny_llama_dir))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_with_config_wraps_as_the_new_config_asks_on_the_same_weights(tiny_llama_dir):
    config = EngineConfig(device="cpu", dtype="float32", num_kv_blocks=8)
    plain = build_runner(tiny_llama_dir, config)
    assert type(plain) is ModelRunner
    rates = MachineRates(copy_bandwidth=1e9, matmul_flops=1e9)
    measured = UtilisationRunner(plain.with_config(config), rates)
    # Asked for: wrapped, the rates shared (nothing probed); not asked for: plain again.
    sibling = measured.with_config(config.with_(measure_utilisation=True, batching="static"))
    assert isinstance(sibling, UtilisationRunner) and sibling.occupancy.rates is rates
    again = sibling.with_config(config)
    assert type(again) is ModelRunner
    assert plain.model is measured.model is sibling.model is again.model  # one set of weights
    assert "machine_rates" in sibling.describe() and "machine_rates" not in again.describe()
