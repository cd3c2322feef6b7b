"""Resuming a training run: a deterministic run resumed trains as an uninterrupted one does,
and a resume on other data or with settings the checkpoint fixes is refused (split from
test_train.py so that the test processes share its load)."""

from __future__ import annotations

import json
import re

import pytest

from conftest import Interrupt, interrupt_at, tiny_config, whole_and_resumed_at_epoch_1
from petal.errors import PetalError
from petal.training.loop import train

QUIET = {"log": lambda line: None}


@pytest.mark.slow  # 8 s in CI on a Zen 3 host (session 39: 775 s): `pytest -m slow` runs it
def test_a_resumed_deterministic_run_trains_on_what_an_uninterrupted_one_does(
    small_records, tmp_path
):
    # 50 images, batch 10: a pass is 5 steps, an epoch 2, so the resume starts mid-pass.
    cfg = tiny_config(
        small_records, model="dense", epochs=3, deterministic=True, seed=7, shuffle_buffer=16
    )
    whole, resumed = whole_and_resumed_at_epoch_1(cfg, tmp_path)
    assert len(whole) == 3
    assert resumed == whole


@pytest.mark.slow  # 7-52 s in the full suite (session 27): `pytest -m slow` runs it
def test_a_resumed_deterministic_float16_run_follows_the_schedule_of_an_uninterrupted_one(
    small_records, tmp_path
):
    """float16 loss scaling skips the steps whose gradients overflow (the first ones, at
    Keras' initial scale), and the optimizer does not count them: the resume set its count
    to the epochs' steps, and the schedule jumped ahead (lr 0.0027 where the whole run had
    0: another history)."""
    from petal.training.callbacks import read_history

    # The dense model (float16 convolutions take minutes on a loaded CPU) on 0..255 pixels,
    # whose gradients overflow float16 at Keras' initial scale as squeezenet's did.
    cfg = tiny_config(small_records, model="dense", normalization="raw", epochs=2,
                      deterministic=True, seed=7, shuffle_buffer=16, precision="mixed_float16")
    train(cfg, tmp_path / "whole", **QUIET)
    with pytest.raises(Interrupt):
        train(cfg, tmp_path / "resumed", log=interrupt_at("epoch 1/2"))
    train(cfg, tmp_path / "resumed", resume=True, **QUIET)
    kept = ("epoch", "loss", "accuracy", "val_loss", "val_accuracy", "lr", "lr_end")
    whole, resumed = (
        [{k: row[k] for k in kept} for row in read_history(tmp_path / run / "history.csv")]
        for run in ("whole", "resumed")
    )
    # Half an epoch's warm-up (1 step) then cosine: without skipped steps epoch 2 would
    # begin past the peak, at 0.0027.
    assert whole[1]["lr"] == 0.0, "no float16 step was skipped: the test shows nothing"
    assert resumed == whole


def test_resume_on_data_with_other_classes_is_refused(small_records, make_records, tmp_path):
    """Same names in another order would train the model's outputs under the wrong labels
    (and relabel the run in config.json); another class count stopped in Keras' loader."""
    from conftest import CLASSES

    run = tmp_path / "run"
    train(tiny_config(small_records, model="dense", epochs=1, steps_per_epoch=1), run, **QUIET)
    saved = (run / "config.json").read_text()
    for classes in (tuple(reversed(CLASSES)), tuple(CLASSES[:2])):
        other = make_records(f"other-{len(classes)}", classes=classes)
        with pytest.raises(PetalError, match=r"Classes of .* differ from those of the run in .*"
                           r"same classes in the same order"):
            train(tiny_config(other, model="dense", epochs=2, steps_per_epoch=1), run, resume=True,
                  **QUIET)
    assert (run / "config.json").read_text() == saved


@pytest.mark.slow  # 9-11 s in CI on a Zen 3 host (session 39: 775 s): `pytest -m slow` runs it
def test_resume_on_the_runs_photos_split_another_way_is_refused(
    small_flowers, small_records, tmp_path
):
    """Records converted again with another seed resumed silently: most of their validation
    photos had trained, val_acc scored them, and config.json then named those records, so
    petal evaluate took them for held out. The image folder the records came from (split by
    file name) the same, with a warning meant for folder runs split by an older petal."""
    from petal.data import convert

    def converted(name, **kw):
        out = tmp_path / name
        convert(small_flowers, out, workers=1, progress=False, shards=1, **kw)
        return out

    run = tmp_path / "run"
    train(tiny_config(small_records, model="dense", epochs=1), run, **QUIET)
    files = {name: (run / name).read_bytes() for name in ("config.json", "history.csv")}
    reseeded = converted("seed1", image_size=64, seed=1)
    fix = (f"start a new run from this one's weights (--weights {run / 'best.weights.h5'} "
           "--workdir NEW).")
    harm = ("resuming on it would validate on photos the run trained on (and petal evaluate "
            "would score them as held out)")
    refused = (
        f"{reseeded} and {small_records}, the records {run} trained on, were both converted "
        f"from {small_flowers} but split otherwise (seed 1, not 0): {harm}. Resume on "
        f"{small_records}, convert {small_flowers} again with --seed 0 --val-fraction 0.19, or "
        f"{fix}"
    )
    for legacy in (False, True):  # a run saved before records_split: its records' manifest
        if legacy:
            config = json.loads(files["config.json"])
            del config["resolved"]["records_split"]
            (run / "config.json").write_text(json.dumps(config))
            files["config.json"] = (run / "config.json").read_bytes()
        with pytest.raises(PetalError) as caught:
            train(tiny_config(reseeded, model="dense", epochs=2), run, resume=True, **QUIET)
        assert str(caught.value) == refused
    with pytest.raises(PetalError) as caught:
        train(tiny_config(small_flowers, model="dense", epochs=2), run, resume=True, **QUIET)
    assert str(caught.value) == (
        f"{small_flowers} is the image folder that {small_records}, the records {run} trained "
        "on, were converted from, and read as a folder it is split another way (by each "
        f"file's name, not by petal convert's --seed 0): {harm}. Resume on {small_records}, or "
        f"{fix}"
    )
    assert {name: (run / name).read_bytes() for name in files} == files
    # Converted again with the same split (at another size): it goes on.
    same_split = converted("seed0-48px", image_size=48, seed=0)
    train(tiny_config(same_split, model="dense", epochs=2), run, resume=True, **QUIET)
    assert json.loads((run / "config.json").read_text())["data"] == str(same_split)

    # A run on the image folder, resumed on records converted from it: split otherwise too.
    on_folder = tmp_path / "on-folder"
    train(tiny_config(small_flowers, model="dense", epochs=1), on_folder, **QUIET)
    with pytest.raises(PetalError, match=re.escape(
        f"{small_records} was converted from {small_flowers}, the image folder {on_folder} "
        f"trained on, and petal convert split it another way (by --seed 0, not by each file's "
        f"name): {harm}. Resume on {small_flowers}, or start a new run")):
        train(tiny_config(small_records, model="dense", epochs=2), on_folder, resume=True,
              **QUIET)
    # Its own folder, split by an older petal: warned, after the run's header.
    config = json.loads((on_folder / "config.json").read_text())
    del config["resolved"]["folder_split"]
    (on_folder / "config.json").write_text(json.dumps(config))
    lines = []
    train(tiny_config(small_flowers, model="dense", epochs=2), on_folder, resume=True,
          log=lines.append)
    warned = [i for i, line in enumerate(lines) if "split image folders another way" in line]
    header = [i for i, line in enumerate(lines) if line.startswith("petal train: dense ")]
    assert len(warned) == 1 and header and header[0] < warned[0]


@pytest.mark.slow  # 86 s in a loaded suite run (session 40): `pytest -m slow` runs it
def test_resume_keeps_what_the_checkpoint_holds_and_the_schedule_by_epoch(
    small_records, tmp_path
):
    import keras

    run = tmp_path / "run"
    train(tiny_config(small_records, model="dense", epochs=1), run, **QUIET)
    saved = (run / "config.json").read_text()
    # Settings the checkpoint fixes are refused before anything is written (a changed
    # model once rewrote config.json and then failed to load, breaking every later resume).
    for change, message in (
        ({"model": "convnet"}, 'model "dense" -> "convnet"'),
        ({"image_size": 24}, r"image_size 32x32 -> 24x24 \(leaving out --image-size and "
                             r"--set image_size keeps 32x32\)"),
        ({"optimizer": "sgd"}, 'optimizer "adam" -> "sgd"'),
        # Inputs scaled another way than the weights learned (the model's own: unit).
        ({"normalization": "symmetric"}, 'normalization "unit" -> "symmetric"'),
        # Loss scaling wraps the optimizer: its state would not load (Keras only warned).
        ({"precision": "mixed_float16"},
         'precision "float32" -> "mixed_float16" \\(--precision float32 keeps it\\)'),
    ):
        cfg = tiny_config(small_records, **{"model": "dense", "epochs": 2, **change})
        with pytest.raises(PetalError, match=f"holds a checkpoint that --resume cannot change: "
                           f"{message}. Leave those settings out"):
            train(cfg, run, resume=True, **QUIET)
        assert (run / "config.json").read_text() == saved
    # A checkpoint that does not load (another model's) leaves config.json as it was.
    from petal.models import create_model

    good = (run / "last.keras").read_bytes()
    create_model("convnet", 5, 32).save(run / "last.keras")  # as a run saves it, untrained
    cfg = tiny_config(small_records, model="dense", epochs=2, learning_rate=0.5)
    with pytest.raises(PetalError, match=r"last.keras does not fit the model of this config"):
        train(cfg, run, resume=True, **QUIET)
    assert (run / "config.json").read_text() == saved
    # A damaged checkpoint (cut short) is one line too.
    (run / "last.keras").write_bytes(good[: len(good) // 2])
    with pytest.raises(PetalError, match=r"last.keras cannot be read \(.*\); it is damaged"):
        train(tiny_config(small_records, model="dense", epochs=2), run, resume=True, **QUIET)
    assert (run / "config.json").read_text() == saved
    # bfloat16 keeps the optimizer's state (same variables): a change that may go on; so is
    # a training size equal to the image size (the run's, resolved from null).
    (run / "last.keras").write_bytes(good)
    lines = []
    train(tiny_config(small_records, model="dense", epochs=2, precision="mixed_bfloat16",
                      train_image_size=32), run, resume=True, log=lines.append)
    assert json.loads((run / "config.json").read_text())["resolved"]["precision"] == (
        "mixed_bfloat16")
    # metrics.json names the last session's precision only: the change was not said.
    assert "petal train: precision float32 -> mixed_bfloat16 from epoch 2 (--precision " \
        "mixed_bfloat16; the last session, to epoch 1, trained in float32)" in lines, lines
    # Another steps per epoch (batch size, training set): the schedule goes on from this
    # epoch at the new count; the optimizer's own count (2 steps) once placed it wrong.
    (run / "last.keras").write_bytes(good)
    lines = []
    metrics = train(tiny_config(small_records, model="dense", epochs=3, steps_per_epoch=3,
                                batch_size=5), run, resume=True, log=lines.append)
    assert any(line.endswith("resuming after epoch 2 (it ran 2 steps/epoch)") for line in lines)
    model = keras.saving.load_model(run / "model.keras", safe_mode=True)
    assert int(model.optimizer.iterations) == 2 * 3 + 3
    assert json.loads((run / "config.json").read_text())["steps_per_epoch"] == 3
    # metrics.json's global batch is the last session's: each session's is kept beside it
    # (the bfloat16 session's was the first's).
    assert (metrics["global_batch"], metrics["steps_per_epoch"]) == (5, 3)
    assert metrics["batches"] == [{"from_epoch": 1, "global_batch": 10, "steps_per_epoch": 2},
                                  {"from_epoch": 3, "global_batch": 5, "steps_per_epoch": 3}]


@pytest.mark.slow  # 46 s in a loaded suite run (session 40): `pytest -m slow` runs it
def test_a_run_sized_by_its_records_resumes_on_records_of_another_size(make_records, tmp_path):
    """A run with image_size null was refused on records of another size (the README's "at
    another size may go on") as if its user had changed the size, with no way back to a
    non-square one: it keeps the size it trained at, and only a size given is refused."""
    run = tmp_path / "run"
    first, other = make_records("16x24", size=(16, 24)), make_records("24x16", size=(24, 16))
    train(tiny_config(first, model="dense", image_size=None, epochs=1), run, **QUIET)
    lines = []
    train(tiny_config(other, model="dense", image_size=None, epochs=2), run, resume=True,
          log=lines.append)
    assert ("petal train: the 24x16 records are resized to 16x24, the size the run trained at "
            "(its image_size is null: the size of the records it began on)") in lines
    saved = json.loads((run / "config.json").read_text())
    assert (saved["image_size"], saved["resolved"]["image_size"]) == (None, [16, 24])
    with pytest.raises(PetalError, match=re.escape(
        "cannot change: image_size 16x24 -> 24x24 (leaving out --image-size and --set "
        "image_size keeps 16x24). Leave those settings out")):
        train(tiny_config(other, model="dense", image_size=24, epochs=3), run, resume=True,
              **QUIET)


def test_resume_without_state_json_refuses_a_run_with_completed_epochs(small_records, tmp_path):
    """A deleted state.json made --resume start over ("completed no epoch"), replacing the
    run's model, history, best weights and metrics."""
    run = tmp_path / "run"
    train(tiny_config(small_records, model="dense", epochs=2, steps_per_epoch=1), run, **QUIET)
    (run / "state.json").unlink()
    files = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    with pytest.raises(PetalError) as caught:
        train(tiny_config(small_records, model="dense", epochs=2, steps_per_epoch=1), run,
              resume=True, **QUIET)
    assert str(caught.value) == (
        f"{run / 'state.json'} is missing, but {run} holds completed epochs (last.keras, "
        "best.weights.h5, model.keras, metrics.json, history.csv); the run cannot be resumed: "
        "restore the file, or start again with --overwrite."
    )
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == files
    # An unfinished run (its checkpoint, and history) too.
    for name in ("model.keras", "metrics.json", "best.weights.h5"):
        (run / name).unlink()
    with pytest.raises(PetalError, match=r"state.json is missing, but .* holds completed "
                       r"epochs \(last.keras, history.csv\)"):
        train(tiny_config(small_records, model="dense", epochs=3, steps_per_epoch=1), run,
              resume=True, **QUIET)
    assert (run / "history.csv").read_bytes() == files["history.csv"]


@pytest.mark.slow  # 28 s in a loaded suite run (session 40): `pytest -m slow` runs it
def test_resume_without_the_history_of_its_completed_epochs_is_refused(small_records, tmp_path):
    """A deleted history.csv resumed: it then held the new epochs alone, and metrics.json named
    a best epoch that state.json and best.weights.h5 did not."""
    run = tmp_path / "run"
    cfg = tiny_config(small_records, model="dense", epochs=2, steps_per_epoch=1)
    train(cfg, run, **QUIET)
    history = (run / "history.csv").read_text()
    (run / "history.csv").unlink()
    more = cfg.replace(epochs=3)
    with pytest.raises(PetalError) as caught:
        train(more, run, resume=True, **QUIET)
    assert str(caught.value) == (
        f"{run / 'state.json'} says 2 epochs completed but {run / 'history.csv'} is missing; "
        "the run cannot be resumed: restore the file, or start again with --overwrite."
    )
    assert not (run / "history.csv").exists()
    (run / "history.csv").write_text("\n".join(history.splitlines()[:2]) + "\n")  # epoch 1
    with pytest.raises(PetalError, match=r"history.csv holds the rows of 1 of them; the run "):
        train(more, run, resume=True, **QUIET)
    (run / "history.csv").write_text(history)
    assert train(more, run, resume=True, **QUIET)["epochs_completed"] == 3


def test_resume_of_a_finished_run_with_a_damaged_metrics_json_writes_it_again(
    small_records, tmp_path
):
    """It said "nothing to do", then a JSONDecodeError traceback."""
    run = tmp_path / "run"
    cfg = tiny_config(small_records, model="dense", epochs=2, steps_per_epoch=1)
    before = train(cfg, run, **QUIET)
    for damaged in ("{bad", "[]"):
        (run / "metrics.json").write_text(damaged)
        lines = []
        metrics = train(cfg, run, resume=True, log=lines.append)
        assert lines[0].startswith(f"petal train: warning: {run / 'metrics.json'} is damaged (")
        assert lines[0].endswith("); writing it again from history.csv and state.json")
        assert json.loads((run / "metrics.json").read_text()) == metrics
        del metrics["wall_seconds"]  # the checkpoint's, not the finish's
        assert metrics == {k: v for k, v in before.items() if k != "wall_seconds"}


def test_wall_time_adds_up_across_resumes(small_records, tmp_path):
    """A resume counted from state.json's wall time, its last checkpoint's: what the session
    did after it (validation, writing the model) was lost, and metrics.json's wall time
    could go down after training more."""
    run = tmp_path / "run"
    cfg = tiny_config(small_records, model="dense", epochs=1, steps_per_epoch=1)
    train(cfg, run, **QUIET)
    finished = json.loads((run / "metrics.json").read_text())
    (run / "metrics.json").write_text(json.dumps({**finished, "wall_seconds": 1000.0}))
    assert json.loads((run / "state.json").read_text())["wall_seconds"] < 1000
    assert train(cfg.replace(epochs=2), run, resume=True, **QUIET)["wall_seconds"] > 1000


def test_a_run_without_config_json_is_named_with_its_fix_with_or_without_resume(
    small_records, tmp_path, capsys
):
    """--resume said "not a petal training run (no config.json); drop --resume", and without
    it "already holds a training run; pass --resume": each sent the user to the other."""
    from petal.cli import main

    run = tmp_path / "run"
    cfg = tiny_config(small_records, model="dense", epochs=1, steps_per_epoch=1)
    train(cfg, run, **QUIET)
    (run / "config.json").unlink()
    refused = (
        f"{run / 'config.json'} is missing from {run}, which holds a training run (history.csv, "
        "state.json, metrics.json); restore the file to continue it with --resume, or start "
        "again with --overwrite (deletes its checkpoints and results)."
    )
    for resume in (True, False):
        with pytest.raises(PetalError) as caught:
            train(cfg, run, resume=resume, **QUIET)
        assert str(caught.value) == refused
    assert main(["train", "--workdir", str(run), "--resume"]) == 2
    assert capsys.readouterr().err == f"petal train: error: {refused}\n"
    assert main(["train", "--workdir", str(run), "--data", str(small_records)]) == 2
    assert capsys.readouterr().err == f"petal train: error: {refused}\n"
    assert not (run / "config.json").exists() and (run / "model.keras").is_file()


def test_a_finished_run_without_last_keras_has_nothing_to_do(small_records, tmp_path):
    """--resume of a complete run said last.keras was missing, start again with --overwrite."""
    run = tmp_path / "run"
    cfg = tiny_config(small_records, model="dense", epochs=1, steps_per_epoch=1)
    metrics = train(cfg, run, **QUIET)
    (run / "last.keras").unlink()
    lines = []
    assert train(cfg, run, resume=True, log=lines.append) == metrics
    assert lines == [f"petal train: {run} already completed 1 epoch; nothing to do (to train "
                     "it further, pass --epochs 2 or more)"]
    # Training on needs it.
    with pytest.raises(PetalError, match=re.escape(
            f"{run}/state.json says epoch 1 but last.keras is missing; start again with "
            "--overwrite.")):
        train(cfg.replace(epochs=2), run, resume=True, **QUIET)


@pytest.mark.slow  # 10-11 s in CI (session 38, 575 s): `pytest -m slow` runs it
def test_resume_warns_of_a_missing_or_damaged_best_weights_file(small_records, tmp_path):
    """It went on silently, and best.weights.h5 (the file the README starts new runs from)
    was not written again unless an epoch beat the lost one."""
    run = tmp_path / "run"
    cfg = tiny_config(small_records, model="dense", epochs=1, steps_per_epoch=1)
    train(cfg, run, **QUIET)
    state = json.loads((run / "state.json").read_text())
    best = run / "best.weights.h5"
    whole = best.read_bytes()
    kept = {name: (run / name).read_bytes() for name in ("last.keras", "state.json")}
    for damage, said in ((best.unlink, "missing"), (lambda: best.write_text("junk"), "damaged")):
        for name, data in kept.items():
            (run / name).write_bytes(data)
        damage()
        lines = []
        train(cfg.replace(epochs=2), run, resume=True, log=lines.append)
        assert (f"petal train: warning: {best} is {said}: the weights of the run's best epoch "
                f"(1, val_acc {state['best_val_accuracy']:.4f}) are lost; it is written again "
                "when a later epoch does better") in lines
    # A whole file: no warning.
    for name, data in kept.items():
        (run / name).write_bytes(data)
    best.write_bytes(whole)
    lines = []
    train(cfg.replace(epochs=2), run, resume=True, log=lines.append)
    assert not any("best.weights.h5" in line for line in lines)


def test_resume_on_its_own_records_converted_again_in_place_with_another_split_is_refused(
    small_flowers, tmp_path
):
    """The records converted again into their own folder with another seed resumed silently
    (only records of another folder were compared): most of their validation photos had
    trained. A run saved before records_split was kept cannot tell, and goes on as before."""
    from petal.data import convert

    records = tmp_path / "records"
    convert(small_flowers, records, image_size=32, seed=0, workers=1, progress=False, shards=1)
    run = tmp_path / "run"
    train(tiny_config(records, model="dense", epochs=1, steps_per_epoch=1), run, **QUIET)
    files = {name: (run / name).read_bytes() for name in ("config.json", "history.csv")}
    convert(small_flowers, records, image_size=32, seed=1, workers=1, progress=False, shards=1,
            overwrite=True)
    with pytest.raises(PetalError) as caught:
        train(tiny_config(records, model="dense", epochs=2, steps_per_epoch=1), run,
              resume=True, **QUIET)
    assert str(caught.value) == (
        f"{records}, the records {run} trained on, were converted again from {small_flowers} "
        "since and split otherwise (seed 1, not 0): resuming on it would validate on photos "
        "the run trained on (and petal evaluate would score them as held out). Convert "
        f"{small_flowers} again into {records} with --seed 0 --val-fraction 0.19 --overwrite, "
        f"or start a new run from this one's weights (--weights {run / 'best.weights.h5'} "
        "--workdir NEW)."
    )
    assert {name: (run / name).read_bytes() for name in files} == files
    # Saved before records_split was kept (in resolved and in trained_on): not known, goes on.
    config = json.loads(files["config.json"])
    del config["resolved"]["records_split"]
    for entry in config["resolved"]["trained_on"]:
        del entry["records_split"]
    (run / "config.json").write_text(json.dumps(config))
    train(tiny_config(records, model="dense", epochs=2, steps_per_epoch=1), run, resume=True,
          **QUIET)


@pytest.mark.slow  # 8-12 s in CI on a Zen 3 host (session 39: 775 s): `pytest -m slow` runs it
def test_resume_refuses_momentum_moved_across_zero_and_keeps_another_non_zero_one(
    small_records, tmp_path
):
    """sgd and rmsprop keep a momentum slot per weight only when momentum is not 0: a resume
    that moved it across zero went on with a fresh optimizer (Keras only warned)."""
    import warnings

    for optimizer, first, across, other in (("sgd", 0.9, 0.0, 0.5), ("rmsprop", 0.0, 0.9, 0.0)):
        run = tmp_path / optimizer
        cfg = tiny_config(small_records, model="dense", epochs=1, steps_per_epoch=1,
                          optimizer=optimizer, momentum=first)
        train(cfg, run, **QUIET)
        saved = (run / "config.json").read_text()
        held = "momentum: any non-zero value keeps it" if first else "no momentum: 0 keeps it"
        with pytest.raises(PetalError, match=re.escape(
            f"cannot change: momentum {first} -> {across} (the saved {optimizer} state holds "
            f"{held}). Leave those settings out"
        )):
            train(cfg.replace(epochs=2, momentum=across), run, resume=True, **QUIET)
        assert (run / "config.json").read_text() == saved
        # Another value on the same side of zero loads the saved state.
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message="Skipping variable loading")
            train(cfg.replace(epochs=2, momentum=other), run, resume=True, **QUIET)


def test_a_checkpoint_whose_optimizer_state_would_not_load_is_refused(tmp_path):
    # Keras only warns when an optimizer's saved variables do not match (and the run went
    # on from a fresh state): whatever option caused it, the resume is refused.
    import keras
    import numpy as np

    from petal.training.loop import _load_checkpoint

    def model_with(momentum: float):
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        model.compile(keras.optimizers.SGD(0.1, momentum=momentum), "mse")
        return model

    saved = model_with(0.9)
    saved.fit(np.ones((4, 3)), np.ones((4, 2)), epochs=1, verbose=0)
    saved.save(tmp_path / "last.keras")
    fresh = model_with(0.0)
    fresh.optimizer.build(fresh.trainable_variables)
    with pytest.raises(PetalError, match=(
        rf"^{re.escape(str(tmp_path / 'last.keras'))} does not fit the model of this config "
        r"\(Skipping variable loading for optimizer '\w+', because it has 2 variables "
        r"whereas the saved optimizer has 4 variables\.\); resume with"
    )):
        _load_checkpoint(fresh, tmp_path)
    same = model_with(0.5)
    same.optimizer.build(same.trainable_variables)
    _load_checkpoint(same, tmp_path)  # the same variables: loads
    assert np.allclose(same.layers[0].kernel.numpy(), saved.layers[0].kernel.numpy())


def test_resume_changing_fine_tune_names_fine_tune_not_head_epochs(tmp_path, capsys):
    # The config's own check came first: "head_epochs is only used with fine_tune=
    # 'head_then_all'", and setting head_epochs=0 only led to this refusal.
    from petal.cli import main
    from petal.training.config import get_preset, save_config

    run = tmp_path / "run"
    run.mkdir()
    cfg = get_preset("codelab-xception").replace(
        data=str(tmp_path / "records"), weights=str(tmp_path / "x.weights.h5"),
        fine_tune="head_then_all", head_epochs=1, epochs=3,
    )
    save_config(cfg, run / "config.json", classes=["a", "b"])
    assert main(["train", "--workdir", str(run), "--resume", "--set", "fine_tune=all"]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"petal train: error: {run} holds a checkpoint that --resume cannot change: fine_tune "
        '"head_then_all" -> "all". Leave those settings out to continue the run, or start a '
        "new one without --resume (another --workdir, or --overwrite)."
    )


def test_a_run_ended_where_it_stopped_saves_those_epochs_and_a_later_resume_has_none_to_do(
    small_records, tmp_path
):
    """--resume --epochs 1 of a 3-epoch run stopped after epoch 1 said done, but config.json
    kept epochs 3 (metrics.json said 1), and a later plain --resume trained epochs 2 and 3."""
    from petal.training.loop import resume_config

    run = tmp_path / "run"
    cfg = tiny_config(small_records, model="dense", epochs=3, steps_per_epoch=1)
    with pytest.raises(Interrupt):
        train(cfg, run, log=interrupt_at("epoch 1/3"))
    metrics = train(cfg.replace(epochs=1), run, resume=True, **QUIET)
    assert metrics["epochs_completed"] == 1
    assert json.loads((run / "config.json").read_text())["epochs"] == 1
    lines = []
    assert train(resume_config(run), run, resume=True, log=lines.append) == metrics
    assert lines == [f"petal train: {run} already completed 1 epoch; nothing to do (to train "
                     "it further, pass --epochs 2 or more)"]


def _epoch_scalars(run, tag: str) -> tuple[list, list]:
    """``tag``'s (step, value) pairs in ``run``'s train event files: all that were written,
    and what TensorBoard shows, where a SessionLog.START (a restart) drops the events before
    it at its step and later."""
    import tensorflow as tf

    files = []
    for path in (run / "tensorboard" / "train").glob("events*"):
        events = list(tf.compat.v1.train.summary_iterator(str(path)))
        files.append((events[0].wall_time, events))
    written, shown = [], []
    for _, events in sorted(files, key=lambda item: item[0]):
        for event in events:
            if event.session_log.status == tf.compat.v1.SessionLog.START:
                shown = [(step, value) for step, value in shown if step < event.step]
            for value in event.summary.value:
                if value.tag == tag:
                    point = (event.step, round(float(tf.make_ndarray(value.tensor)), 9))
                    written.append(point)
                    shown.append(point)
    return written, shown


@pytest.mark.slow  # 8 s in CI on a Zen 3 host (session 39: 611 s): `pytest -m slow` runs it
def test_tensorboard_keeps_no_scalars_of_an_epoch_not_saved(small_records, tmp_path, monkeypatch):
    """A NaN-stopped epoch's scalars stayed in the event files (lr 1e30, twice after two
    such resumes), and its resume wrote the epoch again: TensorBoard showed both. An epoch
    written but not saved (its checkpoint failed) is replaced by the resume's."""
    from petal.training.callbacks import Checkpointer

    cfg = tiny_config(small_records, model="dense", epochs=2, optimizer="sgd",
                      schedule="constant", schedule_options={}, learning_rate=1e-3,
                      tensorboard=True)
    run = tmp_path / "run"
    save = Checkpointer._save

    def fail_at_epoch_2(self, epoch, logs):
        if epoch == 1:
            raise OSError(28, "No space left on device", str(run / "state.json"))
        save(self, epoch, logs)

    with monkeypatch.context() as patch:
        patch.setattr(Checkpointer, "_save", fail_at_epoch_2)
        with pytest.raises((OSError, PetalError)):
            train(cfg, run, **QUIET)
    with pytest.raises(PetalError, match="NaN/inf at epoch 2/2"):
        train(cfg.replace(learning_rate=1e30), run, resume=True, **QUIET)
    assert _epoch_scalars(run, "epoch_lr")[0] == [(1, 1e-3), (2, 1e-3)]
    train(cfg.replace(epochs=3, learning_rate=2e-3), run, resume=True, **QUIET)
    written, shown = _epoch_scalars(run, "epoch_lr")
    assert [step for step, _ in written] == [1, 2, 2, 3]
    assert shown == [(1, 1e-3), (2, 2e-3), (3, 2e-3)]


def test_a_finished_run_given_a_checkpoint_change_is_not_sent_to_more_epochs(
    small_records, tmp_path
):
    """Said "Pass --epochs 2 or more to train it further" for model "dense" -> "squeezenet",
    and with --epochs 2 the checkpoint refused the model change: no number of epochs takes
    it. Other changes (batch_size) still say --epochs."""
    workdir = tmp_path / "run"
    cfg = tiny_config(small_records, model="dense", epochs=1, steps_per_epoch=1)
    train(cfg, workdir, **QUIET)
    with pytest.raises(PetalError) as caught:
        train(cfg.replace(model="squeezenet"), workdir, resume=True, **QUIET)
    assert "--epochs" not in str(caught.value)
    assert str(caught.value).endswith(
        'model "dense" -> "squeezenet". Its checkpoint holds the model, which --resume cannot '
        "change: leave that out, or start a new run without --resume (another --workdir, or "
        "--overwrite)."
    )
    with pytest.raises(PetalError, match=r"batch_size 10 -> 5\. Pass --epochs 2 or more"):
        train(cfg.replace(batch_size=5), workdir, resume=True, **QUIET)


@pytest.mark.slow  # 13 s in CI on a Zen 3 host (session 39: 775 s): `pytest -m slow` runs it
def test_a_resume_stopped_before_it_saved_an_epoch_leaves_config_json_as_it_was(
    small_records, tmp_path, monkeypatch
):
    """`--resume --epochs 40` stopped in its first epoch rewrote config.json all the same:
    a plain `--resume` later trained the 39 epochs the user had given up."""
    from petal.training.callbacks import Checkpointer

    workdir = tmp_path / "run"
    cfg = tiny_config(small_records, model="dense", epochs=1, steps_per_epoch=1)
    train(cfg, workdir, **QUIET)
    before = (workdir / "config.json").read_bytes()

    def stopped(self, epoch, logs):
        raise Interrupt("Ctrl-C before the epoch is saved")

    with monkeypatch.context() as patch:
        patch.setattr(Checkpointer, "_save", stopped)
        with pytest.raises(Interrupt):
            train(cfg.replace(epochs=40, learning_rate=0.5), workdir, resume=True, **QUIET)
    assert (workdir / "config.json").read_bytes() == before
    train(cfg.replace(epochs=2), workdir, resume=True, **QUIET)  # saved with its epoch
    assert json.loads((workdir / "config.json").read_text())["epochs"] == 2
    assert json.loads((workdir / "state.json").read_text())["epoch"] == 2
    # A resume a NaN loss stopped keeps its settings: its error says to go on with them.
    nan = cfg.replace(epochs=4, learning_rate=1e30)
    with pytest.raises(PetalError,
                       match=r"NaN/inf at epoch 3/4.*--resume --workdir \S+` and the new"):
        train(nan, workdir, resume=True, **QUIET)
    assert json.loads((workdir / "config.json").read_text())["epochs"] == 4
