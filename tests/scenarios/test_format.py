"""The scenario format: every shipped file loads, and a wrong field is named in the error."""

import copy
import json

import pytest

from minicb.scenarios import ScenarioError, load_scenario, scenario_names
from minicb.scenarios.scenario import HERE, Scenario

NAMES = scenario_names()


def raw(name: str = "01-static-vs-continuous") -> dict:
    return json.loads((HERE / f"{name}.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("name", NAMES)
def test_each_shipped_scenario_loads_and_is_named_for_its_file(name):
    scenario = load_scenario(name)
    assert scenario.name == name
    assert len(scenario.sides) == 2 and scenario.narration
    for point in scenario.narration:
        assert point.text["en"].strip() and point.text["zh"].strip()


def test_the_lessons_of_the_issue_are_all_there():
    numbers = {name[:2] for name in NAMES}
    assert {"01", "02", "03", "04", "05", "06", "07", "08"} <= numbers


def test_a_file_path_loads_too(tmp_path):
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(raw()), encoding="utf-8")
    assert load_scenario(path).title["en"] == raw()["title"]["en"]


def test_an_unknown_name_lists_the_shipped_ones():
    with pytest.raises(ScenarioError, match="no scenario 'nope'; shipped: 01-static"):
        load_scenario("nope")


def broken(change) -> str:
    data = copy.deepcopy(raw())
    change(data)
    with pytest.raises(ScenarioError) as info:
        Scenario.from_dict(data)
    return str(info.value)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda d: d.pop("runner"), "missing field(s) runner"),
        (lambda d: d.update(colour="red"), "unknown field(s) colour"),
        (lambda d: d.update(runner="H100"), 'runner must be "real" or "GPU:MODEL"'),
        (lambda d: d["title"].pop("zh"), "title: missing field(s) zh"),
        (lambda d: d["summary"].update(zh=" "), "summary.zh must be a non-empty string"),
        (lambda d: d["sides"].pop(), "exactly two engines, got 1"),
        (lambda d: d["sides"][0]["engine"].update(batching="lazy"), "sides[0].engine: unknown"),
        (lambda d: d["sides"][1]["engine"].update(warp=9), "sides[1].engine: unknown engine"),
        (lambda d: d["sides"][1].update(name="static"), "different names"),
        (lambda d: d["requests"][0].update(max_tokens=0), "requests[0].max_tokens must be"),
        (lambda d: d["requests"][0].update(max_tokens=[9, 3]), "low 9 is above high 3"),
        (lambda d: d["requests"][1].update(prefix="sys"), "requests[1].prefix 'sys' is not"),
        (lambda d: d["requests"][1].update(name="first"), "two groups have the same name"),
        (lambda d: d["narration"][0]["trigger"].update(event="boom"), "exactly one of step or"),
        (lambda d: d["narration"][1]["trigger"].update(event="boom"), "event 'boom' is unknown"),
        (lambda d: d["narration"][1]["trigger"].update(side="left"), "trigger.side 'left' is"),
        (lambda d: d["narration"][1]["trigger"].update(request="x"), "trigger.request 'x' is"),
        (lambda d: d["narration"][0]["highlight"].update(blocks="all"), "blocks 'all' is unknown"),
        (lambda d: d["narration"][0]["highlight"].update(requests=["y"]), "highlight.requests"),
        (lambda d: d["narration"][0].update(claims=["fast"]), "claims[0] 'fast' is not"),
        (lambda d: d["narration"][0].update(claims=["static.speed > 1"]), "metric 'speed'"),
        (lambda d: d["narration"][0].update(claims=["left.steps > 1"]), "side 'left' is not"),
        (lambda d: d["narration"][0].update(claims=["static.wait:zz > 1"]), "request 'zz'"),
        (lambda d: d.update(narration=[]), "narration must not be empty"),
    ],
)
def test_a_broken_field_is_named(change, message):
    assert message in broken(change)


def test_the_file_name_is_part_of_the_error(tmp_path):
    data = raw()
    data["seed"] = -1
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(ScenarioError, match="mine.json: seed must be an integer >= 0"):
        load_scenario(path)


def test_not_json_says_so(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text("{", encoding="utf-8")
    with pytest.raises(ScenarioError, match="cannot read it as JSON"):
        load_scenario(path)


def test_each_notebook_names_a_shipped_scenario_in_both_languages():
    """Each notebook's opening (English, then Chinese) names what to show live: shipped
    scenarios, or a simulated demo whose GPU and model the catalogue holds (notebook 14's
    lanes are the simulated demo's own panel, not a lesson)."""
    import re

    from minicb.cost_model.catalogue import load_profile

    notebooks = sorted((HERE.parents[1] / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    assert notebooks
    for path in notebooks:
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        for cell in cells[:2]:  # the English cell, then its Chinese translation
            source = "".join(cell["source"])
            named = re.findall(r"--scenario ([\w-]+)", source)
            simulated = re.findall(r"minicb demo --simulate ([\w.:-]+)", source)
            assert named or simulated, (path.name, "names nothing to show live")
            assert set(named) <= set(NAMES), (path.name, named)
            for spec in simulated:
                load_profile(spec)  # raises for a GPU or model the catalogue lacks


def test_teaching_md_links_every_scenario_in_both_languages():
    for doc in ("docs/teaching.md", "docs/zh/teaching.md"):
        text = (HERE.parents[1] / doc).read_text(encoding="utf-8")
        for name in NAMES:
            assert f"`{name}`" in text, (doc, name)
