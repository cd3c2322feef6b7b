"""Signals a process cannot take at once (:func:`petal.running.signals_watched`): a main
thread inside one long call of TensorFlow, a handler held over a write, a forked child."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

# A dataset whose source waits for ever: next() keeps the main thread inside TensorFlow. The
# source says "stuck" once next() has called it, so the main thread is inside by then.
STUCK = """
import threading
import tensorflow as tf
never = threading.Event()
def source():
    print("stuck", flush=True)
    never.wait()
    yield 1
spec = tf.TensorSpec([], tf.int32)
stuck = iter(tf.data.Dataset.from_generator(source, output_signature=spec))
"""


# The watch's last line, which the process writes just before it ends (the hint before it
# says "to quit at once" too).
QUIT = ": quit at once on"


class _Process:
    """A Python process running ``code``, whose stdout and stderr lines are read as they
    come (TensorFlow's threads may keep it from ever ending: it is killed at the end)."""

    def __init__(self, code: str):
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, start_new_session=True,
        )  # fmt: skip
        self.out: list[str] = []
        self.err: list[str] = []
        for stream, lines in ((self.proc.stdout, self.out), (self.proc.stderr, self.err)):
            threading.Thread(target=lambda s=stream, ls=lines: ls.extend(s), daemon=True).start()

    def wait_for(self, text: str, lines: list[str], timeout: float) -> bool:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if any(text in line for line in list(lines)):
                return True
            time.sleep(0.05)
        return False

    def send(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def _script(body: str, grace: float, prelude: str = "", held_grace: float = 30.0) -> str:
    """A script that runs ``body`` under signals_watched("prog", grace, held_grace) after
    "ready", and exits 130 when it is interrupted. SIGTERM's handler raises
    KeyboardInterrupt."""
    return (
        textwrap.dedent(prelude)
        + "import os, signal, sys, time\n"
        + "from petal.running import signals_held, signals_watched\n"
        + "def term(signum, frame):\n    raise KeyboardInterrupt\n"
        + "signal.signal(signal.SIGTERM, term)\n"
        + "try:\n"
        + f"    with signals_watched('prog', grace={grace}, held_grace={held_grace}):\n"
        + "        print('ready', flush=True)\n"
        + textwrap.indent(textwrap.dedent(body), " " * 8)
        + "except KeyboardInterrupt:\n"
        + "    print('interrupted', flush=True)\n"
        + "    os._exit(130)\n"
        + "print('done', flush=True)\n"
    )


@pytest.mark.slow  # 9 s in CI on a Zen 3 host (session 39: 775 s): `pytest -m slow` runs it
def test_ctrl_c_again_quits_a_main_thread_stuck_in_tensorflow():
    """Ctrl-C did nothing while the main thread waited in TensorFlow for input that never
    came; the process had to be killed with SIGKILL."""
    with _Process(_script("next(stuck)\n", grace=3.0, prelude=STUCK)) as run:
        assert run.wait_for("stuck", run.out, 120), run.err
        run.send(signal.SIGINT)
        time.sleep(1.2)
        run.send(signal.SIGINT)  # before the wait is said: the process may still end itself
        assert run.wait_for("prog: Ctrl-C has waited", run.err, 30), run.err
        assert run.proc.poll() is None
        run.send(signal.SIGINT)
        assert run.proc.wait(30) == 130
        assert run.wait_for(QUIT, run.err, 10), run.err
    _said(run, "Ctrl-C", "press Ctrl-C again", waited="[34]")
    assert run.out == ["ready\n", "stuck\n"]


def _said(run: _Process, name: str, again: str, waited: str) -> None:
    """The watch's two lines: the wait of ``name`` said after ``waited`` (a pattern) seconds,
    then the quit."""
    said = [line.strip() for line in run.err if line.startswith("prog:")]
    assert len(said) == 2 and re.fullmatch(
        rf"prog: {name} has waited {waited} s for the call in progress \(in TensorFlow, most "
        rf"likely\) to return; {again} to quit at once, without clean-up", said[0]
    ), said
    assert said[1] == f"prog: quit at once on {name}, without clean-up"


# The main thread takes no signal while it sleeps (the kernel gives them to another thread),
# as when it waits inside a call of compiled code: without TensorFlow's start-up.
DEAF = "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})\ntime.sleep(60)\n"


def test_sigterm_again_quits_once_the_wait_is_said():
    with _Process(_script(DEAF, grace=1.0)) as run:
        assert run.wait_for("ready", run.out, 60), run.err
        time.sleep(0.3)
        run.send(signal.SIGTERM)
        assert run.wait_for("prog: SIGTERM has waited", run.err, 30), run.err
        run.send(signal.SIGTERM)
        assert run.proc.wait(30) == 128 + signal.SIGTERM
        assert run.wait_for(QUIT, run.err, 10), run.err
    _said(run, "SIGTERM", "send SIGTERM again", waited="[12]")


def test_a_full_stderr_does_not_keep_the_process_from_quitting():
    """The watch's lines to a pipe nobody reads (a paused pager, a stalled log collector)
    blocked it: the second signal did nothing."""
    fill = (
        "os.set_blocking(2, False)\n"
        "try:\n"
        "    while True:\n"
        "        os.write(2, b'x' * 4096)\n"
        "except BlockingIOError:\n"
        "    pass\n"
        "os.set_blocking(2, True)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", _script(DEAF, grace=0.5, prelude="import os\n" + fill)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        assert proc.stdout.readline() == "ready\n"
        time.sleep(0.3)
        proc.send_signal(signal.SIGTERM)
        time.sleep(2.5)  # the wait is said (to no one) after 0.5 s, given up after 1.5
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 128 + signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def test_the_command_line_says_the_wait_while_tensorflow_starts(tmp_path):
    """TensorFlow's start points stderr at a file (its start-up lines are dropped): the
    watch wrote its lines there, and they were lost."""
    for name, body in (("keras", ""), ("tensorflow", "import signal, time\n" + DEAF)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(body)
    code = (
        f"import sys\nsys.path.insert(0, {str(tmp_path)!r})\n"
        "print('ready', flush=True)\n"
        "from petal import cli\n"
        "sys.exit(cli.main(['models']))\n"
    )
    with _Process(code) as run:
        assert run.wait_for("ready", run.out, 60), run.err
        time.sleep(1.0)
        run.send(signal.SIGINT)
        assert run.wait_for("petal models: Ctrl-C has waited", run.err, 30), run.err
        run.send(signal.SIGINT)
        assert run.proc.wait(30) == 130
        assert run.wait_for(QUIT, run.err, 10), run.err
    assert run.err[-1] == "petal models: quit at once on Ctrl-C, without clean-up\n"


@pytest.mark.parametrize(
    "body",
    [
        "time.sleep(60)\n",  # Python takes the signal at once
        # A write that holds the signal over its end takes it as well: no warning.
        "with signals_held():\n    time.sleep(2.5)\n",
    ],
    ids=["sleeping", "held"],
)
def test_a_signal_the_main_thread_takes_stops_it_as_before(body):
    with _Process(_script(body, grace=1.5)) as run:
        assert run.wait_for("ready", run.out, 60), run.err
        time.sleep(0.3)
        run.send(signal.SIGINT)
        time.sleep(0.2)
        run.send(signal.SIGINT)  # a second, soon after: as the first
        assert run.proc.wait(30) == 130
        run.wait_for("interrupted", run.out, 5)
    assert run.out == ["ready\n", "interrupted\n"]
    assert not [line for line in run.err if line.startswith("prog:")], run.err


def test_a_signal_held_over_a_wait_that_does_not_end_is_said_later():
    """A signal held over a write or clean-up that waited for ever (in Python, so that the
    handler holding it ran) was held for ever: only SIGKILL ended the process."""
    body = "with signals_held():\n    threading.Event().wait(60)\n"
    code = _script(body, grace=1.0, held_grace=3.0, prelude="import threading\n")
    with _Process(code) as run:
        assert run.wait_for("ready", run.out, 60), run.err
        time.sleep(0.3)
        run.send(signal.SIGINT)
        time.sleep(1.8)  # past grace, not held_grace: not said yet
        assert not [line for line in run.err if line.startswith("prog:")], run.err
        assert run.wait_for("prog: Ctrl-C waits", run.err, 30), run.err
        run.send(signal.SIGINT)
        assert run.proc.wait(30) == 130
        assert run.wait_for(QUIT, run.err, 10), run.err
    said = [line.strip() for line in run.err if line.startswith("prog:")]
    assert len(said) == 2 and re.fullmatch(
        r"prog: Ctrl-C waits for the write or clean-up in progress to end \([34] s so far\); "
        r"press Ctrl-C again to quit at once, without clean-up", said[0]
    ), said
    assert said[1] == "prog: quit at once on Ctrl-C, without clean-up"


def test_one_signal_held_past_the_grace_is_taken_once_the_block_ends():
    """A block holding one Ctrl-C past its grace (TensorFlow's import on a loaded machine)
    then ended: the line named a write that was not one. (Whether the process then quit at
    once is a race: the next test checks the watch itself.)"""
    body = "with signals_held(\"the test's work\"):\n    time.sleep(4)\n"
    with _Process(_script(body, grace=0.5, held_grace=1.5)) as run:
        assert run.wait_for("ready", run.out, 60), run.err
        time.sleep(0.3)
        run.send(signal.SIGINT)
        assert run.proc.wait(30) == 130
        run.wait_for("interrupted", run.out, 5)
    assert run.out == ["ready\n", "interrupted\n"], run.err
    said = [line.strip() for line in run.err if line.startswith("prog:")]
    assert len(said) == 1 and re.fullmatch(
        r"prog: Ctrl-C waits for the test's work to end \([12] s so far\); press Ctrl-C again "
        r"to quit at once, without clean-up", said[0]
    ), said


def test_a_held_signal_delivered_again_is_no_second_press(monkeypatch):
    """signals_held delivers the signal it held again when its block ends; its byte reached
    the watch's pipe a second time and, once the long hold had been said, counted as a
    second Ctrl-C: os._exit, without clean-up, if the watch read it before the main thread
    ran the handler."""
    from petal import running

    quits: list[int] = []
    monkeypatch.setattr(running.os, "_exit", quits.append)
    monkeypatch.setattr(running, "_taken_at", [float("-inf")])
    monkeypatch.setattr(running, "_held_at", [time.monotonic() + 60])  # held throughout
    monkeypatch.setattr(running, "_raised", [0])
    read_end, write_end = os.pipe()
    err_read, err_write = os.pipe()
    stop = threading.Event()
    watch = threading.Thread(target=running._watch,
                             args=(read_end, err_write, "prog", (0.1, 0.3), stop))  # fmt: skip
    watch.start()
    try:
        os.write(write_end, bytes([signal.SIGINT]))
        said = os.read(err_read, 4096).decode()  # blocks until the hold is said
        assert said.startswith("prog: Ctrl-C waits for the write or clean-up in progress")
        running._raised[0] += 1  # as signals_held does before it delivers the signal again
        os.write(write_end, bytes([signal.SIGINT]))
        time.sleep(0.5)
        assert quits == []
        os.write(write_end, bytes([signal.SIGINT]))  # a real second press
        deadline = time.monotonic() + 10
        while not quits and time.monotonic() < deadline:
            time.sleep(0.05)
        assert quits == [128 + signal.SIGINT]
    finally:
        stop.set()
        os.write(write_end, b"\0")
        watch.join(10)
        for fd in (write_end, err_read):
            os.close(fd)


def test_a_forked_childs_signals_are_not_the_parents():
    """A child forked under the watch (bench_input's ceiling forks its workers) inherited
    its pipe: a SIGTERM the child took was seen as one the parent never took."""
    body = """\
    pid = os.fork()
    if pid == 0:
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        except KeyboardInterrupt:
            os._exit(7)
        os._exit(0)
    print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
    time.sleep(1.5)
    """
    with _Process(_script(body, grace=0.5)) as run:
        assert run.proc.wait(60) == 0, run.err
        run.wait_for("done", run.out, 5)
    assert run.out == ["ready\n", "7\n", "done\n"]
    assert not [line for line in run.err if line.startswith("prog:")], run.err


def test_outside_the_main_thread_nothing_is_watched():
    from petal.running import _watch_pipe, signals_watched

    def watched():
        with signals_watched("prog"):
            seen.append(_watch_pipe[0])

    seen: list = []
    thread = threading.Thread(target=watched)
    thread.start()
    thread.join()
    assert seen == [None]
    with signals_watched("prog", grace=0.1):
        seen.append(_watch_pipe[0])
        assert signal.getsignal(signal.SIGINT).__wrapped__ is signal.default_int_handler
    assert seen[1] is not None and _watch_pipe[0] is None
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert signal.set_wakeup_fd(-1) == -1  # the pipe is no longer the process's


def test_no_thread_or_pipe_outlives_the_watch():
    from petal.running import signals_watched

    before = set(os.listdir("/proc/self/fd"))
    with signals_watched("prog"):
        assert any(t.name == "petal-signals" for t in threading.enumerate())
    assert not any(t.name == "petal-signals" for t in threading.enumerate())
    assert set(os.listdir("/proc/self/fd")) <= before


def _state():
    """What a watch leaves in this process: the pipe it publishes, SIGINT's handler, the
    wakeup fd, its thread, the open descriptors."""
    from petal.running import _watch_pipe

    wakeup = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(wakeup)
    threads = [t for t in threading.enumerate() if t.name == "petal-signals" and t.is_alive()]
    return _watch_pipe[0], signal.getsignal(signal.SIGINT), wakeup, threads


@pytest.mark.parametrize(
    ("owner", "name", "error"),
    [
        (os, "pipe", OSError(24, "Too many open files")),
        (os, "dup", OSError(24, "Too many open files")),
        (threading.Thread, "start", RuntimeError("can't start new thread")),
    ],
    ids=["pipe", "dup", "thread"],
)
def test_a_watch_that_cannot_start_runs_the_block_unwatched(monkeypatch, owner, name, error):
    """With no descriptor to spare, the command never ran, and SIGINT's handler stayed
    wrapped."""
    from petal.running import signals_watched

    def fail(*args, **kwargs):
        raise error

    before, fds = _state(), set(os.listdir("/proc/self/fd"))
    monkeypatch.setattr(owner, name, fail)
    ran = []
    with signals_watched("prog"):
        ran.append(1)
    # An error of the block is its own, not one raised while handling the watch's.
    with pytest.raises(LookupError) as caught, signals_watched("prog"):
        raise LookupError("the block's")
    monkeypatch.undo()
    assert ran == [1] and caught.value.__context__ is None
    assert _state() == before and set(os.listdir("/proc/self/fd")) <= fds


def test_a_signal_while_the_watch_ends_waits_until_it_has_ended(monkeypatch):
    """Ctrl-C as the watch ended left its pipe published (every later command unwatched),
    its descriptors open and the wakeup fd set."""
    from petal.running import signals_watched

    real_join = threading.Thread.join

    def join(self, timeout=None):
        if self.name == "petal-signals":
            os.kill(os.getpid(), signal.SIGINT)
        return real_join(self, timeout)

    before, fds = _state(), set(os.listdir("/proc/self/fd"))
    monkeypatch.setattr(threading.Thread, "join", join)
    with pytest.raises(KeyboardInterrupt), signals_watched("prog"):
        pass
    monkeypatch.undo()
    assert _state() == before and set(os.listdir("/proc/self/fd")) <= fds


@pytest.mark.skipif(sys.platform == "win32", reason="needs POSIX resource limits")
def test_a_marker_whose_write_fails_is_not_left_behind(tmp_path):
    """On a full disk the running marker was created, its write failed, and the empty file
    stayed: every later conversion into that folder was refused ("an unknown process is
    converting into it") once space was freed. A file-size limit of 0 makes the write fail
    as a full disk does."""
    code = textwrap.dedent(f"""
        import resource, sys
        from pathlib import Path
        from petal.errors import PetalError
        from petal.running import mark_reading, mark_running
        folder = Path({str(tmp_path)!r})
        resource.setrlimit(resource.RLIMIT_FSIZE, (0, resource.RLIM_INFINITY))
        try:
            mark_running(folder, PetalError, "converting into it")
        except OSError as err:
            print("refused:", err.strerror)
        mark_reading(folder, "training from it")
        print(sorted(p.name for p in folder.iterdir()))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == ["refused: File too large", "[]"], done.stdout
