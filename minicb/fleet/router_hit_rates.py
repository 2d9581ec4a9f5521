"""Approximate against precise routing, SIMULATED: each router's prefix-cache hit rate on
the same shared-prefix chat, with pools small enough to evict, in one run.

    python -m minicb.fleet.router_hit_rates [--replicas 2] [--num-kv-blocks 128]

The chat: 24 conversations of 4 turns, every three sharing one of 8 system prompts of 128
tokens, user messages of mean 24 tokens and answers of mean 64 (each next turn sends the
answer back), 8 conversations a second, 0.2 s between a turn's answer and the next. Each
replica's pool holds ``num_kv_blocks`` blocks of 16 tokens: at 128, a few conversations,
so the pools evict and what the router *sent* drifts from what a replica *holds*. The same
conversations go through a ``SimulatedFleet`` (simulated.py) under each router; the
figures are the merged metrics' prefix-cache hit rate (prompt tokens found cached over
prompt tokens), the blocks the replicas' KV events reported removed (evictions) and how
many times the index had to resync. The last row is the precise router again with one
record in ``LOSE_EVERY`` lost on the way (a stale index): each loss is found at that
replica's next record, its snapshot comes a decision after it is asked for, and until it is
in, the router counts none of that replica's blocks.
"""

from __future__ import annotations

import argparse
from typing import Any

from minicb.chat_workload import ChatSessions, chat_conversations
from minicb.core.config import EngineConfig
from minicb.fleet.kv_events import KVEventBatch
from minicb.fleet.simulated import SimulatedFleet

PROFILE = "L4:smollm2-135m"
POLICIES = ("round-robin", "prefix-aware", "precise-prefix", "cost")
CHAT = dict(turns=4, system_len=128, num_system_prompts=8, user_mean=24, answer_mean=64,
            rate=8.0, think_mean_s=0.2, seed=3)  # fmt: skip
CONVERSATIONS = 24
LOSE_EVERY = 5  # the stale row: one KV event record in this many is lost
STALE = f"precise-prefix, 1 in {LOSE_EVERY} records lost"


def chat_fleet(policy: str, replicas: int = 2, num_kv_blocks: int = 128) -> SimulatedFleet:
    """A simulated fleet for the chat: 16 slots and a budget of 512 tokens per replica."""
    config = EngineConfig(max_num_seqs=16, max_num_batched_tokens=512,
                          num_kv_blocks=num_kv_blocks)  # fmt: skip
    return SimulatedFleet(PROFILE, config, policy, replicas)


def chat() -> ChatSessions:
    return ChatSessions(chat_conversations(CONVERSATIONS, **CHAT))


def hit_rates(replicas: int = 2, num_kv_blocks: int = 128) -> dict[str, dict[str, Any]]:
    """Each router's figures on the same chat (see the module doc)."""
    rows = {}
    for name in (*POLICIES, STALE):
        fleet = chat_fleet(name.split(",")[0], replicas, num_kv_blocks)
        deliver, removed, lose = fleet.deliver_kv, [0], LOSE_EVERY if name == STALE else 0

        def counting(replica: int, record: KVEventBatch, deliver=deliver, removed=removed,
                     lose=lose):  # fmt: skip
            removed[0] += len(record.removed)
            if not lose or record.seq % lose:
                deliver(replica, record)

        fleet.deliver_kv = counting  # type: ignore[method-assign]
        summary = fleet.run(chat())["summary"]
        rows[name] = {
            "hit_rate": summary["prefix_cache"]["hit_rate"],
            "prefill_tokens": summary["prefix_cache"]["prefill_tokens"],
            "finished": summary["requests"]["finished"],
            "blocks_removed": removed[0],
            "resyncs": fleet.router.index.resyncs,
        }
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--num-kv-blocks", type=int, default=128)
    args = parser.parse_args(argv)
    print(f"SIMULATED ({PROFILE}), {args.replicas} replicas of {args.num_kv_blocks} blocks, "
          f"{CONVERSATIONS} chats of {CHAT['turns']} turns")  # fmt: skip
    for policy, row in hit_rates(args.replicas, args.num_kv_blocks).items():
        print(f"{policy:>34}: prefix hit rate {row['hit_rate']:.1%}, "
              f"{row['prefill_tokens']:,} prompt tokens computed, "
              f"{row['blocks_removed']:,} blocks evicted, {row['resyncs']} resyncs")  # fmt: skip


if __name__ == "__main__":
    main()
