"""Fixtures for the browser test: a private JupyterLab server and a headless Chromium page.

The server runs from this interpreter's environment, on 127.0.0.1, a free port and a
random token, with its own config/data/settings directories and a temporary root that
holds a copy of ``playground.ipynb``; teardown shuts down its kernels and then stops the
server by its PID. Nothing here runs unless browser tests were asked for (``-m browser``).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Dict, Iterator

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
ARTIFACTS = REPO / "test-artifacts"
CHROMIUM = Path(os.environ.get("PAGED_KV_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SERVER_START_TIMEOUT_S = 90

# User settings that keep the page quiet and every cell rendered: no news or update
# toasts over the notebook, no "Select Kernel" dialog (start the notebook's own kernel),
# and no windowing (off-screen cells would not be in the DOM).
LAB_SETTINGS = {
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {
        "fetchNews": "false",
        "checkForUpdates": False,
    },
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {
        "windowingMode": "none",
        "autoStartDefaultKernel": True,
    },
}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _api(base: str, path: str, token: str, method: str = "GET") -> object:
    request = urllib.request.Request(f"{base}{path}", method=method,
                                     headers={"Authorization": f"token {token}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        body = response.read()
    return json.loads(body) if body else None


@pytest.fixture(scope="session")
def browser_enabled(request: pytest.FixtureRequest) -> None:
    """Skip unless ``-m browser`` selected these tests and their tools are installed."""
    if "browser" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("browser tests run only with `-m browser` (make test-browser)")
    if not CHROMIUM.exists():
        pytest.skip(f"no Chromium at {CHROMIUM}: install the system package (apt-get install -y chromium)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        pytest.skip("the playwright package is missing: pip install -e .[browser]")
    try:
        import jupyterlab  # noqa: F401
    except ImportError:
        pytest.skip("jupyterlab is missing: pip install -e .[dev]")


@pytest.fixture(scope="session")
def jupyter_server(browser_enabled: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dict[str, str]]:
    """A running JupyterLab with ``playground.ipynb`` and a copy of ``lessons/`` in its root:
    yields base url, token and root."""
    home = tmp_path_factory.mktemp("jupyter")
    root = home / "root"
    root.mkdir()
    shutil.copy(HERE / "playground.ipynb", root / "playground.ipynb")
    # The lessons as a fresh clone has them (stored outputs, no kernel state yet).
    shutil.copytree(REPO / "lessons", root / "lessons")
    shutil.copytree(REPO / "benchmarks", root / "benchmarks")  # lessons 06 and 09 time with these
    settings = home / "settings"
    for name, values in LAB_SETTINGS.items():
        path = settings / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    env = dict(os.environ)
    env.update(
        JUPYTER_CONFIG_DIR=str(home / "config"),
        JUPYTER_DATA_DIR=str(home / "data"),
        JUPYTER_RUNTIME_DIR=str(home / "runtime"),
        JUPYTERLAB_SETTINGS_DIR=str(settings),
        JUPYTERLAB_WORKSPACES_DIR=str(home / "workspaces"),
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])),
    )
    port, token = _free_port(), secrets.token_hex(16)
    cmd = [
        sys.executable, "-m", "jupyterlab", "--no-browser",
        "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
        "--ServerApp.terminals_enabled=False",
    ]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")
    ARTIFACTS.mkdir(exist_ok=True)
    log_path = ARTIFACTS / "jupyter-server.log"
    base = f"http://127.0.0.1:{port}"
    with open(log_path, "wb") as log:
        server = subprocess.Popen(cmd, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + SERVER_START_TIMEOUT_S
            while True:
                if server.poll() is not None:
                    pytest.fail(f"jupyter lab exited with {server.returncode}; see {log_path}")
                try:
                    _api(base, "/api/status", token)
                    break
                except (urllib.error.URLError, ConnectionError, OSError):
                    if time.monotonic() > deadline:
                        pytest.fail(f"jupyter lab did not answer within {SERVER_START_TIMEOUT_S} s; see {log_path}")
                    time.sleep(0.5)
            yield {"base": base, "token": token, "root": str(root)}
        finally:
            try:
                for kernel in _api(base, "/api/kernels", token) or []:
                    _api(base, f"/api/kernels/{kernel['id']}", token, method="DELETE")
            except (urllib.error.URLError, OSError):
                pass
            if server.poll() is None:
                server.send_signal(signal.SIGTERM)
                try:
                    server.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    server.kill()
                    server.wait(timeout=10)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    """Remember whether a test's body failed, so ``page`` can keep a screenshot of it."""
    outcome = yield
    report = outcome.get_result()
    if report.when == "call":
        item.stash[_FAILED] = report.failed


_FAILED = pytest.StashKey[bool]()


@pytest.fixture
def page(jupyter_server: Dict[str, str], request: pytest.FixtureRequest):
    """A fresh headless Chromium page (big enough to show the whole playground)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(viewport={"width": 1400, "height": 1500})
            tab = context.new_page()
            tab.set_default_timeout(30_000)
            yield tab
            if request.node.stash.get(_FAILED, False):
                ARTIFACTS.mkdir(exist_ok=True)
                tab.screenshot(path=str(ARTIFACTS / f"{request.node.name}-failure.png"), full_page=True)
        finally:
            browser.close()
