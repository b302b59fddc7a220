"""``prmloop screenshots``: pictures of the Prefect UI in headless Chromium, to check what people see.

Opens the flow runs, deployments and artifacts pages (and the newest version of each loop artifact) of a running
Prefect server (the one ``prmloop up`` or ``prmloop demo`` started, or ``--url``) in Debian's
``chromium`` without a display, and saves one PNG per page. The UI is a single-page application, so
Chromium is given virtual time to run its scripts and fetch from the API before the picture is taken.
A server that asks for basic auth (every one prmloop starts) is opened through a proxy that logs in.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import urllib.request
from pathlib import Path

__all__ = [
    "ARTIFACT_KEYS",
    "PAGES",
    "find_chromium",
    "latest_artifact_ids",
    "page_text",
    "screenshot",
    "take_screenshots",
]

#: Page name -> path under the UI root.
PAGES: dict[str, str] = {
    "flow-runs": "/runs",
    "deployments": "/deployments",
    "artifacts": "/artifacts",
}

#: Artifacts whose latest version gets a picture of its own (``artifact-<key>.png``).
ARTIFACT_KEYS = ("loop-learning-curve", "loop-summary", "loop-per-hour", "prioritize-queue", "sample-per-question")


def latest_artifact_ids(api_url: str, keys: tuple[str, ...] = ARTIFACT_KEYS) -> dict[str, str]:
    """Key -> id of the newest artifact with that key (keys with none are left out); ``api_url``: a
    server that needs no login (the proxy of :func:`take_screenshots`)."""
    found = {}
    for key in keys:
        body = {"artifacts": {"key": {"any_": [key]}}, "sort": "UPDATED_DESC", "limit": 1, "offset": 0}
        request = urllib.request.Request(
            api_url.rstrip("/") + "/artifacts/filter",
            data=json.dumps(body).encode(),
            headers={"content-type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            rows = json.loads(response.read())
        if rows:
            found[key] = str(rows[0]["id"])
    return found


def find_chromium() -> str:
    """The Chromium executable.

    Raises:
        FileNotFoundError: none installed (Debian: ``apt-get install chromium``).
    """
    for name in ("chromium", "chromium-browser", "google-chrome", "headless_shell"):
        path = shutil.which(name)
        if path:
            return path
    raise FileNotFoundError(
        "no Chromium found on the PATH (prmloop screenshots needs a headless browser): install Debian's "
        "package with `apt-get install chromium` (as root), then run the command again"
    )


def _headless(chromium: str | None, wait_ms: int) -> list[str]:
    return [
        chromium or find_chromium(),
        "--headless=new",
        "--no-sandbox",  # root in a container has no user namespace sandbox
        "--disable-gpu",
        "--disable-dev-shm-usage",
        # Nothing beyond this machine answers: Chromium's own background calls would only fail, many at a time.
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-quic",
        "--no-first-run",
        f"--virtual-time-budget={wait_ms}",
    ]


def page_text(url: str, *, chromium: str | None = None, wait_ms: int = 20_000) -> str:
    """The text of ``url`` as the browser renders it, after ``wait_ms`` of virtual time for its scripts
    (the UI fetches what it shows from the API): what a person would read on the page."""
    import html
    import re

    command = [*_headless(chromium, wait_ms), "--dump-dom", url]
    done = subprocess.run(command, capture_output=True, text=True, timeout=wait_ms / 1000 + 90, check=False)
    if done.returncode != 0 or not done.stdout.strip():
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"chromium could not read {url}: {tail[0]}")
    body = re.sub(r"<(script|style)\b.*?</\1>", " ", done.stdout, flags=re.S | re.I)
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", body)).split())


def screenshot(
    url: str, out: Path, *, chromium: str | None = None, wait_ms: int = 20_000, size: str = "1440,1000"
) -> Path:
    """Save a PNG of ``url`` to ``out`` after ``wait_ms`` of virtual time for the page's scripts."""
    out.parent.mkdir(parents=True, exist_ok=True)
    command = [*_headless(chromium, wait_ms), "--hide-scrollbars", f"--window-size={size}", f"--screenshot={out}", url]
    done = subprocess.run(command, capture_output=True, text=True, timeout=wait_ms / 1000 + 90, check=False)
    if done.returncode != 0 or not out.is_file():
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"chromium could not take {url}: {tail[0]}")
    return out


def take_screenshots(
    ui_url: str,
    out_dir: Path,
    *,
    pages: dict[str, str] | None = None,
    wait_ms: int = 20_000,
    auth_string: str | None = None,
) -> dict[str, str]:
    """One PNG per page of the UI at ``ui_url`` (``http://host:port``); returns page name -> file. A
    server that asks for ``auth_string`` is opened through :func:`~prmloop.flows.ops.ui_proxy.authenticating_proxy`."""
    from prmloop.flows.ops.ui_proxy import authenticating_proxy

    chromium = find_chromium()
    with contextlib.ExitStack() as stack:
        root = ui_url.rstrip("/").removesuffix("/api")
        if auth_string:
            root = stack.enter_context(authenticating_proxy(root, auth_string))
        targets = dict(pages or PAGES)
        if pages is None:
            for key, artifact_id in latest_artifact_ids(root + "/api").items():
                targets[f"artifact-{key}"] = f"/artifacts/artifact/{artifact_id}"
        return {
            name: str(screenshot(root + path, out_dir / f"{name}.png", chromium=chromium, wait_ms=wait_ms))
            for name, path in targets.items()
        }
