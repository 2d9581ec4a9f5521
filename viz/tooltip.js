// Hover over a timeline row: the request's prompt, its text so far, its TTFT and the
// scheduler's reasons for what happened to it, as of the iteration on screen.

import { t, translateReason } from "./i18n.js";
import { PHASE_NAMES } from "./model.js";

const tip = () => document.getElementById("tooltip");
const MAX_TEXT = 400;

function line(label, value) {
  const div = document.createElement("div");
  const b = document.createElement("b");
  b.textContent = `${label}: `;
  div.append(b, String(value));
  return div;
}

// A chat-templated prompt shows as its user turn; other template markers are dropped.
function promptText(p) {
  const m = p.match(/<\|im_start\|>user\n([\s\S]*?)<\|im_end\|>/);
  return m ? m[1] : p.replace(/<\|[^|>]*\|>/g, " ").trim();
}

function stateAt(r, cursor) {
  if (r.endStep != null && r.endStep < cursor) return t("finished");
  return t(`ph_${PHASE_NAMES[r.cellAt(cursor)]}`);
}

export function showTooltip(ev, panel, r, cursor) {
  const el = tip();
  if (!r) { el.hidden = true; return; }
  el.replaceChildren();
  const head = document.createElement("div");
  head.innerHTML = "<b></b>";
  head.firstChild.textContent = `${t(panel.model.batching)} · ${t("req")} #${r.id} · ${stateAt(r, cursor)}`;
  el.append(head);
  const prompt = r.typed ?? (r.prompt != null ? promptText(r.prompt) : null) ??
    (r.numPrompt != null ? `${r.numPrompt} ${t("tokens")}` : null);
  if (prompt != null) el.append(line(t("promptLabel"), prompt.slice(0, MAX_TEXT)));
  const text = r.textAt(cursor) || (r.tokenIds.length ? `[${r.tokenIds.slice(0, 64).join(" ")}]` : "") ||
    (r.redacted ? t("hidden") : "");
  el.append(line(t("text"), text.length > MAX_TEXT ? `…${text.slice(-MAX_TEXT)}` : text || "–"));
  const ttft = r.firstTokenStep != null && r.firstTokenStep <= cursor ? r.ttft() : null;
  el.append(line(t("ttft"), ttft == null ? "–" : `${(ttft * 1000).toFixed(0)} ms`));
  el.append(line(t("arrivedAt"), r.startStep));
  const draft = r.drafts[cursor - r.startStep];
  if (draft) { // the cell under the cursor verified a speculative draft
    const [guesses, accepted, proposer] = draft;
    const bonus = accepted === guesses ? ` + ${t("bonusToken")}` : "";
    el.append(line(t("draftAt"), `${accepted}/${guesses} ${t("accepted")}${bonus} · ${proposer ?? "–"}`));
  }
  if (r.endStep != null && r.endStep <= cursor) el.append(line(t("left"), r.endStep));
  const reasons = r.reasons.filter(([k]) => k <= cursor).slice(-6);
  if (reasons.length) {
    el.append(line(t("reasons"), ""));
    for (const [k, reason] of reasons) {
      const div = document.createElement("div");
      div.textContent = `  @${k}: ${translateReason(reason)}`;
      el.append(div);
    }
  }
  el.hidden = false;
  const x = Math.min(ev.clientX + 14, window.innerWidth - 440);
  const y = Math.min(ev.clientY + 14, window.innerHeight - el.offsetHeight - 8);
  el.style.left = `${x}px`; el.style.top = `${Math.max(4, y)}px`;
}

export function hideTooltip() { tip().hidden = true; }
