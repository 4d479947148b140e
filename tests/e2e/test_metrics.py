"""Every process serves Prometheus metrics (--metrics HOST:PORT): each metric named in
docs/operations.md appears, and those that count work move when work is done."""

from __future__ import annotations

import re
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from omega.etcd_launcher import LocalEtcd, free_ports
from tests.e2e.cluster import cluster, wait_for

pytestmark = [pytest.mark.etcd, pytest.mark.slow]

SERVER = ("omega_commit_seconds", "omega_commit_claims", "omega_commit_transactions",
          "omega_jobs", "omega_tasks", "omega_machines", "omega_cell_capacity",
          "omega_cell_used", "omega_replica_lag_revisions", "omega_replica_lag_seconds",
          "omega_cell_revision", "omega_sync_subscribers")
SCHEDULER = ("omega_scheduler_busy_seconds", "omega_scheduler_busyness",
             "omega_scheduler_conflict_fraction", "omega_scheduler_transactions",
             "omega_scheduler_claims_rejected", "omega_scheduler_tasks_placed",
             "omega_scheduler_jobs_abandoned", "omega_scheduler_jobs_held",
             "omega_scheduler_job_wait_seconds",
             "omega_scheduler_decision_seconds", "omega_scheduler_attempts_per_job",
             "omega_scheduler_queue_depth", "omega_replica_lag_revisions",
             "omega_replica_lag_seconds")
AGENT = ("omega_agent_tasks", "omega_agent_tasks_running", "omega_agent_machines",
         "omega_agent_reports", "omega_agent_report_errors", "omega_agent_registrations",
         "omega_agent_lease_losses")


def scrape(port: int) -> dict[str, float]:
    """Every sample as ``name{labels}`` -> value."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text.decode()):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}"] = s.value
    return out


def names(samples: dict[str, float]) -> set[str]:
    return {re.sub(r"(_total|_count|_sum|_bucket|_created)?\{.*", "", k) for k in samples}


def value(samples: dict[str, float], key: str) -> float:
    """The sample ``name{k=v,...}`` (labels in any order), 0 when absent."""
    name, _, labels = key.rstrip("}").partition("{")
    ordered = ",".join(sorted(x for x in labels.split(",") if x))
    return samples.get(f"{name}{{{ordered}}}", 0.0)


def test_every_process_serves_its_metrics_and_they_move(fresh_etcd: LocalEtcd,
                                                        tmp_path: Path) -> None:
    server_m, sched_m, agent_m = free_ports(3)
    with cluster(fresh_etcd.endpoint, tmp_path) as c:
        config = tmp_path / "server.toml"
        config.write_text("[limits.batch]\nmax_resources = { cpu = 2 }\n")
        c.server("cellstate-0", extra=("--metrics", f"127.0.0.1:{server_m}",
                                       "--config", str(config)))
        c.start("agent", "agent", "--cellstate", c.cellstate, "--spec",
                str(c.spec("cell", 2)), "--id", "agent-0", "--metrics",
                f"127.0.0.1:{agent_m}")
        c.start("batch", "scheduler", "batch", "--cellstate", c.cellstate, "--instance",
                "b0", "--metrics", f"127.0.0.1:{sched_m}")
        with c.client() as client:
            wait_for("2 machines", lambda: client.status()["machines_up"] == 2, c)
            wait_for("the scheduler", lambda: bool(client.status()["schedulers"]), c)
            before = {p: scrape(p) for p in (server_m, sched_m, agent_m)}
            # 3 one-cpu tasks under a 2-cpu limit: two run, one waits for them to end.
            client.submit_job({"id": "j", "scheduler": "batch", "task_count": 3,
                               "task_resources": {"cpu": 1, "mem": 1}, "duration": 0.5})
            wait_for("three tasks to finish", lambda: client.get_job("j")["task_states"].get(
                "finished", 0) == 3, c)
        after = {p: scrape(p) for p in (server_m, sched_m, agent_m)}
    # Labelled counters have samples once something was counted: every name is there now.
    for port, expected in ((server_m, SERVER), (sched_m, SCHEDULER), (agent_m, AGENT)):
        assert set(expected) <= names(after[port]), set(expected) - names(after[port])
    s0, s1 = before[server_m], after[server_m]
    assert value(s1, "omega_commit_seconds_count{}") > value(s0, "omega_commit_seconds_count{}")
    assert value(s1, "omega_commit_claims_total{outcome=committed,scheduler=batch}") >= 2
    # The task past the limit was held back by its scheduler, never sent to be refused.
    assert value(s1, "omega_commit_claims_total{outcome=limit_exceeded,scheduler=batch}") == 0
    assert value(s1, "omega_jobs{state=pending}") + value(s1, "omega_jobs{state=running}") \
        + value(s1, "omega_jobs{state=finished}") == 1
    assert value(s1, "omega_cell_revision{}") > value(s0, "omega_cell_revision{}")
    who = "instance=b0,scheduler=batch"
    b0, b1 = before[sched_m], after[sched_m]
    assert value(b1, f"omega_scheduler_tasks_placed_total{{{who}}}") == 3
    assert value(b1, f"omega_scheduler_claims_rejected_total{{{who},reason=limit_exceeded}}") == 0
    assert value(b1, f"omega_scheduler_decision_seconds_count{{{who}}}") > value(
        b0, f"omega_scheduler_decision_seconds_count{{{who}}}")
    assert value(b1, f"omega_scheduler_job_wait_seconds_count{{{who}}}") == 1
    assert value(b1, f"omega_scheduler_transactions_total{{{who},outcome=successful}}") >= 2
    a0, a1 = before[agent_m], after[agent_m]
    assert value(a1, "omega_agent_tasks_total{agent=agent-0,event=started}") >= 2
    assert value(a1, "omega_agent_tasks_total{agent=agent-0,event=finished}") >= 2
    assert value(a1, "omega_agent_reports_total{agent=agent-0}") > value(
        a0, "omega_agent_reports_total{agent=agent-0}")
    assert value(a1, "omega_agent_machines{agent=agent-0}") == 2
