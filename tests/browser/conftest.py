"""Browser tests: real Chromium (Debian's, through Playwright) against a live server.

Each server runs as its own process (``python -m minicb.cli demo ...``), as a user would
start it. Screenshots go to artifacts/screenshots/. Skipped, saying why, when
/usr/bin/chromium is absent (``make test`` installs it).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.helpers import free_port

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "artifacts" / "screenshots"
STARTUP_S = 180  # loading torch and a model on a busy two-core machine


def pytest_collection_modifyitems(config, items):
    for item in items:
        if Path(str(item.fspath)).parent == Path(__file__).parent:
            item.add_marker(pytest.mark.browser)
            if not os.path.exists(CHROMIUM):
                item.add_marker(
                    pytest.mark.skip(reason=f"{CHROMIUM} is absent (make test installs it)")
                )


@pytest.fixture(scope="package")
def chromium():
    """One browser for this package. Package scope, not session: Playwright's sync API keeps
    an event loop running until it stops, and later tests call ``asyncio.run``."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def tab(chromium):
    """A fresh page (named so as not to meet pytest-playwright's own ``page``)."""
    context = chromium.new_context(viewport={"width": 1500, "height": 1000})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda err: errors.append(str(err)))
    page.errors = errors  # checked by the tests: a script error fails them
    yield page
    context.close()


def shot(page, name: str) -> Path:
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = SHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


@contextmanager
def server(*args: str):
    """Run ``minicb ARGS --port P`` until the block ends; yields its address."""
    port = free_port()
    log = open(SHOTS.parent / f"server-{port}.log", "w") if SHOTS.parent.exists() else None
    proc = subprocess.Popen(
        [sys.executable, "-m", "minicb.cli", *args, "--port", str(port)],
        cwd=ROOT,
        stdout=log or subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.time() + STARTUP_S
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"minicb {args[0]} exited with {proc.returncode}")
            try:
                urllib.request.urlopen(url, timeout=2).read()  # the page: open with a key too
                break
            except OSError:
                if time.time() > deadline:
                    raise
                time.sleep(0.3)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if log:
            log.close()


def js(page, expr: str):
    return page.evaluate(expr)


def wait_for(page, expr: str, timeout_s: float = 60.0):
    """Wait until the JS expression is truthy; returns its value."""
    page.wait_for_function(expr, timeout=timeout_s * 1000)
    return page.evaluate(expr)


def next_frame(page) -> None:
    """Wait until the page has drawn two more animation frames: what it holds is painted
    (for a screenshot), without guessing a delay."""
    page.evaluate("new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
