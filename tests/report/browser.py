"""Debian's `chromium`, headless, driven over the DevTools protocol: load a page, read it, screenshot it.

`inspect_page(page, screenshot)` starts `chromium --headless --remote-debugging-port=0`
on the file, waits for the page's load event, decodes every <img> in the browser
(`HTMLImageElement.decode()`, which fails for a broken or missing image), reads each
<figure>'s data attributes, writes a full-page PNG screenshot and stops the browser.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

CHROMIUM = "chromium"
START_TIMEOUT_S = 30.0
CALL_TIMEOUT_S = 30.0
GROUP_EXIT_TIMEOUT_S = 5.0  # Chromium's helpers, killed, gone before the profile is removed
WIDTH = 1100

READ_PAGE_JS = """
Promise.all(Array.from(document.images).map(img => img.decode().then(() => true, () => false)
  .then(ok => ({src: img.getAttribute('src'), decoded: ok,
               width: img.naturalWidth, height: img.naturalHeight}))))
.then(images => ({
  images,
  figures: Array.from(document.querySelectorAll('figure')).map(f => ({
    key: f.dataset.figure, points: Number(f.dataset.points), empty: f.dataset.empty,
    caption: f.querySelector('figcaption').textContent, images: f.querySelectorAll('img').length})),
  title: document.title,
  height: document.documentElement.scrollHeight,
}))
"""


@dataclass(frozen=True)
class PageView:
    title: str
    images: list[dict[str, Any]]  # src, decoded, width, height (natural size)
    figures: list[dict[str, Any]]  # key, points, empty, caption, images


def chromium_path() -> str | None:
    return shutil.which(CHROMIUM)


def inspect_page(page: Path, screenshot: Path) -> PageView:
    """Load `page` in headless Chromium; returns what the browser saw and writes `screenshot`."""
    binary = chromium_path()
    if binary is None:
        raise RuntimeError("chromium is not installed: run scripts/setup_system.sh")
    with tempfile.TemporaryDirectory(prefix="rollstream-chromium-") as profile:
        args = [
            binary,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--hide-scrollbars",
            f"--user-data-dir={profile}",
            "--remote-debugging-port=0",
            f"--window-size={WIDTH},900",
            "about:blank",
        ]
        # its own process group: Chromium's helpers (crashpad, renderers) outlive the browser
        # process and kept writing into the profile while it was removed ("Directory not empty")
        process = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        try:
            port = _devtools_port(Path(profile), process)
            return asyncio.run(_drive(port, page.resolve().as_uri(), screenshot))
        finally:
            _stop_group(process)


def _stop_group(process: subprocess.Popen[bytes]) -> None:
    """Stop the browser, then every process left in its group, before its profile is removed."""
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    deadline = time.monotonic() + GROUP_EXIT_TIMEOUT_S
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
        while time.monotonic() < deadline:
            os.killpg(process.pid, 0)  # raises once the group is gone
            time.sleep(0.05)


def _devtools_port(profile: Path, process: subprocess.Popen[bytes]) -> int:
    marker = profile / "DevToolsActivePort"
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"chromium exited with {process.returncode} before opening DevTools")
        if marker.exists() and (lines := marker.read_text().splitlines()):
            return int(lines[0])
        time.sleep(0.05)
    raise RuntimeError(f"chromium did not open DevTools within {START_TIMEOUT_S:.0f} s")


async def _drive(port: int, url: str, screenshot: Path) -> PageView:
    async with aiohttp.ClientSession() as http:
        target = await _page_target(http, port)
        async with http.ws_connect(target, max_msg_size=0) as ws:
            devtools = _DevTools(ws)
            await devtools.call("Page.enable")
            await devtools.call("Page.navigate", url=url)
            await devtools.event("Page.loadEventFired")
            result = await devtools.call(
                "Runtime.evaluate", expression=READ_PAGE_JS, awaitPromise=True, returnByValue=True
            )
            if "exceptionDetails" in result:
                raise RuntimeError(f"page script failed: {result['exceptionDetails']}")
            seen = result["result"]["value"]
            await devtools.call(
                "Emulation.setDeviceMetricsOverride",
                width=WIDTH,
                height=int(seen["height"]),
                deviceScaleFactor=1,
                mobile=False,
            )
            shot = await devtools.call("Page.captureScreenshot", format="png")
            screenshot.parent.mkdir(parents=True, exist_ok=True)
            screenshot.write_bytes(base64.b64decode(shot["data"]))
    return PageView(title=seen["title"], images=seen["images"], figures=seen["figures"])


class _DevTools:
    """Calls and events on one DevTools WebSocket (events seen while waiting are kept)."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.ids = itertools.count(1)
        self.events: list[str] = []

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        number = next(self.ids)
        await self.ws.send_str(json.dumps({"id": number, "method": method, "params": params}))
        reply = await self._until(lambda message: message.get("id") == number, method)
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error']}")
        return dict(reply["result"])

    async def event(self, name: str) -> None:
        if name not in self.events:
            await self._until(lambda message: message.get("method") == name, name)

    async def _until(self, wanted: Any, what: str) -> dict[str, Any]:
        async with asyncio.timeout(CALL_TIMEOUT_S):
            async for frame in self.ws:
                message = json.loads(frame.data)
                if "method" in message:
                    self.events.append(message["method"])
                if wanted(message):
                    return dict(message)
        raise RuntimeError(f"DevTools closed while waiting for {what}")


async def _page_target(http: aiohttp.ClientSession, port: int) -> str:
    """The DevTools WebSocket URL of the browser's tab (it may take a moment to appear)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        async with http.get(f"http://127.0.0.1:{port}/json/list") as response:
            targets = await response.json()
        pages = [t for t in targets if t.get("type") == "page"]
        if pages:
            return str(pages[0]["webSocketDebuggerUrl"])
        await asyncio.sleep(0.05)
    raise RuntimeError("chromium never showed the page")
