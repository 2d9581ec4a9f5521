"""The test tiers: the Makefile's targets together run every collected test, `make test` is
the fast tier with its duration guard, and CI runs every tier after the linter.

A tier is the -m expression its make target passes. A new marker that the fast tier leaves
out, with no target of its own, would make its tests run nowhere: this test names them."""

import re
from pathlib import Path

import pytest
from _pytest.mark.expression import Expression

from tests.conftest import COLLECTED

ROOT = Path(__file__).resolve().parents[1]
MAKEFILE = (ROOT / "Makefile").read_text()
TIER_TARGETS = ("test", "test-slow", "test-browser", "test-perflab")


def recipe(target: str) -> str:
    """The recipe lines of a make target, with $(FAST) expanded."""
    match = re.search(rf"^{re.escape(target)}:.*\n((?:\t.*\n)+)", MAKEFILE, re.M)
    assert match, f"the Makefile has no target {target}"
    fast = re.search(r"^FAST := (.+)$", MAKEFILE, re.M).group(1).strip()
    return match.group(1).replace("$(FAST)", fast)


def marker_expression(target: str) -> str:
    found = re.findall(r'-m "([^"]*)"', recipe(target))
    assert len(found) == 1, f"make {target} should pass one -m expression, found {found}"
    return found[0]


def in_tier(expression: str, markers: set[str]) -> bool:
    return Expression.compile(expression).evaluate(lambda name, **args: name in markers)


def test_every_collected_test_runs_in_a_tier(request):
    collected = request.config.stash.get(COLLECTED, [])
    files = {nodeid.split("::")[0] for nodeid, _ in collected}
    every_file = {str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py")}
    if files != every_file:
        pytest.skip("checks the whole suite's collection: run it with the whole suite")
    tiers = {target: marker_expression(target) for target in TIER_TARGETS}
    nowhere = [n for n, marks in collected if not any(in_tier(e, marks) for e in tiers.values())]
    assert not nowhere, f"{len(nowhere)} tests are in no tier ({tiers}), e.g. {nowhere[:5]}"
    fast = [nid for nid, marks in collected if in_tier(tiers["test"], marks)]
    assert len(fast) > len(collected) / 2, "the fast tier should hold most of the tests"


def test_make_test_is_the_fast_tier_with_its_guard_and_make_test_all_runs_everything():
    assert marker_expression("test") == "not slow and not browser and not perflab"
    assert "--fast-test-limit=" in recipe("test")
    assert marker_expression("test-all") == "", "test-all deselects nothing"
    assert "--hypothesis-profile=thorough" in recipe("test-all")


def test_ci_runs_the_linter_then_every_tier():
    commands = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert commands.index("make lint") < commands.index("make test-all")
