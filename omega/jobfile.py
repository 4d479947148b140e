"""Job spec files: one job, or ``{"jobs": [...]}``, in JSON or TOML (``omega submit
--file``, ``omega demo --jobs``)."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import orjson


def load_job_file(path: Path) -> list[dict[str, Any]]:
    """Job specs from a JSON or TOML file: one job, or ``{"jobs": [...]}``. The specs
    are checked by the server (with the field at fault named); here only the shape."""
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise ValueError(f"{path}: cannot read ({e.strerror})") from None
    try:
        doc: Any = (tomllib.loads(raw.decode()) if path.suffix == ".toml"
                    else orjson.loads(raw))
    except (tomllib.TOMLDecodeError, orjson.JSONDecodeError, UnicodeDecodeError) as e:
        kind = "TOML" if path.suffix == ".toml" else "JSON"
        raise ValueError(f"{path}: not valid {kind} ({e})") from None
    jobs = doc.get("jobs") if isinstance(doc, dict) and "jobs" in doc else [doc]
    if not isinstance(jobs, list) or not all(isinstance(j, dict) for j in jobs) or not jobs:
        raise ValueError(f"{path}: expected a job object or {{\"jobs\": [objects]}}")
    return jobs
