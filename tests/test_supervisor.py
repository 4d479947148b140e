"""omega/supervisor.py: a command run under it ends the way the command ended, outlives
the end of the thread that started it, and ends (with its children, and its cleanup
folder removed) when the process that started it dies."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from omega.proc import alive, supervised


def _start(command: list[str], **kw: object) -> subprocess.Popen[bytes]:
    return subprocess.Popen(supervised(command, **kw),  # type: ignore[arg-type]
                            start_new_session=True)


def test_ends_the_way_its_command_ended() -> None:
    assert _start(["sh", "-c", "exit 3"]).wait(10) == 3
    p = _start(["sleep", "60"])
    time.sleep(0.3)
    p.terminate()  # forwarded to the command
    assert p.wait(10) == -signal.SIGTERM
    # A command killed by SIGKILL (the OOM killer, a crash test): the supervisor cannot
    # take a handler for it, and still ends by it, not with an error of its own.
    p = _start(["sh", "-c", "kill -KILL $$"])
    assert p.wait(10) == -signal.SIGKILL


def test_outlives_the_thread_that_started_it() -> None:
    """The kernel's parent-death signal follows the thread that started a child; the
    supervisor ignores it while the parent process lives."""
    started: list[subprocess.Popen[bytes]] = []
    t = threading.Thread(target=lambda: started.append(_start(["sleep", "60"])))
    t.start()
    t.join()
    p = started[0]
    try:
        time.sleep(1.5)  # past the supervisor's own check of its parent
        assert p.poll() is None
    finally:
        p.kill()
        p.wait(10)


def test_ends_with_its_parent_and_removes_the_cleanup_folder(tmp_path: Path) -> None:
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "file").write_text("x")
    # A parent that starts the supervised command (whose child starts another), says
    # their pids, and is then killed outright.
    code = (f"import subprocess, sys; sys.path.insert(0, {os.getcwd()!r}); "
            "from omega.proc import supervised; "
            "p = subprocess.Popen(supervised(['sh', '-c', 'sleep 60 & echo $!; wait'], "
            f"cleanup={str(folder)!r}), start_new_session=True); "
            "print(p.pid, flush=True); p.wait()")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    supervisor = int(parent.stdout.readline())
    grandchild = int(parent.stdout.readline())
    try:
        assert alive(supervisor) and alive(grandchild)
        parent.kill()
        parent.wait(10)
        deadline = time.monotonic() + 15
        while (alive(supervisor) or alive(grandchild) or folder.exists()) \
                and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(supervisor) and not alive(grandchild)
        assert not folder.exists()
    finally:
        for pid in (supervisor, grandchild):
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
