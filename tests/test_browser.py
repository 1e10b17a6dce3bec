"""A real browser on the live dashboard: headless Chromium, driven over the DevTools protocol (no selenium).

`wansync run` serves the page; Chromium loads it while rounds run; the overlay graph must be drawn and
a link's throughput must change as updates arrive over the WebSocket. Skipped, with the reason, when
Chromium is not installed (scripts/install-system-deps.sh installs it).
"""

import asyncio
import base64
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import aiohttp
import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# this machine has no internet: without these flags Chromium stalls on network lookups
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-extensions", "--window-size=1400,1400"]

pytestmark = [
    pytest.mark.loopback,
    pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (run scripts/install-system-deps.sh)"),
]


class Page:
    """The smallest DevTools client: call a method, wait for the reply with its id."""

    def __init__(self, ws):
        self.ws = ws
        self.next_id = 0

    async def call(self, method, **params):
        self.next_id += 1
        my = self.next_id
        await self.ws.send_json({"id": my, "method": method, "params": params})
        while True:
            msg = await self.ws.receive_json(timeout=20)
            if msg.get("id") == my:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg["result"]

    async def eval(self, expression):
        res = await self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in res:
            raise RuntimeError(f"{expression}: {res['exceptionDetails']}")
        return res["result"].get("value")

    async def wait(self, expression, timeout=20.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = await self.eval(expression)
            if value:
                return value
            await asyncio.sleep(0.2)
        raise AssertionError(f"timed out waiting for {expression}")


async def devtools_url(profile, proc, timeout=30.0):
    """Chromium writes its DevTools port into the profile; the page target's WebSocket comes from /json/list."""
    port_file = profile / "DevToolsActivePort"
    deadline = time.monotonic() + timeout
    while not (port_file.exists() and port_file.read_text().strip()):
        if proc.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"chromium did not start (exit {proc.poll()})")
        await asyncio.sleep(0.1)
    port = int(port_file.read_text().split()[0])
    async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port}/json/list") as r:
        targets = await r.json()
    return next(t["webSocketDebuggerUrl"] for t in targets if t["type"] == "page")


async def dashboard_url(log, proc, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if m := re.search(r"dashboard: (http://\S+/)", log.read_text()):
            return m.group(1)
        if proc.poll() is not None:
            break
        await asyncio.sleep(0.1)
    pytest.fail("wansync run printed no dashboard URL:\n" + log.read_text()[-2000:])


async def test_dashboard_draws_the_overlay_and_updates_live(tmp_path):
    log = tmp_path / "run.log"
    run = subprocess.Popen([sys.executable, "-m", "wansync.cli", "run", "--nodes", "4", "--topology", "hetero",
                            "--schemes", "mst,ring", "--scale", "0.005", "--rounds", "60", "--out",
                            str(tmp_path / "r.jsonl")], stdout=subprocess.DEVNULL, stderr=log.open("w"))
    profile = tmp_path / "profile"
    browser = subprocess.Popen([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "--remote-debugging-port=0",
                                "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = await dashboard_url(log, run)
        ws_url = await devtools_url(profile, browser)
        async with aiohttp.ClientSession() as http, http.ws_connect(ws_url, max_msg_size=0) as ws:
            page = Page(ws)
            await page.call("Page.navigate", url=url)
            # the graph: 4 nodes and the 12 directed links of a 4-node full mesh, the plan's tree over them
            await page.wait("document.querySelectorAll('#graph .node').length === 4")
            await page.wait("document.querySelectorAll('#graph line.link').length === 12")  # all registered
            await page.wait("document.querySelectorAll('#graph .tree-edge').length > 0")
            assert "plan v" in await page.eval("document.getElementById('plan-label').textContent")
            await page.wait("document.getElementById('conn').textContent === 'live'")
            # a throughput value changes over time: the links table, redrawn from WebSocket updates
            tp = "[...document.querySelectorAll('#links-table td.tp')].map(e => e.textContent).join(' ')"
            first = await page.wait(f"/[1-9]/.test({tp}) && {tp}")
            changed = await page.wait(f"({tp}) !== {first!r} && /[1-9]/.test({tp}) && {tp}")
            assert changed != first
            await page.wait("document.querySelectorAll('#tp-chart polyline.series').length > 0")
            await page.wait("document.querySelectorAll('#round-chart circle').length > 0")
            await page.wait("document.querySelectorAll('#timeline .event').length >= 2")
            shot = await page.call("Page.captureScreenshot", format="png")
            png = base64.b64decode(shot["data"])
            assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
            if target := os.environ.get("WANSYNC_SCREENSHOT"):
                with open(target, "wb") as fh:
                    fh.write(png)
    finally:
        browser.terminate()
        if run.poll() is None:
            run.send_signal(signal.SIGINT)  # the launcher reaps its agents on Ctrl-C
        for p in (browser, run):
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
