"""JupyterLab in a real browser: every notebook opens, renders and runs its first code cell.

The test starts JupyterLab as a subprocess it owns (loopback only, a free port, a random token, the
workshop settings of jupyter-config/ on its config path, every other Jupyter folder in a temporary
directory), opens each notebook of notebooks/ in headless Chromium driven by Playwright, and checks
what a participant sees: the cells are there, no error dialog and no news question, a kernel starts,
the first code cell runs (execution count [1], its output, the kernel idle again). A screenshot of
the first notebook is kept as an artifact: under $WORKBOOK_ARTIFACTS when set, else in pytest's
temporary directory; the path is printed. The server is stopped through its own process handle.

Chromium is Debian's `chromium` package (Playwright's own browser download is not used); .ci/run
installs it when missing. Without chromium or playwright the browser test is skipped, except in CI
(CI=true), where it fails and says what is missing.

The notebooks are served from a copy, so nothing the browser does (autosave included) can touch the
files in notebooks/.
"""
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
CONFIG = ROOT / "jupyter-config"
IN_CI = os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")

SERVER_START_S = 180     # a loaded 2-core machine needs tens of seconds to import and start JupyterLab
PAGE_S = 120             # JupyterLab's page and the notebook's cells
KERNEL_S = 240           # a kernel starts, imports torch + triton + workbook and runs the first cell
STOP_S = 20              # terminate, then kill


# A notebook the test adds to the served copy, whose first code cell raises: the browser checks must
# report it, which proves they can fail.
CONTROL = "zz_control_first_cell_raises.ipynb"
CONTROL_NB = {
    "cells": [
        {"cell_type": "markdown", "metadata": {}, "source": ["# Control: the first code cell raises"]},
        {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [],
         "source": ["raise RuntimeError('the control notebook fails on purpose')"]},
    ],
    "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}},
    "nbformat": 4, "nbformat_minor": 5,
}


def _chromium():
    return shutil.which("chromium") or shutil.which("chromium-browser")


def _browser_or_skip():
    """Playwright's sync API and the chromium executable, or skip (fail in CI) naming what is missing."""
    missing = []
    try:
        from playwright import sync_api
    except ImportError:
        sync_api = None
        missing.append("the Python package playwright (python3 -m pip install -r requirements.txt)")
    chromium = _chromium()
    if chromium is None:
        missing.append("Debian's chromium on PATH (apt-get install -y --no-install-recommends chromium; "
                       ".ci/run installs it)")
    if missing:
        msg = "the JupyterLab browser test needs " + " and ".join(missing)
        if IN_CI:
            pytest.fail(msg + ". CI=true: this test must run in CI, so it fails instead of skipping.")
        pytest.skip(msg)
    return sync_api, chromium


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get_json(url, timeout=10):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


def _first_code_cell(nb):
    return next(c for c in nb["cells"] if c["cell_type"] == "code")


class Lab:
    """A running JupyterLab: url, token, the folder it serves, its log."""

    def __init__(self, url, token, root, log, printed_output):
        self.url, self.token, self.root, self.log = url, token, root, log
        self.printed_output = printed_output   # notebook -> whether its first code cell prints

    def api(self, path):
        return _get_json(f"{self.url}{path}?token={self.token}")

    def log_tail(self, n=3000):
        return self.log.read_text(errors="replace")[-n:]

    def shut_down_kernel(self, name):
        """Delete the session (and so the kernel) of notebook `name`."""
        for s in self.api("/api/sessions"):
            if s["path"] == name:
                req = urllib.request.Request(f"{self.url}/api/sessions/{s['id']}?token={self.token}",
                                             method="DELETE")
                urllib.request.urlopen(req, timeout=STOP_S).close()


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """JupyterLab serving a copy of notebooks/, as a workshop starts it (JUPYTER_CONFIG_PATH)."""
    base = tmp_path_factory.mktemp("jupyterlab")
    root = base / "notebooks"
    shutil.copytree(ROOT / "notebooks", root, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    # The copies' first code cells start without their recorded run, so [1] and the output that the
    # browser test waits for can only come from the kernel it starts.
    printed_output = {}
    for path in sorted(root.glob("*.ipynb")):
        nb = json.loads(path.read_text())
        cell = _first_code_cell(nb)
        printed_output[path.name] = bool(cell["outputs"])
        cell["execution_count"], cell["outputs"] = None, []
        path.write_text(json.dumps(nb))
    (root / CONTROL).write_text(json.dumps(CONTROL_NB))
    printed_output[CONTROL] = False

    # One user setting of the test's own: JupyterLab attaches only the cells in view ("full"
    # windowing) instead of rendering every cell of every notebook, which costs a 2-core machine
    # more Chromium time than the kernels take. The workshop settings under test are untouched.
    tracker = base / "user-settings" / "@jupyterlab" / "notebook-extension"
    tracker.mkdir(parents=True)
    (tracker / "tracker.jupyterlab-settings").write_text(json.dumps({"windowingMode": "full"}))

    port, token = _free_port(), secrets.token_hex(24)
    env = dict(os.environ)
    env.update(
        JUPYTER_CONFIG_PATH=str(CONFIG),                     # the workshop settings under test
        JUPYTER_CONFIG_DIR=str(base / "config"),             # not the user's ~/.jupyter
        JUPYTER_RUNTIME_DIR=str(base / "runtime"),
        JUPYTERLAB_SETTINGS_DIR=str(base / "user-settings"),
        JUPYTERLAB_WORKSPACES_DIR=str(base / "workspaces"),
    )
    log = base / "server.log"
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root",
           "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
           f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}"]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, env=env, cwd=base, stdout=out, stderr=subprocess.STDOUT)
    server = Lab(f"http://127.0.0.1:{port}", token, root, log, printed_output)
    try:
        deadline = time.monotonic() + SERVER_START_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"JupyterLab exited with code {proc.returncode} before serving:\n"
                            f"{server.log_tail()}")
            try:
                server.api("/api/status")
                break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                if time.monotonic() > deadline:
                    pytest.fail(f"JupyterLab did not answer within {SERVER_START_S} s:\n"
                                f"{server.log_tail()}")
                time.sleep(0.25)
        yield server
    finally:
        proc.terminate()                     # SIGTERM: the server shuts its kernels down and exits
        try:
            proc.wait(timeout=STOP_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=STOP_S)


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    where = os.environ.get("WORKBOOK_ARTIFACTS")
    if where:
        path = Path(where).resolve()
        path.mkdir(parents=True, exist_ok=True)
        return path
    return tmp_path_factory.mktemp("artifacts")


class BrowserSession:
    """One JupyterLab page in headless Chromium, as a participant uses it: each notebook is opened
    from the file browser, its first code cell run with Shift+Enter. Up to IN_FLIGHT notebooks are
    open at a time, so one kernel's start-up overlaps the next notebook's rendering; each is then
    checked, saved (to the copy), closed, and its kernel shut down."""

    IN_FLIGHT = 3

    def __init__(self, sync_api, page, lab, artifacts):
        self.expect, self.page, self.lab, self.artifacts = sync_api.expect, page, lab, artifacts
        self.problems = {}        # notebook name -> what went wrong (empty: all checks passed)
        self.open = {}            # notebook name -> (its tab's widget id, start time, first code cell)
        self.js_errors = []
        page.on("pageerror", lambda e: self.js_errors.append(str(e)))

    def start(self):
        self.page.goto(f"{self.lab.url}/lab?reset&token={self.lab.token}", timeout=PAGE_S * 1000)
        self.expect(self.page.locator(".jp-DirListing-item").first).to_be_visible(timeout=PAGE_S * 1000)

    def run_all(self, names):
        queue = []
        for name in names:
            self._step(name, self._open_and_run)
            queue.append(name)
            if len(queue) == self.IN_FLIGHT:
                self._step(queue.pop(0), self._check_and_close)
        for name in queue:
            self._step(name, self._check_and_close)

    def _step(self, name, fn):
        if self.problems.get(name):
            return                # an earlier step failed: its message is the one to report
        n_errors = len(self.js_errors)
        try:
            fn(name)
        except Exception as e:    # noqa: BLE001 (any failure is reported under the notebook's test)
            self.problems.setdefault(name, []).append(f"{type(e).__name__}: {e}")
        self.problems.setdefault(name, [])
        if len(self.js_errors) > n_errors:
            self.problems[name].append(f"uncaught errors in the page: {self.js_errors[n_errors:]}")
        if self.page.locator(".jp-Dialog").count():
            self.problems[name].append(f"a dialog is open: {self.page.locator('.jp-Dialog').first.inner_text()}")
            self.page.keyboard.press("Escape")
        if self.page.get_by_text("official Jupyter news").count():
            self.problems[name].append("JupyterLab asks whether to fetch news: the workshop settings "
                                       "of jupyter-config/ were not applied")

    def _panel(self, name):
        return self.page.locator(f"[id='{self.open[name][0]}']")

    def _tab(self, name):
        return self.page.locator(f"#jp-main-dock-panel .lm-TabBar-tab[data-id='{self.open[name][0]}']")

    def _open_and_run(self, name):
        page, expect = self.page, self.expect
        t0 = time.monotonic()
        page.locator(".jp-DirListing-item").filter(has=page.get_by_text(name, exact=True)).dblclick()
        tab = page.locator("#jp-main-dock-panel .lm-TabBar-tab.lm-mod-current")
        expect(tab).to_have_text(name)
        self.open[name] = (tab.get_attribute("data-id"), t0)
        panel = self._panel(name)
        nb = json.loads((self.lab.root / name).read_text())

        # it renders: the first cell is shown; the status bar counts all of the notebook's cells
        expect(panel.locator(".jp-Cell").first).to_be_visible()
        expect(page.locator(".jp-StatusBar-Widget").get_by_text(
            re.compile(rf"^Cell \d+/{len(nb['cells'])}$"))).to_be_visible()

        # a kernel starts: the status bar's kernel item for this notebook says Idle
        expect(page.locator(f".jp-StatusBar-TextItem[title='Change kernel for {name}']")).to_have_text(
            re.compile(r"\| Idle$"), timeout=KERNEL_S * 1000)

        # run the first code cell as a participant does: select it (a click on the first cell, then
        # Down in command mode), Shift+Enter
        index = next(i for i, c in enumerate(nb["cells"]) if c["cell_type"] == "code")
        panel.locator(".jp-Cell").first.locator(".jp-InputPrompt").click()
        page.keyboard.press("Escape")
        for _ in range(index):
            page.keyboard.press("ArrowDown")
        cell = panel.locator(f".jp-Cell[data-windowed-list-index='{index}']")
        expect(cell).to_have_class(re.compile(r"\bjp-mod-active\b"))
        expect(cell.locator(".jp-InputPrompt")).to_have_text("[ ]:")
        page.keyboard.press("Shift+Enter")
        self.open[name] += (index,)

    def _check_and_close(self, name):
        page, expect = self.page, self.expect
        panel, tab = self._panel(name), self._tab(name)
        _, t0, index = self.open[name]
        tab.click()
        expect(panel).to_be_visible()
        cell = panel.locator(f".jp-Cell[data-windowed-list-index='{index}']")
        expect(cell.locator(".jp-InputPrompt")).to_have_text("[1]:", timeout=KERNEL_S * 1000)
        expect(page.locator(f".jp-StatusBar-TextItem[title='Change kernel for {name}']")).to_have_text(
            re.compile(r"\| Idle$"), timeout=KERNEL_S * 1000)
        if self.lab.printed_output[name]:
            expect(cell.locator(".jp-OutputArea-output").first).to_be_visible()
        ran_s = time.monotonic() - t0

        if name == NOTEBOOKS[0].name:
            cell.scroll_into_view_if_needed()
            shot = self.artifacts / f"jupyterlab_{Path(name).stem}.png"
            page.screenshot(path=str(shot))
            print(f"\n[test_jupyterlab] screenshot of {name} in JupyterLab: {shot}")

        print(f"[test_jupyterlab] {name}: opened, kernel started, first code cell ran: {ran_s:.1f} s "
              f"(up to {self.IN_FLIGHT} notebooks at a time)")

        # save (to the copy): the tab then closes without asking, and the file holds what the
        # browser's notebook holds, error outputs included (JupyterLab shows them like stderr)
        page.keyboard.press("Control+s")
        expect(tab).not_to_have_class(re.compile(r"\bjp-mod-dirty\b"))
        saved = json.loads((self.lab.root / name).read_text())["cells"][index]
        assert saved["execution_count"] == 1, f"saved execution count {saved['execution_count']}"
        errors = [o for o in saved["outputs"] if o["output_type"] == "error"]
        assert not errors, (f"the first code cell raised {errors[0]['ename']}: {errors[0]['evalue']}\n"
                            f"{cell.inner_text()}")
        tab.locator(".lm-TabBar-tabCloseIcon").click()
        expect(tab).to_have_count(0)
        self.lab.shut_down_kernel(name)


@pytest.fixture(scope="module")
def browser_results(lab, artifacts):
    """Open every notebook in one JupyterLab page; what went wrong, per notebook."""
    sync_api, chromium = _browser_or_skip()
    sync_api.expect.set_options(timeout=PAGE_S * 1000)   # every wait is bounded; none by 5 s
    t0 = time.monotonic()
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, headless=True, timeout=PAGE_S * 1000)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.set_default_timeout(PAGE_S * 1000)
            session = BrowserSession(sync_api, page, lab, artifacts)
            session.start()
            session.run_all([p.name for p in NOTEBOOKS] + [CONTROL])
        finally:
            browser.close()
    print(f"[test_jupyterlab] {len(NOTEBOOKS)} notebooks and the control in the browser: "
          f"{time.monotonic() - t0:.1f} s")
    return session.problems


def test_workshop_settings_resolve(lab):
    """The server hands the browser the settings of jupyter-config/lab/settings/overrides.json as
    defaults, and makes no news or update request of its own."""
    notif = lab.api("/lab/api/settings/@jupyterlab/apputils-extension:notification")["schema"]
    assert notif["properties"]["fetchNews"]["default"] == "false", "the news question would be asked"
    assert notif["properties"]["checkForUpdates"]["default"] is False
    tracker = lab.api("/lab/api/settings/@jupyterlab/notebook-extension:tracker")["schema"]
    assert tracker["properties"]["codeCellConfig"]["default"]["lineNumbers"] is True
    assert lab.api("/lab/api/news") == {"news": []}
    assert lab.api("/lab/api/update") == {"notification": None}


@pytest.mark.parametrize("name", [p.name for p in NOTEBOOKS])
def test_notebook_in_browser(name, browser_results):
    """It renders (every cell, no dialog, no news question, no uncaught error in the page), a kernel
    starts, and the first code cell runs: [1], its output, the kernel idle again."""
    assert not browser_results[name], f"{name} in JupyterLab:\n" + "\n".join(browser_results[name])


def test_browser_checks_can_fail(browser_results):
    """The control notebook's first code cell raises: the same checks must report it."""
    problems = browser_results[CONTROL]
    assert any("the first code cell raised" in p and "the control notebook fails on purpose" in p
               for p in problems), f"the failing control notebook passed the browser checks: {problems}"
