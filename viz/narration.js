// A scenario's lesson on the page (minicb demo --scenario NAME, or the replay of an exported
// one): the menu of lessons, the narration card with back and next, and the highlight of
// the rows a narration point names. The server pauses the engines at each point and sends
// it ("narration"); hello carries the scenario and the points already fired. Texts come in
// both languages from the scenario file and follow the page's language.

import { getLang, t } from "./i18n.js";

const $ = (id) => document.getElementById(id);
// at: the point shown; awaiting: the next point to arrive is shown (set by Next when the
// last one is shown; several points fired in one round are then read one Next at a time)
const lesson = { scenario: null, points: [], at: -1, awaiting: true };

export function scenarioLabel(name) {
  const panel = lesson.scenario && lesson.scenario.panels[name];
  return panel ? panel.label[getLang()] || panel.label.en : null;
}

export function showScenario(app, scenario, canChoose) {
  lesson.scenario = scenario || null;
  lesson.points = scenario ? [...scenario.fired] : [];
  lesson.at = lesson.points.length - 1;
  lesson.awaiting = true;
  $("lesson").hidden = !scenario;
  const pick = $("lesson-pick");
  pick.hidden = !scenario || !canChoose;
  // A disaggregated lesson refuses engine settings (each role runs the lesson's): no form.
  if (canChoose) $("settings-form").hidden = Boolean(scenario) && scenario.settings === false;
  if (scenario && canChoose) {
    pick.replaceChildren(...scenario.choices.map((name) => new Option(name, name)));
    pick.value = scenario.name;
  }
  renderLesson(app);
}

export function onNarration(app, point) {
  lesson.points = lesson.points.filter((p) => p.index !== point.index).concat([point]);
  if (lesson.awaiting) { lesson.at = lesson.points.length - 1; lesson.awaiting = false; }
  app.setPaused(true);
  renderLesson(app);
}

export function renderLesson(app) {
  const s = lesson.scenario;
  if (!s) return;
  const lang = getLang();
  $("lesson-title").textContent = s.title[lang];
  $("lesson-summary").textContent = s.summary[lang];
  const point = lesson.points[lesson.at];
  const text = $("lesson-text");
  text.textContent = point ? point.text[lang] : t("lessonStart");
  text.dataset.index = point ? point.index : "";
  text.lang = lang;
  $("lesson-count").textContent = `${point ? point.index + 1 : 0} / ${s.points}`;
  $("lesson-back").disabled = lesson.at <= 0;
  const done = lesson.points.length >= s.points && lesson.at >= lesson.points.length - 1;
  $("lesson-next").disabled = app.mode === "replay" ? lesson.at >= lesson.points.length - 1 : done;
  highlight(app, point);
  for (const p of app.panels) p.model.version++;
  app.dirty = true;
}

function highlight(app, point) {
  const rows = (point && point.highlight.panels) || {};
  for (const p of app.panels) {
    const lit = new Set(rows[p.name] || []);
    for (const r of p.model.order) r.lit = lit.has(r.id);
    p.el.dataset.lit = [...lit].join(" ");
    p.el.dataset.litBlocks = point && rows[p.name] ? point.highlight.blocks : "none";
    p.el.classList.toggle("lit", lit.size > 0);
  }
  if (app.mode === "replay" && point && app.replay) scrubTo(app, point.round);
}

function scrubTo(app, round) { // the moment the point fired: the end of that iteration
  const ends = app.panels.map((p) => p.model.stepAt(round)).filter(Boolean).map((s) => s.wallEnd);
  if (!ends.length) return;
  app.replay.t = Math.max(...ends);
  app.replay.playing = false;
}

export function wireLesson(app) {
  $("lesson-back").onclick = () => { if (lesson.at > 0) { lesson.at--; renderLesson(app); } };
  $("lesson-next").onclick = () => {
    if (lesson.at < lesson.points.length - 1) { lesson.at++; renderLesson(app); return; }
    if (app.mode !== "replay") { lesson.awaiting = true; app.send({ type: "resume" }); app.setPaused(false); }
  };
  $("lesson-pick").onchange = () => app.send({ type: "scenario", name: $("lesson-pick").value });
}
