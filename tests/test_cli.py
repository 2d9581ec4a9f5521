"""The ``minicb`` console script: every subcommand is registered, and bad input is a clear
error rather than a traceback."""

import pytest

from minicb.cli import build_parser, format_summary, main
from minicb.telemetry.metrics import compute_metrics


def test_help_lists_every_subcommand(capsys):
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["--help"])
    assert exit_.value.code == 0
    printed = capsys.readouterr().out
    for name in ("generate", "replay", "demo", "serve", "bench"):
        assert name in printed


def test_bad_input_is_a_clear_error(tmp_path, capsys):
    assert main(["replay", str(tmp_path / "missing.jsonl")]) == 2
    assert "minicb replay: error: cannot read" in capsys.readouterr().err
    assert main(["bench", "--repeats", "0"]) == 2
    assert "--repeats must be at least 1" in capsys.readouterr().err


def test_format_summary_of_no_events_prints_dashes():
    text = format_summary(compute_metrics([]))
    assert text.startswith("requests   0 arrived")
    assert "TTFT" in text and "fairness" in text
