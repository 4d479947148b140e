"""The web dashboard in a real browser (Debian's headless chromium, driven by Selenium)
against a running demo at high contention: what a person sees on the page, and that it
follows the cell live (a machine cordoned with the command line turns up cordoned on
the page without a reload)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.etcd, pytest.mark.slow]



def _browser() -> tuple[str, str]:
    """Debian's chromium and its driver, installed by the test run itself where they
    are missing (the README's test command sets up everything the suite needs; a
    machine that cannot install them fails here, saying so, rather than skip)."""
    found = shutil.which("chromium"), shutil.which("chromedriver")
    if not all(found) and shutil.which("apt-get"):
        for argv in (["apt-get", "update", "-qq"],
                     ["apt-get", "install", "-y", "-qq", "chromium", "chromium-driver"]):
            subprocess.run(argv, check=False, capture_output=True, timeout=900,
                           env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
        found = shutil.which("chromium"), shutil.which("chromedriver")
    chromium, driver = found
    if not (chromium and driver):
        raise RuntimeError("the dashboard's browser test needs Debian's chromium and "
                           "chromium-driver, and apt-get could not install them here")
    return chromium, driver


from selenium import webdriver  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

# As root, in a sandbox without a network: no sandbox, and nothing that phones home.
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--window-size=1400,1100"]


@pytest.fixture
def browser() -> Iterator[Any]:
    options = webdriver.ChromeOptions()
    chromium, chromedriver = _browser()  # installed only when this test runs
    options.binary_location = chromium
    profile = tempfile.mkdtemp(prefix="omega-chromium-")
    for flag in [*FLAGS, f"--user-data-dir={profile}"]:
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(chromedriver), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture
def demo(tmp_path: Path) -> Iterator[tuple[str, list[str], subprocess.Popen[str]]]:
    """A demo at high contention: (dashboard URL, the TLS flags of its operator, the
    process). Stopped with SIGTERM at the end, pass or fail."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "omega.cli", "demo", "--contention", "high", "--duration",
         "600", "--no-fsync", "--data-dir", str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        url, operator = "", []
        for line in proc.stdout:
            lines.append(line)
            if "omega env" in line:  # the client file is written: the operator's flags
                settings = tomllib.loads((tmp_path / "client.toml").read_text())
                operator = [x for k in ("cellstate", "ca", "cert", "key")
                            for x in (f"--{k}", settings[k])]
            if m := re.match(r"dashboard: (http://\S+) ", line):
                url = m.group(1)
                break
        assert url and operator, "".join(lines)
        yield url, operator, proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
    assert "invariants hold" in out, "".join(lines) + out


# What the page shows, read in one go inside the page (it redraws every second, so
# element handles held across a redraw would go stale): texts and states as drawn.
READ_PAGE = """
const rows = (id) => [...document.querySelectorAll(`#${id} tbody tr`)].map(
  (tr) => [...tr.cells].map((td) => td.innerText));
return {
  summary: document.getElementById("summary").innerText,
  note: document.getElementById("machines-note").innerText,
  machines: [...document.querySelectorAll("#heatmap .m")].map(
    (m) => [m.dataset.machine, m.dataset.state]),
  schedulers: rows("schedulers"),
  charts: document.querySelectorAll("#schedulers tbody tr svg polyline.busyness").length,
  pending: rows("pending"),
  preemptions: rows("preemptions"),
  preempt_total: document.getElementById("preempt-total").innerText,
  events: rows("events"),
};
"""


def _until(driver: Any, what: str, check: Callable[[dict[str, Any]], Any],
           timeout: float = 90) -> dict[str, Any]:
    """The page as read once ``check`` holds for it."""
    try:
        return dict(WebDriverWait(driver, timeout, poll_frequency=0.5).until(
            lambda d: (lambda page: page if check(page) else False)(
                d.execute_script(READ_PAGE))))
    except Exception:
        pytest.fail(f"the page never showed {what}:\n"
                    f"{driver.find_element(By.TAG_NAME, 'body').text[:3000]}")


def test_a_person_sees_the_cell_live(browser: Any, demo: tuple[str, list[str], Any],
                                     tmp_path: Path) -> None:
    url, operator, _ = demo
    browser.get(url)
    # The heat map: one square per machine of the small cell, each with a state.
    page = _until(browser, "32 machines", lambda p: len(p["machines"]) == 32)
    assert {state for _, state in page["machines"]} == {"up"}
    assert page["note"] == "32 up, 0 down"
    # A row per scheduler instance, each with its chart once reports have come in.
    page = _until(browser, "the scheduler instances", lambda p: p["charts"] >= 8)
    names = {row[0] for row in page["schedulers"]}
    assert {"batch/b0", "batch/b3", "service/s0", "flow/f0", "fair/fa0",
            "mapreduce/mr0"} <= names
    # Schedulers conflict at this contention: some instance's conflicted count is not 0.
    _until(browser, "a conflict", lambda p: any(
        len(row) == 6 and not row[3].startswith("0 ") for row in p["schedulers"]))
    # Pending jobs with their reasons in words, and preemptions as they happen.
    _until(browser, "a pending job with a reason", lambda p: any(
        len(row) == 4 and row[3].strip() for row in p["pending"]))
    page = _until(browser, "a preemption", lambda p: re.match(
        r"[1-9]\d* since", p["preempt_total"]) and len(p["preemptions"][0]) == 5)
    _, task, machine, by, why = page["preemptions"][0]
    assert re.fullmatch(r"\S+/\d+", task) and re.fullmatch(r"m\d{5}", machine)
    # Who preempted it and for which task, as its task record's history says.
    assert by and why.startswith("preempted for "), (by, why)
    # The events panel (issue 34): the cell's task histories, newest first, with who and
    # why; a preemption shows there with the task it made room for.
    page = _until(browser, "a preemption among the events", lambda p: any(
        len(row) == 6 and row[2] == "preempted" and row[5].startswith("preempted for ")
        for row in p["events"]))
    assert all(re.fullmatch(r"\S+/\d+", row[1]) for row in page["events"])
    # Placements go on, so one shows among the newest (a burst of preemptions can fill the
    # panel for a moment: CI once read it holding nothing else).
    _until(browser, "a placement among the events", lambda p: any(
        len(row) == 6 and row[2] == "placed" for row in p["events"]))
    # Live: cordon a machine from the command line; the page shows it, no reload.
    subprocess.run([sys.executable, "-m", "omega.cli", "cordon", "m00007", *operator],
                   check=True, timeout=60)
    _until(browser, "m00007 cordoned", lambda p: ["m00007", "cordoned"] in p["machines"])
    before = page["summary"]
    _until(browser, "the revision move on",
           lambda p: p["summary"] != before and "revision" in p["summary"])
    shot = Path(os.environ.get("OMEGA_DASHBOARD_SCREENSHOT", tmp_path / "dashboard.png"))
    assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
