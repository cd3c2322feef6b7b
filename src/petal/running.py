"""The marker a process keeps in a local folder it writes (``petal train``'s work directory,
``petal convert``'s output), so that a second process is refused instead of mixing its files
with the first's.

The marker holds ``{"pid": ..., "host": ...}``; one left by a process that has died (same
host, no such process) protects nothing and is taken over.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
from collections.abc import Callable
from pathlib import Path

from petal.errors import PetalError

RUNNING_FILE = ".petal-running"


def running_elsewhere(folder: Path) -> str | None:
    """Who else holds ``folder`` (``"process PID on HOST"``), when another live process (or
    one on another host) does; None otherwise."""
    try:
        holder = json.loads((folder / RUNNING_FILE).read_text())
        pid, host = int(holder["pid"]), str(holder["host"])
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError, OSError):
        return "an unknown process"  # unreadable: assume someone holds it
    who = f"process {pid} on {host}"
    if host != socket.gethostname():
        return who
    if pid == os.getpid():
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None  # left by a process that died
    except PermissionError:
        return who
    return who


def mark_running(folder: Path, in_use: Callable[[str], PetalError]) -> Callable[[], None]:
    """Writes :data:`RUNNING_FILE` in ``folder`` (created exclusively: of two processes
    starting at once, one is refused with ``in_use(who)``); returns the function that
    removes it, if it is still this process's."""
    path = folder / RUNNING_FILE
    mine = json.dumps({"pid": os.getpid(), "host": socket.gethostname()})
    for _ in range(2):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            if who := running_elsewhere(folder):
                raise in_use(who) from None
            path.unlink(missing_ok=True)  # left by a process that died: take it over
            continue
        with os.fdopen(fd, "w") as f:
            f.write(mine)
        break
    else:
        raise in_use("another process")

    def unmark() -> None:
        with contextlib.suppress(OSError):
            if path.read_text() == mine:
                path.unlink()

    return unmark
