"""What a round of speculative decoding costs, and gives, on a named GPU: the step-time
model (step_time.py) applied to a verification step and to the proposer's own steps.

One *round* for a batch of ``B`` decode rows at context ``c``, with ``k`` guesses a row:

- **off**: one decode step, ``B`` rows of one token each (``t_off``);
- **on**: the proposer's work, then one verification step of the target: ``B`` rows of
  ``1 + k`` tokens each, sampled at every position (the LM head runs ``1 + k`` times a row);
  - ``ngram``: the proposer is a list search on the host: nothing on the GPU;
  - ``draft``: a draft model (a catalogue entry, e.g. ``llama-3.2-1b`` drafting
    ``llama-3.1-8b``) runs ``k`` steps of ``B`` rows of one token, each reading its own
    weights and its own KV cache (``c + i`` tokens a row);
  - ``early_exit``: the target's first ``L`` layers and its LM head run ``k`` steps: the
    same as a draft model whose shape is the target's cut to ``L`` layers.
  The draft steps are charged their roofline (bytes and FLOPs), not the step overhead, which
  the round pays once (scheduling, inputs, sampling: launches are taken to be captured in a
  CUDA graph; a draft run without one pays its kernel launches too, left out here).

Each guess is taken to be accepted with probability ``alpha`` when the ones before it were
(the i.i.d. model of Leviathan et al., 2023), so a row gets, a round,

    tokens = 1 + alpha + alpha^2 + ... + alpha^k      (1 at alpha 0, k + 1 at alpha 1)

and ``alpha`` relates to the acceptance rate minicb measures (accepted / guesses) as
``rate = (tokens - 1) / k``. **The break-even rule**: speculation pays when the tokens a row
gets a round exceed the cost of a round counted in plain steps, ``t_on / t_off``; the
speed-up (of both decode throughput and time per output token) is their ratio. A bigger
batch makes the verification step compute-bound: ``t_on / t_off`` climbs towards ``1 + k``
and the gain shrinks, then turns into a cost. Pure Python: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from minicb.cost_model.catalogue import model_shape
from minicb.cost_model.step_time import StepTimeModel, attended_pairs

PROPOSERS = ("ngram", "draft", "early_exit")


def tokens_per_round(alpha: float, k: int) -> float:
    """Expected tokens a row gets from a round of ``k`` guesses, each accepted with
    probability ``alpha`` after the ones before it: accepted guesses plus the model's own."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    return sum(alpha**i for i in range(k + 1))


@dataclass(frozen=True)
class SpeculationCost:
    """The step-time model of a target, and of the proposer's steps beside it."""

    target: StepTimeModel
    proposer: str = "draft"
    draft: StepTimeModel | None = None  # the draft model's steps (None for ngram)

    @classmethod
    def build(
        cls, target: StepTimeModel, proposer: str, draft_model: str = "", draft_layers: int = 0
    ) -> SpeculationCost:
        """``draft_model``: a catalogue name or model folder (proposer ``draft``);
        ``draft_layers``: the target's layers the draft runs (proposer ``early_exit``)."""
        if proposer == "ngram":
            return cls(target, proposer)
        if proposer == "draft":
            shape = model_shape(draft_model)
            if shape.vocab_size != target.model.vocab_size:
                raise ValueError(
                    f"a draft must share the target's tokenizer: {shape.name} has "
                    f"{shape.vocab_size} tokens, {target.model.name} {target.model.vocab_size}"
                )
        elif proposer == "early_exit":
            if not 0 < draft_layers <= target.model.num_layers:
                raise ValueError(
                    f"draft_layers must be in 1..{target.model.num_layers}, got {draft_layers}"
                )
            shape = replace(
                target.model, name=f"{target.model.name}[:{draft_layers}]", num_layers=draft_layers
            )
        else:
            raise ValueError(f"proposer must be one of {', '.join(PROPOSERS)}, got {proposer!r}")
        return cls(target, proposer, replace(target, model=shape))

    def plain_step_s(self, batch: int, context: int) -> float:
        """A decode step of ``batch`` rows of one token at ``context`` (speculation off)."""
        return self.target.totals_terms(batch, batch, batch * context, batch * context)["step_s"]

    def verify_step_s(self, batch: int, context: int, k: int) -> float:
        """The target's step over ``batch`` rows of 1 + k tokens, ending at context + k."""
        n, end = 1 + k, context + k
        return self.target.totals_terms(
            batch * n, batch * n, batch * end, batch * attended_pairs(n, end)
        )["step_s"]

    def draft_s(self, batch: int, context: int, k: int) -> float:
        """The proposer's seconds for ``k`` guesses a row: k roofline steps of the draft."""
        if self.draft is None:
            return 0.0
        total = 0.0
        for i in range(k):
            c = batch * (context + i)
            terms = self.draft.totals_terms(batch, batch, c, c)
            total += terms["step_s"] - terms["overhead_s"] - terms["comm_s"]
        return total

    def round(self, batch: int, context: int, k: int, alpha: float) -> dict[str, float]:
        """One round off and on: seconds, the round's cost in plain steps, tokens a row a
        round, and the predicted speed-up (tokens over cost: above 1 it pays)."""
        off = self.plain_step_s(batch, context)
        draft = self.draft_s(batch, context, k)
        on = draft + self.verify_step_s(batch, context, k)
        tokens = tokens_per_round(alpha, k)
        return {
            "batch": batch,
            "step_off_s": off,
            "draft_s": draft,
            "round_on_s": on,
            "round_cost_steps": on / off,
            "tokens_per_round": tokens,
            "speedup": tokens / (on / off),
        }

    def break_even_alpha(self, batch: int, context: int, k: int) -> float | None:
        """The smallest alpha at which a round pays for itself at this batch (to 1e-4), or
        None when even alpha 1 (every guess accepted) does not."""
        cost = self.round(batch, context, k, 1.0)["round_cost_steps"]
        if tokens_per_round(1.0, k) <= cost:
            return None
        lo, hi = 0.0, 1.0
        while hi - lo > 1e-4:
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if tokens_per_round(mid, k) <= cost else (lo, mid)
        return hi
