"""The attention-backend registry (minicb/core/attention/backend_choice.py): the core's
torch backend is always there, Triton registers from minicb/kernels/__init__.py, "auto"
asks each registered rule, and a name nobody registered says what to import."""

from __future__ import annotations

import pytest
import torch

from minicb.core.attention import backend_choice
from minicb.core.attention.backend_choice import BACKENDS, BackendEntry, get_backend
from minicb.core.registry import FeatureNotLoaded

CPU = torch.device("cpu")


def test_the_core_backend_and_triton_are_registered():
    assert get_backend("torch", CPU).name == "torch"
    assert "triton" in BACKENDS  # tests/conftest.py imports minicb.features


def test_auto_on_cpu_takes_torch_saying_why():
    backend = get_backend("auto", CPU)
    assert backend.name == "torch" and backend.reason.startswith("auto: ")


def test_a_backend_nobody_registered_names_import_minicb_features(monkeypatch):
    monkeypatch.delitem(BACKENDS, "triton")
    with pytest.raises(FeatureNotLoaded, match="import minicb.features") as refused:
        get_backend("triton", CPU)
    assert (refused.value.seam, refused.value.name) == ("attention backend", "triton")
    assert get_backend("auto", CPU).reason == (
        "auto: the core's own backend, no other is registered"
    )


def test_auto_takes_the_first_registered_rule_that_wants_the_device(monkeypatch):
    class Named:
        def __init__(self, reason: str) -> None:
            self.name, self.reason = "named", reason

    monkeypatch.setitem(BACKENDS, "triton", BackendEntry(Named, auto=lambda d: (False, "no")))
    monkeypatch.setitem(BACKENDS, "named", BackendEntry(Named, auto=lambda d: (True, "yes")))
    assert get_backend("auto", CPU).reason == "auto: yes"
    assert get_backend("named", CPU).reason == "asked for"


def test_a_missing_package_is_refused_by_name_and_passed_over_by_auto(monkeypatch):
    entry = BackendEntry(
        lambda r: None, package="no_such_pkg", hint="pip it", auto=lambda d: (True, "")
    )
    monkeypatch.setitem(BACKENDS, "triton", entry)
    with pytest.raises(RuntimeError, match="needs the no_such_pkg package.*pip it"):
        get_backend("triton", CPU)
    assert "no_such_pkg cannot be imported here" in get_backend("auto", CPU).reason
    assert backend_choice.package_missing("torch") is None
