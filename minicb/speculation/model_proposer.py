"""The model proposer: a network (a draft model, or the target's first layers) guesses the
next k tokens of every row at once, one batched forward per guess.

For each row it first catches up: the draft's own KV (draft_kv.py) is right for a prefix
of the request's tokens, and the rest (the prompt on a first draft, the tokens the target
accepted and its bonus, or everything after a rejected guess) is fed as one ragged chunk,
whose last position gives the first guess. Then each guess is fed back for the next, k - 1
more forwards of one token a row. Rows are batched exactly as the target batches them (the
core's ``step_inputs`` over a plan of the draft's rows, the target's attention backend), so
the draft is the engine's own machinery on a second, smaller pool.

A greedy row guesses by argmax. A sampled row draws its guess from the draft's filtered
distribution ``q`` (the same temperature, top-k and top-p as the request: a ``q`` close to
the target's ``p`` is accepted more often) and returns ``q`` with it: the runner verifies
such a draft by rejection sampling (drafter.py's ``verify``), which keeps the target's
distribution whatever the draft is. A seeded request draws its guesses from generators of
(its seed, the token's position), so its tokens do not depend on who shares its batch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from minicb.core.config import SamplingParams
from minicb.core.runner import Runner
from minicb.core.runner.model_runner import ModelRunner
from minicb.core.runner.sampler import inverse_cdf, token_generator
from minicb.core.runner.step_inputs import step_inputs
from minicb.core.runner.wrappers import find_layer
from minicb.core.scheduler.block_manager import blocks_needed
from minicb.core.scheduler.plan import DECODE, PREFILL, ScheduledRequest, StepPlan
from minicb.speculation.draft_kv import DraftKV
from minicb.speculation.draft_networks import DraftNetwork
from minicb.speculation.drafter import Draft, DraftRequest
from minicb.speculation.rejection import target_probs

DRAFT_SEED_SALT = 0x5EED_D4AF  # a seeded request's guesses draw apart from its tokens


@dataclass
class _Row:
    """One row's draft in the making."""

    request_id: int
    tokens: list[int]  # the request's tokens, as the proposer was given them
    start: int  # how many of them the draft's KV already holds
    count: int  # guesses to make
    params: SamplingParams | None
    guesses: list[int] = field(default_factory=list)
    q: list[torch.Tensor] = field(default_factory=list)  # one (vocab,) per sampled guess


class ModelProposer:
    """``ModelProposer(build, num_tokens, by)``: ``build(target)`` makes the network from
    the target's model runner when the engine attaches it; ``by`` names it in reasons."""

    def __init__(
        self, build: Callable[[ModelRunner], DraftNetwork], num_tokens: int, by: str
    ) -> None:
        self.build, self.num_tokens, self.by = build, num_tokens, by
        self.network: DraftNetwork | None = None
        self.kv: DraftKV | None = None

    def attach(self, runner: Runner) -> None:
        target = find_layer(runner, ModelRunner)
        if target is None:
            raise ValueError(
                f"{self.by} runs a model beside the target: it needs the model runner, and "
                f"this engine's runner is {type(runner).__name__}"
            )
        config = target.config
        ranks = runner.describe().get("tensor_parallel_size", 1)
        if ranks > 1:
            raise ValueError(
                f"{self.by} drafts on one device: tensor_parallel_size must be 1, not {ranks}"
            )
        self.network = net = self.build(target)
        self.backend, self.device = target.backend, target.device
        self.block_size = config.block_size
        # As many blocks as the target's pool (a row's draft never holds more tokens than
        # its target row), plus room for each slot's k guesses beyond what the target took.
        spare = config.max_num_seqs * (blocks_needed(self.num_tokens, self.block_size) + 1)
        cfg = net.cfg
        self.kv = DraftKV(
            cfg.num_layers,
            (self.block_size, cfg.num_kv_heads, cfg.head_dim),
            target.num_kv_blocks + spare,
            config.answer("KV format", "auto"),  # the target's format
            target.dtype,
            self.device,
        )
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(config.seed + 1)  # not the target's draws

    def retain(self, request_ids: set[int]) -> None:
        if self.kv is not None:
            self.kv.retain(request_ids)

    @torch.inference_mode()
    def propose(self, rows: Sequence[DraftRequest]) -> list[Draft | None]:
        if self.network is None or self.kv is None:
            raise RuntimeError(f"{self.by} was not attached to a runner (LLMEngine does it)")
        work: list[_Row | None] = [self._prepare(row) for row in rows]
        live = [w for w in work if w is not None]
        while live:
            self._guess(live)
            live = [w for w in live if len(w.guesses) < w.count]
        drafts: list[Draft | None] = []
        for w in work:
            if w is None:
                drafts.append(None)
                continue
            # The KV written: the tokens and every guess but the last (never fed).
            self.kv.wrote(w.request_id, w.tokens + w.guesses[:-1])
            q = torch.stack(w.q) if w.q else None
            drafts.append(Draft(w.guesses, q=q, by=self.by))
        return drafts

    def _prepare(self, row: DraftRequest) -> _Row | None:
        """The row's catch-up and how many guesses fit its context and the draft's pool."""
        assert self.kv is not None and self.network is not None
        tokens = list(row.token_ids)
        n = len(tokens)
        start = self.kv.valid(row.request_id, tokens)
        # Feeding the tokens and count - 1 guesses must fit the context and the pool.
        count = min(row.max_tokens, self.network.max_model_len - n + 1)
        count = min(count, self.kv.room(row.request_id, n) + 1)
        if count < 1:
            return None
        self.kv.hold(row.request_id, n + count - 1)
        return _Row(row.request_id, tokens, start, count, row.params)

    def _guess(self, rows: list[_Row]) -> None:
        """One forward of the draft over every row still guessing, and one guess each."""
        assert self.kv is not None and self.network is not None
        plan = StepPlan(0, "draft", self.block_size)
        for w in rows:
            if w.guesses:  # feed the last guess
                feed, at = [w.guesses[-1]], len(w.tokens) + len(w.guesses) - 1
            else:  # catch up on everything the draft has not seen
                feed, at = w.tokens[w.start :], w.start
            table = self.kv.blocks.block_table(w.request_id)
            plan.scheduled.append(
                ScheduledRequest(
                    request_id=w.request_id,
                    phase=PREFILL if len(feed) > 1 else DECODE,
                    num_tokens=len(feed),
                    start_position=at,
                    context_len=at + len(feed),
                    block_table=table,
                    num_blocks=len(table),
                    store_kv=True,
                    samples=True,
                    token_ids=feed,
                    params=w.params,
                )
            )
        batch = step_inputs(plan, self.block_size, self.device)
        hidden = self.network(
            batch.input_ids, batch.positions, batch.meta, self.kv.caches, self.backend
        )
        logits = self.network.logits(hidden[batch.sample_rows])
        greedy = logits.argmax(-1).tolist()
        for i, w in enumerate(rows):
            if w.params is None or w.params.greedy:
                w.guesses.append(greedy[i])
                continue
            q = target_probs(logits[i : i + 1], w.params)  # (1, vocab), filtered as p is
            u = torch.rand((1, 1), generator=self._generator(w), device=self.device)
            w.guesses.append(int(inverse_cdf(q, u)[0]))
            w.q.append(q[0])

    def _generator(self, w: _Row) -> torch.Generator:
        """The generator a guess draws from: a seeded request's, by its position."""
        if w.params is None or w.params.seed is None:
            return self.generator
        index = len(w.tokens) + len(w.guesses)
        return token_generator(w.params.seed ^ DRAFT_SEED_SALT, index, self.device)
