"""``minicb serve --fleet ray [--ray-address ADDR]`` reaches the Ray fleets with its address,
and ``--ray-address`` without ``--fleet ray`` is refused by name. Fast and without Ray:
stand-ins take the place of RayFleet and RayDisaggregatedFleet, so no cluster starts."""

from __future__ import annotations

import pytest

from minicb.cli import build_parser
from minicb.fleet.ray import ray_disagg, ray_fleet
from minicb.server.serve_command import build_serve


class Built(Exception):
    """Raised by a stand-in fleet once it has its arguments (nothing is started)."""


def serve(model: str, *extra: str):
    argv = ["serve", "--model", model, "--dtype", "float32", "--no-measure-utilisation"]
    return build_serve(build_parser().parse_args([*argv, *extra]))


def stand_in(given: list) -> object:
    def fleet(*args, **options):  # noqa: ANN002, ANN003, ANN202
        given.append((args, options))
        raise Built

    return fleet


@pytest.mark.parametrize("extra", [[], ["--ray-address", "10.0.0.5:6379"]])
def test_fleet_ray_starts_a_ray_fleet_with_the_address(tiny_llama_dir, monkeypatch, extra):
    given: list = []
    monkeypatch.setattr(ray_fleet, "RayFleet", stand_in(given))
    for replicas in (["--replicas", "2"], []):  # one replica on Ray is still a Ray fleet
        with pytest.raises(Built):
            serve(tiny_llama_dir, "--fleet", "ray", *replicas, *extra)
    address = extra[1] if extra else None
    assert [options["ray_address"] for _, options in given] == [address, address]
    assert [args[1] for args, _ in given] == [2, 1]


def test_disaggregate_on_ray_starts_the_ray_disaggregated_fleet(tiny_llama_dir, monkeypatch):
    given: list = []
    monkeypatch.setattr(ray_disagg, "RayDisaggregatedFleet", stand_in(given))
    with pytest.raises(Built):
        serve(tiny_llama_dir, "--disaggregate", "1:2", "--fleet", "ray", "--ray-address", "auto")
    (args, options), = given
    assert args[1:3] == (1, 2) and options["ray_address"] == "auto"


def test_a_ray_address_without_fleet_ray_is_refused(tiny_llama_dir):
    with pytest.raises(ValueError, match="--ray-address needs --fleet ray"):
        serve(tiny_llama_dir, "--replicas", "2", "--ray-address", "auto")
