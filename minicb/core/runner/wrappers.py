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
or form only when a config asks for it, so ``import minicb.features`` loads no torch, and
a *wanted* predicate that reads the feature's own settings record (its folder's
settings.py) to say when a config asks for it. The core names each seam and the order of
its entries, never a feature's module, class or setting; a config cannot name a feature's
setting before its package is loaded (``EngineConfig.from_kwargs`` says what to import).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

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

# When a config asks for a weight form (on this device, in this compute dtype) or a wrapper
# (on this device): the feature registers it, reading its own settings record.
FormWanted = Callable[["EngineConfig", "torch.device", "torch.dtype"], bool]
WrapperWanted = Callable[["EngineConfig", "torch.device"], bool]

# The order the weight forms are applied in, and the wrappers' order, innermost first.
WEIGHT_FORMS = ("int8_weights", "packed_weights", "batch_invariant")
WRAPPERS = ("tensor_parallel", "cuda_graphs", "utilisation")

_weight_forms: dict[str, tuple[Callable[[], WeightForm], FormWanted]] = {}
_wrappers: dict[str, tuple[Callable[[], type[RunnerWrapper]], WrapperWanted]] = {}


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


def register_weight_form(name: str, load: Callable[[], WeightForm], wanted: FormWanted) -> None:
    """A feature's weight form under ``name`` (one of WEIGHT_FORMS): ``load()`` imports it,
    ``wanted(config, device, dtype)`` says when a config asks for it."""
    _weight_forms[name] = (load, wanted)


def register_wrapper(
    name: str, load: Callable[[], type[RunnerWrapper]], wanted: WrapperWanted
) -> None:
    """A feature's runner wrapper under ``name`` (one of WRAPPERS): ``load()`` imports it,
    ``wanted(config, device)`` says when a config asks for it."""
    _wrappers[name] = (load, wanted)


def weight_forms(
    config: EngineConfig, device: torch.device, dtype: torch.dtype
) -> list[WeightForm]:
    """The weight forms ``config`` asks for that can run on ``device`` in ``dtype``, in
    order. (A config names a feature's setting only once its package is loaded, so an
    unregistered form is one nobody asked for.)"""
    entries = [_weight_forms[name] for name in WEIGHT_FORMS if name in _weight_forms]
    asked = [load() for load, wanted in entries if wanted(config, device, dtype)]
    return [form for form in asked if form.fits(device, dtype)]


def registered_weight_forms() -> list[WeightForm]:
    """Every weight form a loaded package provides (to check a model someone else built)."""
    return [load() for load, _ in _weight_forms.values()]


def wrappers(config: EngineConfig, device: torch.device) -> list[type[RunnerWrapper]]:
    """The runner wrappers ``config`` asks for on ``device``, innermost first."""
    entries = [_wrappers[name] for name in WRAPPERS if name in _wrappers]
    return [load() for load, wanted in entries if wanted(config, device)]


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
