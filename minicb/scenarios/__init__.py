"""The classroom's scenarios: one lesson per JSON file in this folder (docs/scenarios.md).

A scenario names a workload, two engines shown side by side, a runner (the embedded model,
or a simulated GPU) and a script of narration points, each with its text in English and
Chinese and the claims about the run that the text makes. ``load_scenario`` reads and
checks a file; ``player`` builds its engines, feeds its requests and fires its narration.
"""

import minicb.features  # noqa: F401  (a product may run engines with any feature)
from minicb.scenarios.scenario import Scenario, load_scenario, scenario_names
from minicb.scenarios.schema import ScenarioError

__all__ = ["Scenario", "ScenarioError", "load_scenario", "scenario_names"]
