"""The marker a process keeps in a local folder it writes (``petal train``'s work directory,
``petal convert``'s output), so that a second process is refused instead of mixing its files
with the first's.

A process reading a local records folder (``petal train``) leaves a marker of its own
there (:func:`mark_reading`; several may read at once), so that a conversion into that
folder is refused instead of replacing the shards it reads.

Each marker holds ``{"pid": ..., "host": ..., "doing": ...}`` (what the holder does there,
for the refusal: "training in it", "converting into it"); one left by a process that has died
(same host, no such process) protects nothing and is taken over.

:func:`signals_held` keeps Ctrl-C and SIGTERM from cutting such a process's writes short;
:func:`signals_watched` lets a second one end a process whose main thread cannot take the first.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from petal.errors import PetalError

RUNNING_FILE = ".petal-running"
# Markers of the processes reading a records folder (``petal train``): one file each.
READING_PREFIX = ".petal-reading-"


def running_elsewhere(folder: Path, doing: str = "using it", *, only: bool = False) -> str | None:
    """Who else holds ``folder`` and what it does there (``"process PID on HOST is training
    in it"``; ``doing`` when its marker does not say), when another live process (or one on
    another host) does; None otherwise. ``only``: a holder whose marker does not say it is
    ``doing`` (or cannot be read) counts as none."""
    return _holder(folder / RUNNING_FILE, doing, only)


def _holder(marker: Path, doing: str, only: bool = False) -> str | None:
    """:func:`running_elsewhere` of one marker file."""
    try:
        holder = json.loads(marker.read_text())
        pid, host = int(holder["pid"]), str(holder["host"])
        said = holder.get("doing")
    except (FileNotFoundError, NotADirectoryError):  # the latter: "folder" is a file
        return None
    except (ValueError, KeyError, TypeError, AttributeError, OSError):
        # Unreadable: assume someone holds it.
        return None if only else f"an unknown process is {doing}"
    if only and said != doing:
        return None
    doing = str(said or doing)
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
        try:
            with os.fdopen(fd, "w") as f:
                f.write(mine)
        except BaseException:
            # A full disk: an empty marker left behind refused every later run ("an
            # unknown process is ...") once space was freed.
            path.unlink(missing_ok=True)
            raise
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
        with contextlib.suppress(OSError):  # created, then its write failed (a full disk)
            path.unlink(missing_ok=True)
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


# How long a signal waits on the main thread before :func:`signals_watched` says so (once
# :func:`signals_held` holds it: HELD_GRACE_S); another signal then ends the process.
SIGNAL_GRACE_S = 5.0
HELD_GRACE_S = 30.0
HELD_DOING = "the write or clean-up in progress"
# What the block holding the last signal held does (:func:`signals_held`), and how many
# signals it has delivered again (the watch counts those it has read: not the user's).
_held_doing = [HELD_DOING]
_raised = [0]


@contextlib.contextmanager
def signals_held(doing: str = HELD_DOING) -> Iterator[None]:
    """Ctrl-C and SIGTERM wait until the block is over, then are delivered to the handlers
    that were in place (SIGTERM first, when both came). ``doing``: what the block does, as
    :func:`signals_watched` says it when a held signal waits long.

    Keras opens and loads a model file's weight store inside a bare ``except:``: the
    exception of a signal raised there was swallowed and the save or load went on another
    way (training ran on and exited 0). In a thread other than the main one, which receives
    no signals, the block runs as it is.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []

    def hold(signum, frame) -> None:
        _held_at[0] = time.monotonic()
        _held_doing[0] = doing
        caught.append(signum)

    previous = {signum: signal.signal(signum, hold) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            # None: a handler not set from Python, which cannot be put back; the default.
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)
        if caught:
            signum = signal.SIGTERM if signal.SIGTERM in caught else signal.SIGINT
            if callable(signal.getsignal(signum)):
                # Delivered again, its byte reaches the watch's pipe a second time: not
                # another press (it quit at once, without clean-up, once a long hold was said).
                _raised[0] += 1
            signal.raise_signal(signum)


# When the main thread last ran a handler of Ctrl-C or SIGTERM, and when it last held one
# (time.monotonic()).
_taken_at = [float("-inf")]
_held_at = [float("-inf")]
# The pipe of the watch in progress: (read end, write end), or None.
_watch_pipe: list[tuple[int, int] | None] = [None]
_NAMES = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM"}


@contextlib.contextmanager
def signals_watched(
    prog: str, grace: float = SIGNAL_GRACE_S, held_grace: float = HELD_GRACE_S
) -> Iterator[None]:
    """When the main thread has not run the handler of a Ctrl-C or SIGTERM for ``grace``
    seconds, ``prog`` says so on stderr, and another one ends the process at once (exit
    128 + its number, without clean-up). A signal that :func:`signals_held` holds is said
    after ``held_grace`` seconds (a write that never ends held Ctrl-C for ever).

    Python runs signal handlers in the main thread between two of its instructions, so a
    main thread inside one long call of compiled code (TensorFlow waiting for input that
    does not come, a TPU that does not answer) took no signal: Ctrl-C and SIGTERM did
    nothing, and only SIGKILL ended the process. The signal's arrival is written to a pipe
    (``signal.set_wakeup_fd``) that a thread reads; the handlers in place when the block
    starts note when they run, and :func:`signals_held`'s when it holds one. The thread writes to
    the stderr of the block's start (TensorFlow's start points stderr at a file a while).
    Outside the main thread, off POSIX systems, and without a file descriptor to spare, the
    block runs as it is.
    """
    main = threading.current_thread() is threading.main_thread()
    if not main or _watch_pipe[0] or os.name != "posix":
        yield
        return
    try:
        read_end, write_end = os.pipe()
    except OSError:  # no descriptor to spare
        read_end = None
    if read_end is None:  # outside the except clause: the block's errors are not chained to it
        yield
        return
    stop = threading.Event()
    watch = None
    handlers: dict = {}
    previous_fd = None
    pipe = (read_end, write_end, -1)
    try:
        with signals_held():  # a signal waits until the watch is in place
            os.set_blocking(write_end, False)
            pipe = (read_end, write_end, os.dup(2))
            watch = threading.Thread(
                target=_watch, args=(read_end, pipe[2], prog, (grace, held_grace), stop),
                name="petal-signals", daemon=True,
            )  # fmt: skip
            watch.start()
            previous_fd = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
            _watch_pipe[0] = (read_end, write_end)
        for signum in _NAMES:
            handler = signal.getsignal(signum)
            if callable(handler):
                handlers[signum] = handler
                signal.signal(signum, _noting(handler))
        watched = True
    except (OSError, RuntimeError, ValueError):  # no descriptor or thread to spare
        _end_watch(watch, stop, pipe, previous_fd, handlers)
        watched = False
    except BaseException:
        _end_watch(watch, stop, pipe, previous_fd, handlers)
        raise
    if not watched:  # as above
        yield
        return
    try:
        yield
    finally:
        _end_watch(watch, stop, pipe, previous_fd, handlers)


def _end_watch(watch, stop, pipe, previous_fd, handlers) -> None:
    """Undoes what :func:`signals_watched` set up, as far as it got; a signal meanwhile
    waits until it is done. ``pipe``: (read end, write end, copy of stderr or -1). The
    thread closes the first and the last (their numbers are not free for other files while
    it may still use them)."""
    read_end, write_end, err = pipe
    for signum, handler in handlers.items():
        if getattr(signal.getsignal(signum), "__wrapped__", None) is handler:
            signal.signal(signum, handler)
    with signals_held():
        if previous_fd is not None:
            signal.set_wakeup_fd(previous_fd)
        _watch_pipe[0] = None
        stop.set()
        with contextlib.suppress(OSError):
            os.write(write_end, b"\0")  # wakes the watch
        with contextlib.suppress(OSError):
            os.close(write_end)
        if watch is None or watch.ident is None:  # never started
            for fd in (read_end, err):
                with contextlib.suppress(OSError):
                    if fd >= 0:
                        os.close(fd)
        else:
            watch.join(5)


def _noting(handler: Callable) -> Callable:
    """``handler``, noting when it runs (in ``_taken_at``, for :func:`signals_watched`)."""

    def noting(signum, frame):
        _taken_at[0] = time.monotonic()
        return handler(signum, frame)

    noting.__wrapped__ = handler
    return noting


def _watch(read_end: int, err: int, prog: str, graces: tuple, stop: threading.Event) -> None:
    """The thread of :func:`signals_watched`: reads the numbers of the signals that arrive
    from ``read_end`` until ``stop`` is set, writing to ``err`` (a copy of stderr); closes
    both when it ends."""
    try:
        _read_signals(read_end, err, prog, graces, stop)
    finally:
        for fd in (read_end, err):
            with contextlib.suppress(OSError):
                os.close(fd)


def _read_signals(read_end: int, err: int, prog: str, graces: tuple, stop) -> None:
    """:func:`_watch`'s loop; ``graces``: (grace, held_grace) of :func:`signals_watched`."""
    waiting = None  # (when, number) of the oldest signal the main thread has not taken
    said = False
    redelivered = _raised[0]  # signals_held's deliveries read so far (this thread's count)
    poll = select.poll()  # not select(): the pipe's number may be above FD_SETSIZE
    poll.register(read_end, select.POLLIN)
    while not stop.is_set():
        try:
            ready = poll.poll(None if waiting is None else 250)
            arrived = os.read(read_end, 64) if ready else b""
        except OSError:
            return
        now = time.monotonic()
        # The handler may run before this thread reads the signal's byte: 0.5 s of slack.
        if waiting is not None and _taken_at[0] >= waiting[0] - 0.5:
            waiting, said = None, False
        for signum in arrived:
            if signum not in _NAMES or stop.is_set():
                continue
            if redelivered < _raised[0]:  # a held signal delivered again, not a new one
                redelivered += 1
                continue
            if waiting is None:
                waiting = (now, signum) if _taken_at[0] < now - 0.5 else None
            elif said:
                try:
                    _say(err, f"{prog}: quit at once on {_NAMES[signum]}, without clean-up")
                finally:
                    os._exit(128 + signum)
        if waiting is None or said:
            continue
        held = _held_at[0] >= waiting[0] - 0.5
        if now - waiting[0] < graces[held]:
            continue
        said = True
        name, seconds = _NAMES[waiting[1]], now - waiting[0]
        again = "press Ctrl-C again" if waiting[1] == signal.SIGINT else "send SIGTERM again"
        if held:
            why = f"waits for {_held_doing[0]} to end ({seconds:.0f} s so far)"
        else:
            why = (
                f"has waited {seconds:.0f} s for the call in progress (in TensorFlow, most "
                "likely) to return"
            )
        _say(err, f"{prog}: {name} {why}; {again} to quit at once, without clean-up")


def _say(err: int, line: str) -> None:
    """Writes ``line`` to ``err``, giving up after a second (a pipe nobody reads, a
    stopped terminal) so that the process can still quit."""

    def write(data: bytes) -> None:
        with contextlib.suppress(OSError):
            while data:
                data = data[os.write(err, data) :]

    writer = threading.Thread(target=write, args=((line + "\n").encode(),), daemon=True)
    writer.start()
    writer.join(1.0)


def _forget_watch() -> None:
    """In a forked child: signals go to no parent's watch (:func:`signals_watched`), whose
    thread is not there to read them."""
    if pipe := _watch_pipe[0]:
        _watch_pipe[0] = None
        try:
            signal.set_wakeup_fd(-1)
        except ValueError:
            return  # the pipe stays open: its number must not name another file here
        for end in pipe:
            with contextlib.suppress(OSError):
                os.close(end)


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_forget_watch)
