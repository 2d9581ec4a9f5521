"""Seam 3: what optional features add to the model runner, and when a config asks for each.

The core's ``ModelRunner`` computes one plain way: the whole model on one device, eager,
linear weights as loaded. A feature changes that from its own folder, in one of three ways,
each registered here by name when its package is imported (``import minicb.features``):

- a **weight form** (``register_weight_form``): how the decoder's linear layers hold their
  weights, applied by build_model.py after the cast to the compute dtype, in the order of
  ``WEIGHT_FORMS`` (int8 weights, oneDNN packing, batch-invariant row tiles: each wraps
  what the one before left);
- a **runner wrapper** (``register_wrapper``): a runner around the model runner that
  changes a step (``execute(plan, forward=...)``: the step's logits computed another way, or
  work before and after it) and passes everything else through, in the order of
  ``WRAPPERS`` (innermost first). The performance lab's compiled decode step
  (perflab/compiled.py) is such a wrapper, added by hand;
- a **model part**: a wrapper may also say which part of the model this process holds
  (``RunnerWrapper.part``; tensor parallelism's shard), which the model runner builds in
  place of the whole model.

Registration is free: a feature registers a *loader*, a function that imports its wrapper
or form only when a config asks for it, so ``import minicb.features`` loads no torch. The
core names each seam and the config fields that ask for it (they stay in config.py), never
a feature's module or class; a config that asks for a name no package registered gets the
seams' one error, ``FeatureNotLoaded`` (minicb/core/registry.py), which says what to import.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from minicb.core.registry import lookup

if TYPE_CHECKING:
    import torch

    from minicb.core.config import EngineConfig
    from minicb.core.runner import Runner, RunnerOutput
    from minicb.core.runner.llama import LlamaModel, ModelConfig
    from minicb.core.runner.loader import ModelFiles
    from minicb.core.runner.step_inputs import StepInputs
    from minicb.core.scheduler.plan import StepPlan

# A step's logits from its inputs: ``ModelRunner.logits``, or a wrapper's.
Forward = Callable[["StepInputs"], "torch.Tensor | None"]

# Weight forms, in the order they are applied, and when a config asks for each (on this
# device, in this compute dtype).
WEIGHT_FORMS: tuple[tuple[str, Callable[[EngineConfig, torch.device, torch.dtype], bool]], ...] = (
    ("int8_weights", lambda config, device, dtype: config.weight_dtype == "int8"),
    (
        "packed_weights",
        lambda config, device, dtype: (
            config.packed_weights and device.type == "cpu" and str(dtype) == "torch.bfloat16"
        ),
    ),
    ("batch_invariant", lambda config, device, dtype: config.batch_invariant),
)
# Runner wrappers, innermost first, and when a config asks for each (on this device).
WRAPPERS: tuple[tuple[str, Callable[[EngineConfig, torch.device], bool]], ...] = (
    ("tensor_parallel", lambda config, device: config.tensor_parallel_size > 1),
    # Captured all-reduces would have to be replayed on every rank in step: one rank only.
    (
        "cuda_graphs",
        lambda config, device: (
            config.use_cuda_graphs and device.type == "cuda" and config.tensor_parallel_size == 1
        ),
    ),
    ("utilisation", lambda config, device: config.measure_utilisation),
)

_weight_forms: dict[str, Callable[[], WeightForm]] = {}
_wrappers: dict[str, Callable[[], type[RunnerWrapper]]] = {}


class WeightForm(Protocol):
    """A way of holding the decoder's linear weights (int8, packed, in row tiles)."""

    unshareable: str  # the error when a runner would share weights held otherwise

    def fits(self, device: torch.device, dtype: torch.dtype) -> bool:
        """Whether it can run on ``device`` in ``dtype`` (if not, the plain layers stay)."""

    def apply(self, model: LlamaModel) -> None:
        """Replace the model's linear layers by this form's, in place."""

    def held_by(self, model: LlamaModel) -> bool:
        """Whether ``model``'s layers are held in this form (a shared model is checked)."""

    def describe(self) -> dict[str, Any]:
        """What ``runner.describe()`` says of weights held this way."""


class ModelPart(Protocol):
    """The part of the model this process holds, when it holds a part (a tensor-parallel
    rank's shard); ``ModelRunner(part=...)`` builds that part instead of the whole."""

    def config(self, whole: ModelConfig) -> ModelConfig:
        """The architecture of the part (fewer heads, a narrower MLP)."""

    def shape(self, model: LlamaModel) -> None:
        """Make the meta-device skeleton of ``model`` this part's (layers swapped)."""

    def weights(self, files: ModelFiles, names: set[str]) -> Any:
        """Yield (name, tensor) of this part's slice of each checkpoint tensor in ``names``."""


def register_weight_form(name: str, load: Callable[[], WeightForm]) -> None:
    """A feature's weight form under ``name`` (one of WEIGHT_FORMS): ``load()`` imports it."""
    _weight_forms[name] = load


def register_wrapper(name: str, load: Callable[[], type[RunnerWrapper]]) -> None:
    """A feature's runner wrapper under ``name`` (one of WRAPPERS): ``load()`` imports it."""
    _wrappers[name] = load


def _loaded(registry: dict[str, Callable[[], Any]], seam: str, name: str) -> Any:
    """What the loader registered as ``name`` returns (a ``FeatureNotLoaded`` if none is)."""
    return lookup(registry, seam, name, "the engine config")()


def weight_forms(
    config: EngineConfig, device: torch.device, dtype: torch.dtype
) -> list[WeightForm]:
    """The weight forms ``config`` asks for that can run on ``device`` in ``dtype``, in
    order."""
    asked = [
        _loaded(_weight_forms, "weight form", n)
        for n, on in WEIGHT_FORMS
        if on(config, device, dtype)
    ]
    return [form for form in asked if form.fits(device, dtype)]


def registered_weight_forms() -> list[WeightForm]:
    """Every weight form a loaded package provides (to check a model someone else built)."""
    return [load() for load in _weight_forms.values()]


def wrappers(config: EngineConfig, device: torch.device) -> list[type[RunnerWrapper]]:
    """The runner wrappers ``config`` asks for on ``device``, innermost first."""
    return [
        _loaded(_wrappers, "runner wrapper", name) for name, on in WRAPPERS if on(config, device)
    ]


def find_layer(runner: Any, kind: type) -> Any:
    """The runner of type ``kind`` in ``runner``'s chain of wrappers (outermost first), or
    None: how a new wrapper finds its sibling's, to share what it measured or opened."""
    while runner is not None and not isinstance(runner, kind):
        runner = getattr(runner, "inner", None)
    return runner


class RunnerWrapper:
    """A runner around another (``inner``): everything it does not override is the inner
    runner's, read through ``__getattr__`` (its pools, tokenizer, device, views)."""

    def __init__(self, inner: Runner) -> None:
        self.inner = inner

    @classmethod
    def part(cls, config: EngineConfig, device: torch.device) -> ModelPart | None:
        """The part of the model the runner inside should hold (None: the whole model)."""
        return None

    @classmethod
    def wrap(cls, inner: Runner, config: EngineConfig, sibling: Runner | None) -> Runner:
        """This wrapper around ``inner``, built for ``config``; ``sibling``: the runner on
        the same weights that ``with_config`` was called on, None for a first runner."""
        return cls(inner)

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # not set yet (copying, unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)

    def execute(self, plan: StepPlan, *, forward: Forward | None = None) -> RunnerOutput:
        return self.inner.execute(plan, forward=forward)

    def with_config(self, config: EngineConfig, sibling: Runner | None = None) -> Runner:
        """A runner for ``config`` on these weights, with the wrappers it asks for: the model
        runner inside builds it, with this whole chain as the sibling."""
        return self.inner.with_config(config, sibling=sibling or self)

    def describe(self) -> dict[str, Any]:
        return self.inner.describe()
