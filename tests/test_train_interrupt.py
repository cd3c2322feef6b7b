"""A run stopped in or after its checkpoints: the final model a resume writes, what a kill or
a full disk leaves in the work directory, and the epoch line of an epoch saved under Ctrl-C."""

from __future__ import annotations

import errno
import json
import os
import signal
from pathlib import Path

import numpy as np
import pytest

from conftest import Interrupt, interrupt_at, tiny_config
from petal.errors import PetalError
from petal.training.loop import train

QUIET = {"log": lambda line: None}


def _load(path: Path):
    """A saved model as Keras loads it in one's own code (compiled, when it was saved so)."""
    import keras

    import petal.training.schedules  # noqa: F401 (registers the schedule for loading)

    return keras.saving.load_model(path, safe_mode=True)


@pytest.fixture
def tiny_backbone():
    """A registered model with a nested ``backbone`` (for fine_tune='head_then_all')."""
    import keras
    from keras import layers

    from petal.models import registry

    name = "test_interrupt_backbone"

    @registry.register(name, family="test", description="test only", normalization="unit",
                       default_image_size=32, min_image_size=8, pretrained=True)
    def build(num_classes, image_size, weights=None, **kwargs):
        x = inp = keras.Input((*image_size, 3))
        x = layers.GlobalAveragePooling2D()(layers.Conv2D(4, 3, strides=2, name="conv")(x))
        backbone = keras.Model(inp, x, name=registry.BACKBONE_NAME)
        inputs = keras.Input((*image_size, 3))
        out = layers.Dense(num_classes, activation="softmax", name="head")(backbone(inputs))
        return keras.Model(inputs, out, name=name)

    yield name
    registry._INFOS.pop(name, None)
    registry._BUILDERS.pop(name, None)


@pytest.mark.parametrize(  # 31 s a case in a loaded suite run (session 40): one in CI
    "fine_tune", ["all", pytest.param("head_then_all", marks=pytest.mark.slow)]
)
def test_a_run_stopped_in_its_last_checkpoint_resumes_to_the_compiled_model_of_a_finish(
    small_records, tmp_path, request, fine_tune
):
    """Every phase was skipped, so nothing compiled the model: the resume saved it
    uncompiled (README promises petal's schedule), without its optimizer."""
    from petal.models import create_model, get_backbone

    changes = {"model": "dense"}
    if fine_tune == "head_then_all":
        name = request.getfixturevalue("tiny_backbone")
        weights = tmp_path / "start.weights.h5"
        create_model(name, 5, 32).save_weights(weights)
        changes = {"model": name, "weights": str(weights), "fine_tune": fine_tune,
                   "head_epochs": 1}
    cfg = tiny_config(small_records, **changes)  # 2 epochs of 2 steps
    run = tmp_path / "run"
    with pytest.raises(Interrupt):
        train(cfg, run, log=interrupt_at("epoch 2/2"))
    assert json.loads((run / "state.json").read_text())["epoch"] == 2
    assert not (run / "model.keras").exists()

    lines = []
    metrics = train(cfg, run, resume=True, log=lines.append)
    assert f"petal train: {run} already completed 2 epochs" in lines
    assert metrics["epochs_completed"] == 2
    model, last = _load(run / "model.keras"), _load(run / "last.keras")
    assert model.compiled
    assert type(model.optimizer.learning_rate).__name__ == type(
        last.optimizer.learning_rate).__name__
    # The optimizer's state goes on from the last step: 4 steps, or the full phase's 2.
    assert int(model.optimizer.iterations) == int(last.optimizer.iterations)
    assert int(model.optimizer.iterations) == (4 if fine_tune == "all" else 2)
    for got, want in zip(model.get_weights(), last.get_weights(), strict=True):
        np.testing.assert_array_equal(got, want)
    if fine_tune == "head_then_all":  # saved as the full phase trained it: unfrozen
        assert get_backbone(model).trainable


@pytest.mark.slow  # 8-59 s in CI on a Zen 3 host (session 39: 775 s): `pytest -m slow` runs it
def test_the_final_model_is_written_whole_while_the_run_still_holds_its_workdir(
    small_records, tmp_path, monkeypatch
):
    """model.keras was written in place after the run's marker was removed: a kill there
    left a 0-byte model.keras that evaluate called damaged ("retrain with --overwrite"),
    though last.keras held the final epoch; and a resume then said there was nothing to do
    once metrics.json was written too."""
    import keras

    from petal.evaluation.workdir import load_model, open_run
    from petal.running import RUNNING_FILE

    run = tmp_path / "run"
    real_save = keras.Model.save
    seen = {}

    def killed_in_the_final_save(self, path, *args, **kwargs):
        if Path(path).name.endswith("model.keras") and not seen:
            seen["marker"] = (run / RUNNING_FILE).is_file()
            Path(path).write_bytes(b"")  # as far as it got
            raise Interrupt("killed")
        return real_save(self, path, *args, **kwargs)

    monkeypatch.setattr(keras.Model, "save", killed_in_the_final_save)
    cfg = tiny_config(small_records, model="dense")
    with pytest.raises(Interrupt):
        train(cfg, run, **QUIET)
    assert seen["marker"]  # the run held its work directory until then
    assert not (run / RUNNING_FILE).exists()
    assert sorted(p.name for p in run.glob("*model.keras")) == []  # nothing cut short
    with pytest.raises(PetalError, match=r"has no model.keras: the run has not finished\. "
                       r"Resume it with `petal train --resume --workdir .*`"):
        open_run(run)

    # A model.keras cut short (as the kill left it before): --resume writes it again from
    # last.keras, even once metrics.json is written too, and evaluate says so.
    train(cfg, run, resume=True, **QUIET)
    (run / "model.keras").write_bytes((run / "model.keras").read_bytes()[:3000])
    with pytest.raises(PetalError, match=(
        r"the model file is damaged: `petal train --resume --workdir \S+` writes it again "
        r"from the run's last checkpoint \(\S+last.keras, epoch 2\), or retrain with "
        r"`petal train --config \S+config.json --workdir \S+ --overwrite`\.$"
    )):
        load_model(open_run(run))
    lines = []
    train(cfg, run, resume=True, log=lines.append)
    assert f"petal train: {run} already completed 2 epochs" in lines
    assert _load(run / "model.keras").compiled


def test_a_full_disk_in_a_checkpoint_names_the_file_and_leaves_no_temporary_files(
    tmp_path, monkeypatch
):
    """ENOSPC from Keras and h5py names no file, and their temporary files stayed, filling
    the disk again at the next try."""
    import keras

    from petal.training.callbacks import Checkpointer

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    checkpointer = Checkpointer(tmp_path, {"epoch": 0, "best_epoch": 0,
                                           "best_val_accuracy": -1.0})
    checkpointer.set_model(model)
    checkpointer.on_epoch_end(0, {"val_accuracy": 0.5})
    saved = {p.name: p.read_bytes() for p in tmp_path.iterdir()}

    def full(path, *args, **kwargs):
        Path(path).write_bytes(b"partly")
        raise OSError(errno.ENOSPC, "No space left on device")

    # The best weights, last.keras, state.json in turn (a better epoch each time).
    for where, target, name in ((model, "save_weights", "best.weights.h5"),
                                (model, "save", "last.keras"),
                                (Path, "write_text", "state.json")):
        with monkeypatch.context() as patch:
            patch.setattr(where, target, full)
            with pytest.raises(OSError) as raised:
                checkpointer.on_epoch_end(1, {"val_accuracy": 0.9})
        assert raised.value.filename == str(tmp_path / name)
        now = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
        if name == "state.json":  # (last.keras was written: the state names epoch 1 still)
            now["last.keras"] = saved["last.keras"]
        assert now == saved, name
    assert checkpointer.state["epoch"] == 1
    assert json.loads((tmp_path / "state.json").read_text())["epoch"] == 1


def test_ctrl_c_in_a_checkpoint_prints_its_epoch_line_before_stopping(
    small_records, tmp_path, monkeypatch
):
    """The signal, held until the checkpoint was written, stopped training before the
    line of the epoch it saved was printed (history.csv had its row)."""
    from petal.training import callbacks

    real = callbacks.write_json

    def write_json(path, data):
        if Path(path).name == "state.json":
            os.kill(os.getpid(), signal.SIGINT)  # held until the epoch is saved
        real(path, data)

    monkeypatch.setattr(callbacks, "write_json", write_json)
    lines = []
    with pytest.raises(KeyboardInterrupt):
        train(tiny_config(small_records, model="dense"), tmp_path / "run", log=lines.append)
    assert json.loads((tmp_path / "run" / "state.json").read_text())["epoch"] == 1
    assert lines[-1].startswith("epoch 1/2  loss "), lines[-1]


@pytest.mark.slow  # 7-8 s in CI on a Zen 3 host (session 39: 775 s): `pytest -m slow` runs it
def test_a_full_disk_in_the_best_weights_leaves_no_open_file_to_crash_the_exit(tmp_path):
    """HDF5, writing best.weights.h5 itself, kept the file open after ENOSPC: h5py's errors
    and a segmentation fault followed the one-line error at exit. (A 4 KiB file size limit
    fails its writes, the flushes of its metadata too, as a full disk does.)"""
    from conftest import run_script

    script = tmp_path / "save.py"
    script.write_text(
        f"""
import resource, signal, sys
from pathlib import Path
import keras
from petal.training.callbacks import Checkpointer

model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(1024)])
checkpointer = Checkpointer({str(tmp_path)!r}, {{}})
checkpointer.set_model(model)
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails (EFBIG) instead
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.RLIM_INFINITY))
try:
    checkpointer.on_epoch_end(0, {{"val_accuracy": 0.5}})
except OSError as err:
    kept = err  # as the CLI keeps it, until the exit
    print("error:", err.filename, flush=True)
"""
    )
    done = run_script(script)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"error: {tmp_path / 'best.weights.h5'}" in done.stdout
    assert "h5py" not in done.stderr, done.stderr[-2000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["save.py"]


def test_weights_to_a_path_keras_counts_as_remote_are_saved_by_keras(tmp_path, monkeypatch):
    """Keras copies what it writes to a remote path (/gcs/, a GCS mount): the in-memory
    buffer is only for local files."""
    import keras
    from keras.src.utils import file_utils

    from petal.training.callbacks import save_weights

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    taken = []
    monkeypatch.setattr(file_utils, "is_remote_path", lambda p: taken.append(p) or True)
    save_weights(model, tmp_path / "a.weights.h5")
    assert taken and taken[0] == str(tmp_path / "a.weights.h5")
    monkeypatch.undo()
    again = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    again.load_weights(tmp_path / "a.weights.h5")
    pairs = zip(model.get_weights(), again.get_weights(), strict=True)
    assert all((a == b).all() for a, b in pairs)


@pytest.mark.slow  # 10-12 s in CI on a Zen 3 host (session 39: 775 s): `pytest -m slow` runs it
def test_an_overwrite_that_saves_no_epoch_puts_the_run_it_replaced_back(
    small_records, tmp_path, monkeypatch
):
    """--overwrite deleted the finished run first: a new run stopped in its first epoch (a
    corrupt record, Ctrl-C, a NaN loss) left neither, only its own config.json and
    history.csv."""
    from petal.training.callbacks import Checkpointer
    from petal.training.loop import train
    from petal.training.saved import run_restored

    run = tmp_path / "run"
    cfg = tiny_config(small_records, model="dense", epochs=1, steps_per_epoch=1,
                      tensorboard=True)  # fmt: skip
    train(cfg, run, log=lambda line: None)
    (run / "eval").mkdir()
    (run / "eval" / "eval.json").write_text("{}")  # an evaluation's
    (run / "eval" / "notes.txt").write_text("mine")  # the user's: stays where it is
    kept = {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file()}

    def stopped(self, epoch, logs):
        raise Interrupt("Ctrl-C before the epoch is saved")

    said = []
    with monkeypatch.context() as patch:
        patch.setattr(Checkpointer, "_save", stopped)
        with pytest.raises(Interrupt) as caught:
            train(cfg.replace(learning_rate=0.5), run, overwrite=True, log=said.append)
    assert run_restored(caught.value)  # the CLI's hint names the run put back, not "complete"
    back = {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file()}
    assert back == kept and not (run / ".petal-replaced").exists()
    assert (f"petal train: --overwrite: replacing the run in {run} (config.json, history.csv, "
            "state.json, metrics.json, best.weights.h5, last.keras, model.keras)") in said
    assert said[-1] == (f"petal train: no epoch was saved: the run --overwrite replaced is back "
                        f"in {run}")
    with pytest.raises(PetalError, match="NaN/inf at epoch 1/1") as caught:  # before a save
        train(cfg.replace(learning_rate=1e30, optimizer="sgd", schedule="constant",
                          schedule_options={}), run, overwrite=True, log=lambda line: None)
    assert run_restored(caught.value)
    assert {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file()} == kept
    # Once the new run saves an epoch, the old one is gone.
    train(cfg.replace(learning_rate=0.5), run, overwrite=True, log=lambda line: None)
    assert json.loads((run / "config.json").read_text())["learning_rate"] == 0.5
    assert not (run / ".petal-replaced").exists() and not (run / "eval" / "eval.json").exists()
    assert (run / "eval" / "notes.txt").read_text() == "mine"


def test_an_overwrite_killed_before_its_first_epoch_gets_the_run_it_replaced_back(
    small_records, tmp_path, monkeypatch, capsys
):
    """A SIGKILL (the out-of-memory killer) in an --overwrite's first epoch left the old run
    in .petal-replaced: --resume continued the killed run from nothing, and a later save
    deleted the old one, and evaluate told the user to resume."""
    from petal import cli
    from petal.evaluation.report import build_report
    from petal.evaluation.workdir import open_run
    from petal.training import loop
    from petal.training.callbacks import Checkpointer

    run = tmp_path / "run"
    cfg = tiny_config(small_records, model="dense", epochs=1, steps_per_epoch=1)
    train(cfg, run, **QUIET)
    kept = {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file()}

    def killed(self, epoch, logs):
        raise Interrupt("SIGKILL before the epoch is saved")

    with monkeypatch.context() as patch:
        patch.setattr(Checkpointer, "_save", killed)
        patch.setattr(loop, "_restore_run", lambda *args, **kwargs: None)  # a kill: no clean-up
        with pytest.raises(Interrupt):
            train(cfg.replace(learning_rate=0.5), run, overwrite=True, **QUIET)
    assert (run / ".petal-replaced" / "model.keras").is_file()
    assert not (run / "model.keras").exists()
    with pytest.raises(PetalError) as err:
        open_run(run)
    assert str(err.value) == (
        f"{run} has no model.keras: an --overwrite was stopped before it saved an epoch, and "
        f"left the run it replaced in {run / '.petal-replaced'}; `petal train --resume "
        f"--workdir {run}` puts that run back."
    )
    assert cli.main(["train", "--workdir", str(run), "--resume"]) == 0
    said = capsys.readouterr().out
    assert (f"petal train: an --overwrite was stopped before it saved an epoch, and left the run "
            f"it replaced in {run / '.petal-replaced'}: that run is back in {run}") in said
    assert f"{run} already completed 1 epoch" in said
    back = {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file()}
    assert back.keys() == kept.keys() and back[Path("config.json")] == kept[Path("config.json")]
    assert not (run / ".petal-replaced").exists()

    # Killed before its config.json, then a plain start: the old run is back, and refused.
    loop._set_aside_run(run)
    for read in (open_run, build_report):
        with pytest.raises(PetalError) as err:
            read(run)
        assert "holds no run (config.json): an --overwrite was stopped" in str(err.value)
    with pytest.raises(PetalError, match="already holds a training run"):
        train(cfg, run, **QUIET)
    back = {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file()}
    assert back == kept and not (run / ".petal-replaced").exists()

    # Killed while setting it aside: its state.json was taken for the new run's, and the
    # recovery deleted the rest of the old run (or put back only the files moved).
    (run / ".petal-replacing").mkdir()
    for name in ("config.json", "history.csv"):
        (run / name).rename(run / ".petal-replacing" / name)
    said = []
    loop.recover_replaced(run, said.append)
    assert said == [f"petal train: an --overwrite was stopped while it set aside the run it "
                    f"replaced (in {run / '.petal-replacing'}): that run is back in {run}"]
    back = {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file()}
    assert back == kept and not (run / ".petal-replacing").exists()

    # Killed after the new run saved its epoch, before it deleted the old one: it goes.
    (run / ".petal-replaced").mkdir()
    (run / ".petal-replaced" / "model.keras").write_bytes(b"old")
    loop.recover_replaced(run, said.append)
    assert said[-1] == (f"petal train: deleted {run / '.petal-replaced'}, the run an --overwrite "
                        "replaced: the new run had saved an epoch")
    assert not (run / ".petal-replaced").exists() and (run / "model.keras").is_file()


def test_an_extension_stopped_before_its_first_checkpoint_drops_its_row_and_says_how_to_go_on(
    small_records, tmp_path, monkeypatch, capsys
):
    """A finished run extended (--resume --epochs) and stopped between the new epoch's row in
    history.csv and its checkpoint kept the row, said only that the run was complete, and
    `--resume`, which report then advised, had nothing to do."""
    from petal import cli
    from petal.training import callbacks
    from petal.training.callbacks import read_history

    run = tmp_path / "run"
    train(tiny_config(small_records, model="dense", epochs=1), run, **QUIET)
    real = callbacks.Checkpointer.on_epoch_end

    def stop(self, epoch, logs=None):
        if epoch >= 1:  # the extension's first epoch: its row is written, not its checkpoint
            raise KeyboardInterrupt
        real(self, epoch, logs)

    monkeypatch.setattr(callbacks.Checkpointer, "on_epoch_end", stop)
    capsys.readouterr()
    assert cli.main(["train", "--workdir", str(run), "--resume", "--epochs", "3"]) == 130
    assert [row["epoch"] for row in read_history(run / "history.csv")] == [1]
    err = capsys.readouterr().err
    assert (f"petal train: the run is complete at its 1 epoch and no later one was saved "
            f"(model.keras and metrics.json are of epoch 1); continue with "
            f"`petal train --resume --epochs 3 --workdir {run}`\n") in err
