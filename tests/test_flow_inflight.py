"""The flow scheduler and its own claims in flight: committed, but not yet in the
snapshot its replica holds. A round in between must not claim those tasks again (the
store would refuse each as already placed: a conflict the scheduler caused itself)."""

from __future__ import annotations

from cellstate.model import MachineState
from schedulers.flow import FlowPolicy
from schedulers.runtime import Attempt
from schedulers.testing import Harness, job, machine, settled


def test_a_round_before_the_replica_catches_up_does_not_claim_the_same_tasks() -> None:
    h = Harness()
    h.admin.add_machines([machine(f"m{i}", cpu=8, rack=f"r{i // 2}") for i in range(4)])
    policy = FlowPolicy(policy="load-spread", interval=1.0)
    inst = h.add(policy, scheduler="flow")
    h.submit([job("j", tasks=6, cpu=1, scheduler="flow")])
    h.pump()
    assert inst.step() == 0.0  # a round: six claims, committed
    committer = h.committer(inst)
    assert [len(r.result.committed) for r in committer.log if r.result] == [6]
    # The replica is not pumped: its snapshot still shows the six tasks waiting.
    h.clock.now += 2.0
    inst.step()  # the next rescheduling round
    again = [c.task for r in committer.log[1:] for c in r.transaction.claims]
    assert again == [], f"claimed again while in flight: {again}"
    h.pump()
    h.clock.now += 2.0
    inst.step()
    snap = h.snapshot()
    assert sum(len(m.allocations) for m in snap.machines.values()) == 6
    assert all(not r.result.rejected for r in committer.log if r.result)


def test_a_task_shape_first_seen_after_the_first_round_reaches_machines() -> None:
    """Quincy routes shapes through rack aggregators: a shape that appears after the
    network was built (here: the first job, after a round over an empty queue) needs
    its arcs to the racks as much as one present at the build."""
    h = Harness()
    h.admin.add_machines([machine(f"m{i}", cpu=8, rack=f"r{i // 2}") for i in range(4)])
    policy = FlowPolicy(policy="quincy", interval=1.0)
    inst = h.add(policy, scheduler="flow")
    h.run(lambda s: bool(policy.rounds), max_steps=20)  # a round with no job at all
    h.submit([job("j", tasks=3, cpu=1, scheduler="flow")])
    h.run(settled, max_time=30.0)
    h.submit([job("k", tasks=2, cpu=2, mem=2, scheduler="flow")])  # a second shape
    h.run(settled, max_time=30.0)
    snap = h.snapshot()
    assert sum(len(m.allocations) for m in snap.machines.values()) == 5
    assert inst.metrics.summary(h.clock())["tasks_placed"] == 5


def test_what_changed_while_claims_were_in_flight_reaches_the_network() -> None:
    """A rescheduling round that finds its own claims in flight solves nothing, but
    the changes it is handed (here: a machine went down before the claims committed)
    are handed to no later round: the network must take them all the same."""
    h = Harness()
    h.admin.add_machines([machine(f"m{i}", cpu=8, rack=f"r{i // 2}") for i in range(4)])
    policy = FlowPolicy(policy="load-spread", interval=1.0)
    inst = h.add(policy, scheduler="flow")
    h.submit([job("j", tasks=6, cpu=1, scheduler="flow")])
    h.pump()
    attempt = inst.decide()
    assert isinstance(attempt, Attempt) and attempt.plan.claims
    h.admin.update_machine("m3", state=MachineState.DOWN)
    h.pump()  # the replica shows m3 down ...
    inst.finish(attempt)  # ... and not the claims committed after that
    h.clock.now += 2.0
    inst.step()  # claims in flight: no solve
    h.pump()
    h.clock.now += 2.0
    inst.step()
    graph = policy._graph
    assert graph is not None
    assert graph.machines["m3"].machine.state is MachineState.DOWN


def test_aladdin_remembers_jobs_that_arrived_while_its_claims_were_in_flight() -> None:
    """Aladdin+H plans only the jobs that may wait (those the changes name, and those
    its last round left waiting). A round that finds its own claims in flight plans
    nothing, but the changes it was handed go to no later round: a job that arrived
    then must still be planned (under load the demo's job file was left unplaced)."""
    h = Harness()
    h.admin.add_machines([machine(f"m{i}", cpu=8, rack=f"r{i // 2}") for i in range(4)])
    policy = FlowPolicy(policy="aladdin", interval=1.0)
    inst = h.add(policy, scheduler="flow")
    h.submit([job("j", tasks=2, cpu=1, scheduler="flow")])
    h.pump()
    attempt = inst.decide()
    assert isinstance(attempt, Attempt) and attempt.plan.claims
    h.submit([job("k", tasks=3, cpu=1, scheduler="flow")])
    h.pump()  # the replica shows k ...
    inst.finish(attempt)  # ... and not j's claims, committed after that
    h.clock.now += 2.0
    inst.step()  # claims in flight: nothing planned
    h.pump()
    h.run(settled, max_time=60.0)
    snap = h.snapshot()
    placed = sorted(t for m in snap.machines.values() for t in m.allocations)
    assert placed == ["j/0", "j/1", "k/0", "k/1", "k/2"]
