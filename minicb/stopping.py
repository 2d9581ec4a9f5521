"""When a request stops: stop tokens, max_tokens, the context limit, stop strings.

Pure Python. Stop strings are matched on the decoded text; the text is cut before the
stop string, as the OpenAI API does.
"""

from __future__ import annotations

from minicb.request import Request, RequestStatus


def check_stop(req: Request, eos_token_ids: list[int], max_model_len: int) -> RequestStatus | None:
    """Token-level checks after a new token was appended."""
    last = req.output_token_ids[-1]
    if not req.params.ignore_eos and last in eos_token_ids:
        return RequestStatus.FINISHED_STOPPED
    if last in req.params.stop_token_ids:
        return RequestStatus.FINISHED_STOPPED
    if len(req.output_token_ids) >= req.params.max_tokens or req.num_tokens >= max_model_len:
        return RequestStatus.FINISHED_LENGTH
    return None


def find_stop_string(text: str, stops: list[str]) -> int | None:
    """Index where the earliest stop string begins in ``text``, or None."""
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(hits) if hits else None
