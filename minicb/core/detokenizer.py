"""IncrementalDetokenizer: one request's output text, decoded a few tokens at a time.

Decoding the whole output again for every new token costs O(n) per token, O(n^2) per
request. Here only a short window is decoded: the tokens since the last point where the
text was complete (``_prefix``), with the tokens already shown (up to ``_read``) decoded
beside it, so that the new text is the difference of the two::

    output ids   ...  | prefix .......... read | new ids
    window text       decode(ids[prefix:])       minus decode(ids[prefix:read])

The window starts at a token boundary where the text was whole, so a tokenizer whose
decoding is local (byte-level BPE: the text of a run of tokens is the UTF-8 decoding of
their bytes) gives exactly the text a full decode gives. While the window's text ends in
U+FFFD, a multi-byte character is still incomplete: nothing is added and the window grows
until the character is whole, so a split character never shows as a replacement char.

Stop strings are matched on the text as it grows, by one KMP automaton per stop string
(``StopMatcher``): each new character moves each automaton once (amortised), so the check
costs what the new text is long, however long the stops or the output. The text is cut
where the earliest stop begins, as the OpenAI API does, and the tail that could still
begin a stop string (the automata's states say how long) is held back, so the deltas of a
request always add up to its final text.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

REPLACEMENT_CHAR = "\ufffd"


def _failure(stop: str) -> list[int]:
    """KMP's table: ``fail[i]`` is the length of the longest proper prefix of ``stop[:i]``
    that is also a suffix of it (where a match of ``i`` characters falls back to)."""
    fail, k = [0, 0], 0
    for c in stop[1:]:
        while k and stop[k] != c:
            k = fail[k]
        k += stop[k] == c
        fail.append(k)
    return fail


class StopMatcher:
    """Where stop strings occur in a text given a piece at a time, in time linear in the
    text: per stop string, the length of the longest end of the text so far that begins
    it (its automaton's state)."""

    def __init__(self, stops: list[str]) -> None:
        self.stops = stops
        self._fail = [_failure(s) for s in stops]
        self._state = [0] * len(stops)

    def feed(self, text: str, offset: int) -> int | None:
        """Read ``text``, the whole text's characters from ``offset`` on; returns where the
        earliest-beginning stop string that ends in it begins, or None."""
        found = None
        for k, (stop, fail) in enumerate(zip(self.stops, self._fail, strict=True)):
            state = self._state[k]
            for i, c in enumerate(text):
                while state and stop[state] != c:
                    state = fail[state]
                state += stop[state] == c
                if state == len(stop):  # a match: the earliest of this stop in the new text
                    begin = offset + i + 1 - len(stop)
                    found = begin if found is None else min(found, begin)
                    state = fail[state]
                    break
            self._state[k] = state
        return found

    @property
    def held(self) -> int:
        """Characters at the end of the text read that could still begin a stop string."""
        return max(self._state, default=0)


@dataclass
class IncrementalDetokenizer:
    """The text of one request's output so far, and how much of it deltas have carried."""

    tokenizer: Any | None  # anything with ``decode(ids, skip_special_tokens=True)``
    stops: list[str] = field(default_factory=list)
    text: str = ""  # the output as text (cut before a stop string once one is found)
    shown: int = 0  # characters of ``text`` the deltas have carried
    stopped: bool = False  # a stop string was found: the request ends here
    _prefix: int = 0  # output ids before this index are not decoded again
    _read: int = 0  # output ids before this index are in ``text``

    def __post_init__(self) -> None:
        self._matcher = StopMatcher(self.stops)

    def add(self, token_ids: list[int], final: bool) -> str:
        """The text the newest of ``token_ids`` (the whole output so far) adds to the deltas.

        ``final``: the request ends with these tokens (a stop token or a length limit), so
        nothing is held back. Sets ``stopped`` if a stop string ends the text."""
        old = len(self.text)
        if self._grow(token_ids) and self.stops:
            cut = self._matcher.feed(self.text[old:], old)
            if cut is not None:  # the text ends where the stop string begins
                self.text, self.stopped = self.text[:cut], True
        end = len(self.text)
        if self.stops and not (final or self.stopped):  # hold back a possible stop's start
            end -= self._matcher.held
        end = max(end, self.shown)
        delta, self.shown = self.text[self.shown : end], end
        return delta

    def _grow(self, token_ids: list[int]) -> bool:
        """Decode the window and append its new text if it is whole; True if it grew."""
        if self.tokenizer is None:
            return False
        window = token_ids[self._prefix :]
        known = self.tokenizer.decode(window[: self._read - self._prefix], skip_special_tokens=True)
        new = self.tokenizer.decode(window, skip_special_tokens=True)
        if len(new) <= len(known) or new.endswith(REPLACEMENT_CHAR):
            return False  # no text yet (a special token), or a character still incomplete
        self.text += new[len(known) :]
        self._prefix, self._read = self._read, len(token_ids)
        return True
