"""The one mechanism behind every seam: a name looked up in a registry, and the error when
a config names a feature that nobody registered.

Each seam of the core keeps its own registry, a plain dict from a name to what builds the
feature: the scheduler's hooks (``DRAFTERS``, ``ADMISSION_SIZES`` in scheduler/hooks.py),
the prefix cache's lower tiers (``CACHE_TIERS``, scheduler/cache_tier.py), the runner's
weight forms and wrappers (runner/wrappers.py), the KV layer's formats
(attention/kv_layer.py), the attention backends (attention/backend_choice.py) and the
step strategies (step_strategy.py). The core fills in its own entries; a feature's
package adds its own when it is imported, and ``import minicb.features`` imports them all
(``import minicb`` does it). So a feature the config accepts may simply not be loaded,
and every seam says so in the same words, through ``lookup``. Pure Python.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TypeVar

T = TypeVar("T")


class FeatureNotLoaded(ValueError):
    """A config names a feature whose package was never imported, so it never registered
    (a ValueError, as every invalid setting is: whoever shows those shows this one)."""

    def __init__(self, seam: str, name: str, asked_by: str, registered: Iterable[str]) -> None:
        self.seam = seam  # what kind of thing was looked up: "drafter", "cache tier"...
        self.name = name  # the name nobody registered
        known = ", ".join(registered) or "none"
        super().__init__(
            f"{asked_by} asks for the {name!r} {seam}, which is not registered (registered: "
            f"{known}). Optional features register when their package is imported: "
            "import minicb.features first (import minicb does it)"
        )


def lookup(registry: Mapping[str, T], seam: str, name: str, asked_by: str) -> T:
    """``registry[name]``, or ``FeatureNotLoaded`` naming the ``seam``, the ``name``, the
    setting that asked for it (``asked_by``: "speculative='ngram'") and the import that
    registers it."""
    try:
        return registry[name]
    except KeyError:
        raise FeatureNotLoaded(seam, name, asked_by, registry) from None
