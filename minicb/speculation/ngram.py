"""The n-gram proposer (prompt lookup): guess a request's next tokens with no second model.

Take the last ``n`` tokens (``ngram_max`` down to ``ngram_min``), find where they occurred
before in the request's own prompt or output (the longest such suffix; among its
occurrences, the one followed by the most tokens, then the most recent), and propose the
tokens that followed them there. It shines when the output copies its input (rewriting or
editing code or text given in the prompt) and costs little when it finds nothing. The
drafter (drafter.py) asks it for every row at once and fits the guesses into the plan.
Pure Python, no torch.
"""

from __future__ import annotations

from collections.abc import Sequence

from minicb.speculation.drafter import Draft, DraftRequest


class NgramProposer:
    """Prompt lookup: the tokens that followed the last occurrence of the longest suffix of
    ``min_n`` to ``max_n`` tokens that has occurred before."""

    def __init__(self, min_n: int = 1, max_n: int = 4) -> None:
        self.min_n, self.max_n = min_n, max_n

    def propose(self, rows: Sequence[DraftRequest]) -> list[Draft | None]:
        return [self.lookup(row.token_ids, row.max_tokens) for row in rows]

    def lookup(self, token_ids: Sequence[int], max_tokens: int) -> Draft | None:
        """Up to ``max_tokens`` tokens that followed the best earlier match of a suffix of
        ``token_ids``, or None when no suffix of ``min_n`` tokens occurred before."""
        n = len(token_ids)
        if max_tokens < 1 or n <= self.min_n:
            return None
        # Best: the longest match, then the longest continuation (capped at max_tokens: the
        # latest occurrence of a repeated run is followed by one token only), then the latest.
        best, best_end = (0, 0), -1
        for end in self._earlier(token_ids, token_ids[-1]):  # most recent first
            length = 1
            while (
                length < self.max_n
                and length <= end
                and token_ids[end - length] == token_ids[n - 1 - length]
            ):
                length += 1
            score = (length, min(n - 1 - end, max_tokens))
            if score > best:
                best, best_end = score, end
                if score == (self.max_n, max_tokens):
                    break
        length = best[0]
        if length < self.min_n:
            return None
        start = best_end - length + 1
        tokens = list(token_ids[best_end + 1 : best_end + 1 + max_tokens])
        return Draft(tokens, list(token_ids[start : best_end + 1]), start)

    @staticmethod
    def _earlier(token_ids: Sequence[int], token: int) -> list[int]:
        """Positions before the last one that hold ``token``, latest first (list.index
        scans in C, much faster than a Python loop over a long prompt)."""
        found, i, stop = [], -1, len(token_ids) - 1
        ids = token_ids if isinstance(token_ids, list) else list(token_ids)
        while True:
            try:
                i = ids.index(token, i + 1, stop)
            except ValueError:
                return found[::-1]
            found.append(i)
