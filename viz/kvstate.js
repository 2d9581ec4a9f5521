// KvState: the KV map as the page holds it, block by block, mirrored from the events.
//
// Every request's device and swap blocks and the evictable cached blocks. A view or a
// kv_snapshot event gives the whole map; each step's kv_ops (and a kv_changes event's)
// change it as the block manager changed the pool, so the page draws what the engine holds
// without any event carrying the whole pool. minicb/telemetry/kv_state.py is the same map
// in Python, with the prefix cache's host tier too, whose operations (offload, reload,
// host_uncache) this map, which draws the device pool, passes over; docs/events.md lists
// every operation.

export class KvState {
  constructor() { this.tables = new Map(); this.swaps = new Map(); this.cached = new Set(); }

  static fromView(kv) {
    const s = new KvState();
    for (const [rid, t] of Object.entries(kv.block_tables || {})) s.tables.set(Number(rid), [...t]);
    for (const [rid, t] of Object.entries(kv.swap_tables || {})) s.swaps.set(Number(rid), [...t]);
    for (const b of kv.cached_blocks || []) s.cached.add(b);
    return s;
  }

  clone() {
    const s = new KvState();
    for (const [rid, t] of this.tables) s.tables.set(rid, [...t]);
    for (const [rid, t] of this.swaps) s.swaps.set(rid, [...t]);
    s.cached = new Set(this.cached);
    return s;
  }

  apply(ops) {
    for (const [kind, rid, arg] of ops) {
      if (kind === "append") { if (!this.tables.has(rid)) this.tables.set(rid, []); this.tables.get(rid).push(...arg); }
      else if (kind === "trim") this.tables.get(rid)?.splice(arg);
      else if (kind === "free") { this.tables.delete(rid); this.swaps.delete(rid); }
      else if (kind === "swap_out") { this.tables.delete(rid); this.swaps.set(rid, [...arg]); }
      else if (kind === "swap_in") { this.swaps.delete(rid); this.tables.set(rid, [...arg]); }
      else if (kind === "cache") for (const b of arg) this.cached.add(b);
      else if (kind === "uncache") for (const b of arg) this.cached.delete(b);
    }
  }
}
