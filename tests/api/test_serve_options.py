"""``minicb serve``'s options for the tokenizer's door and the replicas' restarts reach what
they set: ``--max-tokenizing-chars N`` the OpenAI routes' tokenizer door, ``--no-restart-replicas``
the fleet (restart is on by default)."""

from __future__ import annotations

import pytest

from minicb.cli import build_parser
from minicb.fleet import fleet as fleet_module
from minicb.server.serve_command import build_serve
from minicb.server.tokenizer_queue import MAX_TOKENIZING_CHARS


def serve_args(model: str, *extra: str):
    argv = ["serve", "--model", model, "--num-kv-blocks", "64", "--no-measure-utilisation"]
    return build_parser().parse_args([*argv, *extra])


def test_max_tokenizing_chars_reaches_the_routes_tokenizer_door(tiny_llama_dir):
    app, *_ = build_serve(serve_args(tiny_llama_dir, "--max-tokenizing-chars", "3000"))
    assert app.state.openai.tokenizer.max_chars == 3000
    app, *_ = build_serve(serve_args(tiny_llama_dir))
    assert app.state.openai.tokenizer.max_chars == MAX_TOKENIZING_CHARS
    with pytest.raises(ValueError, match="--max-tokenizing-chars must be at least 1, got 0"):
        build_serve(serve_args(tiny_llama_dir, "--max-tokenizing-chars", "0"))


class Built(Exception):
    """Raised by the stand-in Fleet once it has the options (no process is started)."""


def test_no_restart_replicas_reaches_the_fleet(tiny_llama_dir, monkeypatch):
    given: list[dict] = []

    def fleet(*args, **options):  # noqa: ANN002, ANN003, ANN202
        given.append(options)
        raise Built

    monkeypatch.setattr(fleet_module, "Fleet", fleet)
    for extra in ([], ["--no-restart-replicas"]):
        with pytest.raises(Built):
            build_serve(serve_args(tiny_llama_dir, "--replicas", "2", *extra))
    assert [o["restart_replicas"] for o in given] == [True, False]
