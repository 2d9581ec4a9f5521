"""The seam for a feature's settings: each optional feature keeps its own config record.

``EngineConfig`` (config.py) holds the core's settings and one field, ``features``, with the
records of the features a config turns on. A feature's record is a frozen dataclass in its
own folder (``minicb/speculation/settings.py``: ``SpeculationSettings``) that subclasses
``FeatureSettings``; its field names are the flat option names it owns (``speculative``,
``ngram_max``...), the words the command line, the page, the scenario files and
``LLM(model, speculative="ngram")`` use. Its package registers it here when it is imported
(``register_settings``), so ``EngineConfig.from_kwargs`` knows which record a flat name
belongs to, and ``to_dict`` writes every registered option back out flat.

The core never reads a feature's field. Where a seam must learn something from a feature
(which drafter, which KV format, how many host blocks), the record says so in
``answers``: the seam's name -> the record's attribute that answers it, read through
``EngineConfig.answer(seam, default)``. Pure Python: a feature registers for free.
"""

from __future__ import annotations

from dataclasses import fields
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

if TYPE_CHECKING:
    from minicb.core.config import EngineConfig

S = TypeVar("S", bound="FeatureSettings")


class FeatureSettings:
    """Base of a feature's record (a frozen dataclass). It checks its own fields in
    ``__post_init__`` and, in ``check``, what it needs of the rest of the config."""

    name: ClassVar[str]  # the record's key: "speculation", "host_tier"...
    answers: ClassVar[dict[str, str]] = {}  # seam -> the attribute that answers it

    def check(self, config: EngineConfig) -> None:
        """Raise ValueError where this record cannot run with the rest of ``config`` (the
        core's fields or another feature's record). Nothing to check by default."""

    @classmethod
    def of(cls: type[S], config: EngineConfig) -> S:
        """This feature's record in ``config``: the one it holds, or the defaults."""
        return config.feature(cls)


# Every registered record class by its name, and the flat option names each one owns.
RECORDS: dict[str, type[FeatureSettings]] = {}
OPTIONS: dict[str, type[FeatureSettings]] = {}


def register_settings(record: type[S]) -> type[S]:
    """Called by a feature's package when it is imported (see minicb/features.py)."""
    RECORDS[record.name] = record
    for f in fields(record):  # type: ignore[arg-type]
        OPTIONS[f.name] = record
    return record


def check_choice(name: str, value: Any, allowed: tuple[str, ...]) -> None:
    """The error every setting with a fixed set of words raises (core and features alike)."""
    if value not in allowed:
        raise ValueError(f"unknown {name} {value!r}; choose one of {', '.join(allowed)}")


def check_positive(name: str, value: Any) -> None:
    """The error every setting that counts something raises."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
