// The lecture deck: one slide at a time, English or Chinese, speaker notes on demand.
// Keys: → / space / PageDown next, ← / PageUp back, n notes, l language, Home first.
// The address keeps the place: index.html?lang=zh#5 opens slide 5 in Chinese.
const slides = [...document.querySelectorAll("section.slide")];
const params = new URLSearchParams(location.search);
let lang = params.get("lang") === "zh" ? "zh" : "en";
let index = 0;

function show(i) {
  index = Math.max(0, Math.min(slides.length - 1, i));
  slides.forEach((s, k) => { s.hidden = k !== index; });
  const s = slides[index];
  document.getElementById("where").textContent =
    `${index + 1} / ${slides.length} · ${s.dataset.at} · ${s.dataset.minutes} min`;
  history.replaceState(null, "", `?lang=${lang}#${index + 1}`);
}

function setLang(l) {
  lang = l;
  document.body.dataset.lang = l;
  document.documentElement.lang = l === "zh" ? "zh-CN" : "en";
  document.getElementById("lang").textContent = l === "zh" ? "English" : "中文";
  show(index);
}

document.getElementById("prev").onclick = () => show(index - 1);
document.getElementById("next").onclick = () => show(index + 1);
document.getElementById("lang").onclick = () => setLang(lang === "zh" ? "en" : "zh");
document.getElementById("notes").onclick = () => document.body.classList.toggle("with-notes");
document.addEventListener("keydown", (e) => {
  if (["ArrowRight", " ", "PageDown"].includes(e.key)) show(index + 1);
  else if (["ArrowLeft", "PageUp"].includes(e.key)) show(index - 1);
  else if (e.key === "Home") show(0);
  else if (e.key === "n") document.body.classList.toggle("with-notes");
  else if (e.key === "l") setLang(lang === "zh" ? "en" : "zh");
  else return;
  e.preventDefault();
});
index = Math.max(0, (parseInt(location.hash.slice(1), 10) || 1) - 1);
setLang(lang);
window.deck = { slides, show, setLang, get index() { return index; }, get lang() { return lang; } };
