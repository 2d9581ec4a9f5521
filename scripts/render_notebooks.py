"""Render the notebooks for reading without running them: docs/notebooks/NAME.md, with
every cell's source, its printed output and each plotly figure as a PNG beside it.

    PYTHONPATH=. .venv/bin/python scripts/render_notebooks.py [NN_name.ipynb ...]

Each notebook runs top to bottom in a fresh kernel of this interpreter (as
tests/test_notebooks.py runs them); each plotly figure is drawn by Chromium with the
plotly.js of the installed plotly package (offline) and saved as a PNG. The notebooks
themselves stay stored without outputs. The rendering opens with a hash of the
notebook's cell sources, and tests/test_rendered_notebooks.py fails when a notebook has
changed since it was rendered, so the two stay in step. Timings in the rendered outputs are
those of the run that rendered them (the date and machine are written at the top).
"""

from __future__ import annotations

import argparse
import base64
import datetime
import hashlib
import json
import os
import platform
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "notebooks"
CHROMIUM = "/usr/bin/chromium"


def source_hash(nb) -> str:
    """The hash the rendering carries: every cell's type and source, in order."""
    text = json.dumps([[c.cell_type, c.source] for c in nb.cells], ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def execute(path: Path):
    import nbformat
    from nbclient import NotebookClient

    data = tempfile.mkdtemp(prefix="minicb-render-")
    spec = Path(data) / "kernels" / "minicb-render"
    spec.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": "render",
                                                  "language": "python"}))  # fmt: skip
    os.environ["JUPYTER_PATH"] = data
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, kernel_name="minicb-render", timeout=900,
                   resources={"metadata": {"path": str(path.parent)}}).execute()  # fmt: skip
    return nb


def figure_png(browser, figure: dict, path: Path) -> None:
    """Draw a plotly figure (its JSON) in Chromium, offline, and save it as a PNG."""
    import plotly

    js = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    layout = dict(figure.get("layout", {}))
    width, height = 1000, int(layout.get("height") or 450)
    html = (
        f"<html><body style='margin:0'><div id=f></div><script src='{js.as_uri()}'></script>"
        f"<script>Plotly.newPlot('f', {json.dumps(figure.get('data', []))}, "
        f"Object.assign({json.dumps(layout)}, {{width: {width}, height: {height}}}), "
        "{staticPlot: true}).then(() => { document.title = 'drawn'; });</script></body></html>"
    )
    page = browser.new_page(viewport={"width": width, "height": height})
    tmp = Path(tempfile.mkdtemp()) / "figure.html"
    tmp.write_text(html)
    page.goto(tmp.as_uri())
    page.wait_for_function("document.title === 'drawn'", timeout=30_000)
    page.locator("#f").screenshot(path=str(path))
    page.close()


def text_of(output: dict) -> str | None:
    if output.get("output_type") == "stream":
        return output.get("text", "")
    if output.get("output_type") == "error":
        return f"{output.get('ename')}: {output.get('evalue')}"
    data = output.get("data", {})
    if "text/plain" in data and "application/vnd.plotly.v1+json" not in data:
        return data["text/plain"]
    return None


def render(path: Path, browser) -> Path:
    import nbformat

    source = nbformat.read(path, as_version=4)
    nb = execute(path)
    stem = path.stem
    images = OUT / "images"
    images.mkdir(parents=True, exist_ok=True)
    for old in images.glob(f"{stem}-*.png"):
        old.unlink()
    when = datetime.date.today().isoformat()
    lines = [
        f"<!-- source hash: {source_hash(source)} (scripts/render_notebooks.py) -->",
        f"# {path.name}, rendered",
        "",
        f"The notebook [`notebooks/{path.name}`](../../notebooks/{path.name}) with its outputs, "
        f"as one run printed and drew them on {when} ({platform.machine()}, "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}). Counts are "
        "deterministic; timings are that run's. To run it yourself, open the notebook.",
        "",
        f"Notebook [`notebooks/{path.name}`](../../notebooks/{path.name}) 的渲染版本，"
        f"含一次运行（{when}）打印的输出和画出的图。计数是确定的；耗时是那一次运行的。"
        "想自己运行，请打开 notebook。",
        "",
    ]
    figures = 0
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            lines += [cell.source.replace("](../", "](../../"), ""]
            continue
        lines += ["```python", cell.source, "```", ""]
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if "application/vnd.plotly.v1+json" in data:
                figures += 1
                name = f"{stem}-{figures}.png"
                figure_png(browser, data["application/vnd.plotly.v1+json"], images / name)
                lines += [f"![figure {figures}](images/{name})", ""]
            elif "image/png" in data:
                figures += 1
                name = f"{stem}-{figures}.png"
                (images / name).write_bytes(base64.b64decode(data["image/png"]))
                lines += [f"![figure {figures}](images/{name})", ""]
            else:
                text = text_of(output)
                if text and text.strip():
                    lines += ["```text", text.rstrip("\n"), "```", ""]
    out = OUT / f"{stem}.md"
    out.write_text("\n".join(lines), encoding="utf-8")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", help="file names in notebooks/ (default: all)")
    args = parser.parse_args()
    names = args.notebooks or [
        p.name for p in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    ]
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"]
        )
        for name in names:
            print(render(ROOT / "notebooks" / name, browser), flush=True)
        browser.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
