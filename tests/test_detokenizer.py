"""The incremental detokenizer gives, token by token, exactly what decoding the whole output
again for every token gave: the same deltas, the same final text, the same stop."""

from __future__ import annotations

import random

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from minicb import LLMEngine, SamplingParams
from minicb.core.detokenizer import IncrementalDetokenizer
from minicb.core.runner.fake import FakeRunner

FFFD = "\ufffd"


def byte_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE with one token per byte and no merges, built in memory: every
    character beyond ASCII is split across tokens."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok)


def full_decode_reference(tokenizer, ids: list[int], stops: list[str]):
    """What the engine did before: decode all the output for every new token (keeping the
    old text while it ends in U+FFFD), cut at the earliest stop string, and hold back the
    longest end that begins a stop string. Returns (deltas, final text, stopped)."""
    text, shown, deltas = "", 0, []
    for n in range(1, len(ids) + 1):
        decoded = tokenizer.decode(ids[:n], skip_special_tokens=True)
        text = text if decoded.endswith(FFFD) else decoded
        hits = [i for i in (text.find(s) for s in stops) if i >= 0]
        stopped = bool(hits)
        if stopped:
            text = text[: min(hits)]
        held = max(
            (k for k in range(1, len(text) + 1) if any(s.startswith(text[-k:]) for s in stops)),
            default=0,
        )
        end = max(len(text) if stopped or n == len(ids) else len(text) - held, shown)
        deltas.append(text[shown:end])
        shown = end
        if stopped:
            break
    return deltas, text, stopped


def incremental(tokenizer, ids: list[int], stops: list[str]):
    detok = IncrementalDetokenizer(tokenizer, stops)
    deltas = []
    for n in range(1, len(ids) + 1):
        deltas.append(detok.add(ids[:n], final=n == len(ids)))
        if detok.stopped:
            break
    return deltas, detok.text, detok.stopped


def random_cases(tokenizer, vocab: int, texts: list[str], seed: int, count: int):
    """Token sequences: random ids (invalid UTF-8, special tokens and all), and encoded
    texts full of multi-byte characters; stop strings taken from the decoded text."""
    rng = random.Random(seed)
    for i in range(count):
        if i % 2:
            ids = [rng.randrange(vocab) for _ in range(rng.randint(1, 40))]
        else:
            ids = tokenizer.encode(rng.choice(texts), add_special_tokens=False)
        full = tokenizer.decode(ids, skip_special_tokens=True)
        stops = []
        for _ in range(rng.randint(0, 2)):
            a = rng.randrange(len(full) + 1)
            stops.append(full[a : a + rng.randint(1, 4)] or "zz")
        yield ids, stops


TEXTS = [
    "héllo wörld, naïve café",
    "世界你好，continuous batching 🎉🚀 done",
    "a\u0301 combining, 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 math, Ελληνικά",
    "plain ascii text with a stop. And more words after it.",
]


def test_a_split_character_shows_whole_and_never_as_a_replacement_char():
    tok = byte_tokenizer()
    ids = tok.encode("a🎉b", add_special_tokens=False)  # 1 + 4 + 1 byte tokens
    deltas, text, _ = incremental(tok, ids, [])
    assert deltas == ["a", "", "", "", "🎉", "b"]
    assert text == "a🎉b"


def test_matches_a_full_decode_on_random_byte_sequences():
    tok = byte_tokenizer()
    for ids, stops in random_cases(tok, 256, TEXTS, seed=0, count=400):
        assert incremental(tok, ids, stops) == full_decode_reference(tok, ids, stops), (ids, stops)


def test_a_stop_string_split_across_multi_byte_tokens_is_held_back():
    tok = byte_tokenizer()
    ids = tok.encode("ok 世界 more", add_special_tokens=False)
    deltas, text, stopped = incremental(tok, ids, ["世界"])
    assert stopped and text == "ok " and "".join(deltas) == "ok "
    assert FFFD not in "".join(deltas)


def test_engine_deltas_add_up_to_the_decoded_output():
    tok = byte_tokenizer()
    ids = tok.encode("naïve 🎉 text, then END here", add_special_tokens=False)
    runner = FakeRunner(tokenizer=tok, token_fn=lambda rid, i: ids[i % len(ids)])
    engine = LLMEngine(runner=runner)
    params = SamplingParams(max_tokens=len(ids), temperature=0.0, stop=["END"])
    rid = engine.add_request([5, 5], params)
    deltas, outputs = [], []
    while engine.has_unfinished():
        result = engine.step()
        deltas += [d.text for d in result.new_tokens if d.request_id == rid]
        outputs += result.finished
    assert "".join(deltas) == outputs[0].text == "naïve 🎉 text, then "
    assert outputs[0].finish_reason == "stop"


@pytest.mark.slow
def test_matches_a_full_decode_with_the_default_tokenizer():
    from minicb.core.runner.loader import default_model_dir, load_tokenizer

    tok = load_tokenizer(default_model_dir())
    for ids, stops in random_cases(tok, len(tok), TEXTS, seed=1, count=300):
        assert incremental(tok, ids, stops) == full_decode_reference(tok, ids, stops), (ids, stops)
