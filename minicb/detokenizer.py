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

Stop strings are matched on the text as it grows (only the end where a new match can
begin is searched), the text is cut where the earliest one begins, as the OpenAI API does,
and a tail that could still begin a stop string is held back, so the deltas of a request
always add up to its final text.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from minicb.request import find_stop_string

REPLACEMENT_CHAR = "\ufffd"


def stop_prefix_len(text: str, stops: list[str]) -> int:
    """Length of the longest end of ``text`` that is the beginning of a stop string."""
    for n in range(min(len(text), max((len(s) for s in stops), default=1) - 1), 0, -1):
        if any(s.startswith(text[-n:]) for s in stops):
            return n
    return 0


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

    def add(self, token_ids: list[int], final: bool) -> str:
        """The text the newest of ``token_ids`` (the whole output so far) adds to the deltas.

        ``final``: the request ends with these tokens (a stop token or a length limit), so
        nothing is held back. Sets ``stopped`` if a stop string ends the text."""
        old = len(self.text)
        if self._grow(token_ids) and self.stops:
            cut = self._find_stop(old)
            if cut is not None:  # the text ends where the stop string begins
                self.text, self.stopped = self.text[:cut], True
        end = len(self.text)
        if self.stops and not (final or self.stopped):  # hold back a possible stop's start
            end -= stop_prefix_len(self.text, self.stops)
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

    def _find_stop(self, old: int) -> int | None:
        """Where the earliest stop string begins; the text before ``old`` held none, so a
        match must end in the new part and only that end is searched."""
        start = max(0, old - max(len(s) for s in self.stops) + 1)
        hit = find_stop_string(self.text[start:], self.stops)
        return None if hit is None else start + hit
