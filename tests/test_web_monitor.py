"""`hetswarm monitor --web`: its JSON and its page against a real small swarm, and the server's own behaviour.

The observed swarm (tests/helpers/shared_swarm.py: a coordinator and two `hetswarm join --coordinator` clients, 2
stages × 1 pipeline of the tiny model) runs on 127.0.0.1; the monitor serves on 127.0.0.1:0 and prints its URL.
/api/v1/state lists every peer, the plan and the training history; headless Chromium (Debian's, driven by Playwright) shows every peer in the grid and the heatmap
and draws the curves. Without a browser the page test is skipped with the reason; the rest still runs. The server
is also tested alone: a read that times out keeps the last state, and bad requests are answered, not fatal.
"""
from __future__ import annotations

import asyncio
import json
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
import zipfile
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from hivemind.utils import get_dht_time
from typer.testing import CliRunner

from hetswarm.client.cli.app import app
from hetswarm.client.monitor.web import ProgressHistory, WebAddress, WebMonitor, serve_web
from hetswarm.protocol.errors import HetswarmError, RejectedInput
from hetswarm.protocol.record_store import SwarmRecords
from hetswarm.protocol.records import Progress
from tests.helpers.shared_swarm import CLIENTS, ObservedSwarm
from tests.helpers.waiting import pids_left

ROOT = Path(__file__).resolve().parent.parent
SWARM = "webtest"
PEER = "QmYmMBM4vh9eoAh1EwnRNM9EpFJBgvXviz4LGTDycLc9cT"
SOME_PEER_MADDR = f"/ip4/127.0.0.1/tcp/1/p2p/{PEER}"
_URL_LINE = re.compile(r"Web view: (http://127\.0\.0\.1:\d+/)")
pytestmark = [pytest.mark.timeout(240), pytest.mark.usefixtures("hetswarm_logger_restored")]



# --- the command line and the server alone -------------------------------------------------------------------------

@pytest.mark.timeout(60)
@pytest.mark.parametrize("value", ["nonsense", "127.0.0.1", "127.0.0.1:99999", ":8080", "localhost:http",
                                   "127.0.0.1:-1", "a b:80"])
def test_a_bad_web_address_is_one_clear_error(value):
    result = CliRunner().invoke(app, ["monitor", "--initial-peers", SOME_PEER_MADDR, "--web", value])
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, RejectedInput), repr(result.exception)
    assert "--web must be HOST:PORT" in str(result.exception) and repr(value) in str(result.exception)


@pytest.mark.timeout(60)
def test_web_with_json_is_refused():
    result = CliRunner().invoke(app, ["monitor", "--initial-peers", SOME_PEER_MADDR, "--web", "127.0.0.1:0", "--json"])
    assert isinstance(result.exception, RejectedInput) and "leave out --once and --json" in str(result.exception)


def test_web_addresses_parse_and_print_as_urls():
    assert WebAddress.parse("127.0.0.1:0") == WebAddress(host="127.0.0.1", port=0)
    assert WebAddress.parse("[::1]:8080") == WebAddress(host="::1", port=8080)
    assert WebAddress.parse("0.0.0.0:8080").url(("0.0.0.0", 8080)) == "http://127.0.0.1:8080/"
    assert WebAddress.parse("[::1]:0").url(("::1", 4321, 0, 0)) == "http://[::1]:4321/"


def progress(step: int, *, version: int = 1, peer: str = PEER, loss: float | None = 5.0) -> Progress:
    return Progress(peer_id=peer, assignment_version=version, step=step, loss=loss, tokens_per_s=100.0,
                    compute_s=0.25, wait_s=0.5, updated_at=0.0)


def test_history_keeps_one_point_per_step_and_stays_bounded():
    history = ProgressHistory(max_points_per_peer=3, max_peers=2)
    for step in range(5):
        history.record([progress(step), progress(step)])  # read twice: the DHT still holds the same latest step
    points = history.to_json()["peers"][PEER]
    assert [p["step"] for p in points] == [2, 3, 4]
    assert points[0]["step_s"] == pytest.approx(0.75)
    others = ["Qm" + c * 44 for c in "abc"]
    for peer in others:
        history.record([progress(0, peer=peer)])
    assert set(history.to_json()["peers"]) == set(others[1:])  # the least recently heard peers were dropped


def test_history_keeps_each_held_out_loss_once_by_the_step_it_was_measured_after():
    history = ProgressHistory(max_points_per_peer=2)
    for step in range(8):  # measured after steps 1, 3 and 5; each record repeats the newest until the next
        measured = (step - 1) // 2 * 2 + 1 if step >= 1 else None
        held_out = {} if measured is None or measured > 5 else {"held_out_step": measured, "held_out_loss": 9.0 - measured}
        history.record([progress(step).copy(update=held_out)])
    assert history.to_json()["held_out"] == {PEER: [(3, 6.0), (5, 4.0)]}  # bounded as the steps are


class FlakyRecords(SwarmRecords):
    """The real reader over no DHT: the first read of each key answers (one Progress record under its key, nothing
    under the others), every later one times out."""

    def __init__(self) -> None:
        super().__init__(dht=None, swarm=SWARM, timeout_s=0.5)
        self.read_keys: set[str] = set()

    async def read_expiring(self, field: str, **_) -> dict:
        if field in self.read_keys:
            raise TimeoutError
        self.read_keys.add(field)
        return {PEER: (progress(7), get_dht_time() + 60.0)} if field == "progress" else {}


def test_a_timed_out_read_keeps_the_last_state_and_bad_requests_are_answered():
    async def scenario() -> dict[str, Any]:
        monitor = WebMonitor(FlakyRecords(), coordinator=None, refresh_s=0.1)
        runner = aiohttp.web.AppRunner(monitor.application())
        await runner.setup()
        try:
            await aiohttp.web.TCPSite(runner, "127.0.0.1", 0).start()
            base = f"http://127.0.0.1:{runner.addresses[0][1]}"
            await monitor.refresh()
            await monitor.refresh()  # times out
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
                codes = {}
                for method, path in [("POST", "/api/v1/state"), ("GET", "/nope"), ("GET", "/static/../web.py"),
                                     ("GET", "/static/%2e%2e/web.py"), ("GET", "/static/missing.js"),
                                     ("GET", "/" + "a" * 9000)]:
                    async with session.request(method, base + path) as response:
                        codes[(method, path[:30])] = response.status
            reader, writer = await asyncio.open_connection("127.0.0.1", runner.addresses[0][1])
            writer.write(b"NOT HTTP AT ALL\r\n\r\n")
            codes["garbage"] = int((await asyncio.wait_for(reader.readline(), 10)).split()[1])
            writer.close()
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
                async with session.get(base + "/") as response:
                    page = await response.text()
                    policy = response.headers["Content-Security-Policy"]
                async with session.get(base + "/api/v1/state") as response:
                    state = await response.json()
            return {"codes": codes, "page": page, "policy": policy, "state": state}
        finally:
            await runner.cleanup()

    result = asyncio.run(scenario())
    assert all(400 <= code < 500 for code in result["codes"].values()), result["codes"]
    assert "/static/monitor.js" in result["page"] and "default-src 'self'" in result["policy"]
    state = result["state"]
    assert state["progress"][0]["step"] == 7 and state["history"]["peers"][PEER][0]["step"] == 7  # the last state
    assert state["monitor"]["reads"] == 1 and state["monitor"]["failed_reads"] == 1
    assert "could not be read within" in state["monitor"]["error"]


def test_a_taken_port_is_one_clear_error():
    async def serve_on_taken_port() -> None:
        taken = await asyncio.start_server(lambda reader, writer: None, "127.0.0.1", 0)
        try:
            port = taken.sockets[0].getsockname()[1]
            await serve_web(FlakyRecords(), WebAddress(host="127.0.0.1", port=port), stop=asyncio.Event(),
                            coordinator=None, refresh_s=1.0, on_ready=print)
        finally:
            taken.close()

    with pytest.raises(HetswarmError, match="cannot serve the web view on 127.0.0.1:"):
        asyncio.run(asyncio.wait_for(serve_on_taken_port(), 30))


# --- against a real swarm -------------------------------------------------------------------------------------------

def get_state(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url + "api/v1/state", timeout=10) as response:
        return json.load(response)


def ready(state: dict[str, Any]) -> bool:
    """Every client listed and placed in the plan, and the history holding steps of both (training has begun)."""
    names = {p["name"] for p in state["peers"]}
    assignment = state["assignment"]
    placed = {peer["name"] for row in assignment["grid"] for peer in row} if assignment else set()
    return names == set(CLIENTS) == placed and len(state["history"]["peers"]) == len(CLIENTS)


@pytest.fixture(scope="module")
def monitor(observed_swarm: ObservedSwarm):
    """A web monitor of the observed swarm (tests/helpers/shared_swarm.py), a process of its own."""
    swarm = observed_swarm.swarm
    process = swarm.start("monitor", "monitor", "--initial-peers", swarm.initial_peers, "--swarm", swarm.swarm,
                          "--coordinator", swarm.coordinator_id, "--web", "127.0.0.1:0", "--refresh", "1")
    return process, process.wait_for(_URL_LINE, timeout_s=60).group(1)


@pytest.fixture(scope="module")
def settled(monitor) -> dict[str, Any]:
    _, url = monitor
    deadline = time.monotonic() + 170
    state = get_state(url)
    while not ready(state) and time.monotonic() < deadline:
        time.sleep(1.0)
        state = get_state(url)
    return state


@pytest.mark.swarm
def test_the_state_lists_every_peer_the_plan_and_the_history(observed_swarm, settled):
    assert ready(settled), json.dumps({k: settled[k] for k in ("peers", "assignment", "history")})[-3000:]
    assert {p["name"] for p in settled["peers"]} == set(CLIENTS)
    assert settled["assignment"]["coordinator_id"] == observed_swarm.swarm.coordinator_id
    assert settled["assignment"]["bottleneck_link"] is not None
    assert settled["history"]["predictions"][-1]["version"] == settled["assignment"]["version"]
    assert settled["monitor"]["error"] is None and settled["monitor"]["reads"] >= 1


def find_chromium() -> str | None:
    """Debian's chromium (the only browser this project installs; Playwright's own download is not used)."""
    return next((path for name in ("chromium", "chromium-browser") if (path := shutil.which(name))), None)


@pytest.mark.swarm
def test_the_page_shows_every_peer_in_the_grid_and_the_heatmap(monitor, settled, tmp_path):
    try:
        from playwright.sync_api import Error as PlaywrightError
        from playwright.sync_api import sync_playwright
    except ImportError:
        reason = "playwright is not installed (pip install playwright): the page test needs it"
        print(reason)
        pytest.skip(reason)
    if (chromium := find_chromium()) is None:
        reason = "no chromium on PATH (apt-get install chromium): the page test needs a browser"
        print(reason)
        pytest.skip(reason)
    assert ready(settled)
    _, url = monitor
    ids = sorted(p["peer_id"] for p in settled["peers"])
    with sync_playwright() as playwright:
        try:
            browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        except PlaywrightError as e:
            reason = f"chromium at {chromium} did not start: {str(e).splitlines()[0]}"
            print(reason)
            pytest.skip(reason)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            errors, requests = [], []
            page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.on("request", lambda request: requests.append(request.url))
            page.goto(url)
            page.wait_for_function(
                """ids => ids.every(id =>
                       document.querySelector(`#grid td.grid-cell[data-peer-id="${id}"]`) &&
                       document.querySelector(`#heatmap [data-row-peer="${id}"]`) &&
                       document.querySelector(`#peers tr[data-peer-id="${id}"]`))
                     && document.querySelectorAll('#heatmap g[data-kind^="measured"]').length >= 2
                     && Number(document.getElementById('step-chart').dataset.series) >= 1""",
                arg=ids, timeout=60_000)
            page.screenshot(path=str(tmp_path / "web-monitor.png"), full_page=True)
            hops = page.locator('#grid td.hop[data-bottleneck="true"]').count()
            page.click('button[data-metric="bandwidth_mbps"]')
            bandwidth_note = page.inner_text("#links-note")
        finally:
            browser.close()
    assert (tmp_path / "web-monitor.png").stat().st_size > 10_000
    assert hops == 1  # 2 stages × 1 pipeline: the only hop is the bottleneck
    assert bandwidth_note.startswith("bandwidth")
    assert errors == []  # no script error and no refused load (the page's security policy logs refusals as errors)
    assert all(u.startswith(url) for u in requests), requests  # nothing fetched from anywhere else


@pytest.mark.swarm
def test_ctrl_c_stops_the_monitor_cleanly(monitor):
    process, _ = monitor
    process.signal(signal.SIGINT)
    assert process.process.wait(timeout=30) == 0, process.output()[-2000:]
    assert "Traceback" not in process.output()
    assert pids_left(process) == []


@pytest.mark.timeout(180)
@pytest.mark.swarm
def test_the_static_files_ship_in_the_wheel(tmp_path):
    """A non-editable install serves the page too: the wheel holds the static files as package data."""
    pytest.importorskip("setuptools", reason="building the wheel needs setuptools in this environment")
    result = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
                             "--wheel-dir", str(tmp_path), str(ROOT)], capture_output=True, text=True, timeout=170,
                            stdin=subprocess.DEVNULL, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    (wheel,) = tmp_path.glob("hetswarm-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {f"hetswarm/client/monitor/static/{name}" for name in ("index.html", "monitor.js", "monitor.css")} <= names
