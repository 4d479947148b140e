"""A discrete-event simulator that drives the real schedulers (Omega §4).

See docs/simulator.md for experiment files and the trace format."""
