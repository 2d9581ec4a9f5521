"""A token bucket: a tenant's token-rate limit.

The bucket holds up to ``burst`` tokens and refills at ``rate`` tokens a second. A request
takes what it asks for (prompt tokens plus max_tokens: what it may cost the replicas,
known before it runs) if the bucket holds that much; otherwise it is refused, and the
answer says how long until the bucket will hold enough (an HTTP ``Retry-After``). Refused
requests take nothing, so a client that retries when told is served at the rate.
"""

from __future__ import annotations

import math


class TokenBucket:
    def __init__(self, rate: float, burst: float, now: float = 0.0) -> None:
        self.rate, self.burst = rate, burst
        self.level, self.then = burst, now  # full at the start

    def _refill(self, now: float) -> None:
        self.level = min(self.burst, self.level + (now - self.then) * self.rate)
        self.then = max(self.then, now)

    def take(self, tokens: float, now: float) -> float:
        """Take ``tokens`` and return 0, or take nothing and return the seconds until the
        bucket holds them (math.inf if it never can: more than its burst)."""
        self._refill(now)
        if tokens > self.burst:
            return math.inf
        if tokens <= self.level:
            self.level -= tokens
            return 0.0
        return (tokens - self.level) / self.rate

    def give_back(self, tokens: float) -> None:
        """Return what a request took that never ran (refused further on)."""
        self.level = min(self.burst, self.level + tokens)
