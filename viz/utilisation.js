// The utilisation card's words, from the engine's description: a simulated GPU's card keeps
// its heading (the profile's published peaks); a real engine's says it is measured against
// this machine's probes and names them (info.runner.machine_rates: copy bandwidth, matmul
// FLOP/s, minicb/utilisation/probes.py). The note under the chart shows only where a step went
// above 100 % (a model whose weights fit in the CPU's caches: above the DRAM roofline).

import { t } from "./i18n.js";

const $ = (id) => document.getElementById(id);

export function showUtilisation(info) {
  const rates = !info || info.simulated ? null : (info.runner || {}).machine_rates;
  $("util-title").dataset.i18n = rates ? "utilChartReal" : "utilChart";
  $("util-rates").hidden = !rates;
  $("util-rates").textContent = rates
    ? t("utilRates").replace("{bw}", rates.copy_gb_s).replace("{fl}", rates.matmul_gflop_s)
    : "";
}
