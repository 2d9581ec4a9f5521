"""Multi-turn chat: conversations whose every turn extends the one before, and the closed
loop that releases each turn after the previous turn's answer.

``chat_conversations`` draws conversations that open with one of a few shared system
prompts and whose every turn holds all of the turn before (its prompt, its answer) and a
new user message: the shape a prefix cache and a prefix-aware router are for.
``ChatSessions`` releases each turn a user's pause after the previous turn's answer,
shaped as workload.py's ``Arrivals`` (``next_time``, ``due``, truthy while turns remain)
so that the same driver runs either. Pure Python.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Sequence
from dataclasses import dataclass, replace

from minicb.workload import RequestSpec, arrival_times


@dataclass(frozen=True)
class Conversation:
    """One chat: each turn's prompt is the previous turn's prompt, its answer and a new
    user message, so turn k+1 begins with all of turn k (what a prefix cache can reuse).
    ``start``: when the first turn arrives; ``think_s[k]``: the user's pause between the
    answer to turn k and turn k+1 (a closed loop: the next turn waits for the answer).
    The answers written in ``turns`` are the workload's own; a closed loop told the
    answer the model gave puts that one in the next prompt instead (``ChatSessions``)."""

    turns: list[RequestSpec]
    start: float
    think_s: list[float]

    def next_prompt(self, turn: int, prompt: Sequence[int], answer: Sequence[int]) -> list[int]:
        """Turn ``turn + 1``'s prompt after turn ``turn`` was sent as ``prompt`` and
        answered with ``answer``: what the chat holds, then the next user message."""
        sent, nxt = self.turns[turn], self.turns[turn + 1]
        user = nxt.prompt[len(sent.prompt) + sent.output_tokens :]
        return [*prompt, *answer, *user]


def chat_conversations(
    n: int,
    turns: int = 4,
    system_len: int = 1024,
    num_system_prompts: int = 4,
    user_mean: float = 128,
    answer_mean: float = 128,
    rate: float | None = None,
    think_mean_s: float = 2.0,
    seed: int = 0,
    vocab: int = 32000,
) -> list[Conversation]:
    """``n`` conversations of ``turns`` turns, each opening with one of
    ``num_system_prompts`` shared system prompts of ``system_len`` tokens (conversation i
    has prompt i % num_system_prompts), user messages and answers exponential of their
    means (within 8x the mean), starting as a Poisson process of ``rate`` (None: all at
    once), pauses exponential of ``think_mean_s``. Token ids are random, so no two
    messages share a block by chance. The answers in the prompts are the workload's own
    until a closed loop is told the model's (``ChatSessions.answered``)."""
    rng = random.Random(seed)

    def tokens(k: int) -> list[int]:
        return [rng.randrange(10, vocab) for _ in range(k)]

    def length(mean: float) -> int:
        return max(1, min(round(8 * mean), round(rng.expovariate(1.0 / mean))))

    systems = [tokens(system_len) for _ in range(num_system_prompts)]
    starts = arrival_times(n, rate, seed=seed + 1)
    out = []
    for i in range(n):
        history, specs = list(systems[i % num_system_prompts]), []
        for _ in range(turns):
            history += tokens(length(user_mean))
            answer = length(answer_mean)
            specs.append(RequestSpec(list(history), answer, group=f"chat-{i}"))
            history += tokens(answer)
        pauses = [rng.expovariate(1.0 / think_mean_s) for _ in range(turns - 1)]
        out.append(Conversation(specs, starts[i], pauses))
    return out


class ChatSessions:
    """The arrival loop of conversations, a closed loop: the first turns arrive at their
    start, each later turn ``think_s`` after its previous turn's answer (``answered``),
    with that answer in its prompt when the caller gives it (as a chat client sends back
    what the model said: the blocks a replica cached while decoding it are then found by
    the next turn, which is what a prefix-aware router counts on). Shaped as ``Arrivals``
    (``next_time``, ``due``, truthy while turns remain), so the same driver runs either;
    the arrival stamped on a turn is its release time."""

    def __init__(self, conversations: Sequence[Conversation], start: float = 0.0) -> None:
        self.conversations = list(conversations)
        self._ready = [(start + c.start, i) for i, c in enumerate(self.conversations)]
        heapq.heapify(self._ready)
        self._released = [0] * len(self.conversations)  # turns handed out, per conversation
        self._prompts: dict[int, list[int]] = {}  # a next turn's prompt with the real answer
        self._left = sum(len(c.turns) for c in self.conversations)

    def __bool__(self) -> bool:
        return self._left > 0

    @property
    def next_time(self) -> float | None:
        return self._ready[0][0] if self._ready else None

    def due(self, now: float) -> list[RequestSpec]:
        """Every turn whose time has come at ``now``, in order."""
        out = []
        while self._ready and self._ready[0][0] <= now:
            t, i = heapq.heappop(self._ready)
            turn = self.conversations[i].turns[self._released[i]]
            prompt = self._prompts.pop(i, turn.prompt)
            out.append(replace(turn, prompt=prompt, arrival=t))
            self._released[i] += 1
            self._left -= 1
        return out

    def answered(
        self, request: RequestSpec, time: float, answer: Sequence[int] | None = None
    ) -> None:
        """``request`` (a turn ``due`` gave) finished at ``time``: release the next turn
        of its conversation (one turn of a conversation is out at a time), its prompt
        holding ``answer`` (the model's tokens) if given, else the workload's answer."""
        i = int(request.group.removeprefix("chat-"))
        done = self._released[i]
        if done < len(self.conversations[i].turns):
            if answer is not None:
                self._prompts[i] = self.conversations[i].next_prompt(
                    done - 1, request.prompt, answer
                )
            heapq.heappush(self._ready, (time + self.conversations[i].think_s[done - 1], i))
