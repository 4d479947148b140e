"""The application: the processes of an Omega cell (CLI, demo, node agents, workload
generator, the etcd launcher) built on the ``cellstate``, ``schedulers`` and ``simulator``
libraries. Nothing below imports it."""
