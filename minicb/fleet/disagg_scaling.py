"""The planner's side of a disaggregated cluster (disaggregated.py), SIMULATED: what it is
told, and what its decisions do to the two pools.

``DisaggregatedCluster`` runs the engines; with a planner (``PoolScaler``, e.g. the SLA
planner, sla_planner.py) each pool also grows and shrinks, and that is this object's work.
Between two looks it collects what the planner is told of the interval: each arrival's
prompt length, each first token's TTFT, each finished request's ITL and length. At each
look it describes the pools (``PoolsState``: engines ready, engines still starting, what
each holds, what waits) and carries out each decision: an added engine is built by the
cluster and takes its start-up delay (the colocated fleet's, simulated.py), costing from
the moment it is asked for; a removed one leaves its router at once and drains what it
holds. Every decision is logged with its time, pool, reason and the pools' sizes after it.
Pure Python: no torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from minicb.fleet.autoscale import ScaleDecision
from minicb.fleet.disagg_member import Member, member_load
from minicb.fleet.sla_planner import Pool, PoolScaler, PoolsState

if TYPE_CHECKING:  # the cluster owns this object; only its type is named here
    from minicb.fleet.disaggregated import DisaggregatedCluster


class ClusterScaling:
    """One cluster's planner, its observations of the current interval and its log."""

    def __init__(
        self, cluster: DisaggregatedCluster, planner: PoolScaler, startup_s: float
    ) -> None:
        self.cluster, self.planner, self.startup_s = cluster, planner, startup_s
        self.log: list[dict[str, Any]] = []  # each decision, its time, pool and sizes
        self.prompts: list[int] = []
        self.ttfts: list[float] = []
        self.itls: list[float] = []
        self.outputs: list[int] = []

    def look(self, now: float) -> None:
        """The planner's look at ``now`` at the interval since the last one, done."""
        cluster = self.cluster
        state = PoolsState(
            now=now, arrived=len(self.prompts), prompt_tokens=sum(self.prompts),
            ttft_s=self.ttfts, itl_s=self.itls, output_tokens=self.outputs,
            decode_running=sum(m.engine.queue_sizes()["running"] for m in cluster.decode
                               if m.removed is None and m.ready_at <= now),
            prefill=_pool(cluster.prefill, now), decode=_pool(cluster.decode, now),
        )  # fmt: skip
        self.prompts, self.ttfts, self.itls, self.outputs = [], [], [], []
        for side, decision in self.planner.decide(state):
            self._scale(side, decision, now)

    def _scale(self, side: str, decision: ScaleDecision, now: float) -> None:
        cluster = self.cluster
        members = cluster.prefill if side == "prefill" else cluster.decode
        router = cluster.route_prefill if side == "prefill" else cluster.route_decode
        if decision.action == "add":
            index = router.add()  # the next index: its place in ``members``
            member = cluster.build(side, index)
            member.added, member.ready_at = now, now + self.startup_s
            member.catch_up(member.ready_at)
            members.append(member)
        else:  # out of the router now; it drains what it holds
            index = decision.replica
            router.remove(index)
            members[index].removed = now
        pools = {"prefill": cluster.prefill, "decode": cluster.decode}
        live = {name: sum(m.removed is None for m in pool) for name, pool in pools.items()}
        self.log.append({"time": now, "pool": side, "action": decision.action,
                         "replica": index, "reason": decision.reason, **live})  # fmt: skip


def _pool(side: list[Member], now: float) -> Pool:
    """One pool as the planner sees it at ``now``: only ready engines count as serving."""
    live = [m for m in side if m.removed is None]
    ready = [m for m in live if m.ready_at <= now]
    held = {m.index: len(m.numbers) for m in ready}
    waiting = sum(member_load(m, now).waiting for m in ready)
    added = [m.ready_at for m in ready if m.added > 0]
    since = now - max(added) if added else None
    return Pool(len(ready), len(live) - len(ready), held, waiting, since)
