"""The demo as an operator watches it: schedulers conflicting under --contention high,
JSON logs from every process, and --keep-going while processes are killed."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}
STATUS_LINE = re.compile(r"^\[\d\d:\d\d:\d\d rev \d+\] jobs (\d+): ")


def _demo(*argv: str) -> list[str]:
    return [sys.executable, "-m", "omega.cli", "demo", "--no-fsync", *argv]


@pytest.mark.etcd
def test_high_contention_shows_conflicts_and_retries_with_json_logs(tmp_path: Path) -> None:
    proc = subprocess.run(_demo("--contention", "high", "--duration", "10", "--log-format",
                                "json", "--data-dir", str(tmp_path)),
                          capture_output=True, text=True, timeout=240, env=ENV)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    # The instance table is labelled, and the batch scheduler runs four instances.
    headers = [x for x in out.splitlines() if x.split()[:4] == ["scheduler", "placed", "txns",
                                                               "conflicted"]]
    assert headers, out
    assert {f"batch/b{i}" for i in range(4)} <= set(re.findall(r"^    (batch/b\d) ", out,
                                                                re.MULTILINE))
    last = next(x for x in out.splitlines() if x.startswith("done:"))
    conflicts = re.search(r"(\d+) transactions, (\d+) conflicted", last)
    assert conflicts and int(conflicts.group(2)) > 0, last  # the store turned claims down
    # ... and the schedulers retried: some instance made more than one attempt per job.
    attempts = [float(m) for m in re.findall(r"^    \S+/\S+ +\d+ +\d+ +\d+ +\d+ +\d+ +([\d.]+) ",
                                             out, re.MULTILINE)]
    assert attempts and max(attempts) > 1.0, out
    assert "invariants hold" in last
    # The final status and the closing line read the cell at the same revision.
    final = out.split("final status:\n", 1)[1]
    jobs_line = next(x for x in final.splitlines() if x.startswith("jobs: "))
    closing = re.search(r"^done: (\d+) jobs \(([^)]*)\)", last)
    assert closing, last
    by_state = [{k: int(v) for k, v in re.findall(r"(\w+) (\d+)", text) if int(v)}
                for text in (jobs_line, closing.group(2))]
    assert by_state[0] == by_state[1], (jobs_line, last)
    assert sum(by_state[0].values()) == int(closing.group(1))
    # Where to scrape: one address per server, scheduler and agent.
    scrape = re.search(r"^Prometheus metrics \(scrape these\): (.*)$", out, re.MULTILINE)
    assert scrape, out
    named = dict(re.findall(r"(\S+) http://(127\.0\.0\.1:\d+)/metrics", scrape.group(1)))
    assert set(named) == {"cellstate-0", "agent-0", "agent-1", "batch-0", "batch-1",
                          "batch-2", "batch-3", "service-0", "flow-0", "fair-0",
                          "mapreduce-0"}
    # Every line of every process's log is a JSON object with a timestamp.
    events: list[dict[str, object]] = []
    for log in sorted((tmp_path / "logs").glob("*.log")):
        for n, line in enumerate(log.read_text().splitlines(), 1):
            try:
                doc = json.loads(line)
            except ValueError:
                pytest.fail(f"{log.name}:{n} is not JSON: {line!r}")
            assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", doc["ts"]), line
            assert {"level", "logger", "msg", "pid"} <= set(doc), line
            events.append(doc)
    messages = [str(e["msg"]) for e in events]
    assert any(re.search(r"claim\(s\) conflicted \(.*\); will retry", m) for m in messages)
    assert any("serving cell default on port" in m for m in messages)


def _read_until(proc: subprocess.Popen[str], lines: list[str], pattern: str,
                deadline: float) -> re.Match[str]:
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        found = re.search(pattern, line)
        if found:
            return found
    pytest.fail(f"no line matching {pattern!r}:\n{''.join(lines)}")


@pytest.mark.etcd
def test_keep_going_reports_killed_processes_and_the_rest_go_on(tmp_path: Path) -> None:
    """A scheduler, an agent and a server are killed; the demo says so, its view goes on
    (through the other server), the dead agent's machines go down, and at the end the
    invariants hold and the demo reports who ended during the run."""
    proc = subprocess.Popen(_demo("--keep-going", "--servers", "2", "--duration", "300",
                                  "--data-dir", str(tmp_path)),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=ENV)
    lines: list[str] = []
    deadline = time.monotonic() + 200
    try:
        started = _read_until(proc, lines, r"^\d+ processes: (.*)$", deadline)
        pids = {n: int(p) for n, p in re.findall(r"(\S+) \(pid (\d+)\)", started.group(1))}
        scrape = _read_until(proc, lines, r"^Prometheus metrics \(scrape these\): (.*)$",
                             deadline)
        _read_until(proc, lines, STATUS_LINE.pattern, deadline)
        # The metrics the demo points at answer while it runs.
        agent = re.search(r"agent-0 http://(\S+)/metrics", scrape.group(1))
        assert agent
        with urllib.request.urlopen(f"http://{agent.group(1)}/metrics", timeout=10) as r:
            assert b"omega_agent_" in r.read()
        for name in ("batch-0", "agent-1", "cellstate-1"):
            os.kill(pids[name], signal.SIGKILL)
        reported: set[str] = set()
        while len(reported) < 3:  # in whatever order the demo notices them
            found = _read_until(proc, lines, r"\] (\S+) \(pid (\d+)\) was killed by SIGKILL; "
                                             r"\d+ processes still run", deadline)
            assert pids[found.group(1)] == int(found.group(2))
            reported.add(found.group(1))
        assert reported == {"batch-0", "agent-1", "cellstate-1"}
        # The view goes on, and shows the agent's machines down once its lease lapses.
        _read_until(proc, lines, r"machines up \d+, down [1-9]", deadline)
        after = _read_until(proc, lines, STATUS_LINE.pattern, deadline)
        assert after
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out = "".join(lines) + rest
    last = next(x for x in out.splitlines() if x.startswith("done:"))
    assert "invariants hold" in last, out
    ended = re.search(r"ended during the run: (.*?); invariants", last)
    assert ended and set(ended.group(1).split(", ")) == {"batch-0", "agent-1", "cellstate-1"}
    assert "batch/b0 (gone)" in out  # its last report still counts
    server_log = (tmp_path / "logs" / "cellstate-0.log").read_text()
    assert re.search(r"Z WARNING cellstate\.api\.server: \d+ machine\(s\) down, their tasks "
                     r"lost: agent agent-1's lease lapsed", server_log), server_log
