"""A tenant: who sends a request, in which priority band, and what it may ask for.

A service shared by many clients names each one (an API key names its tenant, the
server's ``--tenant NAME:KEY:PRIORITY[:TOKENS_PER_S]``); traffic that shows no tenant's
key is one tenant, ``DEFAULT_TENANT``. What a tenant is allowed travels with its name:

- ``priority``: its band. As the engine's own priority (and vLLM's), a LOWER value is
  served first: while band 0 has a request queued, band 1 waits, however long.
- ``tokens_per_s`` and ``burst_tokens``: its token-rate limit (token_bucket.py), counted
  over what a request asks for, prompt tokens plus ``max_tokens``; None: no limit.
- ``max_queued``: how many of its requests may wait in the fair queue at once.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_TENANT = "default"
MAX_QUEUED = 64  # a tenant's requests waiting in the fair queue before a 429
BURST_S = 10.0  # a rate-limited tenant may spend this many seconds of its rate at once


@dataclass(frozen=True)
class Tenant:
    name: str
    priority: int = 0
    tokens_per_s: float | None = None
    burst_tokens: float | None = None  # None: BURST_S seconds of its rate
    max_queued: int = MAX_QUEUED

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a tenant needs a name")
        if self.tokens_per_s is not None and self.tokens_per_s <= 0:
            raise ValueError(f"tenant {self.name!r}: tokens_per_s must be positive")
        if self.max_queued < 1:
            raise ValueError(f"tenant {self.name!r}: max_queued must be at least 1")

    @property
    def burst(self) -> float | None:
        """The most tokens it may ask for at once (None: unlimited)."""
        if self.tokens_per_s is None:
            return None
        return self.burst_tokens if self.burst_tokens is not None else self.tokens_per_s * BURST_S


def parse_tenant(text: str, max_queued: int = MAX_QUEUED) -> tuple[Tenant, str]:
    """``NAME:KEY:PRIORITY[:TOKENS_PER_S]`` -> (the tenant, its key); ValueError naming
    the form otherwise."""
    parts = text.split(":")
    form = "NAME:KEY:PRIORITY[:TOKENS_PER_S] (e.g. alice:sk-alice:0:2000)"
    if len(parts) not in (3, 4) or not parts[0] or not parts[1]:
        raise ValueError(f"--tenant takes {form}, got {len(parts)} fields")
    try:
        priority = int(parts[2])
        rate = float(parts[3]) if len(parts) == 4 else None
    except ValueError as err:
        raise ValueError(f"--tenant takes {form}: {err}") from err
    return Tenant(parts[0], priority, rate, max_queued=max_queued), parts[1]
