"""The marker a process keeps in a local folder it writes (``petal train``'s work directory,
``petal convert``'s output), so that a second process is refused instead of mixing its files
with the first's.

A process reading a local records folder (``petal train``) leaves a marker of its own
there (:func:`mark_reading`; several may read at once), so that a conversion into that
folder is refused instead of replacing the shards it reads.

Each marker holds ``{"pid": ..., "host": ..., "doing": ...}`` (what the holder does there,
for the refusal: "training in it", "converting into it"); one left by a process that has died
(same host, no such process) protects nothing and is taken over.

:func:`signals_held` keeps Ctrl-C and SIGTERM from cutting such a process's writes short.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from petal.errors import PetalError

RUNNING_FILE = ".petal-running"
# Markers of the processes reading a records folder (``petal train``): one file each.
READING_PREFIX = ".petal-reading-"


def running_elsewhere(folder: Path, doing: str = "using it") -> str | None:
    """Who else holds ``folder`` and what it does there (``"process PID on HOST is training
    in it"``; ``doing`` when its marker does not say), when another live process (or one on
    another host) does; None otherwise."""
    return _holder(folder / RUNNING_FILE, doing)


def _holder(marker: Path, doing: str) -> str | None:
    """:func:`running_elsewhere` of one marker file."""
    try:
        holder = json.loads(marker.read_text())
        pid, host = int(holder["pid"]), str(holder["host"])
        doing = str(holder.get("doing") or doing)
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError, AttributeError, OSError):
        return f"an unknown process is {doing}"  # unreadable: assume someone holds it
    who = f"process {pid} on {host} is {doing}"
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


def in_use_error(folder, who: str, option: str, marker: str = RUNNING_FILE) -> PetalError:
    """The refusal of ``folder``, held by ``who`` (:func:`running_elsewhere`'s text) through
    its file ``marker``; ``option`` names what to pass instead (``--workdir``, ``DST``)."""
    return PetalError(
        f"{folder} is in use: {who}; wait for it to end or stop it, or pass another {option} "
        f"(if it is not running, delete {os.path.join(folder, marker)})."
    )


def mark_running(
    folder: Path, in_use: Callable[[str], PetalError], doing: str
) -> Callable[[], None]:
    """Writes :data:`RUNNING_FILE` in ``folder``, saying this process is ``doing`` there
    (created exclusively: of two processes starting at once, one is refused with
    ``in_use(who)``, :func:`running_elsewhere`'s text); returns the function that removes
    it, if it is still this process's."""
    path = folder / RUNNING_FILE
    mine = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "doing": doing})
    for _ in range(2):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            if who := running_elsewhere(folder, doing):
                raise in_use(who) from None
            path.unlink(missing_ok=True)  # left by a process that died: take it over
            continue
        with os.fdopen(fd, "w") as f:
            f.write(mine)
        break
    else:
        raise in_use(f"another process is {doing}")

    def unmark() -> None:
        with contextlib.suppress(OSError):
            if path.read_text() == mine:
                path.unlink()

    return unmark


def mark_reading(folder: Path, doing: str) -> Callable[[], None]:
    """Leaves a marker (:data:`READING_PREFIX` + host and pid) in the local records ``folder``
    while this process is ``doing`` there (``"training from it"``), so that a conversion
    into it is refused (:func:`reading_elsewhere`) instead of replacing the shards under the
    reader; returns the function that removes it. Several readers may hold one folder; a
    folder this process may not write (shared, read-only data) is read without a marker."""
    path = folder / f"{READING_PREFIX}{socket.gethostname()}-{os.getpid()}"
    try:
        path.write_text(
            json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "doing": doing})
        )
    except OSError:
        return lambda: None

    def unmark() -> None:
        path.unlink(missing_ok=True)

    return unmark


def reading_elsewhere(folder: Path) -> tuple[str, str] | None:
    """Who reads ``folder`` (:func:`running_elsewhere`'s text) and the name of its marker
    (:func:`mark_reading`), when another live process does; None otherwise."""
    try:
        markers = sorted(folder.glob(f"{READING_PREFIX}*"))
    except OSError:
        return None
    for marker in markers:
        if who := _holder(marker, "reading it"):
            return who, marker.name
    return None


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Ctrl-C and SIGTERM wait until the block is over, then are delivered to the handlers
    that were in place (SIGTERM first, when both came).

    Keras opens and loads a model file's weight store inside a bare ``except:``: the
    exception of a signal raised there was swallowed and the save or load went on another
    way (training ran on and exited 0). In a thread other than the main one, which receives
    no signals, the block runs as it is.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = {
        signum: signal.signal(signum, lambda signum, frame: caught.append(signum))
        for signum in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        yield
    finally:
        for signum, handler in previous.items():
            # None: a handler not set from Python, which cannot be put back; the default.
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)
        if caught:
            signal.raise_signal(signal.SIGTERM if signal.SIGTERM in caught else signal.SIGINT)
