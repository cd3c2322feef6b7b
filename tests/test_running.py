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

# A dataset whose source waits for ever: next() keeps the main thread inside TensorFlow.
STUCK = """
import threading
import tensorflow as tf
never = threading.Event()
def source():
    never.wait()
    yield 1
spec = tf.TensorSpec([], tf.int32)
stuck = iter(tf.data.Dataset.from_generator(source, output_signature=spec))
"""


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


def _script(body: str, grace: float, prelude: str = "") -> str:
    """A script that runs ``body`` under signals_watched("prog", grace) after "ready", and
    exits 130 when it is interrupted. SIGTERM's handler raises KeyboardInterrupt."""
    return (
        textwrap.dedent(prelude)
        + "import os, signal, sys, time\n"
        + "from petal.running import signals_held, signals_watched\n"
        + "def term(signum, frame):\n    raise KeyboardInterrupt\n"
        + "signal.signal(signal.SIGTERM, term)\n"
        + "try:\n"
        + f"    with signals_watched('prog', grace={grace}):\n"
        + "        print('ready', flush=True)\n"
        + textwrap.indent(textwrap.dedent(body), " " * 8)
        + "except KeyboardInterrupt:\n"
        + "    print('interrupted', flush=True)\n"
        + "    os._exit(130)\n"
        + "print('done', flush=True)\n"
    )


def test_ctrl_c_again_quits_a_main_thread_stuck_in_tensorflow():
    """Ctrl-C did nothing while the main thread waited in TensorFlow for input that never
    came; the process had to be killed with SIGKILL."""
    with _Process(_script("next(stuck)\n", grace=1.0, prelude=STUCK)) as run:
        assert run.wait_for("ready", run.out, 120), run.err
        time.sleep(0.5)
        run.send(signal.SIGINT)
        assert run.wait_for("prog: Ctrl-C has waited", run.err, 30), run.err
        assert run.proc.poll() is None  # one signal never ends it without clean-up
        run.send(signal.SIGINT)
        assert run.proc.wait(30) == 130
        run.wait_for("quit at once", run.err, 5)
    said = [line.strip() for line in run.err if line.startswith("prog:")]
    assert said[0] == (
        "prog: Ctrl-C has waited 1 s for the call in progress (in TensorFlow, most likely) to "
        "return; press Ctrl-C again to quit at once, without clean-up"
    )
    assert said[1].startswith(
        "prog: quit at once on Ctrl-C, without clean-up (Ctrl-C before it had waited "
    )
    assert len(said) == 2 and run.out == ["ready\n"]


def test_a_second_sigterm_quits_at_once_before_the_first_was_said_to_wait():
    with _Process(_script("next(stuck)\n", grace=60, prelude=STUCK)) as run:
        assert run.wait_for("ready", run.out, 120), run.err
        time.sleep(0.5)
        run.send(signal.SIGTERM)
        time.sleep(1.5)
        run.send(signal.SIGTERM)
        assert run.proc.wait(30) == 128 + signal.SIGTERM
        run.wait_for("quit at once", run.err, 5)
    said = [line.strip() for line in run.err if line.startswith("prog:")]
    assert len(said) == 1 and re.fullmatch(
        r"prog: quit at once on SIGTERM, without clean-up \(SIGTERM before it had waited [12] s "
        r"for the call in progress\)", said[0]
    ), said


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
    with _Process(_script(body, grace=0.5)) as run:
        assert run.wait_for("ready", run.out, 60), run.err
        time.sleep(0.3)
        run.send(signal.SIGINT)
        time.sleep(0.2)
        run.send(signal.SIGINT)  # a second, soon after: as the first
        assert run.proc.wait(30) == 130
        run.wait_for("interrupted", run.out, 5)
    assert run.out == ["ready\n", "interrupted\n"]
    assert not [line for line in run.err if line.startswith("prog:")], run.err


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


def test_the_command_line_watches_its_commands():
    code = (
        STUCK
        + "from petal import cli\n"
        + "from petal.models import registry\n"
        + "def summary(*args):\n"
        + "    print('stuck', flush=True)\n"
        + "    next(stuck)\n"
        + "registry.model_summary = summary\n"
        + "cli.main(['models'])\n"
    )
    with _Process(code) as run:
        assert run.wait_for("stuck", run.out, 120), run.err
        time.sleep(0.5)
        run.send(signal.SIGINT)
        time.sleep(1.5)
        run.send(signal.SIGINT)
        assert run.proc.wait(30) == 130
        run.wait_for("quit at once", run.err, 5)
    assert run.err[-1].startswith("petal models: quit at once on Ctrl-C, without clean-up")


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
    assert set(os.listdir("/proc/self/fd")) == before
