// A simulated GPU, unmistakable: the header's badge, the tab's title, a tag on every panel
// and the name of the time axis all say "simulated" and name the profile, live and in a
// replayed trace alike (both read the engine's description: info.simulated, info.runner).

import { applyLabels, t } from "./i18n.js";
import { showUtilisation } from "./utilisation.js";

const $ = (id) => document.getElementById(id);

// "SIMULATED · H100-SXM · llama-3.1-8b", or null for a real engine.
export function simulationLabel(info) {
  if (!info || !info.simulated) return null;
  const r = info.runner || {};
  return `${t("simulatedBadge")} · ${r.gpu || "?"} · ${r.model || info.model || "?"}`;
}

export function showSimulation(info, panels) {
  const label = simulationLabel(info);
  document.body.classList.toggle("simulated", !!label);
  $("simulated").hidden = !label;
  $("simulated").textContent = label || "";
  document.title = label ? `${label} · minicb` : "minicb";
  if (label && info.model) $("model").textContent = info.model; // the picker may change it
  $("xmode-time").dataset.i18n = label ? "simtime" : "walltime";
  for (const p of panels) {
    const tag = p.el.querySelector(".sim-tag");
    tag.hidden = !label;
    tag.textContent = label || "";
  }
  showUtilisation(info); // the utilisation card's heading: simulated peaks or measured rates
  applyLabels();
}
