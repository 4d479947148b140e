"""Pricing many tasks at once (``CostModel.task_prices``) gives exactly what pricing
them one by one (``task_costs``) gives: Quincy's array pricing on random layouts,
inputs and options, and the default that any other model inherits."""

from __future__ import annotations

import attrs
import numpy as np
from hypothesis import given, settings, strategies as st

from cellstate.model import Block, Job, Resources
from schedulers.flow.costs import (
    CostModel,
    Preference,
    QuincyCostModel,
    Racks,
    TaskCosts,
    TaskPrices,
)


def _job(task_input: list[tuple[Block, ...]], tasks: int) -> Job:
    return Job(id="j", owner="u", scheduler="flow", task_count=tasks,
               task_resources=Resources.of(cpu=1), task_input=tuple(task_input))


@st.composite
def _cases(draw: st.DrawFn) -> tuple[QuincyCostModel, Racks, Job, list[int]]:
    racks = draw(st.integers(1, 4))
    machines = draw(st.integers(1, 9))
    # Machine names that do not sort as their numbers do: ties break by name.
    layout = Racks({f"m{draw(st.integers(0, 99)):02d}x{i}": f"r{draw(st.integers(0, racks - 1))}"
                    for i in range(machines)})
    names = [*sorted(layout), "gone1", "gone2"]  # two machines the cell lacks
    sizes = st.sampled_from([0.0, 0.25, 0.5, 1.0, 1.0, 3.0, 0.1, 2.5])
    task_input = []
    for _ in range(draw(st.integers(0, 6))):
        blocks = []
        for _ in range(draw(st.integers(0, 4))):
            on = draw(st.lists(st.sampled_from(names), min_size=1, max_size=4, unique=True))
            blocks.append(Block(draw(sizes), tuple(on)))
        task_input.append(tuple(blocks))
    tasks = len(task_input) + draw(st.integers(0, 2))  # some tasks read no input of their own
    options = {
        "rack_cost": draw(st.sampled_from([0, 1, 2, 0.5])),
        "core_cost": draw(st.sampled_from([1, 4, 7.5])),
        "data_scale": draw(st.sampled_from([1, 100, 33.3])),
        "machine_threshold": draw(st.sampled_from([0.0, 0.1, 0.34, 0.5, 1.0])),
        "rack_threshold": draw(st.sampled_from([0.0, 0.25, 0.5, 1.0])),
        "max_preferences": draw(st.sampled_from([0, 1, 2, 8])),
    }
    indices = draw(st.lists(st.integers(0, max(tasks - 1, 0)), unique=True))
    return QuincyCostModel(**options), layout, _job(task_input, max(tasks, 1)), sorted(indices)


@settings(max_examples=400, deadline=None)
@given(_cases())
def test_quincys_array_pricing_equals_its_task_by_task_pricing(
        case: tuple[QuincyCostModel, Racks, Job, list[int]]) -> None:
    model, layout, job, indices = case
    prices = model.task_prices(job, indices, layout)
    one_by_one = [(i, tc) for i in indices
                  if (tc := model.task_costs(job, i, layout)) is not None]
    assert prices.tasks == [i for i, _ in one_by_one]
    assert [prices.costs(k) for k in range(len(prices.tasks))] == [tc for _, tc in one_by_one]
    assert model.tasks_unscheduled(job, prices, 12.5).tolist() == [
        model.task_unscheduled(job, tc, 12.5) for _, tc in one_by_one]


class _Odd(QuincyCostModel):
    """A subclass that changes the per-task pricing: the array pricing written for
    Quincy must step aside for it."""

    def task_costs(self, job: Job, index: int, racks: Racks) -> TaskCosts | None:
        tc = super().task_costs(job, index, racks)
        return None if tc is None else TaskCosts(
            (*tc.preferences, Preference("", "r0", 7)), tc.cluster + 1)


def test_a_model_that_prices_tasks_its_own_way_is_asked_task_by_task() -> None:
    layout = Racks({"a": "r0", "b": "r1"})
    job = _job([(Block(1.0, ("a",)),), (Block(2.0, ("a", "b")),)], 2)
    model = _Odd()
    prices = model.task_prices(job, [0, 1], layout)
    assert [prices.costs(k) for k in range(2)] == [model.task_costs(job, i, layout)
                                                   for i in range(2)]
    plain = [QuincyCostModel().task_costs(job, i, layout) for i in range(2)]
    assert prices.cluster.tolist() == [tc.cluster + 1 for tc in plain if tc is not None]
    assert len(prices.cluster) == 2


def test_the_default_packs_whatever_task_costs_answers() -> None:
    class Two(CostModel):
        def task_costs(self, job: Job, index: int, racks: Racks) -> TaskCosts | None:
            if index % 2:
                return None
            return TaskCosts((Preference("b", "", index), Preference("", "r9", 3)), 40 + index)

    prices = Two().task_prices(_job([], 5), [0, 1, 2, 3, 4], Racks())
    assert prices.tasks == [0, 2, 4]
    assert prices.costs(1) == TaskCosts((Preference("b", "", 2), Preference("", "r9", 3)), 42)
    assert np.array_equal(prices.start, [0, 2, 4, 6])
    empty = TaskPrices.of([])
    assert empty.tasks == [] and empty.start.tolist() == [0]


@settings(max_examples=150, deadline=None)
@given(st.lists(_cases(), min_size=1, max_size=4))
def test_many_jobs_priced_together_get_each_job_s_own_prices(
        cases: list[tuple[QuincyCostModel, Racks, Job, list[int]]]) -> None:
    # One model and layout (the first case's); each job its own input and tasks.
    model, layout = cases[0][0], cases[0][1]
    asked = [(attrs.evolve(job, id=f"j{k}"), indices)
             for k, (_, _, job, indices) in enumerate(cases)]
    together = model.jobs_task_prices(asked, layout)
    assert len(together) == len(asked)
    assert len({id(jp.prices) for jp in together}) == 1  # one pass for all of them
    for (job, indices), jp in zip(asked, together, strict=True):
        alone = model.task_prices(job, indices, layout)
        assert jp.tasks == alone.tasks
        assert [jp.prices.costs(jp.first + k) for k in range(len(jp.tasks))] == [
            alone.costs(k) for k in range(len(alone.tasks))]
        mine = np.arange(jp.first, jp.first + len(jp.tasks), dtype=np.int64)
        assert model.tasks_unscheduled(job, jp.prices, 3.0, mine).tolist() == \
            model.tasks_unscheduled(job, alone, 3.0).tolist()
        # Asked for the job's rows only, the default (task by task) agrees.
        assert CostModel.tasks_unscheduled(model, job, jp.prices, 3.0, mine).tolist() == \
            model.tasks_unscheduled(job, alone, 3.0).tolist()


def test_a_model_that_prices_tasks_its_own_way_is_asked_job_by_job() -> None:
    layout = Racks({"a": "r0", "b": "r1"})
    jobs = [(_job([(Block(1.0, ("a",)),)], 1), [0]), (_job([(Block(2.0, ("b",)),)], 1), [0])]
    got = _Odd().jobs_task_prices(jobs, layout)
    assert [jp.first for jp in got] == [0, 0]
    assert got[0].prices is not got[1].prices
    assert [jp.prices.costs(0) for jp in got] == [_Odd().task_costs(j, 0, layout)
                                                 for j, _ in jobs]
