// Arrivals the demo's workload skipped. It sends each arrival to both engines or to
// neither, and skips one while either engine holds --max-outstanding requests, so that both
// keep the same workload: while it skips, the engine that keeps up shows gaps it did not
// cause. This line says so beside the legend (hidden while nothing was skipped).

import { t } from "./i18n.js";

let last = null; // the latest counts, drawn again when the language changes

export function showArrivals(arrivals = last) {
  const el = document.getElementById("arrivals");
  if (!el || !arrivals) return;
  last = arrivals;
  el.hidden = !arrivals.skipped;
  el.textContent = t("arrivalsSkipped")
    .replace("{skipped}", arrivals.skipped.toLocaleString("en-US"))
    .replace("{total}", (arrivals.sent + arrivals.skipped).toLocaleString("en-US"))
    .replace("{limit}", arrivals.limit.toLocaleString("en-US"));
}
