"""Headless Chromium driven over the DevTools protocol: what a page shows, and where.

:class:`Browser` starts ``chromium --headless=new`` with a fresh profile and a fixed window,
talks to its page over DevTools (the ``websockets`` client), loads a URL and waits until a
text appears; :meth:`Browser.top_of` gives the y coordinate (CSS pixels from the top of the
page, as first shown, no scrolling) of the first visible element whose text contains a string,
so a test can assert that a figure is on the first screen.  :meth:`Browser.screenshot` writes
what the window shows as a PNG.
"""
from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
from typing import Optional

CHROMIUM = os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")

# the top (CSS px) of the first element with a box whose own text contains the needle
_TOP_OF = """(needle => {
  const walk = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  let node;
  while ((node = walk.nextNode())) {
    if (!node.textContent.includes(needle)) continue;
    const range = document.createRange();
    range.selectNodeContents(node);
    const box = range.getBoundingClientRect();
    if (box.height > 0 && box.width > 0) return box.top + window.scrollY;
  }
  return null;
})(%s)"""


class Browser:
    """One headless Chromium window of ``width`` x ``height`` CSS pixels (a context manager)."""

    def __init__(self, width: int = 1400, height: int = 1000, timeout_s: float = 60.0):
        assert CHROMIUM, "no chromium (apt-get install chromium)"
        self.width, self.height, self.timeout_s = width, height, timeout_s
        self.profile = tempfile.mkdtemp(prefix="chromium-")
        self.proc = subprocess.Popen(
            [CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--window-size={width},{height}", "--remote-debugging-port=0", "--remote-debugging-address=127.0.0.1",
             f"--user-data-dir={self.profile}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        port_file = os.path.join(self.profile, "DevToolsActivePort")
        deadline = time.monotonic() + timeout_s
        while not (os.path.exists(port_file) and open(port_file).read().strip()):
            assert self.proc.poll() is None and time.monotonic() < deadline, "chromium did not start its DevTools"
            time.sleep(0.2)
        port = int(open(port_file).read().split()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
            page = next(t for t in json.load(r) if t["type"] == "page")
        from websockets.sync.client import connect

        self.ws = connect(page["webSocketDebuggerUrl"], max_size=64 * 2 ** 20, open_timeout=timeout_s).__enter__()
        self._id = 0
        # the page's viewport exactly width x height (the window's includes the browser's own bars)
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)

    def call(self, method: str, **params):
        """One DevTools command; its result (events in between are skipped)."""
        self._id += 1
        self.ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv(timeout=self.timeout_s))
            if msg.get("id") == self._id:
                assert "error" not in msg, f"{method}: {msg['error']}"
                return msg["result"]

    def evaluate(self, expression: str):
        got = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return got["result"].get("value")

    def open(self, url: str, wait_for: str, timeout_s: float = 90.0) -> "Browser":
        """Load ``url`` and wait until the page's text contains ``wait_for`` (fails after
        ``timeout_s`` with the text it has)."""
        self.call("Page.navigate", url=url)
        deadline = time.monotonic() + timeout_s
        while True:
            text = self.text()
            if wait_for in text:
                time.sleep(1.0)        # let the page finish laying out what it just rendered
                return self
            assert time.monotonic() < deadline, f"{url} never showed {wait_for!r}; it shows: {text[:2000]}"
            time.sleep(0.5)

    def text(self) -> str:
        return self.evaluate("document.body ? document.body.innerText : ''") or ""

    def top_of(self, needle: str) -> Optional[float]:
        """The y (CSS px from the page's top) of the first element showing ``needle``; None when
        nothing shows it."""
        return self.evaluate(_TOP_OF % json.dumps(needle))

    def screenshot(self, path) -> None:
        data = self.call("Page.captureScreenshot", format="png")["data"]
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))

    def close(self) -> None:
        try:
            self.ws.__exit__(None, None, None)
        finally:
            self.proc.kill()
            self.proc.wait(timeout=30)
            shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> "Browser":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
