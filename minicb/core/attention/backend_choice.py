"""Which attention backend runs, and why: chosen once, when the runner is built.

The core has one backend of its own, plain torch (backend.py). Every other backend enters
through this file's registry, ``BACKENDS``, which maps a name to a ``BackendEntry``: a
feature's package adds its entry when it is imported (the Triton kernels from
minicb/kernels/__init__.py), so the core never names or imports it. An entry's ``build``
imports the backend's module only when that backend is chosen, so registering costs
nothing (not even torch), and ``import minicb.features`` registers them all (a name nobody
registered: ``FeatureNotLoaded``, minicb/core/registry.py).

A backend may need an optional package (Triton publishes wheels for Linux only): its entry
names it, and asking for that backend where the package cannot be imported is a clear error
with the entry's ``hint``. "auto" asks each entry that has an ``auto`` rule whether it
should run on this device (Triton: on CUDA, not on CPU where only its slow interpreter
runs); the first that should, and can be imported, runs; otherwise the torch backend does.
An entry "auto" wanted but could not import is logged once (a warning on CUDA, where that
costs speed). Each backend carries a ``reason`` in words, which ``runner.describe()``
reports.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

from minicb.core.registry import lookup

if TYPE_CHECKING:  # the registry itself needs no torch: a feature registers for free
    import torch

    from minicb.core.attention.backend import AttentionBackend

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BackendEntry:
    """One registered attention backend, as ``get_backend`` needs to know it."""

    build: Callable[[str], AttentionBackend]  # its reason in words -> the backend
    package: str | None = None  # an optional package it needs (e.g. "triton"), or None
    hint: str = ""  # what to do where that package cannot be imported
    # Whether "auto" takes it on a device, and why in words; None: only when named.
    auto: Callable[[torch.device], tuple[bool, str]] | None = None


def _torch_backend(reason: str) -> AttentionBackend:
    from minicb.core.attention.backend import TorchBackend  # torch: when a runner is built

    return TorchBackend(reason)


# name -> entry. The core's own entry is here; features add theirs when imported.
BACKENDS: dict[str, BackendEntry] = {"torch": BackendEntry(_torch_backend)}


def package_missing(package: str) -> str | None:
    """Why ``package`` cannot be imported here, or None if it can. The module is looked up,
    not imported: importing Triton fixes its interpreter switch for the whole process."""
    try:
        found = importlib.util.find_spec(package) is not None
    except (ImportError, ValueError) as err:  # a blocked or broken installation
        return str(err) or type(err).__name__
    return None if found else f"No module named '{package}'"


@cache
def _say_once(package: str, device_type: str, why: str) -> None:
    message = f"{package} is not importable ({why}): attention runs on the torch backend"
    # On CUDA that costs speed, so warn; on CPU "auto" takes torch anyway.
    log.log(logging.WARNING if device_type == "cuda" else logging.INFO, message)


def get_backend(name: str, device: torch.device) -> AttentionBackend:
    """The backend for ``name`` ("auto", or a name in ``BACKENDS``) on ``device``."""
    if name == "auto":
        return _auto(device)
    entry = lookup(BACKENDS, "attention backend", name, f"attention_backend={name!r}")
    missing = package_missing(entry.package) if entry.package else None
    if missing:
        raise RuntimeError(
            f"attention_backend={name!r} needs the {entry.package} package, which cannot be "
            f"imported here ({missing}). {entry.hint}"
        )
    return entry.build("asked for")


def _auto(device: torch.device) -> AttentionBackend:
    """The first registered backend whose ``auto`` rule takes this device, else torch, with
    the reasons the others were passed over."""
    passed_over = []
    for entry in BACKENDS.values():
        if entry.auto is None:
            continue
        missing = package_missing(entry.package) if entry.package else None
        if missing:
            _say_once(entry.package, device.type, missing)
            passed_over.append(f"{entry.package} cannot be imported here: {missing}")
            continue
        wanted, why = entry.auto(device)
        if wanted:
            return entry.build(f"auto: {why}")
        passed_over.append(why)
    why = "; ".join(passed_over) or "the core's own backend, no other is registered"
    return _torch_backend(f"auto: {why}")
