"""A real browser: JupyterLab in headless Chromium runs a notebook with ``vitviz.explore_attention``.

JupyterLab listens on a free loopback port with a random token and a temporary root folder; Chromium is Debian's
``/usr/bin/chromium`` (``$VITVIZ_CHROMIUM``) driven by Playwright (no ``playwright install``). The test runs all
cells, moves the layer slider with the keyboard, and checks that the ``<img>`` of the widget now holds other PNG
bytes; then it clicks the image and checks that the query patch followed. Everything has a bounded timeout and
JupyterLab is shut down in ``finally``. ``make test-browser`` installs what it needs and runs it.
"""

from __future__ import annotations

import base64
import importlib.util
import io
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import nbformat
import pytest
from conftest import skip_or_fail
from PIL import Image

from vitviz.widgets._render import colorbar

pytestmark = [pytest.mark.browser, pytest.mark.timeout(900)]

CHROMIUM = os.environ.get("VITVIZ_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
START_S, KERNEL_S, RUN_S, UPDATE_S = 120, 120, 300, 60
NOTEBOOK_CELLS = [
    "import skimage.data\n\nimport vitviz\n\n"
    "model = vitviz.load_model_or_random('cifar10-vit', device='cpu')  # trained if the checkpoint is there",
    "explorer = vitviz.explore_attention(model, skimage.data.chelsea(), size=256)\nexplorer",
]
IMG = "img.vitviz-image"
PNG_OF = """async (sel) => {
    const img = document.querySelector(sel);
    const bytes = new Uint8Array(await (await fetch(img.src)).arrayBuffer());
    let s = ''; for (const b of bytes) s += String.fromCharCode(b);
    return {src: img.src, data: btoa(s)};
}"""


def _missing() -> str | None:
    for module in ("playwright", "jupyterlab", "ipywidgets"):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed (make install-browser)"
    if not os.access(CHROMIUM, os.X_OK):
        return f"no Chromium at {CHROMIUM} (make install-browser, or set VITVIZ_CHROMIUM)"
    return None


@pytest.fixture(autouse=True)
def _needs_browser():
    skip_or_fail(_missing())


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(condition: Callable[[], object], timeout: float, what: str, interval: float = 0.5) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"waited {timeout:.0f} s for {what}")


def api(base: str, token: str, path: str, method: str = "GET") -> object | None:
    req = urllib.request.Request(f"{base}/api/{path}", method=method, headers={"Authorization": f"token {token}"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            body = r.read()
            return json.loads(body) if body else {}
    except OSError:
        return None


@contextmanager
def jupyterlab(root: Path, work: Path) -> Iterator[tuple[str, str, Path]]:
    """JupyterLab on ``127.0.0.1:<free port>`` serving ``root``; yields ``(base_url, token, log)``."""
    port, token = free_port(), secrets.token_hex(16)
    env = {**os.environ}
    env.pop("MPLBACKEND", None)  # the kernel inherits it: Agg would hide inline figures
    for var, sub in (("JUPYTER_CONFIG_DIR", "config"), ("JUPYTER_RUNTIME_DIR", "runtime"),
                     ("JUPYTERLAB_SETTINGS_DIR", "settings"), ("JUPYTERLAB_WORKSPACES_DIR", "workspaces")):
        env[var] = str(work / sub)
    news = work / "settings" / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    news.parent.mkdir(parents=True)
    news.write_text(json.dumps({"fetchNews": "false", "checkForUpdates": False}))  # no news pop-up
    log = work / "jupyterlab.log"
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
           "--port-retries=0", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
           "--allow-root", "--LabApp.news_url=None", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
           "--LabApp.extension_manager=readonly"]
    base = f"http://127.0.0.1:{port}"
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_for(lambda: proc.poll() is not None or api(base, token, "status") is not None, START_S,
                     "JupyterLab to start")
            assert proc.poll() is None, f"JupyterLab exited:\n{log.read_text()[-3000:]}"
            yield base, token, log
        finally:
            api(base, token, "shutdown", method="POST")  # also shuts the kernels down
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(timeout=15)


def kernel_idle(base: str, token: str) -> bool:
    kernels = api(base, token, "kernels") or []
    return bool(kernels) and all(k.get("execution_state") == "idle" for k in kernels)


def run_all_cells(page) -> None:
    """JupyterLab's Run > Run All Cells; the command palette when the menu is not found."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        page.click(".lm-MenuBar-itemLabel:text-is('Run')", timeout=15_000)
        page.click("li.lm-Menu-item:has(.lm-Menu-itemLabel:text-is('Run All Cells'))", timeout=15_000)
    except PlaywrightTimeout:
        page.keyboard.press("Escape")
        page.keyboard.press("Control+Shift+C")
        page.keyboard.type("Run All Cells")
        page.keyboard.press("Enter")


def shown_png(page) -> tuple[str, bytes]:
    got = page.evaluate(PNG_OF, IMG)
    return got["src"], base64.b64decode(got["data"])


def wait_new_png(page, old_src: str, timeout_s: float) -> bool:
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        page.wait_for_function("([sel, old]) => { const i = document.querySelector(sel); return i && i.src && "
                               "i.src !== old; }", arg=[IMG, old_src], timeout=timeout_s * 1000)
        return True
    except PlaywrightTimeout:
        return False


def test_explore_attention_updates_in_jupyterlab(tmp_path):
    from playwright.sync_api import sync_playwright

    root = tmp_path / "root"
    root.mkdir()
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in NOTEBOOK_CELLS])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    nbformat.write(nb, root / "explore.ipynb")
    shot = tmp_path / "jupyterlab_explore_attention.png"
    with jupyterlab(root, tmp_path) as (base, token, log), sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS, timeout=60_000)
        page = None
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 820})
            page.set_default_timeout(60_000)
            page.goto(f"{base}/lab/tree/explore.ipynb?token={token}", timeout=90_000)
            page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=START_S * 1000)
            wait_for(lambda: kernel_idle(base, token), KERNEL_S, "the kernel to start")
            run_all_cells(page)
            page.wait_for_selector(f"{IMG}[src^='blob:'], {IMG}[src^='data:']", timeout=RUN_S * 1000)
            wait_for(lambda: kernel_idle(base, token), RUN_S, "the cells to finish")
            src, before = shown_png(page)
            with Image.open(io.BytesIO(before)) as im:  # the 256x256 map, then its labelled colour bar
                bar = colorbar(256, "inferno", ticks=((0.0, "0"), (1.0, "1")))
                assert im.format == "PNG" and im.size == (256 + bar.shape[1], 256)
            readout = page.locator(".vitviz-layer .widget-readout")
            layer_before = readout.inner_text()

            page.locator(".vitviz-layer .noUi-handle").focus()  # keyboard first, then a drag
            page.keyboard.press("ArrowLeft")
            if not wait_new_png(page, src, UPDATE_S):
                handle = page.locator(".vitviz-layer .noUi-handle").bounding_box()
                track = page.locator(".vitviz-layer .noUi-base").bounding_box()
                page.mouse.move(handle["x"] + handle["width"] / 2, handle["y"] + handle["height"] / 2)
                page.mouse.down()
                page.mouse.move(track["x"] + 1, handle["y"] + handle["height"] / 2, steps=8)
                page.mouse.up()
                assert wait_new_png(page, src, UPDATE_S), "moving the layer slider did not change the image"
            src, after = shown_png(page)
            assert after != before, "the widget's <img> src changed but its PNG bytes did not"
            assert readout.inner_text() != layer_before

            if importlib.util.find_spec("ipyevents") is not None:  # a click picks the query patch
                page.locator(IMG).click(position={"x": 4, "y": 4})
                assert wait_new_png(page, src, UPDATE_S), "clicking the image did not change it"
                assert page.locator(".vitviz-row .widget-readout").inner_text() == "1"  # row 0, shown from 1
                assert page.locator(".vitviz-col .widget-readout").inner_text() == "1"
                assert page.locator(".vitviz-query select").input_value() == "patch (row, col)"
            wait_for(lambda: kernel_idle(base, token), UPDATE_S, "the kernel to settle")
            page.locator(".vitviz-explorer").scroll_into_view_if_needed()
            page.screenshot(path=str(shot))
        except Exception:
            if page is not None:
                page.screenshot(path=str(tmp_path / "failure.png"))
            print(log.read_text(errors="replace")[-4000:])
            raise
        finally:
            browser.close()
    assert shot.stat().st_size > 10_000
    if os.environ.get("VITVIZ_BROWSER_OUT"):
        out = Path(os.environ["VITVIZ_BROWSER_OUT"])
        out.mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, out / shot.name)
