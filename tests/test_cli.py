"""The command line's own behaviour (commands themselves are tested with their modules)."""

import os
import signal
import subprocess
import sys

import pytest

from petal import cli

NOISE = [
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n",
    "I0000 00:00:1796281994.837965   21286 port.cc:153] oneDNN custom operations are on. "
    "You may see slightly different numerical results.\n",
    "I0000 00:00:1796281994.838543   21286 cudart_stub.cc:31] Could not find cuda drivers on "
    "your machine, GPU will not be used.\n",
    "E0000 00:00:1796282006.040266   21286 cuda_platform.cc:52] failed call to cuInit: "
    "INTERNAL: CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)\n",
]
KEPT = [
    "W0000 00:00:1796282006.040266   21286 some_op.cc:12] a real warning\n",
    "E0000 00:00:1796282006.040266   21286 some_op.cc:12] a real error\n",
    "/path/module.py:3: DeprecationWarning: something\n",
    "petal convert: error: Source folder not found: x\n",
]


def test_startup_noise_pattern_drops_only_tensorflows_start_up_lines():
    assert all(cli._STARTUP_NOISE.search(line) for line in NOISE)
    assert not any(cli._STARTUP_NOISE.search(line) for line in KEPT)


@pytest.mark.slow  # 36 s in a loaded suite run (session 40): `pytest -m slow` runs it
def test_commands_start_tensorflow_without_its_start_up_lines():
    code = (
        "import gc, sys\n"
        "from petal.cli import start_tensorflow_quietly\n"
        "start_tensorflow_quietly()\n"
        "print(gc.get_freeze_count())\n"
        "import tensorflow as tf\n"
        "tf.constant(1.0) + 1\n"
        "print('after', file=sys.stderr)\n"
    )
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    assert out.returncode == 0, out.stderr
    # TensorFlow's and Keras' objects are frozen: the collector's full passes skip them.
    assert int(out.stdout) > 100_000
    lines = out.stderr.splitlines(True)
    assert not [ln for ln in lines if cli._STARTUP_NOISE.search(ln)], out.stderr
    assert lines[-1] == "after\n"  # stderr works again afterwards


@pytest.mark.parametrize(  # 28-30 s a case in a loaded suite run (session 40): one in CI
    ("signame", "status", "said"),
    [("SIGINT", 130, "interrupted"),
     pytest.param("SIGTERM", 143, "terminated", marks=pytest.mark.slow)],
)
def test_ctrl_c_during_the_tensorflow_import_waits_for_its_end(signame, status, said):
    """Raised inside the import, KeyboardInterrupt left modules half-initialised (a
    segfault, an ImportError or matplotlib's RuntimeError instead of "interrupted"). The
    script sends itself SIGINT as Keras starts importing."""
    code = (
        "import builtins, os, signal, sys\n"
        "from petal.cli import main\n"
        "real = builtins.__import__\n"
        "sent = []\n"
        "def hook(name, *args, **kwargs):\n"
        "    if name == 'keras' and not sent:\n"
        "        sent.append(1)\n"
        f"        os.kill(os.getpid(), signal.{signame})\n"
        "    return real(name, *args, **kwargs)\n"
        "builtins.__import__ = hook\n"
        "code = main(['models', '--json'])\n"
        "builtins.__import__ = real\n"
        "print(code, 'keras.models' in sys.modules, 'tensorflow' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
        start_new_session=True,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == [str(status), "True", "True"]
    assert out.stderr.rstrip().endswith(f"petal models: {said}")


@pytest.mark.parametrize(
    ("stderr", "args"),
    [
        ("2>&-", 'convert "$1" "$2"'),  # refused before TensorFlow starts: 0.2 s
        ("2>/dev/full", 'convert "$1" "$2"'),
        # After TensorFlow's import: 34-35 s in a loaded suite run (session 40).
        pytest.param("2>&-", "models --num-classes 1", marks=pytest.mark.slow),
    ],
    ids=["closed", "full", "closed-after-tensorflow"],
)
def test_an_error_keeps_its_exit_status_when_stderr_cannot_take_its_line(stderr, args, tmp_path):
    """The failed write of the error line ended the command with 1 (and a traceback that
    could not be written either)."""
    if stderr.endswith("/dev/full") and not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    command = f'"$0" -m petal {args} {stderr}'
    out = subprocess.run(
        ["sh", "-c", command, sys.executable, str(tmp_path / "nowhere"), str(tmp_path / "out")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert (out.returncode, out.stdout) == (2, "")


@pytest.mark.parametrize("stderr", ["2>&-", "2>/dev/full"], ids=["closed", "full"])
def test_unwritten_help_and_a_scripts_interruption_keep_their_status_without_stderr(stderr):
    """The twins of the test above: `petal --version` with stdout full, and a benchmark
    script's "interrupted" or "terminated" (`run_script`), ended with 1 when their one line
    could not be written to stderr either."""
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    out = subprocess.run(
        ["sh", "-c", f'"$0" -m petal --version >/dev/full {stderr}', sys.executable],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 2
    for raised, status in (("KeyboardInterrupt", 130), ("cli._Terminated", 143)):
        code = (f"from petal import cli\ndef work():\n    raise {raised}\n"
                "cli.run_script('bench.py', work)")  # fmt: skip
        out = subprocess.run(
            ["sh", "-c", f'"$0" -c "$1" {stderr}', sys.executable, code],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert (out.returncode, out.stdout) == (status, ""), raised


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_the_demo_s_hint_keeps_the_exit_status_when_stderr_cannot_take_it(tmp_path, signum):
    """The resume hint was printed with print(): with stderr full or closed, the demo
    stopped by a signal ended with 1 and a traceback, not 130 or 143."""
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    code = (
        "import signal, sys\nimport petal.demo\nfrom petal import cli\n"
        # Not TensorFlow's import (10 s of CPU a process on a 2-core Zen 3): the demo stops
        # before anything uses it.
        "cli.start_tensorflow_quietly = lambda: None\n"
        f"petal.demo.run_demo = lambda *a, **k: signal.raise_signal({int(signum)})\n"
        f"sys.exit(cli.main(['demo', '--data', {str(tmp_path)!r}, '--workdir', "
        f"{str(tmp_path / 'demo')!r}]))"
    )
    for stderr in ("2>/dev/full", "2>&-"):
        out = subprocess.run(["sh", "-c", f'"$0" -c "$1" {stderr}', sys.executable, code],
                             capture_output=True, text=True, timeout=300)  # fmt: skip
        assert (out.returncode, out.stdout) == (128 + signum, ""), stderr


def test_the_resume_hint_does_not_wait_for_tensorflow(tmp_path):
    # `petal demo` stopped while it converted printed "interrupted", then imported
    # TensorFlow (10 s on a 2-core Zen 3) to read state.json for its hint.
    (tmp_path / "config.json").write_text('{"epochs": 3}')
    (tmp_path / "state.json").write_text('{"epoch": 2}')
    code = ("import sys\nfrom petal import cli\n"
            f"cli._print_resume_hint({str(tmp_path)!r}, 'demo')\n"
            "print('tensorflow' in sys.modules)")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    assert "petal demo: epoch 2 is saved; continue with `petal train --resume" in out.stderr
    assert out.stdout.strip() == "False", out.stderr


def test_listing_presets_does_not_start_tensorflow():
    out = subprocess.run(
        [sys.executable, "-c", "import sys; from petal.cli import main; main(['train', "
         "'--list-presets']); print('tensorflow' in sys.modules)"],
        capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "codelab-squeezenet" in out.stdout
    assert out.stdout.strip().endswith("False")
    # `python -m petal` is the petal command too.
    out = subprocess.run([sys.executable, "-m", "petal", "train", "--list-presets"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "codelab-squeezenet" in out.stdout, out.stderr
    out = subprocess.run([sys.executable, "-m", "petal", "train", "--epochs", "x"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "--epochs" in out.stderr, out.stderr


def test_models_checks_num_classes_and_survives_a_model_too_large_to_build(monkeypatch, capsys):
    import tensorflow as tf

    from petal.models import registry

    assert cli.main(["models", "--num-classes", "1"]) == 2
    assert capsys.readouterr().err.strip() == (
        "petal models: error: --num-classes must be an int >= 2. Received: num_classes=1"
    )

    def summary(name, num_classes, image_size):
        if name == "dense":  # its first Dense layer at 4000 px: 48M x 500 floats
            raise tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor")
        return {"name": name, "params": 1, "mflops": 1.0, "image_size": image_size,
                "default_image_size": 192, "normalization": "unit", "pretrained": False}

    monkeypatch.setattr(registry, "model_summary", summary)
    assert cli.main(["models", "--image-size", "4000"]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert rows[1].split()[:4] == ["dense", "out", "of", "memory"]
    assert rows[2].split()[0] == "convnet"


def test_sigterm_stops_a_command_as_ctrl_c_does(monkeypatch, capsys, tmp_path):
    # A job scheduler or a preempted VM sends SIGTERM: cleanup runs (a KeyboardInterrupt),
    # training says how to resume, and the exit status is 128 + 15.
    import signal

    from petal.training import loop

    def terminated_train(config, workdir, resume=False, overwrite=False):
        (tmp_path / "run" / "state.json").write_text('{"epoch": 2}')
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(loop, "train", terminated_train)
    (tmp_path / "run").mkdir()
    def not_handled(*args):
        raise AssertionError("petal let SIGTERM through to the caller's handler")

    before = signal.signal(signal.SIGTERM, not_handled)
    argv = ["train", "--preset", "quick", "--data", str(tmp_path), "--workdir",
            str(tmp_path / "run")]
    try:
        assert cli.main(argv) == 143
    finally:
        assert signal.signal(signal.SIGTERM, before) is not_handled  # the caller's is back
    assert capsys.readouterr().err.splitlines() == [
        f"petal train: epoch 2 is saved; continue with `petal train --resume --workdir "
        f"{tmp_path / 'run'}`",
        "petal train: terminated",
    ]


def _run_to_resume(monkeypatch, tmp_path):
    """A run folder of the quick preset to --resume, and the dict that gets the config
    ``petal train`` would train (as ``cfg``; train itself is replaced)."""
    from petal.training import loop

    run = tmp_path / "run"
    run.mkdir()
    # A run's config.json (petal train's holds the run's classes under "resolved").
    (run / "config.json").write_text('{"preset": "quick", "data": "/photos", "epochs": 5, '
                                     '"resolved": {"classes": ["a", "b"]}}')
    given = {}
    monkeypatch.setattr(loop, "train", lambda config, *a, **k: given.update(cfg=config))
    return run, given


def test_resume_continues_the_saved_config_not_a_preset(monkeypatch, capsys, tmp_path):
    run, given = _run_to_resume(monkeypatch, tmp_path)
    argv = ["train", "--workdir", str(run), "--resume", "--epochs", "7"]
    assert cli.main([*argv, "--preset", "codelab-squeezenet"]) == 2
    assert capsys.readouterr().err == (
        f"petal train: error: --resume continues the run saved in {run}; --preset starts a "
        "new one: drop --preset (change fields with --set KEY=VALUE), or drop --resume and "
        "pass --overwrite to start afresh.\n"
    )
    # A config file's fields apply on top of the saved run; a "preset" key of another
    # preset is refused as --preset is (it was ignored without a word).
    (tmp_path / "more.json").write_text('{"preset": "codelab-squeezenet", "seed": 3}')
    assert cli.main([*argv, "--config", str(tmp_path / "more.json")]) == 2
    assert "names preset 'codelab-squeezenet', but the run being resumed is 'quick'" in (
        capsys.readouterr().err)
    (tmp_path / "more.json").write_text('{"preset": "quick", "seed": 3}')
    assert cli.main([*argv, "--config", str(tmp_path / "more.json")]) == 0
    cfg = given["cfg"]
    assert (cfg.data, cfg.epochs, cfg.seed, cfg.preset) == ("/photos", 7, 3, "quick")


def test_ctrl_c_in_train_says_how_to_resume_from_the_last_saved_epoch(
    monkeypatch, capsys, tmp_path
):
    from petal.training import loop

    saved = {"state": None}

    def interrupted_train(config, workdir, resume=False, overwrite=False):
        if saved["state"] is not None:
            (tmp_path / "my run" / "state.json").write_text(saved["state"])
        raise KeyboardInterrupt

    monkeypatch.setattr(loop, "train", interrupted_train)
    argv = ["train", "--preset", "quick", "--data", str(tmp_path), "--workdir",
            str(tmp_path / "my run")]
    (tmp_path / "my run").mkdir()
    assert cli.main(argv) == 130  # interrupted before an epoch was saved: nothing to resume
    assert capsys.readouterr().err.splitlines() == [
        "petal train: no epoch was saved; the same command starts the run again",
        "petal train: interrupted",
    ]

    saved["state"] = "[3]"  # not petal's state file: no hint, and no error on top of Ctrl-C
    assert cli.main(argv) == 130
    assert capsys.readouterr().err == "petal train: interrupted\n"

    saved["state"] = '{"epoch": 3}'
    assert cli.main(argv) == 130
    assert capsys.readouterr().err.splitlines() == [
        f"petal train: epoch 3 is saved; continue with `petal train --resume --workdir "
        f"'{tmp_path / 'my run'}'`",
        "petal train: interrupted",
    ]

    # Stopped once its last files were written: a resume had "nothing to do".
    (tmp_path / "my run" / "model.keras").write_text("model")
    (tmp_path / "my run" / "metrics.json").write_text('{"epochs_completed": 3}')
    assert cli.main(argv) == 130
    assert capsys.readouterr().err.splitlines() == [
        f"petal train: the run is complete: its 3 epochs, model.keras and metrics.json are "
        f"saved in {tmp_path / 'my run'}",
        "petal train: interrupted",
    ]


def test_ctrl_c_in_a_resume_for_more_epochs_of_an_unfinished_run_says_its_epochs(
    monkeypatch, capsys, tmp_path
):
    """2 of 5 epochs saved, resumed with --epochs 8 and stopped before its next save: the
    hint said plain --resume, which goes on to the 5 that config.json still names."""
    from petal.training import loop

    run, _ = _run_to_resume(monkeypatch, tmp_path)
    (run / "state.json").write_text('{"epoch": 2}')

    def interrupted_train(config, workdir, resume=False, overwrite=False):
        raise KeyboardInterrupt

    monkeypatch.setattr(loop, "train", interrupted_train)
    argv = ["train", "--workdir", str(run), "--resume"]
    for extra, more in ((["--epochs", "8"], " --epochs 8"), ([], ""), (["--epochs", "5"], "")):
        assert cli.main([*argv, *extra]) == 130
        assert capsys.readouterr().err.splitlines() == [
            f"petal train: epoch 2 is saved; continue with `petal train --resume{more} "
            f"--workdir {run}`",
            "petal train: interrupted",
        ]


def test_train_help_names_every_strategy(capsys):
    """`default` is accepted but was left out of the help."""
    from petal.training.strategy import STRATEGIES

    assert cli.main(["train", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    said = text.split("--strategy STRATEGY ")[1].split(" --precision")[0]
    assert said.split(" (")[0].split(", ") == list(STRATEGIES), said


def test_predict_json_is_strict_json(monkeypatch, capsys, tmp_path):
    """A model whose weights blew up predicts NaN: --json printed `NaN`, which strict
    parsers refuse; it is null, as in petal's files."""
    import json

    import petal.evaluation.predict as predict_module
    from petal.cli import main

    nan = [{"file": "a.jpg", "predictions": [{"label": "daisy", "probability": float("nan")}]}]
    monkeypatch.setattr(predict_module, "predict", lambda *args, **kwargs: nan)
    assert main(["predict", str(tmp_path), "a.jpg", "--json"]) == 0

    def refuse(constant):
        raise ValueError(constant)

    out = json.loads(capsys.readouterr().out, parse_constant=refuse)
    assert out[0]["predictions"][0]["probability"] is None


def test_an_error_once_an_epoch_is_saved_says_how_to_resume_and_a_full_disk_its_fix(
    monkeypatch, capsys, tmp_path
):
    """A full disk said `[Errno 28] No space left on device`: no file, no fix, and the
    epochs saved before it were not named (the hint came after Ctrl-C only)."""
    import errno

    from petal.errors import PetalError
    from petal.training import loop

    run = tmp_path / "run"
    run.mkdir()
    raised = {}

    def failing_train(config, workdir, resume=False, overwrite=False):
        if raised.get("after_epoch"):  # saved now: a state.json with a new wall time
            raised["wall"] = raised.get("wall", 0) + 1
            (run / "state.json").write_text(
                f'{{"epoch": {raised["after_epoch"]}, "wall_seconds": {raised["wall"]}}}')
        raise raised["error"]

    monkeypatch.setattr(loop, "train", failing_train)
    argv = ["train", "--preset", "quick", "--data", str(tmp_path), "--workdir", str(run)]
    hint = (f"petal train: epoch 2 is saved; continue with `petal train --resume --workdir "
            f"{run}`")
    fix = "free space on that disk, or write to another one (pass another --workdir)."

    raised.update(after_epoch=2, error=OSError(errno.ENOSPC, "No space left on device"))
    assert cli.main(argv) == 2
    assert capsys.readouterr().err.splitlines() == [
        hint, f"petal train: error: No space left on the device writing into {run}: {fix}"]
    where = str(run / "last.keras")
    raised.update(error=OSError(errno.ENOSPC, "Unable to create file (\nerrno = 28)", where))
    assert cli.main(argv) == 2
    assert capsys.readouterr().err.splitlines() == [
        hint, f"petal train: error: No space left on the device writing {where}: {fix}"]

    # Other errors once an epoch is saved (a corrupt record in epoch 3) get the hint too,
    # unless they say how to resume (a non-finite loss); none when no epoch was saved now.
    raised.update(error=PetalError("Corrupt record in shard x."))
    assert cli.main(argv) == 2
    assert capsys.readouterr().err.splitlines() == [
        hint, "petal train: error: Corrupt record in shard x."]
    raised.update(error=PetalError("NaN loss: go on with `petal train --resume`."))
    assert cli.main(argv) == 2
    assert capsys.readouterr().err.splitlines() == [
        "petal train: error: NaN loss: go on with `petal train --resume`."]
    raised.update(after_epoch=None, error=OSError(errno.EACCES, "Permission denied\n(x)", where))
    assert cli.main(argv) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"petal train: error: [Errno 13] Permission denied (x): '{where}'"]


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        (["predict", "run", ""], "IMAGE"),
        (["predict", "run", "a.jpg", ""], "IMAGE"),
        (["predict", "", "a.jpg"], "WORKDIR"),
        (["evaluate", "run", "--out", ""], "--out"),
        (["evaluate", "run", "--data", ""], "--data"),
        (["evaluate", ""], "WORKDIR"),
        (["export", "run", "--out", ""], "--out"),
        (["export", ""], "WORKDIR"),
        (["report", ""], "WORKDIR"),
        (["convert", "", "records"], "SRC"),
        (["convert", "photos", ""], "DST"),
        (["inspect", ""], "DST"),
        (["train", "--data", "", "--workdir", "run"], "--data"),
        (["train", "--data", "photos", "--workdir", ""], "--workdir"),
        (["train", "--config", "", "--data", "photos"], "--config"),
        (["demo", "--data", ""], "--data"),
        (["demo", "--data", "photos", "--workdir", ""], "--workdir"),
        # --json "" and --png "" were taken as not given: the results went unwritten.
        (["bench", "input", ""], "RECORDS"),
        (["bench", "input", "rec", "--json", ""], "--json"),
        (["bench", "input", "rec", "--png", ""], "--png"),
        (["bench", "input", "rec", "--folder", ""], "--folder"),
        (["bench", "input", "rec", "--raw-records", ""], "--raw-records"),
    ],
)
def test_an_empty_path_argument_is_refused_not_taken_as_the_current_folder(
    argv, option, monkeypatch, capsys, tmp_path
):
    """Path("") is ".": `petal predict RUN "$IMG"` with IMG unset predicted every image
    under the working directory, evaluate and export --out "" wrote into it, evaluate
    --data "" quietly scored the run's own data."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "photo.jpg").write_bytes(b"\xff\xd8 never read")
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    said = f"petal {argv[0]}: error: {option} is empty (an unset shell variable?); pass "
    assert len(err) == 1 and err[0].startswith(said), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["photo.jpg"]


def test_a_full_disk_in_convert_names_its_output_and_convert_s_own_option(
    monkeypatch, capsys, tmp_path
):
    # A shard's write carries no file name: the error named nothing and sent the user to
    # --workdir, an option convert does not have.
    import errno

    import petal.data

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(petal.data, "convert", full)
    src, dst = tmp_path / "photos", tmp_path / "records"
    (src / "a").mkdir(parents=True)
    assert cli.main(["convert", str(src), str(dst)]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"petal convert: error: No space left on the device writing into {dst}: free space "
        "on that disk, or write to another one (pass another DST)."
    )


def test_a_closed_stdout_ends_the_command_quietly(monkeypatch, capsys):
    # `petal predict DIR | head -1`: "error: [Errno 32] Broken pipe" and exit 2.
    read, write = os.pipe()
    os.close(read)
    monkeypatch.setattr(sys, "stdout", open(write, "w", buffering=1))  # noqa: SIM115
    try:
        assert cli.main(["train", "--list-presets"]) == 141
    finally:
        sys.stdout.close()
    assert capsys.readouterr().err == ""


def test_names_the_locale_cannot_encode_are_escaped_and_convert_draws_no_bar_into_a_log(
    monkeypatch, capsys, tmp_path
):
    # Under LANG=C a class named rosé crashed inspect (and evaluate's table part-way) with a
    # UnicodeEncodeError; convert drew its bars into files and CI logs.
    import io

    from PIL import Image

    for cls in ("rosé", "tulips"):
        (tmp_path / "src" / cls).mkdir(parents=True)
        for i in range(3):
            Image.new("RGB", (8, 8), (40 * i, 90, 200)).save(tmp_path / "src" / cls / f"{i}.png")
    out = str(tmp_path / "out")
    assert cli.main(["convert", str(tmp_path / "src"), out, "--image-size", "8",
                     "--workers", "1"]) == 0
    assert "scan" not in capsys.readouterr().err
    ascii_out = io.TextIOWrapper(io.BytesIO(), encoding="ascii")
    monkeypatch.setattr(sys, "stdout", ascii_out)
    assert cli.main(["inspect", out, "--verify"]) == 0
    ascii_out.flush()
    assert b"ros\\xe9" in ascii_out.buffer.getvalue()
    assert "verify" not in capsys.readouterr().err


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_in_the_demo_says_how_to_finish_its_run(monkeypatch, capsys, tmp_path, signum):
    """SIGTERM said only "terminated": not the commands that finish the run."""
    import petal.demo

    run = tmp_path / "demo"

    def interrupted(data, workdir, overrides=()):
        run.mkdir()
        (run / "config.json").write_text("{}")
        (run / "state.json").write_text('{"epoch": 4}')
        signal.raise_signal(signum)

    monkeypatch.setattr(petal.demo, "run_demo", interrupted)
    argv = ["demo", "--data", str(tmp_path), "--workdir", str(run)]
    assert cli.main(argv) == 128 + signum
    said = "interrupted" if signum == signal.SIGINT else "terminated"
    assert capsys.readouterr().err.splitlines() == [
        f"petal demo: {said}",
        f"petal demo: epoch 4 is saved; continue with `petal train --resume --workdir {run}`, "
        f"then `petal evaluate {run}` and `petal report {run}` (the demo run again starts over)",
    ]


def test_an_unknown_option_is_refused_with_its_command_s_help(capsys):
    # It got petal's top-level usage, naming neither the command nor its options.
    with pytest.raises(SystemExit) as caught:
        cli.main(["train", "--bogus"])
    assert caught.value.code == 2
    assert capsys.readouterr().err == (
        "petal train: error: unrecognized arguments: --bogus (see petal train --help)\n"
    )


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["train", "--batch-size", "x"],
         "petal train: error: argument --batch-size: invalid int value: 'x' "
         "(see petal train --help)"),
        (["convert", "photos"],
         "petal convert: error: the following arguments are required: DST "
         "(see petal convert --help)"),
        (["bench", "input"],
         "petal bench input: error: the following arguments are required: RECORDS "
         "(see petal bench input --help)"),
        (["trian"], "petal: error: argument COMMAND: invalid choice: 'trian' (choose from "),
    ],
)
def test_a_refused_argument_is_one_line_without_the_usage_block(capsys, argv, line):
    # argparse printed its whole usage block (a dozen lines for train) above the error.
    with pytest.raises(SystemExit) as caught:
        cli.main(argv)
    assert caught.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(line), err
    prog = line.partition(": error:")[0]
    assert err.endswith(f" (see {prog} --help)\n"), err


def test_a_full_standard_output_is_not_blamed_on_the_output_folder():
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-m", "petal", "train", "--list-presets"],
                              stdout=full, stderr=subprocess.PIPE, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr == (
        "petal train: error: No space left on the device writing the standard output: send it "
        "elsewhere, or free space on its disk.\n"
    )


@pytest.mark.slow  # 39 s in a loaded suite run (session 40): `pytest -m slow` runs it
def test_commands_run_keras_on_tensorflow_and_name_a_keras_settings_file_keras_refuses(
    tmp_path,
):
    # KERAS_BACKEND=jax: evaluate, predict and export crashed with JAX tracebacks, train ran
    # on JAX; a keras.json Keras refuses gave a traceback from every command.
    env = {**os.environ, "KERAS_BACKEND": "jax", "KERAS_HOME": str(tmp_path)}
    code = ("from petal import cli; cli.start_tensorflow_quietly(); import keras; "
            "print(keras.backend.backend())")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == "tensorflow\n"
    assert "petal: warning: KERAS_BACKEND=jax is ignored: petal's commands run Keras on " \
        "TensorFlow" in done.stderr
    (tmp_path / "keras.json").write_text('{"floatx": "bfloat16"}')
    done = subprocess.run([sys.executable, "-m", "petal", "models"],
                          env={**env, "KERAS_BACKEND": "tensorflow"},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1].startswith(
        "petal models: error: Keras did not start: Invalid `floatx` configuration.")
    assert done.stderr.splitlines()[-1].endswith(
        f"fix or remove its settings file {tmp_path / 'keras.json'} (Keras writes a default "
        "one).")


def test_a_broken_pipe_that_is_not_stdout_s_is_an_error_line(monkeypatch, capsys):
    # A connection the command wrote to closed (not stdout): one line, as any OSError.
    def closed(args):
        raise BrokenPipeError(32, "Broken pipe")

    parser = cli.build_parser()
    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    for action in parser._subparsers._group_actions[0].choices.values():
        action.set_defaults(_run=closed)
    assert cli.main(["train", "--list-presets"]) == 2
    assert capsys.readouterr().err == "petal train: error: [Errno 32] Broken pipe\n"


def test_predict_takes_files_on_both_sides_of_an_option(monkeypatch, capsys):
    # `predict RUN a.jpg --top-k 2 b.jpg` was refused ("unrecognized arguments: b.jpg"):
    # argparse ends a list of positionals at the first option.
    parser = cli.build_parser()
    args = cli._parse(parser, ["predict", "RUN", "a.jpg", "--top-k", "2", "b c.jpg", "--json"])
    assert (args.workdir, args.images) == ("RUN", ["a.jpg", "b c.jpg"])
    assert (args.top_k, args.json) == (2, True)
    assert args.command == "predict" and args._run is cli._run_predict
    monkeypatch.setattr(sys, "argv", ["petal", "predict", "RUN", "a.jpg", "--json", "b.jpg"])
    assert cli._parse(parser, None).images == ["a.jpg", "b.jpg"]
    with pytest.raises(SystemExit):  # an unknown option among them is still refused
        cli._parse(parser, ["predict", "RUN", "a.jpg", "--bogus", "b.jpg"])
    assert capsys.readouterr().err.splitlines()[-1] == (
        "petal predict: error: unrecognized arguments: --bogus b.jpg (see petal predict --help)")


def test_predict_takes_a_dash_file_after_double_dash_among_options():
    parser = cli.build_parser()
    args = cli._parse(parser, ["predict", "RUN", "a.jpg", "--top-k", "1", "--", "-x.jpg"])
    assert (args.images, args.top_k) == (["a.jpg", "-x.jpg"], 1)


@pytest.mark.parametrize("command", ["convert", "export"])
def test_sigterm_says_what_was_kept_as_ctrl_c_does(monkeypatch, capsys, tmp_path, command):
    """The README says Ctrl-C and SIGTERM both say what was kept; SIGTERM said only
    "terminated"."""
    import petal.data
    import petal.evaluation.export

    def terminated(*args, **kwargs):
        signal.raise_signal(signal.SIGTERM)

    module = petal.data if command == "convert" else petal.evaluation.export
    monkeypatch.setattr(module, command, terminated)
    src = tmp_path / "src"
    src.mkdir()
    argv = [command, str(src), *([str(tmp_path / "out")] if command == "convert" else [])]
    assert cli.main(argv) == 143
    lines = capsys.readouterr().err.splitlines()
    assert lines[-1] == f"petal {command}: terminated{cli._KEPT[command]}", lines


def test_ctrl_c_in_the_demo_before_an_epoch_says_to_run_it_again(monkeypatch, capsys, tmp_path):
    import petal.demo

    run = tmp_path / "demo"
    runs = iter([None, "{}"])  # while converting, then training before epoch 1

    def interrupted(data, workdir, overrides=()):
        run.mkdir(exist_ok=True)
        if (config := next(runs)) is not None:
            (run / "config.json").write_text(config)
        raise KeyboardInterrupt

    monkeypatch.setattr(petal.demo, "run_demo", interrupted)
    for _ in range(2):
        assert cli.main(["demo", "--data", str(tmp_path), "--workdir", str(run)]) == 130
        assert capsys.readouterr().err.splitlines() == [
            "petal demo: interrupted",
            "petal demo: no epoch was saved; the same command starts the demo again",
        ]


def test_ctrl_c_in_an_overwrite_that_put_the_old_run_back_does_not_call_it_complete(
    monkeypatch, capsys, tmp_path
):
    """A demo run again (or train --overwrite) stopped in its first epoch: the run it
    replaced was put back, and the hint then called that run "complete", telling to
    evaluate it: the old model, on the records the demo had just converted anew."""
    import petal.demo
    from petal.training import loop

    run = tmp_path / "demo"
    run.mkdir()
    (run / "config.json").write_text("{}")  # the earlier, complete run, put back
    (run / "model.keras").write_text("model")
    (run / "metrics.json").write_text('{"epochs_completed": 1}')

    def interrupted(*args, **kwargs):
        err = KeyboardInterrupt()
        err.petal_run_restored = True  # as loop._restore_run marks it
        raise err

    monkeypatch.setattr(petal.demo, "run_demo", interrupted)
    monkeypatch.setattr(loop, "train", interrupted)
    assert cli.main(["demo", "--data", str(tmp_path), "--workdir", str(run)]) == 130
    assert capsys.readouterr().err.splitlines() == [
        "petal demo: interrupted",
        f"petal demo: no epoch of the new run was saved (the run it replaced is back in {run}); "
        "the same command starts the demo again",
    ]
    argv = ["train", "--preset", "quick", "--data", str(tmp_path), "--workdir", str(run),
            "--overwrite"]  # fmt: skip
    assert cli.main(argv) == 130
    assert capsys.readouterr().err.splitlines() == [
        f"petal train: no epoch of the new run was saved (the run it replaced is back in {run}); "
        "the same command starts it again",
        "petal train: interrupted",
    ]


@pytest.mark.parametrize("argv", [["--version"], ["--help"], ["convert", "--help"]])
def test_help_and_version_say_when_they_could_not_be_written(argv):
    # argparse dropped the failed write and exited 0: `petal --version > /dev/full` said
    # nothing and "succeeded".
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-m", "petal", *argv], stdout=full,
                              stderr=subprocess.PIPE, text=True, timeout=60)
    assert (done.returncode, done.stderr) == (2, (
        "petal: error: No space left on the device writing the standard output: send it "
        "elsewhere, or free space on its disk.\n"))
    done = subprocess.run([sys.executable, "-m", "petal", *argv], capture_output=True,
                          text=True, timeout=60)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.startswith("petal 0" if argv == ["--version"] else "usage: petal")


def test_resume_with_a_preset_says_to_drop_resume_for_overwrite(monkeypatch, capsys, tmp_path):
    """Said "drop --preset ..., or pass --overwrite" to a command that already passed
    --overwrite, and --overwrite with --resume is refused: --resume has to go."""
    run, given = _run_to_resume(monkeypatch, tmp_path)
    argv = ["train", "--workdir", str(run), "--resume", "--preset", "quick", "--overwrite"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "or pass --overwrite." not in err
    assert "drop --resume and pass --overwrite to start afresh" in err
    assert cli.main([a for a in argv if a != "--resume"]) == 0
    assert given["cfg"].preset == "quick"
    # A --config file naming another preset: the same fix.
    (tmp_path / "more.json").write_text('{"preset": "codelab-squeezenet", "seed": 3}')
    argv = ["train", "--workdir", str(run), "--resume", "--config", str(tmp_path / "more.json")]
    assert cli.main(argv) == 2
    assert "(drop --resume and pass --overwrite or another --workdir)" in capsys.readouterr().err
    assert cli.main([*(a for a in argv if a != "--resume"), "--overwrite"]) == 0
    assert given["cfg"].preset == "codelab-squeezenet"


@pytest.mark.parametrize("argv", [["--version"], ["--help"], []])
def test_help_and_version_with_stdout_closed_go_to_stderr(argv):
    # `petal --version >&-`: a traceback (None.write) once --help's write was made to raise.
    done = subprocess.run([sys.executable, "-m", "petal", *argv], stdin=subprocess.DEVNULL,
                          stdout=None, stderr=subprocess.PIPE, text=True, timeout=60,
                          pass_fds=(), close_fds=True,
                          preexec_fn=lambda: os.close(1))
    assert done.returncode == (2 if not argv else 0), done.stderr
    assert done.stderr.startswith("petal 0" if argv == ["--version"] else "usage: petal")
    assert "Traceback" not in done.stderr


def _no_tensorflow(monkeypatch):
    def start():
        raise AssertionError("TensorFlow was started")

    monkeypatch.setattr(cli, "start_tensorflow_quietly", start)


def test_a_missing_weights_file_is_said_before_tensorflow_and_the_start_up_lines(
    small_records, tmp_path, monkeypatch, capsys
):
    """It was said after three start-up lines (the strategy, the data) and TensorFlow's
    import, once the model was built."""
    missing = tmp_path / "gone.weights.h5"
    argv = ["train", "--preset", "quick", "--data", str(small_records),
            "--workdir", str(tmp_path / "r")]  # fmt: skip
    with monkeypatch.context() as patched:
        _no_tensorflow(patched)
        assert cli.main([*argv, "--weights", str(missing)]) == 2
    assert capsys.readouterr() == ("", (
        f"petal train: error: --weights {missing} does not exist; pass an existing "
        ".weights.h5 file, 'imagenet' or 'none'.\n"))
    # As a config field (--set, a --config file, the library): before the start-up lines.
    assert cli.main([*argv, "--set", f"weights={missing}"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.splitlines() == [
        f"petal train: error: Weights file not found: {missing} (pass an existing .weights.h5 "
        f"file, 'imagenet', or None: `--weights none` on the command line). Received: "
        f"weights='{missing}'"]
    assert not (tmp_path / "r").exists()


def test_a_missing_convert_source_is_named_as_typed_with_its_fix(
    tmp_path, monkeypatch, capsys
):
    """It said "Source folder does not exist. Received: source=photoz", a Python argument,
    with no fix, after TensorFlow's import."""
    monkeypatch.chdir(tmp_path)
    _no_tensorflow(monkeypatch)
    assert cli.main(["convert", "photoz", "records"]) == 2
    assert capsys.readouterr().err == (
        "petal convert: error: SRC photoz does not exist; check the path (SRC is a folder "
        "with one sub-folder of images per class).\n")
    assert not (tmp_path / "records").exists()


def test_data_that_is_a_file_is_not_said_to_be_in_use(small_records, tmp_path, capsys):
    """`--data SHARD` was refused as "in use: an unknown process is converting into it"
    (the marker looked for under a file could not be read), with a fix that cannot be
    done: delete SHARD/.petal-running."""
    from petal.running import running_elsewhere

    shard = next(small_records.glob("train-*.tfrec"))
    assert running_elsewhere(shard) is None
    argv = ["train", "--preset", "quick", "--data", str(shard), "--workdir", str(tmp_path / "r")]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "in use" not in err
    assert f"Data source is a file, not a folder: {shard}; pass the folder that holds" in err


def test_evaluate_s_table_keeps_a_class_named_with_a_newline_on_one_row(
    monkeypatch, capsys, tmp_path
):
    """The per-class table printed a class folder named "new\\nline" over two lines, where
    labels.txt, predict and the report write it as its escape."""
    import petal.evaluation.evaluate

    scores = {"precision": 0.5, "recall": 1.0, "f1": 0.667, "support": 2}
    report = {"classes": ["daisy", "new\nline"], "per_class": {"daisy": scores,
                                                                "new\nline": scores},
              "macro": {**scores, "support": 4}, "weighted": {**scores, "support": 4}}
    monkeypatch.setattr(petal.evaluation.evaluate, "evaluate", lambda *a, **k: report)
    assert cli.main(["evaluate", str(tmp_path / "run"), "--data", str(tmp_path)]) == 0
    # (and the averages, which only eval.json held, end it as scikit-learn's report does)
    assert capsys.readouterr().out.splitlines() == [
        "class         precision  recall     f1  support",
        "daisy             0.500   1.000  0.667        2",
        "new\\nline         0.500   1.000  0.667        2",
        "macro avg         0.500   1.000  0.667        4",
        "weighted avg      0.500   1.000  0.667        4",
    ]
