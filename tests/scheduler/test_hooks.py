"""The scheduler's hooks (seam 1, minicb/core/scheduler/hooks.py): a plain scheduler loads
none of the features behind them, a feature enters by registering when its package is
imported, and a config that names an unloaded feature gets an error saying what to import.

A fresh interpreter, since this one imported every feature (tests/conftest.py)."""

import subprocess
import sys

RUN = """
import sys
from minicb.core.config import EngineConfig, SamplingParams
from minicb.core.request import Request
from minicb.core.scheduler import make_scheduler
from minicb.core.registry import FeatureNotLoaded

plain = make_scheduler(EngineConfig(), num_kv_blocks=8, max_model_len=64)
plain.add(Request(0, [1, 2, 3], SamplingParams(max_tokens=2), arrival_time=0.0))
plain.schedule()
# The whole house's rule (nothing outside core) is tests/test_architecture.py's; here: the
# features behind these hooks.
loaded = [m for m in sys.modules if m.startswith(("minicb.speculation", "minicb.reservation"))]
assert loaded == [], loaded

for name, value in (("speculative", "ngram"), ("kv_reservation", "max")):
    try:
        make_scheduler(EngineConfig.from_kwargs(**{name: value}), num_kv_blocks=8, max_model_len=64)
    except FeatureNotLoaded as e:
        assert f"{name}={value!r}" in str(e) and "import minicb.features" in str(e), e
    else:
        raise AssertionError(f"{name}={value!r}: no error without the feature")

import minicb.features
both = make_scheduler(EngineConfig.from_kwargs(speculative="ngram", kv_reservation="max"), 8, 64)
assert type(both.drafter).__module__ == "minicb.speculation.drafter"
assert type(both.admission_size).__module__ == "minicb.reservation.modes"
"""


def test_a_plain_scheduler_loads_no_hooked_feature_and_a_missing_one_names_its_import():
    done = subprocess.run([sys.executable, "-c", RUN], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
