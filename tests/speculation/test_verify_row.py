"""The runner's verification of one drafted row with distributions (rejection.verify_row,
called by Drafter.verify): a draft drawn from q == p keeps every guess and adds the bonus;
a seeded row gives the same tokens however often it is verified, whatever the runner's
generator; a guess the target filtered out (top-k) is never kept, and the token drawn
instead is one the target allows."""

import torch

from minicb.core.config import SamplingParams
from minicb.speculation.rejection import target_probs, verify_row

VOCAB = 16


def logits(rows: int, seed: int) -> torch.Tensor:
    return torch.randn((rows, VOCAB), generator=torch.Generator().manual_seed(seed)) * 2


def test_q_equal_to_p_keeps_every_guess_and_the_bonus():
    params = SamplingParams(temperature=0.8, top_k=5, seed=3)
    lg = logits(4, 0)
    q = target_probs(lg[:3], params)
    draft = [int(t) for t in q.argmax(-1)]  # tokens q gives weight to
    tokens = verify_row(draft, q, lg, params, 0, torch.Generator().manual_seed(0))
    assert tokens[:3] == draft and len(tokens) == 4


def test_a_seeded_row_is_the_same_whatever_the_generator():
    params = SamplingParams(temperature=1.0, seed=11)
    lg, q = logits(3, 1), logits(2, 2).softmax(-1)
    draft = [1, 2]
    runs = {
        tuple(verify_row(draft, q, lg, params, 5, torch.Generator().manual_seed(g)))
        for g in range(5)
    }
    assert len(runs) == 1


def test_a_filtered_out_guess_is_rejected_for_an_allowed_token():
    params = SamplingParams(temperature=1.0, top_k=2)
    lg = logits(2, 4)
    allowed = set(torch.topk(lg[0], 2).indices.tolist())
    banned = next(t for t in range(VOCAB) if t not in allowed)
    q = torch.full((1, VOCAB), 1.0 / VOCAB)
    for g in range(20):
        tokens = verify_row([banned], q, lg, params, 0, torch.Generator().manual_seed(g))
        assert len(tokens) == 1 and tokens[0] in allowed
