"""Joining a Ray cluster: the one place that calls ``ray.init``.

With an address (``ray start --head`` printed it; ``auto`` finds the one this machine
joined) the fleet's driver joins that cluster; without one, Ray starts a cluster of one
node on this machine for as long as this process lives. Ray's defaults that matter here:

- a cluster made with ``ray start`` may require a token (``RAY_AUTH_MODE=token``): the
  driver must then have the same ``RAY_AUTH_TOKEN`` (or token file) in its environment;
  Ray reads it from there, so nothing is passed here;
- the driver's own address is the one Ray finds for this host; ``RAY_NODE_IP_ADDRESS``
  overrides it (the tests keep everything on 127.0.0.1).
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)


def require_ray() -> object:
    """The ray module, or ImportError saying how to install it."""
    try:
        import ray
    except ImportError as err:
        raise ImportError(
            "a fleet on Ray needs the ray extra: pip install 'minicb[ray]'"
        ) from err
    return ray


def connect(address: str | None = None) -> None:
    """Join the cluster at ``address`` (a local one when None); a process already
    connected stays connected (to whatever cluster it joined first)."""
    ray = require_ray()
    if ray.is_initialized():
        return
    ray.init(address=address, configure_logging=False)
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    log.info("joined a Ray cluster of %d nodes at %s", len(nodes), address or "(local)")
