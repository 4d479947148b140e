"""A testing kit for scheduler plugin authors, shipped with the package.

* :class:`Harness` steps real scheduler instances (``SchedulerInstance``) over an
  in-memory cell on a virtual :class:`Clock`: deterministic and fast, with the same
  runtime, store and validation code as production. :func:`settled` is the usual
  condition to run until.
* :class:`RecordingCommitter` implements the runtime's ``Committer`` over the real
  store, records every transaction, and rejects on demand (the next N commits, or
  claims on chosen machines, with a chosen ``Reason``) to exercise retry and give-up.
* Fluent builders for machines, jobs and cells (:class:`MachineBuilder`,
  :class:`JobBuilder`, :class:`CellBuilder`) and one-call shorthands (:func:`machine`,
  :func:`job`, :func:`make_cell`, :func:`claims`, :func:`txn`).

It imports only ``cellstate`` and ``schedulers`` and needs no test framework; the
plugin guide (docs/plugins.md) shows it at work.
"""

from schedulers.testing.builders import (
    CellBuilder,
    JobBuilder,
    MachineBuilder,
    claims,
    job,
    machine,
    make_cell,
    txn,
)
from schedulers.testing.committer import Recorded, RecordingCommitter
from schedulers.testing.harness import Clock, Harness, settled

__all__ = [
    "CellBuilder",
    "Clock",
    "Harness",
    "JobBuilder",
    "MachineBuilder",
    "Recorded",
    "RecordingCommitter",
    "claims",
    "job",
    "machine",
    "make_cell",
    "settled",
    "txn",
]
