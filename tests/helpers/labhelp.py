"""A real ``jupyter lab`` in a subprocess, isolated from the user's Jupyter config, with a known token.

With ``extension_under_test=True`` the lab loads the nbtrain extension built beside the nbtrain package
under test (``nbtrain/labextension`` of the checkout on ``PYTHONPATH``), not whichever copy was last
installed into the environment's share/ folder: it is linked into a folder on the lab's ``JUPYTER_PATH``,
which Jupyter searches first.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from helpers import tiers


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class JupyterLab:
    def __init__(self, root: Path, extension_under_test: bool = False, app: str = "jupyterlab") -> None:
        """``extension_under_test``: serve the checkout's own build of the extension (see the module doc);
        otherwise the lab serves whatever the environment has installed. ``app``: the front end's server module,
        ``jupyterlab`` or ``notebook`` (Notebook 7, whose pages load the same prebuilt extensions)."""
        self.root = root
        self.app = app
        self.token = secrets.token_hex(16)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        home = root / "jupyter-home"
        # JUPYTER_PATH is searched before every other data folder (in a virtualenv the environment's own
        # share/jupyter comes before JUPYTER_DATA_DIR), so the extension linked there is the one served.
        jupyter_path = os.pathsep.join(filter(None, [str(home / "path"), os.environ.get("JUPYTER_PATH")]))
        self.env = dict(os.environ, JUPYTER_CONFIG_DIR=str(home / "config"), JUPYTER_DATA_DIR=str(home / "data"),
                        JUPYTER_RUNTIME_DIR=str(home / "runtime"), JUPYTER_PLATFORM_DIRS="1",
                        JUPYTER_PATH=jupyter_path)
        self.notebooks = root / "notebooks"
        self.notebooks.mkdir()
        self.extension = link_built_extension(home / "path" / "labextensions") if extension_under_test else None
        # A notebook attaches to its kernel without asking which; no news pop-up (no network, cleaner pictures).
        if app == "jupyterlab":
            self.user_setting("notebook-extension/tracker", {"autoStartDefaultKernel": True})
            self.user_setting("apputils-extension/notification", {"fetchNews": "false"})
        self.log_path = root / "lab.log"
        self.process: subprocess.Popen | None = None

    def start(self, timeout: float = 90) -> None:
        tiers.starts("a JupyterLab server")
        args = [sys.executable, "-m", self.app, "--no-browser", "--ServerApp.ip=127.0.0.1",
                f"--ServerApp.port={self.port}", "--ServerApp.port_retries=0",
                f"--IdentityProvider.token={self.token}", f"--ServerApp.root_dir={self.notebooks}"]
        if self.app == "jupyterlab":
            args.append(f"--LabApp.workspaces_dir={self.root / 'workspaces'}")
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            args.append("--allow-root")
        self.process = subprocess.Popen(args, env=self.env, stdout=open(self.log_path, "wb"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"jupyter lab exited with {self.process.returncode}:\n{self.log()}")
            try:
                self.api("GET", "api/status")
                return
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.3)
        raise TimeoutError(f"jupyter lab did not answer within {timeout} s:\n{self.log()}")

    def nbtrain_settings(self, values: dict) -> None:
        self._write_settings("nbtrain/plugin", values)

    def user_setting(self, plugin: str, values: dict) -> None:
        self._write_settings(f"@jupyterlab/{plugin}", values)

    def _write_settings(self, plugin_path: str, values: dict) -> None:
        """Lab user settings, as the Settings editor would save them (``<config>/lab/user-settings``)."""
        path = Path(self.env["JUPYTER_CONFIG_DIR"]) / "lab" / "user-settings" / f"{plugin_path}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))

    def api(self, method: str, path: str, body: dict | None = None):
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(f"{self.url}/{path}", data=data, method=method,
                                         headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(request, timeout=10) as response:
            text = response.read()
        return json.loads(text) if text else None

    def start_session(self, path: str) -> dict:
        """Start the notebook's kernel from the server side; the page then attaches to this session (the
        server answers a second session request for the same path with the existing one)."""
        return self.api("POST", "api/sessions", {"path": path, "name": Path(path).name, "type": "notebook",
                                                 "kernel": {"name": "python3"}})

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:] if self.log_path.exists() else ""

    def stop(self) -> None:
        """Shut kernels down through the server, then the server; kill it if it does not go."""
        if self.process is None or self.process.poll() is not None:
            return
        try:
            self.api("POST", "api/shutdown")
            self.process.wait(timeout=20)
        except Exception:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def built_extension() -> Path | None:
    """The checkout's built extension (``nbtrain/labextension``), or None for an installed (wheel) nbtrain.

    Refuses a build older than its TypeScript sources: the browser would test yesterday's panel.
    """
    import nbtrain

    package = Path(nbtrain.__file__).resolve().parent
    built, sources = package / "labextension", package.parent / "labextension"
    if not (built / "package.json").exists():
        if (sources / "src").is_dir():
            raise RuntimeError(f"the extension in {sources} is not built: cd {sources} && jlpm install && "
                               f"jlpm build:prod")
        return None
    if (sources / "src").is_dir():
        newest_source = max(p.stat().st_mtime for d in ("src", "style") for p in (sources / d).iterdir())
        built_at = (built / "package.json").stat().st_mtime
        if newest_source > built_at:
            raise RuntimeError(f"{built} is older than its sources in {sources}: cd {sources} && "
                               f"jlpm build:prod")
    return built


def link_built_extension(labextensions: Path) -> Path | None:
    built = built_extension()
    if built is not None:
        labextensions.mkdir(parents=True, exist_ok=True)
        (labextensions / "nbtrain").symlink_to(built, target_is_directory=True)
    return built


def write_notebook(path: Path, cells: list[str]) -> None:
    notebook = {
        "cells": [{"cell_type": "code", "execution_count": None, "id": f"cell-{i}", "metadata": {}, "outputs": [],
                   "source": source} for i, source in enumerate(cells)],
        "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}},
        "nbformat": 4, "nbformat_minor": 5,
    }
    path.write_text(json.dumps(notebook, indent=1))


CHROMIUM = os.environ.get("NBTRAIN_CHROMIUM", "/usr/bin/chromium")
# Headless Chromium as root, on a machine whose only network is loopback.
LAUNCH_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
               "--disable-sync", "--no-first-run", "--disable-dev-shm-usage"]
DOCS = Path(__file__).resolve().parent.parent.parent / "docs"


def browser_or_skip():
    """Playwright's sync API, or skip the calling test module with the reason (no package, no Chromium)."""
    import shutil

    import pytest

    sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")
    if not (os.path.exists(CHROMIUM) or shutil.which(CHROMIUM)):
        pytest.skip(f"no Chromium at {CHROMIUM} (install it: apt-get install -y chromium)", allow_module_level=True)
    return sync_api


def screenshot_path(name: str, scratch: Path) -> Path:
    """docs/NAME when NBTRAIN_SCREENSHOTS=1 (refreshing the README's pictures), else a scratch copy."""
    return DOCS / name if os.environ.get("NBTRAIN_SCREENSHOTS") else Path(scratch) / name


@contextlib.contextmanager
def lab_page(tmp_path: Path, notebook: str, cells: list[str], viewport: dict, app: str = "jupyterlab"):
    """A JupyterLab (``app="notebook"``: Notebook 7) with the extension under test, ``notebook`` written with
    ``cells`` and a kernel session on it, and a headless Chromium page: ``(lab, page)``. On a failure a screenshot
    and the lab's log are printed; the browser and the lab are stopped however the test ends."""
    sync_api = browser_or_skip()
    lab = JupyterLab(tmp_path, extension_under_test=True, app=app)
    write_notebook(lab.notebooks / notebook, cells)
    lab.start()
    lab.start_session(notebook)
    try:
        with sync_api.sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS, headless=True)
            page = browser.new_page(viewport=viewport)
            try:
                yield lab, page
            except BaseException:
                page.screenshot(path=str(tmp_path / "failure.png"))
                print(f"browser at failure: {tmp_path / 'failure.png'}\njupyter lab log:\n{lab.log()}")
                raise
            finally:
                browser.close()
    finally:
        lab.stop()
