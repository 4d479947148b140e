"""A node agent's metrics for Prometheus, read from the agent when scraped: tasks
started, finished, failed and stopped, running now, reports, registrations and lost
leases (docs/operations.md, "Metrics")."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from omega.agent import Agent


class AgentCollector(Collector):
    def __init__(self, agent: Agent) -> None:
        self.agent = agent

    def collect(self) -> Iterator[Metric]:
        a, s = self.agent, self.agent.stats
        who = [a.agent_id]
        tasks = CounterMetricFamily("omega_agent_tasks", "Task runs by what happened: "
                                    "started, finished, failed, stopped",
                                    labels=["agent", "event"])
        for event in ("started", "finished", "failed", "stopped"):
            tasks.add_metric([*who, event], getattr(s, event))
        yield tasks
        running = GaugeMetricFamily("omega_agent_tasks_running", "Tasks running now",
                                    labels=["agent"])
        running.add_metric(who, sum(1 for r in a.tasks().values() if r.outcome is None))
        yield running
        machines = GaugeMetricFamily("omega_agent_machines", "Machines this agent runs",
                                     labels=["agent"])
        machines.add_metric(who, len(a.machine_ids))
        yield machines
        for name, value, text in (
                ("reports", s.reports, "Task outcomes reported"),
                ("report_errors", s.report_errors, "Report attempts that failed"),
                ("registrations", s.registrations, "Registrations of its machines"),
                ("lease_losses", s.lease_losses, "Keep-alives that found the lease gone")):
            c = CounterMetricFamily(f"omega_agent_{name}", text, labels=["agent"])
            c.add_metric(who, value)
            yield c
