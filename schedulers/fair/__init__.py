"""The fair preemptive scheduler (Cook): see ``schedulers/fair/policy.py``."""

from schedulers.fair.policy import FairConfig, FairPolicy
from schedulers.fair.shares import ShareBook, dominant_share, read_shares, task_order

__all__ = ["FairConfig", "FairPolicy", "ShareBook", "dominant_share", "read_shares",
           "task_order"]
