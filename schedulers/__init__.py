"""Scheduler runtime and plugins (built in the scheduler-runtime issue)."""
