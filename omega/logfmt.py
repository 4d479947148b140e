"""How every ``omega`` process logs: a timestamp on every line, as text or as JSON.

``--log-format text`` (the default, or ``$OMEGA_LOG_FORMAT``)::

    2026-11-23T16:29:31.402Z INFO cellstate.api.server: 150 machines down ...

``--log-format json``: one JSON object a line, for log shippers::

    {"ts": "2026-11-23T16:29:31.402Z", "level": "INFO", "logger": "cellstate.api.server",
     "msg": "150 machines down ...", "pid": 4242}

(with ``"exc"`` holding the traceback of a logged exception). Timestamps are UTC with
milliseconds in both, so the logs of several processes sort together.

What a long-running process announces on its own (a server's address, a workload's
count) goes through :func:`announce`: shown whatever the log level, in the same format
as the rest, so that a JSON log holds nothing but JSON.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import TextIO

import orjson

FORMATS = ("text", "json")
ANNOUNCE = "announce"  # the logger of announcements, shown at every level (not a
# parent of any module's logger, which would inherit its level)


def _timestamp(created: float) -> str:
    whole = int(created)
    return (time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole))
            + f".{int((created - whole) * 1000):03d}Z")


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = (f"{_timestamp(record.created)} {record.levelname} {record.name}: "
                f"{record.getMessage()}")
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, object] = {
            "ts": _timestamp(record.created), "level": record.levelname,
            "logger": record.name, "msg": record.getMessage(), "pid": record.process,
        }
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(doc, default=str).decode()


def log_format(chosen: str | None) -> str:
    """``chosen`` (the flag), else ``$OMEGA_LOG_FORMAT``, else text; anything else is
    an error naming where it came from."""
    if chosen:
        return chosen
    env = os.environ.get("OMEGA_LOG_FORMAT", "")
    if env and env not in FORMATS:
        raise ValueError(f"$OMEGA_LOG_FORMAT: {env!r} is not one of {', '.join(FORMATS)}")
    from omega.clientconfig import default  # the file's value is checked when it is read

    return env or str(default("log_format", "text"))


def configure(level: int, fmt: str, stream: TextIO | None = None, force: bool = False,
              ) -> None:
    """The root logger at ``level``, writing ``fmt`` lines to ``stream`` (stderr);
    announcements (:func:`announce`) pass at any level. Like :func:`logging.basicConfig`,
    nothing changes where the root logger has handlers already (a test runner's), unless
    ``force``."""
    root = logging.getLogger()
    if root.handlers and not force:
        return
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    logging.getLogger(ANNOUNCE).setLevel(min(level, logging.INFO))


def announce(message: str, *args: object) -> None:
    """A line the operator should see whatever the log level (a process is up, a
    count at the end), formatted like every other log line."""
    logging.getLogger(ANNOUNCE).info(message, *args)
