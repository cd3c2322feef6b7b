"""The training loop on tiny real records: artefacts, resume, NaN stop, work-directory rules,
bad data, signals. Resume refusals are in test_train_resume.py, fine-tuning and weights files
in test_train_finetune.py."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import Interrupt, interrupt_at, tiny_config
from petal.errors import PetalError
from petal.training.config import get_preset
from petal.training.loop import prepare_workdir, train

QUIET = {"log": lambda line: None}


def test_run_writes_every_artefact_and_resumes_after_an_interruption(small_records, tmp_path):
    import keras

    import petal.training.schedules  # noqa: F401 (registers the schedule for loading)
    from petal.training.callbacks import read_history

    workdir = tmp_path / "run"
    cfg = tiny_config(small_records, model="dense", epochs=3, tensorboard=True)
    with pytest.raises(Interrupt):
        train(cfg, workdir, log=interrupt_at("epoch 2/3"))
    state = json.loads((workdir / "state.json").read_text())
    assert state["epoch"] == 2 and (workdir / "last.keras").is_file()
    assert not (workdir / "model.keras").exists()

    # The work directory now holds a run: refused without --resume or --overwrite.
    with pytest.raises(PetalError, match="already holds a training run.*--resume.*--overwrite"):
        train(cfg, workdir, **QUIET)

    # A history damaged before its last row is refused in one line; a last row cut short
    # (a kill while writing it) is the interruption's and is dropped.
    history = workdir / "history.csv"
    text = history.read_text()
    header, row1 = text.splitlines()[:2]
    history.write_text(f"{header}\n{row1[:5]}\n{row1}\n")
    with pytest.raises(PetalError, match=r"history.csv is damaged \(line 2 does not have one "
                       r"cell per column\); it cannot be resumed: start again with --overwrite"):
        train(cfg, workdir, resume=True, **QUIET)
    history.write_text(text + "2,0.9")
    # So is a damaged state.json (it was a JSONDecodeError, TypeError or ValueError traceback).
    state_path = workdir / "state.json"
    saved_state = state_path.read_text()
    for damaged, why in (('{"epoch": 2, "best', "Unterminated string"), ("[2]", "a JSON list"),
                         ('{"epoch": "two"}', "epoch is 'two', not a whole number"),
                         ('{"epoch": -1}', "epoch is -1, not a whole number >= 0"),
                         # A traceback at the start, and one after a whole epoch trained:
                         ('{"epoch": 2, "wall_seconds": "a"}', "wall_seconds is 'a', not a "),
                         ('{"epoch": 2, "best_val_accuracy": "x"}', "best_val_accuracy is 'x'")):
        state_path.write_text(damaged)
        with pytest.raises(PetalError) as caught:
            train(cfg, workdir, resume=True, **QUIET)
        assert str(caught.value).startswith(f"{state_path} is damaged ({why}")
        assert str(caught.value).endswith("restore the file, or start again with --overwrite.")
    state_path.write_text(saved_state)
    # Ended where it stopped (--epochs 2): other settings would train nothing and are
    # refused, as for a finished run (they were taken, and metrics.json reported them).
    with pytest.raises(PetalError, match=r"already completed its 2 epochs, so nothing would "
                       r"train and these changes would be ignored: batch_size 10 -> 5\."):
        train(cfg.replace(epochs=2, batch_size=5), workdir, resume=True, **QUIET)
    (workdir / "export").mkdir()  # an export of the model before the resume
    lines = []
    metrics = train(cfg, workdir, resume=True, log=lines.append)
    assert lines[-2] == (f"petal train: {workdir / 'export'}/ holds the results of the model "
                         "before this resume: run petal export again")
    rows = read_history(workdir / "history.csv")
    assert [r["epoch"] for r in rows] == [1, 2, 3]  # the row cut short was dropped
    assert set(rows[0]) == {
        "epoch",
        "loss",
        "accuracy",
        "val_loss",
        "val_accuracy",
        "lr",
        "lr_end",
        "lr_max",
        "lr_max_at",
        "images_per_sec",
        "epoch_seconds",
    }
    assert metrics["epochs_completed"] == 3
    assert metrics["mean_last5_val_accuracy"] == pytest.approx(
        np.mean([r["val_accuracy"] for r in rows])
    )
    assert metrics["best_val_accuracy"] == max(r["val_accuracy"] for r in rows)
    for key in (
        "final_val_accuracy",
        "best_epoch",
        "wall_seconds",
        "train_images_per_sec",
        "replicas",
        "precision",
        "global_batch",
    ):
        assert metrics[key] is not None, key
    assert metrics["global_batch"] == 10 and metrics["replicas"] == 1
    # Resumed with the same batch: one session's batch for all the epochs.
    assert metrics["batches"] == [{"from_epoch": 1, "global_batch": 10, "steps_per_epoch": 2}]
    assert json.loads((workdir / "metrics.json").read_text()) == metrics
    resolved = json.loads((workdir / "config.json").read_text())["resolved"]
    assert resolved["classes"] == ["daisy", "dandelion", "roses", "sunflowers", "tulips"]
    assert resolved["image_size"] == [32, 32] and resolved["records_size"] == [64, 64]
    for name in ("best.weights.h5", "last.keras", "model.keras"):
        assert (workdir / name).is_file(), name
    assert list((workdir / "tensorboard" / "train").iterdir())
    # The optimizer state was restored, not restarted: 3 epochs x 2 steps in all.
    model = keras.saving.load_model(workdir / "model.keras", safe_mode=True)
    assert int(model.optimizer.iterations) == 6
    # The README's recipe loads it compiled in a process that has imported no petal code but
    # the schedule's registration.
    script = tmp_path / "load.py"
    script.write_text(
        "import sys\nimport keras\nimport petal.training.schedules  # noqa: F401\n"
        "model = keras.models.load_model(sys.argv[1])\n"
        "opt = model.optimizer\n"
        "print(int(opt.iterations), opt.get_config()['learning_rate']['class_name'])\n"
    )
    done = subprocess.run(
        [sys.executable, str(script), str(workdir / "model.keras")],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["6", "StepSchedule"]


def _strict_json(path: Path) -> dict:
    """A JSON file read as strict parsers (jq, JavaScript) read it: NaN/Infinity refused."""

    def refuse(constant):
        raise AssertionError(f"{path} holds {constant}, which is not JSON")

    return json.loads(path.read_text(), parse_constant=refuse)


def test_nan_loss_stops_with_the_epoch(small_records, tmp_path, capsys):
    """A NaN in the first epoch named a last.keras never saved and advised the float32 the
    run used; metrics.json counted the NaN epoch as best and final and held `NaN` (not
    JSON); the report said the run had been resumed."""
    from petal.evaluation.report import build_report

    cfg = tiny_config(
        small_records,
        model="dense",
        epochs=3,
        optimizer="sgd",
        learning_rate=1e30,
        schedule="constant",
        schedule_options={},
    )
    run = tmp_path / "run"
    lines = []
    with pytest.raises(PetalError) as caught:
        train(cfg, run, log=lines.append)
    # A printed epoch line means the epoch is saved: the stopped one's is not printed.
    assert not [line for line in lines if line.startswith("epoch")]
    assert str(caught.value) == (
        "Training stopped: the loss became NaN/inf at epoch 1/3 (step 2). Lower the learning "
        "rate (--set learning_rate=...; its peak was 1e+30) or clip the gradients (--set "
        "clipnorm=1.0); no epoch completed, so no checkpoint was saved: start it again with "
        "the new settings (the files of this start are replaced)."
    )
    assert not (run / "model.keras").exists() and not (run / "last.keras").exists()
    metrics = _strict_json(run / "metrics.json")
    assert metrics["stopped"] == "non-finite loss at epoch 1/3 (step 2)"
    assert metrics["epochs_completed"] == 0
    for key in ("final_val_accuracy", "mean_last5_val_accuracy", "best_val_accuracy",
                "best_epoch", "final_loss", "final_val_loss"):
        assert metrics[key] is None, key
    capsys.readouterr()
    build_report(run)
    err = capsys.readouterr().err
    said = ("the run stopped at a non-finite loss at epoch 1/3 (step 2): history.csv and the "
            "curves hold that epoch, no epoch completed before it.")
    assert err == f"petal report: warning: {said}\n"
    assert f"<b>Stopped:</b> {said}" in (run / "report.html").read_text()
    # A failed start, its report's files too: a plain start replaces it (as --overwrite).
    metrics = train(cfg.replace(epochs=1, learning_rate=1e-3), run, **QUIET)
    assert metrics["epochs_completed"] == 1


@pytest.mark.slow  # 47 s in a loaded suite run (session 40): `pytest -m slow` runs it
def test_nan_loss_after_a_saved_epoch_names_its_checkpoint(small_records, tmp_path, capsys):
    """The NaN epoch is neither best nor final; the checkpoint named is the one saved, and
    resuming from it with a lower learning rate, as the message says, finishes the run."""
    from petal.evaluation.report import build_report
    from petal.training.callbacks import read_history

    cfg = tiny_config(small_records, epochs=1, model="dense", optimizer="sgd",
                      schedule="constant", schedule_options={}, learning_rate=1e-3)
    run = tmp_path / "run"
    train(cfg, run, **QUIET)
    good = read_history(run / "history.csv")[0]
    lines = []
    with pytest.raises(PetalError) as caught:
        train(cfg.replace(epochs=2, learning_rate=1e30), run, resume=True, log=lines.append)
    assert not [line for line in lines if line.startswith("epoch")]
    assert re.fullmatch(
        r"Training stopped: the loss became NaN/inf at epoch 2/2 \(step \d\)\. Lower the "
        r"learning rate \(--set learning_rate=\.\.\.; its peak was 1e\+30\) or clip the "
        r"gradients \(--set clipnorm=1\.0\); "
        + re.escape(f"{run / 'last.keras'} holds epoch 1, the last good one: go on from it "
                    f"with `petal train --resume --workdir {run}` and the new settings."),
        str(caught.value),
    ), str(caught.value)
    metrics = _strict_json(run / "metrics.json")
    assert metrics["epochs_completed"] == 1 and metrics["best_epoch"] == 1
    assert metrics["final_val_accuracy"] == metrics["best_val_accuracy"] == good["val_accuracy"]
    assert metrics["final_loss"] == good["loss"]
    capsys.readouterr()
    build_report(run)
    assert "the numbers above are of the 1 epoch(s) before it" in capsys.readouterr().err
    metrics = train(cfg.replace(epochs=2), run, resume=True, **QUIET)
    assert metrics["epochs_completed"] == 2 and "stopped" not in metrics


def test_nan_advice_fits_the_precision_used(tmp_path):
    """float16 overflows where float32 does not: only then is float32 advised."""
    from petal.training.loop import _non_finite_loss

    resolved = {"peak_lr": 0.01, "precision": "mixed_float16"}
    cfg = get_preset("quick").replace(clipnorm=1.0)
    error = _non_finite_loss(tmp_path, "epoch 3/9", cfg, resolved, 0)
    assert str(error).startswith(
        "Training stopped: the loss became NaN/inf at epoch 3/9. Lower the learning rate "
        "(--set learning_rate=...; its peak was 0.01) or train in float32 (--precision "
        "float32, a new run); no epoch completed"
    )


def test_json_files_hold_null_for_a_non_finite_number(tmp_path):
    """json.dumps writes NaN and Infinity, which strict parsers refuse."""
    from petal.jsonfile import write_json

    path = tmp_path / "metrics.json"
    write_json(path, {"loss": float("nan"), "rows": [{"x": float("-inf")}, (1.5, float("inf"))],
                      "n": 3, "name": "nan"})
    assert _strict_json(path) == {"loss": None, "rows": [{"x": None}, [1.5, None]], "n": 3,
                                  "name": "nan"}
    assert not list(tmp_path.glob(".tmp-*"))


def test_workdir_rules(tmp_path):
    run = tmp_path / "run"
    with pytest.raises(PetalError, match="is not a petal training run.*drop --resume"):
        prepare_workdir(run, resume=True, overwrite=False)
    with pytest.raises(PetalError, match="either --resume or --overwrite"):
        prepare_workdir(run, resume=True, overwrite=True)
    (run / "records").mkdir(parents=True)
    (run / "records" / "manifest.json").write_text("{}")
    (run / "eval").mkdir()
    for name in ("config.json", "history.csv", "last.keras"):
        (run / name).write_text("x")
    prepare_workdir(run, resume=True, overwrite=False)  # leaves everything alone
    assert (run / "last.keras").exists()
    said = []
    prepare_workdir(run, resume=False, overwrite=True, log=said.append)
    assert not (run / "config.json").exists() and not (run / "eval").exists()
    # It deleted the run without a word: a new run stopped in its first epoch left neither.
    assert said == [f"petal train: --overwrite: deleting the run in {run} (config.json, "
                    "history.csv, last.keras)"]
    assert (run / "records" / "manifest.json").exists()  # not ours: kept
    (tmp_path / "file").write_text("x")
    with pytest.raises(PetalError, match="is a file"):
        prepare_workdir(tmp_path / "file", resume=False, overwrite=False)
    with pytest.raises(PetalError, match=r"Work directory .*file/run cannot be written: "
                       r".*file is a file, not a folder; pass a --workdir whose parents are "):
        prepare_workdir(tmp_path / "file" / "run", resume=False, overwrite=False, clear=False)
    with pytest.raises(PetalError, match=r"^Work directory /proc/petal/run cannot be written: "
                       r"nothing can be written in /proc \(.*\); pass a --workdir whose parents"):
        prepare_workdir(Path("/proc/petal/run"), resume=False, overwrite=False, clear=False)


def test_train_names_a_config_or_workdir_of_the_wrong_kind(small_records, tmp_path):
    cfg = tiny_config(small_records)
    with pytest.raises(PetalError, match=r"^train needs a TrainConfig .* Received: config of "
                       r"type dict$"):
        train(cfg.to_dict(), tmp_path / "run", **QUIET)
    with pytest.raises(PetalError, match=r"^workdir must be a folder path \(the run folder to "
                       r"write or resume\)\. Received: workdir=None$"):
        train(cfg, None, **QUIET)
    with pytest.raises(PetalError, match=r"^workdir is empty; pass the run folder to write or "):
        train(cfg, "", **QUIET)


def test_bad_model_fails_before_writing(small_records, tmp_path):
    with pytest.raises(PetalError, match="Unknown model 'resnet9000'.*squeezenet"):
        train(tiny_config(small_records, model="resnet9000"), tmp_path / "run", **QUIET)
    assert not (tmp_path / "run").exists()
    with pytest.raises(PetalError, match="No training data"):
        train(tiny_config(small_records, data=None), tmp_path / "run", **QUIET)


@pytest.mark.slow  # 8-13 s in CI on a Zen 3 host (session 39: 775 s): `pytest -m slow` runs it
def test_steps_per_execution_divides_the_epoch(small_records, tmp_path):
    """3 executions' worth of steps per call on 4 steps an epoch ran 6 steps an epoch, and
    the schedule ran out early; the largest divisor at most 3 is used instead, and said."""
    import keras

    lines = []
    cfg = tiny_config(small_records, model="dense", epochs=2, steps_per_epoch=4, batch_size=4,
                      steps_per_execution=3)  # fmt: skip
    train(cfg, tmp_path / "run", log=lines.append)
    model = keras.saving.load_model(tmp_path / "run" / "model.keras", safe_mode=True)
    assert int(model.optimizer.iterations) == 8
    assert ("petal train: steps_per_execution 3 -> 2, the largest that divides the 4 steps per "
            "epoch (Keras runs whole executions: the epochs would run extra steps)") in lines


def test_a_warm_up_longer_than_the_run_names_the_fix(small_records, tmp_path):
    """squeezenet-plus warms up for 3 epochs: a 2-epoch try of it is told what to change."""
    cfg = get_preset("squeezenet-plus").replace(data=str(small_records), epochs=2)
    with pytest.raises(PetalError, match=r"^The learning-rate warm-up \(schedule_options."
                       r"warmup_epochs=3; warmup_cosine decays after it\) does not fit in the 2 "
                       r"epoch\(s\) to train: pass --epochs 4 or more, or a shorter warm-up "
                       r"\(--set schedule_options"):
        train(cfg, tmp_path / "run", **QUIET)
    assert not (tmp_path / "run").exists()


def test_a_workdir_inside_the_training_data_is_refused_before_writing(
    small_flowers, make_records, tmp_path
):
    """In an image folder the run's folder would become a class once evaluate writes its
    plots there; in a records folder its files would mix with the shards."""
    photos = tmp_path / "photos [x]"  # a folder name that is also a glob pattern
    for cls in ("daisy", "roses"):
        (photos / cls).mkdir(parents=True)
        for f in sorted((small_flowers / cls).iterdir())[:2]:
            (photos / cls / f.name).symlink_to(f.resolve())
    for workdir in (photos / "run", photos):
        with pytest.raises(PetalError, match=r"work directory .* is inside the training data .*"
                           r"choose a --workdir outside it"):
            train(tiny_config(photos), workdir, **QUIET)
    assert sorted(p.name for p in photos.iterdir()) == ["daisy", "roses"]
    records = make_records()
    with pytest.raises(PetalError, match="is inside the training data"):
        train(tiny_config(records), records, **QUIET)
    assert not (records / "config.json").exists()


@pytest.mark.slow  # 11 s in CI on a Zen 3 host (session 39: 775 s): `pytest -m slow` runs it
def test_train_on_smaller_crops_than_the_evaluation_size(small_records, tmp_path):
    """train_image_size: 24px random resized crops for training, 32px images for validation."""
    import keras

    cfg = tiny_config(
        small_records,
        epochs=1,
        model="squeezenet",
        model_options={"any_size": True, "fires": [[8, 16]]},  # one fire module: the fastest
        train_image_size=24,
        augment="crop+flip",
    )
    lines = []
    metrics = train(cfg, tmp_path / "run", log=lines.append)
    assert metrics["epochs_completed"] == 1
    assert lines[0].startswith("petal train: squeezenet 32x32 (training on 24x24 crops), 5 ")
    assert not any("larger than the" in line for line in lines)
    # squeezenet-plus's 160px crops kept under --image-size 64 trained on crops larger than
    # the images, without a word.
    from petal.training.loop import _larger_crops

    assert _larger_crops((24, 24), (32, 32)) == ""
    assert _larger_crops((160, 160), (64, 64)) == (
        "training on 160x160 crops, larger than the 64x64 images it is evaluated on: each "
        "epoch costs more, not less (train_image_size is for training smaller, as FixRes "
        "does); pass --set train_image_size=53, or --set train_image_size=null to train at "
        "the image size")
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["train_image_size"] == 24 and metrics["image_size"] == [32, 32]
    model = keras.models.load_model(tmp_path / "run" / "model.keras", compile=False)
    assert model.predict(np.zeros((1, 32, 32, 3), "float32"), verbose=0).shape == (1, 5)

    with pytest.raises(PetalError, match="needs the 'crop' augmentation"):
        train(tiny_config(small_records, train_image_size=24, augment="codelab"), tmp_path / "bad", **QUIET)
    # A model of one input size cannot take the crops: said before anything is written (it
    # was a Keras traceback in the first step, after config.json and history.csv).
    fixed = tiny_config(small_records, train_image_size=24, augment="crop")
    with pytest.raises(PetalError, match=r"needs a model that takes 24x24 crops as well as its "
                       r"32x32 input: pass --set model_options.any_size=true"):  # fmt: skip
        train(fixed, tmp_path / "bad", **QUIET)
    with pytest.raises(PetalError, match="'dense' has no any_size option"):
        train(fixed.replace(model="dense"), tmp_path / "bad", **QUIET)
    assert not (tmp_path / "bad").exists()
    # A model option meant as true/false and given as text (--set model_options.any_size=False
    # keeps the string "False", which is truthy) is refused, not read as true.
    with pytest.raises(PetalError, match="option any_size must be true or false"):
        train(fixed.replace(model_options={"any_size": "False"}), tmp_path / "bad", **QUIET)


def test_corrupt_record_stops_with_its_name_or_is_skipped_and_counted(small_records, tmp_path):
    import shutil

    from conftest import corrupt_record

    records = tmp_path / "records"
    shutil.copytree(small_records, records)
    shard = sorted(records.glob("validation-*.tfrec"))[0]
    corrupt_record(shard, 1)
    cfg = tiny_config(records, epochs=1, model="dense")  # the model plays no part: the fastest one
    with pytest.raises(PetalError, match=rf"Corrupt input.*{shard.name}.*--skip-corrupt"):
        train(cfg, tmp_path / "run", **QUIET)
    # The failed start left config.json and history.csv but no checkpoint: the same command
    # with skip_corrupt starts again in the same work directory (no --overwrite needed).
    assert (tmp_path / "run" / "config.json").is_file()
    assert not (tmp_path / "run" / "last.keras").exists()
    # Evaluation batches of 2: the skipped records take whole batches away (the batch count
    # Keras was told once failed the run).
    metrics = train(cfg.replace(skip_corrupt=True, eval_batch_size=2), tmp_path / "run", **QUIET)
    assert json.loads((tmp_path / "run" / "config.json").read_text())["skip_corrupt"] is True
    # A CRC failure loses the rest of its shard: record 1 and everything after it.
    assert metrics["skipped_corrupt_records"] == int(shard.name.rsplit("-", 1)[1].split(".")[0]) - 1


@pytest.mark.slow  # 35 s in a loaded suite run (session 40): `pytest -m slow` runs it
def test_a_renamed_codelab_shard_stops_training_even_when_skipping_corrupt(
    make_records, tmp_path, caplog
):
    """With skip_corrupt a validation shard renamed to fewer records than it holds was
    trained on: "skipped 0 record(s) ... record 8 is corrupt" and a val_count of its name's
    while more were validated; one renamed to more, "skipped 2 record(s)" that never were.
    The shard is sound: the run stops naming it, the count it holds and its right name."""
    shards = make_records("shards", counts={"all": [8] * 6}, codelab=True, fmt="jpeg")
    (shards / "flowers00-8.tfrec").rename(shards / "flowers00-5.tfrec")  # the validation shard
    cfg = tiny_config(shards, epochs=1, model="dense", skip_corrupt=True)
    with pytest.raises(PetalError) as caught, caplog.at_level("WARNING"):
        train(cfg, tmp_path / "run", **QUIET)
    assert "holds 8 records" not in caplog.text  # the reader's warning said it before the error
    assert str(caught.value) == (
        f"Codelab shard {shards}/flowers00-5.tfrec holds 8 records, not the 5 its file name "
        "says: it is not corrupt (every record reads, and the file ends after the last); "
        "rename it to flowers00-8.tfrec."
    )
    assert not (tmp_path / "run" / "metrics.json").exists()


@pytest.mark.slow  # 29 s in a loaded suite run (session 40): `pytest -m slow` runs it
def test_skipping_most_of_the_training_records_is_said(small_records, tmp_path):
    """A corrupt record ends its shard for the reader: one early in a training shard drops
    most of it every epoch. Counted once, however many epochs, and said at the end."""
    import shutil

    from conftest import break_image, corrupt_record

    records = tmp_path / "records"
    shutil.copytree(small_records, records)
    shard, other = sorted(records.glob("train-*.tfrec"))
    in_shard = int(shard.name.rsplit("-", 1)[1].split(".")[0])
    corrupt_record(shard, 1)
    break_image(other, 0)  # and an image that does not decode: one record more, of 50 still
    lines = []
    cfg = tiny_config(records, epochs=2, model="dense", skip_corrupt=True)
    metrics = train(cfg, tmp_path / "run", log=lines.append)
    assert metrics["skipped_corrupt_records"] == metrics["skipped_corrupt_train_records"]
    assert metrics["skipped_corrupt_train_records"] == in_shard
    assert metrics["undecodable_records_counted"] is True
    assert (
        f"petal train: warning: --skip-corrupt left {in_shard} of the 50 training records "
        f"({100 * in_shard / 50:.0f}%) out of every epoch: after a corrupt record the "
        "reader skips the rest of its shard. Restore the shard, or convert the photos again, "
        "to train on all of them."
    ) in lines


@pytest.mark.slow  # 9 s in CI on a Zen 3 host (session 39: 775 s): `pytest -m slow` runs it
def test_records_whose_image_does_not_decode_are_named_and_counted(
    small_records, tmp_path, monkeypatch
):
    """A record with a sound CRC but an image that does not decode was dropped inside
    tf.data every epoch without a count; it is named up front and counted."""
    import shutil

    from conftest import break_image, corrupt_record
    from petal.data import pipeline

    records = tmp_path / "records"
    shutil.copytree(small_records, records)
    train_shard = sorted(records.glob("train-*.tfrec"))[0]
    val_shard, crc_shard = sorted(records.glob("validation-*.tfrec"))
    break_image(train_shard, 3)
    break_image(val_shard, 1)
    cfg = tiny_config(records, epochs=2, model="dense")
    # Without skip_corrupt: TensorFlow's error names neither; the message names both.
    with pytest.raises(PetalError, match=rf"Corrupt input in {records}: 2 record\(s\) whose "
                       rf"image cannot be decoded: {train_shard}: record 3: .*; {val_shard}: "
                       r"record 1: .*--skip-corrupt"):  # fmt: skip
        train(cfg, tmp_path / "run", **QUIET)
    # Records too many to search: the decoder's reason, not the heading of Keras' error
    # ("Corrupt input in ...: Graph execution error: (the record is not named ...").
    with monkeypatch.context() as patch:
        patch.setattr(pipeline, "MAX_DECODE_SCAN", 10)
        with pytest.raises(PetalError, match=rf"^Corrupt input in {records}: Unknown image "
                           r"file format\. .* \(the record is not named: petal searches local "
                           r"records only, up to 10\)\. Run `petal inspect"):  # fmt: skip
            train(cfg, tmp_path / "run", **QUIET)
    corrupt_record(crc_shard, 2)  # and a CRC failure: the rest of that shard is lost
    crc_lost = int(crc_shard.stem.rsplit("-", 1)[1]) - 2
    lines = []
    metrics = train(cfg.replace(skip_corrupt=True), tmp_path / "run", log=lines.append)
    train_entry, val_entry = metrics["skipped_undecodable_records"]
    assert train_entry.startswith(f"{train_shard}: record 3: Unknown image file format")
    assert val_entry.startswith(f"{val_shard}: record 1: Unknown image file format")
    assert metrics["skipped_corrupt_records"] == 2 + crc_lost  # once, however many epochs
    assert metrics["skipped_corrupt_train_records"] == 1
    assert any(
        line.startswith("petal train: --skip-corrupt: 2 of 60 records cannot be decoded and "
                        f"are skipped: {train_entry}; {val_entry}")
        for line in lines
    )
    resolved = json.loads((tmp_path / "run" / "config.json").read_text())["resolved"]
    assert (resolved["train_count"], resolved["val_count"]) == (49, 9)


def test_folder_with_undecodable_files_names_them_when_skipping(small_flowers, tmp_path):
    folder = tmp_path / "photos"
    for cls in sorted(p.name for p in small_flowers.iterdir()):
        (folder / cls).mkdir(parents=True)
        for f in sorted((small_flowers / cls).iterdir())[:6]:
            (folder / cls / f.name).symlink_to(f.resolve())
    (folder / "daisy" / "zz-not-an-image.jpg").write_bytes(b"plain text, not a JPEG")
    (folder / "tulips" / "IMG_0001.HEIC").write_bytes(b"not read")
    lines = []
    cfg = tiny_config(folder, epochs=1, steps_per_epoch=1, skip_corrupt=True, cache=False, model="dense")
    metrics = train(cfg, tmp_path / "run", log=lines.append)
    assert f"petal train: warning: {folder}: files not read: 1 not of a type petal reads " \
        "(tulips/IMG_0001.HEIC). Images are read from class sub-folders, with the " \
        "extensions .bmp, .gif, .jpeg, .jpg, .png, .webp" in lines
    assert metrics["epochs_completed"] == 1
    assert metrics["skipped_corrupt_records"] == 1
    [entry] = metrics["skipped_corrupt_files"]
    reason = "not an image (no known image format in the file)"  # convert's reason
    assert entry == f"{folder / 'daisy' / 'zz-not-an-image.jpg'}: {reason}"
    assert any("1 of 31 files cannot be decoded" in line for line in lines)


@pytest.mark.slow  # 8-17 s in CI on a Zen 3 host (session 39: 775 s): `pytest -m slow` runs it
def test_skipped_files_change_the_number_of_validation_batches(small_flowers, tmp_path):
    """Undecodable files on both sides of the split: the validation length Keras is told
    leaves them out (it counted them, and the run failed with FailedPreconditionError when
    that changed the number of batches)."""
    from petal.data.pipeline import open_source

    folder = tmp_path / "photos"
    for cls in sorted(p.name for p in small_flowers.iterdir()):
        (folder / cls).mkdir(parents=True)
        for f in sorted((small_flowers / cls).iterdir())[:6]:
            (folder / cls / f.name).symlink_to(f.resolve())
        for i in range(3):
            (folder / cls / f"zz-broken-{i}.jpg").write_bytes(f"not a JPEG {cls} {i}".encode())
    src = open_source(folder)
    bad_val = sum("zz-broken" in f for f in src.files("validation"))
    bad_train = sum("zz-broken" in f for f in src.files("train"))
    good_val = src.count("validation") - bad_val
    # The test needs broken files in validation that remove at least one batch of 4.
    assert bad_val and -(-good_val // 4) < -(-src.count("validation") // 4)
    cfg = tiny_config(folder, epochs=1, steps_per_epoch=1, skip_corrupt=True, cache=False,
                      model="dense", eval_batch_size=4)
    metrics = train(cfg, tmp_path / "run", log=lambda line: None)
    assert metrics["epochs_completed"] == 1 and metrics["skipped_corrupt_records"] == 15
    resolved = json.loads((tmp_path / "run" / "config.json").read_text())["resolved"]
    assert resolved["val_count"] == good_val
    assert resolved["train_count"] == src.count("train") - bad_train


@pytest.mark.parametrize(
    ("values", "match"),
    [
        ({"schedule_options": {"warmup_epochs": "2"}}, "warmup_epochs must be a finite number"),
        # OverflowError: cannot convert float infinity to integer (a traceback).
        ({"schedule": "warmup_cosine", "schedule_options": {"warmup_epochs": float("inf")}},
         r"^Schedule option warmup_epochs must be a finite number\. Received: "),
        # Epochs 2 and 3 trained at a rate of 0, without a word.
        ({"schedule": "warmup_cosine", "epochs": 3, "schedule_options": {"total_epochs": 1}},
         r"^schedule_options\.total_epochs=1 is shorter than the 3 epochs it schedules: the "
         r"cosine reaches end_lr=0 there, and the epochs after it would train at a rate of 0"),
        ({"schedule_options": {"peak_lr": 0.1}}, "peak_lr is set by training from learning_rate"),
        # It silently won over learning_rate, which the log and config.json reported.
        ({"schedule": "codelab_ramp", "schedule_options": {"max_lr": 5e-4}},
         "max_lr is set by training from learning_rate"),
        ({"schedule_options": {"steps_per_epoch": 5}}, "steps_per_epoch is set by training"),
        # The codelab's rule for 8 replicas ran; the log and config.json said one's peak.
        ({"schedule": "codelab_ramp", "learning_rate": None, "schedule_options": {"replicas": 8}},
         r"^schedule_options\.replicas is set by training from the strategy's replicas"),
        ({"augment": "flip+sharpen"}, "Unknown augmentation 'sharpen'"),
        ({"seed": -1}, r"seed must be a whole number from 0 to 4294967295\. Received: seed=-1"),
        # Keras' set_random_seed refused it with a ValueError traceback.
        ({"seed": 2**32}, r"seed must be a whole number .*Received: seed=4294967296$"),
        ({"image_size": 7}, "needs images of at least 16x16"),
        ({"train_image_size": 8}, "needs images of at least 16x16"),
    ],
)
def test_bad_settings_are_refused_before_the_data_is_opened(tmp_path, values, match):
    """The data path does not exist: these errors must come first (they once came after the
    data was opened and the run's header printed, or after the model was built)."""
    cfg = get_preset("quick").replace(data=str(tmp_path / "no-records-here"), **values)
    with pytest.raises(PetalError, match=match):
        train(cfg, tmp_path / "run", log=lambda line: None)
    assert not (tmp_path / "run").exists()


def test_skip_corrupt_yields_to_set_an_empty_preset_is_refused_and_momentum_unused_is_said(
    small_records, tmp_path, capsys
):
    """--skip-corrupt won over --set skip_corrupt=false (every other flag yields to --set);
    --preset '' (an unset variable) trained the default preset; momentum with adam was
    ignored without a word."""
    from petal.cli import main

    run = tmp_path / "run"
    args = ["train", "--preset", "quick", "--model", "dense", "--data", str(small_records),
            "--workdir", str(run), "--epochs", "1", "--image-size", "16", "--batch-size", "8",
            "--precision", "float32", "--set", "steps_per_epoch=1", "--set",
            "tensorboard=false"]  # fmt: skip
    assert main([*args, "--skip-corrupt", "--set", "skip_corrupt=false", "--set",
                 "momentum=0.5"]) == 0  # fmt: skip
    assert json.loads((run / "config.json").read_text())["skip_corrupt"] is False
    assert ("petal train: warning: momentum=0.5 is not used by optimizer 'adam' (its own "
            "momentum is fixed, beta_1 0.9): set optimizer='sgd' or 'rmsprop' to use it, or "
            "leave momentum out\n") in capsys.readouterr().err  # fmt: skip
    args[2] = ""
    assert main([*args, "--overwrite"]) == 2
    assert capsys.readouterr().err == (
        "petal train: error: --preset is empty (an unset shell variable?); pass a preset "
        "(petal train --list-presets), or leave --preset out.\n"
    )


def test_a_shuffle_buffer_past_the_split_is_the_split(small_records):
    """tf.data sets a buffer's room aside: 1e9 images ran the machine out of memory, 1e12
    crashed the process (a segmentation fault)."""
    from petal.data import open_source, train_dataset

    src = open_source(str(small_records))
    whole = train_dataset(src, batch_size=4, shuffle_buffer=src.count("train"), seed=1,
                          deterministic=True)  # fmt: skip
    huge = train_dataset(src, batch_size=4, shuffle_buffer=10**12, seed=1, deterministic=True)
    for a, b in zip(whole.take(3), huge.take(3), strict=True):
        assert np.array_equal(a[1], b[1]) and np.array_equal(a[0], b[0])


def test_a_seed_keras_cannot_take_is_one_line_on_the_command_line(tmp_path, capsys):
    """It was a ValueError traceback from keras.utils.set_random_seed, exit 1."""
    from petal.cli import main

    for seed, shown in (("4294967296", "4294967296"), ("1e30", str(int(1e30)))):
        code = main(["train", "--preset", "quick", "--data", str(tmp_path / "none"),
                     "--workdir", str(tmp_path / "run"), "--set", f"seed={seed}"])
        assert code == 2
        assert capsys.readouterr().err == (
            "petal train: error: seed must be a whole number from 0 to 4294967295. "
            f"Received: seed={shown}\n"
        )
    assert not (tmp_path / "run").exists()


def test_resuming_a_run_without_a_saved_epoch_says_it_starts_over(small_records, tmp_path):
    """It said "resuming after epoch 0"; and "already completed 1 epochs"."""
    workdir = tmp_path / "run"
    cfg = tiny_config(small_records, epochs=1, model="dense")
    with pytest.raises(Interrupt):
        train(cfg, workdir, log=interrupt_at("epoch 1/1"))
    for name in ("state.json", "last.keras", "best.weights.h5"):  # as if killed in epoch 1
        (workdir / name).unlink()
    lines = []
    train(cfg, workdir, resume=True, log=lines.append)
    assert any(line.endswith(", resuming a run that completed no epoch: from the start")
               for line in lines)
    assert ", mean of last 1 0." in lines[-1], lines[-1]  # it said "last 5" of one epoch
    lines.clear()
    # The marker of a process killed in the folder (SIGKILL) stayed through resumes that had
    # nothing to do: a later process given its pid would have been taken for it.
    gone = 4194305  # above Linux's largest pid (2**22): no process has it
    (workdir / ".petal-running").write_text(json.dumps(
        {"pid": gone, "host": socket.gethostname(), "doing": "training in it"}))
    train(cfg, workdir, resume=True, log=lines.append)
    assert lines == [f"petal train: {workdir} already completed 1 epoch; nothing to do (to "
                     "train it further, pass --epochs 2 or more)"]
    assert not (workdir / ".petal-running").exists()


_SIGNAL_IN_A_SAVE = """
import os, signal, sys
from keras.src.saving import saving_lib
from petal.cli import main

real_save = saving_lib._save_model_to_fileobj
saves = []


def save(*args, **kwargs):
    # Keras opens the weight store inside a bare `except:`: the signal is raised there.
    saves.append(1)
    if len(saves) == {nth}:
        real_init = saving_lib.H5IOStore.__init__

        def init(self, *a, **k):
            saving_lib.H5IOStore.__init__ = real_init
            os.kill(os.getpid(), signal.{signame})
            return real_init(self, *a, **k)

        saving_lib.H5IOStore.__init__ = init
    return real_save(*args, **kwargs)


saving_lib._save_model_to_fileobj = save
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize(
    ("nth", "signame", "status", "said"),
    [
        # Epoch 2's last.keras: it was swallowed, and training ran on to exit 0.
        (2, "SIGTERM", 143, "terminated"),
        # model.keras, after the 3 epochs: the run is complete.
        pytest.param(4, "SIGINT", 130, "interrupted", marks=pytest.mark.slow),
    ],
)
def test_a_signal_while_keras_saves_stops_training_once_the_epoch_is_saved(
    small_records, tmp_path, nth, signame, status, said
):
    script = tmp_path / "run.py"
    script.write_text(_SIGNAL_IN_A_SAVE.replace("{nth}", str(nth)).replace("{signame}", signame))
    workdir = tmp_path / "run"
    argv = ["train", "--preset", "quick", "--data", str(small_records), "--workdir",
            str(workdir), "--epochs", "3", "--batch-size", "10", "--image-size", "32",
            "--precision", "float32", "--set", "steps_per_epoch=2", "--set", "tensorboard=false",
            "--set", "model_options.fires=[[8,16]]"]  # one fire module: traced in half the time
    done = subprocess.run([sys.executable, str(script), *argv], capture_output=True, text=True,
                          timeout=300, start_new_session=True)
    assert done.returncode == status, done.stderr[-3000:]
    lines = done.stderr.splitlines()
    assert lines[-1] == f"petal train: {said}"
    if nth == 2:
        assert json.loads((workdir / "state.json").read_text())["epoch"] == 2
        assert lines[-2] == (f"petal train: epoch 2 is saved; continue with `petal train "
                             f"--resume --workdir {workdir}`")
        assert not (workdir / "model.keras").exists()
    else:  # the signal waited for metrics.json too: resuming has nothing to do
        assert (workdir / "model.keras").is_file() and (workdir / "metrics.json").is_file()
        assert lines[-2] == (f"petal train: the run is complete: its 3 epochs, model.keras "
                             f"and metrics.json are saved in {workdir}")


def test_best_weights_are_those_of_the_best_epoch_state_json_names(tmp_path, monkeypatch):
    """best.weights.h5 was replaced before last.keras and state.json: an interruption in
    between left the weights of an epoch that the resume threw away, while metrics.json
    named another best epoch."""
    import os
    import signal

    import keras

    from petal.training import callbacks
    from petal.training.callbacks import Checkpointer

    def weights_of(path):
        probe = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        probe.load_weights(path)
        return probe.get_weights()[0]

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    state = {"epoch": 0, "best_epoch": 0, "best_val_accuracy": -1.0}
    checkpointer = Checkpointer(tmp_path, state)
    checkpointer.set_model(model)
    checkpointer.on_epoch_end(0, {"val_accuracy": 0.5})
    first = model.get_weights()[0].copy()
    np.testing.assert_array_equal(weights_of(tmp_path / "best.weights.h5"), first)

    # Interrupted before state.json of epoch 2 (a better one) is written.
    model.set_weights([w + 1 for w in model.get_weights()])
    real = callbacks.write_json

    def write_json(path, data):
        raise Interrupt("before state.json")

    monkeypatch.setattr(callbacks, "write_json", write_json)
    with pytest.raises(Interrupt):
        checkpointer.on_epoch_end(1, {"val_accuracy": 0.9})
    assert json.loads((tmp_path / "state.json").read_text())["best_epoch"] == 1
    np.testing.assert_array_equal(weights_of(tmp_path / "best.weights.h5"), first)

    # Ctrl-C while the best weights are written waits for state.json, then stops.
    monkeypatch.setattr(callbacks, "write_json", real)
    real_save = model.save_weights

    def save_weights(path, *args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)
        return real_save(path, *args, **kwargs)

    monkeypatch.setattr(model, "save_weights", save_weights)
    with pytest.raises(KeyboardInterrupt):
        checkpointer.on_epoch_end(1, {"val_accuracy": 0.9})
    assert json.loads((tmp_path / "state.json").read_text())["best_epoch"] == 2
    np.testing.assert_array_equal(weights_of(tmp_path / "best.weights.h5"), first + 1)
    assert not list(tmp_path.glob(".tmp-*"))


@pytest.mark.slow  # 113 s in a loaded suite run (session 40): `pytest -m slow` runs it
def test_an_epochs_tensorboard_scalars_are_written_before_it_is_saved(
    small_records, tmp_path, monkeypatch
):
    """They were written after state.json: a signal in between lost them for good, as the
    resume does not train a saved epoch again."""
    import tensorflow as tf
    from tensorflow.core.util import event_pb2

    from petal.training import callbacks

    real = callbacks.write_json

    def write_json(path, data):
        real(path, data)
        if Path(path).name == "state.json":
            raise Interrupt("just after state.json")

    monkeypatch.setattr(callbacks, "write_json", write_json)
    workdir = tmp_path / "run"
    with pytest.raises(Interrupt):
        train(tiny_config(small_records, model="dense", tensorboard=True), workdir, **QUIET)
    assert json.loads((workdir / "state.json").read_text())["epoch"] == 1
    tags = set()
    for events in (workdir / "tensorboard").glob("*/events.*"):
        for record in tf.data.TFRecordDataset(str(events)):
            event = event_pb2.Event.FromString(record.numpy())
            tags |= {(event.step, f"{events.parent.name}/{v.tag}") for v in event.summary.value}
    assert {(1, "train/epoch_loss"), (1, "validation/epoch_accuracy")} <= tags


@pytest.mark.slow  # 7-52 s in the full suite (session 27): `pytest -m slow` runs it
def test_resuming_for_more_epochs_says_the_cosine_schedule_is_rebuilt(small_records, tmp_path):
    """Its rate went from the end of a decay back up near the peak, unsaid."""
    from petal.training.callbacks import read_history

    run = tmp_path / "run"
    cfg = tiny_config(small_records, model="dense", schedule="warmup_cosine",
                      schedule_options={"warmup_epochs": 0.5})
    train(cfg, run, **QUIET)
    lines = []
    train(cfg.replace(epochs=3), run, resume=True, log=lines.append)
    rows = read_history(run / "history.csv")
    assert rows[2]["lr"] > rows[1]["lr_end"]  # back up the decay
    assert (f"petal train: warning: the warmup_cosine schedule is rebuilt for 3 epochs (it was "
            f"built for 2): the learning rate goes from {rows[1]['lr_end']:.3g} at the end of "
            f"epoch 2 to {rows[2]['lr']:.3g} at epoch 3 (a new run follows one schedule over all "
            "its epochs)") in lines
    # Not when the rate goes on as it was: the same epochs, or a decay not yet begun.
    cfg = cfg.replace(epochs=4, schedule_options={"warmup_epochs": 2})
    with pytest.raises(Interrupt):
        train(cfg, tmp_path / "more", log=interrupt_at("epoch 1/4"))
    for epoch, epochs in ((2, 4), (3, 6)):
        lines = []
        with pytest.raises(Interrupt):
            train(cfg.replace(epochs=epochs), tmp_path / "more", resume=True,
                  log=_kept_until(lines, f"epoch {epoch}/{epochs}"))
        assert not [line for line in lines if "rebuilt" in line], lines


def test_a_resume_for_more_epochs_rebuilds_only_the_last_phase_s_schedule(tmp_path):
    """fine_tune='head_then_all': only the full phase grows with --epochs. A resume inside
    the head phase took its length as 3 - 2 = 1 epoch: a false "rebuilt" warning, or the
    resume refused for a warm-up "longer than head_epochs=1" where head_epochs was 3."""
    from petal.training.loop import _rebuilt_schedule

    saved = get_preset("quick").replace(
        fine_tune="head_then_all", head_epochs=3, epochs=5, schedule="warmup_cosine",
        schedule_options={"warmup_epochs": 1.5},
    )  # fmt: skip
    (tmp_path / "config.json").write_text(
        json.dumps({**saved.to_dict(), "resolved": {"classes": ["a", "b"]}})
    )
    for warmup, epochs in ((1.5, 7), (0.5, 6)):
        cfg = saved.replace(epochs=epochs, schedule_options={"warmup_epochs": warmup})
        assert _rebuilt_schedule(cfg, tmp_path, 1, 1e-3, 10, 1) is None
    # In the full phase (epochs 3-5 of 5, now 3-7 of 7): that phase's, named as such.
    cfg = saved.replace(epochs=7, schedule_options={"warmup_epochs": 0.5})
    said = _rebuilt_schedule(cfg, tmp_path, 4, 1e-3, 10, 1)
    assert said.startswith(
        "the full phase's warmup_cosine schedule is rebuilt for 4 epochs (it was built for 2): "
    ), said
    assert said.endswith("(a new run follows one schedule over each phase's epochs)"), said
    # A longer warm-up given with the resume: the saved schedule is built with the saved
    # warm-up (built with the new one, 2.5 epochs in 2, it was refused: "pass --epochs 6").
    cfg = saved.replace(epochs=9, schedule_options={"warmup_epochs": 2.5})
    said = _rebuilt_schedule(cfg, tmp_path, 4, 1e-3, 10, 1)
    assert said.startswith("the full phase's warmup_cosine schedule is rebuilt for 6 epochs "
                           "(it was built for 2): "), said  # fmt: skip
    # A new schedule that cannot be built is refused by the run's own build, not here.
    cfg = saved.replace(epochs=9, schedule_options={"warmup_epochs": 7})
    assert _rebuilt_schedule(cfg, tmp_path, 4, 1e-3, 10, 1) is None


def _kept_until(lines: list[str], prefix: str):
    """A log function that keeps the lines and raises at ``prefix`` (see interrupt_at)."""
    stop = interrupt_at(prefix)

    def log(line: str) -> None:
        lines.append(line)
        stop(line)

    return log


def test_too_few_images_for_a_batch_names_the_setting_that_made_it(make_records, tmp_path):
    # codelab-convnet trains one device at single_device_batch_size=32, not batch_size=16:
    # naming batch_size=16 as the culprit made no sense.
    records = make_records(counts={"train": [30], "validation": [10]})
    cfg = tiny_config(records, single_device_batch_size=64, steps_per_epoch=None)
    with pytest.raises(PetalError) as err:
        train(cfg, tmp_path / "run", log=lambda line: None)
    assert "fewer than one global batch of 64" in str(err.value)
    assert str(err.value).endswith("Received: single_device_batch_size=64")
    with pytest.raises(PetalError) as err:
        train(cfg.replace(single_device_batch_size=None, batch_size=40), tmp_path / "run2",
              log=lambda line: None)
    assert str(err.value).endswith("Received: batch_size=40 per replica x 1 replica(s)")


@pytest.mark.slow  # 10-11 s in CI (session 38, 575 s): `pytest -m slow` runs it
def test_train_and_evaluate_take_the_classes_of_codelab_shards_that_name_none(
    make_records, monkeypatch, tmp_path, capsys
):
    """Shards too large to count every record's class, naming no class, whose sixth class
    comes after the records read when opened: the error's fix was the Python API's
    open_source(classes=...), which petal train and evaluate had no way to take."""
    from conftest import CLASSES, keep_only, relabel_after
    from petal.cli import main
    from petal.data import reader

    folder = make_records("late", counts={"all": [40] * 6}, codelab=True, fmt="jpeg")
    relabel_after(keep_only(folder), 34, 5)  # records 34-39 of each shard: class index 5
    monkeypatch.setattr(reader, "MAX_CLASS_SCAN_BYTES", 0)
    workdir, names = tmp_path / "run", ",".join([*CLASSES, "sixth"])
    args = ["train", "--preset", "quick", "--model", "dense", "--data", str(folder), "--workdir",
            str(workdir), "--epochs", "1", "--image-size", "16", "--batch-size", "8",
            "--precision", "float32", "--set", "steps_per_epoch=2", "--set",
            "tensorboard=false"]  # fmt: skip
    assert main(args) == 2  # the validation shard's records 34-39
    assert "index 5 but the source has 5 classes" in capsys.readouterr().err
    assert main([*args, "--overwrite", "--classes", names]) == 0
    config = json.loads((workdir / "config.json").read_text())
    assert config["classes"] == names and config["resolved"]["classes"] == names.split(",")
    capsys.readouterr()
    # On the run's own data, evaluate reads it with the run's classes.
    assert main(["evaluate", str(workdir), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["classes"] == names.split(",") and report["per_class"]["sixth"]["support"] == 6
    # On the same shards given as other data: --classes, else the one-line error.
    assert main(["evaluate", str(workdir), "--data", f"{folder}/*.tfrec", "--split", "all"]) == 2
    assert "pass --classes NAME,NAME,..." in capsys.readouterr().err
    assert main(["evaluate", str(workdir), "--data", f"{folder}/*.tfrec", "--split", "all",
                 "--classes", names, "--json"]) == 0  # fmt: skip
    assert json.loads(capsys.readouterr().out)["per_class"]["sixth"]["support"] == 36


@pytest.mark.slow  # 12-15 s in CI (session 37, which took 612 s): `pytest -m slow` runs it
def test_another_listing_of_a_runs_codelab_shards_is_refused_to_resume_and_warned_of(
    make_records, tmp_path, capsys
):
    """Codelab shards are split by file: a glob of some of them took shards the run trained
    on for validation. A resume went on and validated on them; evaluate scored them, and
    the train split of the run's own shards, as held out."""
    from petal.cli import main

    folder = make_records("shards", counts={"all": [6] * 13}, codelab=True, fmt="jpeg")
    run = tmp_path / "run"
    train(tiny_config(f"{folder}/*.tfrec", model="dense", epochs=1, image_size=16), run, **QUIET)
    saved = json.loads((run / "config.json").read_text())["resolved"]
    assert saved["trained_on"] == [{
        "data": f"{folder}/*.tfrec", "data_kind": "codelab", "folder_split": None,
        "folder_kept_in_train": None, "records_source": None, "records_split": None,
        "train_shards": [str(folder / f"flowers{k:02d}-6.tfrec") for k in range(2, 13)],
    }]  # fmt: skip
    some = f"{folder}/flowers*[1-9]-*.tfrec"  # 11 files, 01 and 02 validate: 02 trained
    with pytest.raises(PetalError) as err:
        train(tiny_config(some, model="dense", epochs=2, image_size=16), run, resume=True, **QUIET)
    assert str(err.value).startswith(
        f"{some} takes 1 of the shards {run} trained on (flowers02-6.tfrec) for validation "
        "(codelab shards are split by file: the first 19% a folder or glob lists validate): "
        "resuming on it would validate on photos the run trained on"
    )
    (folder / "flowers13-6.tfrec").write_bytes((folder / "flowers00-6.tfrec").read_bytes())
    for name in ("flowers00-6.tfrec", "flowers01-6.tfrec"):  # the folder listed otherwise
        (folder / name).rename(tmp_path / name)
    with pytest.raises(PetalError, match="lists other shards than when .* trained on it, and "
                       r"now takes 2 of the shards .* \(flowers02-6.tfrec, ...\) for validation"):
        train(tiny_config(f"{folder}/*.tfrec", model="dense", epochs=2, image_size=16), run,
              resume=True, **QUIET)  # fmt: skip
    for name in ("flowers00-6.tfrec", "flowers01-6.tfrec"):
        (tmp_path / name).rename(folder / name)
    (folder / "flowers13-6.tfrec").unlink()
    capsys.readouterr()
    assert main(["evaluate", str(run), "--data", some, "--out", str(tmp_path / "ev")]) == 0
    assert ("warning: 1 of the 2 shards of the validation split scored (flowers02-6.tfrec; 6 of "
            "its 12 images) are shards the run trained on") in capsys.readouterr().err
    assert main(["evaluate", str(run), "--split", "train", "--out", str(tmp_path / "ev")]) == 0
    assert ("warning: 11 of the 11 shards of the train split scored (flowers02-6.tfrec, ...; 66 "
            "of its 66 images) are shards the run trained on") in capsys.readouterr().err
    assert main(["evaluate", str(run), "--out", str(tmp_path / "ev")]) == 0
    assert "shards the run trained on" not in capsys.readouterr().err
    # Shards naming a class the model does not know, one record of which names its class
    # otherwise: the records' disagreement was taken for shards that name no classes.
    import tensorflow as tf

    other, relabelled = tmp_path / "other", []
    other.mkdir()
    for shard in sorted(folder.glob("*.tfrec")):
        examples = [tf.train.Example.FromString(r.numpy())
                    for r in tf.data.TFRecordDataset(str(shard))]  # fmt: skip
        with tf.io.TFRecordWriter(str(other / shard.name)) as writer:
            for k, example in enumerate(examples):
                feature = example.features.feature
                index = feature["class"].int64_list.value[0]
                if index == 4:
                    feature["label"].bytes_list.value[:] = [b"lilies"]
                elif index == 0 and not relabelled:
                    feature["label"].bytes_list.value[:] = [b"roses"]
                    relabelled.append(k)
                writer.write(example.SerializeToString())
    assert main(["evaluate", str(run), "--data", str(other), "--out", str(tmp_path / "ev")]) == 2
    err = capsys.readouterr().err
    assert relabelled and f"{other} holds classes the model in {run} does not know: lilies" in err


@pytest.mark.slow  # 9-10 s in CI on a Zen 3 host (session 39: 775 s): `pytest -m slow` runs it
def test_resume_checks_the_split_of_every_data_the_run_trained_on(
    small_flowers, small_records, make_records, tmp_path
):
    """Resumed on other photos, then on the first records converted again with another seed:
    only the last data was compared, so the second resume went on silently and petal
    evaluate scored photos the run had trained on as held out."""
    from petal.data import convert

    run = tmp_path / "run"
    train(tiny_config(small_records, model="dense", epochs=1), run, **QUIET)
    other = make_records("other-photos")  # the same classes, other photos
    train(tiny_config(other, model="dense", epochs=2), run, resume=True, **QUIET)
    trained_on = json.loads((run / "config.json").read_text())["resolved"]["trained_on"]
    assert [entry["data"] for entry in trained_on] == [str(small_records), str(other)]
    assert trained_on[0]["records_split"]["seed"] == 0
    reseeded = tmp_path / "seed1"
    convert(small_flowers, reseeded, workers=1, progress=False, shards=1, image_size=64, seed=1)
    with pytest.raises(PetalError, match=re.escape(
        f"{reseeded} and {small_records}, the records {run} trained on, were both converted "
        f"from {small_flowers} but split otherwise (seed 1, not 0)")):
        train(tiny_config(reseeded, model="dense", epochs=3), run, resume=True, **QUIET)
    # Back on its first records: the list keeps each data once, the latest last.
    train(tiny_config(small_records, model="dense", epochs=3), run, resume=True, **QUIET)
    trained_on = json.loads((run / "config.json").read_text())["resolved"]["trained_on"]
    assert [entry["data"] for entry in trained_on] == [str(other), str(small_records)]


def test_train_prints_its_warnings_on_stderr(make_records, tmp_path, capsys):
    """They were on stdout, while every other command prints its warnings on stderr."""
    from petal.cli import main

    records = make_records()  # 16x16 records, trained at 32x32: upscaled, with a warning
    assert main(["train", "--preset", "quick", "--model", "dense", "--data", str(records),
                 "--workdir", str(tmp_path / "run"), "--epochs", "1", "--image-size", "32",
                 "--batch-size", "8",
                 "--precision", "float32", "--set", "steps_per_epoch=1", "--set",
                 "tensorboard=false"]) == 0  # fmt: skip
    printed = capsys.readouterr()
    assert "petal train: warning: the records are 16x16 and are upscaled to 32x32" in printed.err
    assert ": warning:" not in printed.out and "petal train: dense 32x32" in printed.out


def test_no_room_for_the_cache_names_the_settings_train_takes(make_records, tmp_path, monkeypatch):
    """Told to pass cache='off' or another folder, which train's config refuses (its cache is
    true or false), and named cache='disk' where the user gave 'auto'."""
    from petal.data import pipeline
    from petal.data.reader import open_source

    records = make_records()
    monkeypatch.setattr(pipeline, "_available_memory", lambda: 0)  # auto: to disk
    monkeypatch.setattr(pipeline, "_disk_free", lambda folder: 1000)
    space = re.escape("Caching 0.0 GB of decoded images needs more free space than ")
    with pytest.raises(PetalError, match=space + r".* \(0\.0 GB\); pass cache='off' or a folder "
                       r"with room \(cache='/path'\)\. Received: cache='auto'$"):
        pipeline.train_dataset(open_source(str(records)), batch_size=4, augment=None)
    fix = "set TMPDIR to a folder on a disk with room"
    with pytest.raises(PetalError, match=space + r".* \(0\.0 GB\); pass --set cache=false \(decode "
                       rf"the images again each epoch\) or {fix}\. Received: cache='auto'$"):
        train(tiny_config(records, model="dense", epochs=1, cache="auto"), tmp_path / "run",
              **QUIET)
    # The validation images are cached whatever it says.
    with pytest.raises(PetalError, match=space + rf".* \(0\.0 GB\) for the validation images; "
                       rf"{fix}\.$"):
        train(tiny_config(records, model="dense", epochs=1, cache=False), tmp_path / "run",
              **QUIET)


def _out_of_memory_error(monkeypatch, owner, name: str, records, workdir) -> str:
    """The error of a one-epoch run whose ``owner.name`` runs out of memory."""
    import tensorflow as tf

    def out_of_memory(*args, **kwargs):
        raise tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor")

    monkeypatch.setattr(owner, name, out_of_memory)
    with pytest.raises(PetalError) as caught:
        train(tiny_config(records, model="dense", epochs=1), workdir, **QUIET)
    return str(caught.value)


def test_out_of_memory_building_the_model_is_one_line(make_records, tmp_path, monkeypatch):
    """A traceback (dense's weights at 4000 px, ResourceExhaustedError), as petal models
    already said in one line; the work directory is not touched."""
    import petal.models

    error = _out_of_memory_error(
        monkeypatch, petal.models, "create_model", make_records(), tmp_path / "run"
    )
    assert error == (
        "Out of memory building the model 'dense' for 32x32 images; pass a smaller --image-size "
        "or a smaller --model (`petal models --image-size 32` lists their parameters). "
        "Received: model='dense', image_size=32x32"
    )
    assert not (tmp_path / "run").exists()


def test_a_schedule_shorter_than_half_an_epoch_is_checked_at_the_real_steps(
    make_records, tmp_path
):
    """Pre-checked at one step per epoch, 0.4 epochs of 10 steps rounded to none and was
    refused; one that does round to no step at the real count still fails before the work
    directory is written."""
    from petal.training.callbacks import read_history

    records = make_records()

    def cfg(total_epochs, **kw):
        # (A schedule shorter than the run needs an end_lr above 0: at 0 it is refused.)
        return tiny_config(records, model="dense", epochs=1, schedule="warmup_cosine",
                           schedule_options={"total_epochs": total_epochs, "end_lr": 1e-5},
                           **kw)  # fmt: skip

    train(cfg(0.4, steps_per_epoch=10), tmp_path / "run", **QUIET)  # 4 steps, then end_lr
    assert read_history(tmp_path / "run" / "history.csv")[0]["lr_end"] == pytest.approx(1e-5)
    refused = re.escape("warmup_epochs must be shorter than total_epochs (the cosine decay "
                        "follows it), which must be positive. Received: warmup_epochs=0, "
                        "total_epochs=0.1")
    for given in (2, None):  # 0.2 steps; 13 images in batches of 10: 0.1 steps
        with pytest.raises(PetalError, match=refused):
            train(cfg(0.1, steps_per_epoch=given), tmp_path / f"short-{given}", **QUIET)
        assert not (tmp_path / f"short-{given}").exists()


def test_out_of_memory_in_a_training_step_is_one_line_naming_the_batch(
    make_records, tmp_path, monkeypatch
):
    """A batch too large for the accelerator's memory ended in a ResourceExhaustedError
    traceback: the most common training error on a GPU."""
    import keras

    error = _out_of_memory_error(monkeypatch, keras.Model, "fit", make_records(), tmp_path / "run")
    assert error == (
        "Out of memory training 'dense' on batches of 10 images of 32x32 per replica; pass a "
        "smaller --batch-size (per replica), or a smaller --image-size or --model. Received: "
        "batch_size=10, image_size=32x32, replicas=1"
    )


def test_an_empty_validation_split_names_a_fix_that_fills_it(flowers_dir, tmp_path):
    """The fix names the photos a class needs (or a larger --val-fraction) by the split rule
    of what was given; it named the conversion that had made the split empty."""
    from conftest import link_photos, write_test_records
    from petal.data import convert

    def refusal(data) -> str:
        cfg = tiny_config(data, model="dense", epochs=1, batch_size=2, steps_per_epoch=None)
        with pytest.raises(PetalError, match="validation split of .* holds no images") as err:
            train(cfg, tmp_path / "run", **QUIET)
        assert not (tmp_path / "run").exists()
        return str(err.value)

    def records(per_class: int, **kw) -> tuple[Path, int]:
        out = tmp_path / f"records-{per_class}-{len(kw)}"
        photos = tmp_path / f"photos-{per_class}"
        if not photos.exists():
            link_photos(flowers_dir, photos, per_class)
        result = convert(photos, out, image_size=16, workers=1, progress=False, **kw)
        return out, result.counts["validation"]

    one, validated = records(1)
    assert validated == 0
    assert refusal(one).endswith(
        "(converted with --val-fraction 0.19); training validates every epoch: add photos and "
        "convert them again: --val-fraction 0.19 validates round(0.19 x n) of a class's n "
        "photos, one of 3 or more (these records hold at most 1 per class)."
    )
    assert records(3)[1] == 5  # 3 photos of each class: one of each validates
    two, _ = records(2)
    assert (
        "`petal convert SRC DST --val-fraction 0.25` (one of a class's 2 photos validates), "
        "or add photos" in refusal(two)
    )
    assert records(2, val_fraction=0.25)[1] == 5
    # An image folder keeps one photo of a class of 2 or more on each side: converting its
    # photos, as the refusal said, leaves validation as empty.
    assert refusal(tmp_path / "photos-1").endswith(
        "holds no images; training validates every epoch: add photos: an image folder "
        "validates 19% of each class's photos, and one of a class of 2 or more (the largest "
        "class here holds 1)."
    )
    shards = write_test_records(tmp_path / "shards", counts={"all": [4] * 5}, codelab=True)
    assert refusal(shards).endswith(
        "codelab shards validate the first int(n x 0.19) of their n files, one of 6 or more "
        "(5 here): write their records into 6 or more shard files, each named with its record "
        "count (NAME-<count>.tfrec), or convert the images with `petal convert SRC DST "
        "--val-fraction 0.19` and train on those records."
    )


def test_a_file_where_the_tensorboard_logs_go_is_refused_before_training(tmp_path):
    """It failed with a traceback after an epoch of work (resumed, its history row was kept
    and its state.json not); --overwrite keeps the user's files, so it is refused too."""
    cfg = tiny_config(tmp_path / "records", epochs=1, model="dense", tensorboard=True)
    for name in ("tensorboard", "tensorboard/validation"):
        run = tmp_path / name.replace("/", "-")
        (run / name).parent.mkdir(parents=True, exist_ok=True)
        (run / name).write_text("x")
        for overwrite in (False, True):
            with pytest.raises(PetalError) as caught:
                train(cfg, run, overwrite=overwrite, **QUIET)
            assert str(caught.value) == (
                f"{run / name} is a file, where petal train writes its TensorBoard logs; move "
                "it away, or pass --set tensorboard=false or another --workdir."
            )
        assert (run / name).read_text() == "x"
        assert len(list(run.rglob("*"))) == 1 + name.count("/")


def test_the_step_bar_is_cleared_before_the_epoch_line(small_records, tmp_path, monkeypatch):
    """On a terminal the epoch line was printed into the last column of the step bar, which
    was left on screen: the bar closed after the checkpoint printed the line."""
    from conftest import Terminal

    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    screens = []

    def log(line: str) -> None:
        if line.startswith("epoch "):
            screens.append(terminal.getvalue())

    train(tiny_config(small_records, model="dense", epochs=2), tmp_path / "run", log=log)
    assert len(screens) == 2
    for screen in screens:
        assert "epoch" in screen  # a bar was drawn...
        # ...and cleared: its last line is blank, the cursor back at its start.
        assert screen.endswith("\r") and not screen.rsplit("\r", 2)[-2].strip()


@pytest.mark.slow  # 24 s in a loaded suite run (session 40): `pytest -m slow` runs it
def test_resume_and_overwrite_must_be_bools(small_records, tmp_path):
    """overwrite="no" replaced a finished run and resume="false" resumed one: any truthy
    value was taken as True. Refused as convert and export refuse it."""
    cfg = tiny_config(small_records, model="dense", epochs=1)
    run = tmp_path / "run"
    train(cfg, run, **QUIET)
    before = (run / "metrics.json").read_text()
    for name, value in (("overwrite", "no"), ("resume", "false"), ("overwrite", 1)):
        with pytest.raises(PetalError) as caught:
            train(cfg, run, **{name: value}, **QUIET)
        assert str(caught.value) == (
            f"{name} must be True or False. Received: {name}={value!r}"
        )
    assert (run / "metrics.json").read_text() == before
    import numpy as np

    lines: list[str] = []  # numpy's True resumes it: a finished run, so nothing to do
    assert train(cfg, run, resume=np.bool_(True), log=lines.append)["epochs_completed"] == 1
    assert (run / "metrics.json").read_text() == before and lines


def test_too_few_images_for_a_pods_batch_names_pod_batch_size(make_records, tmp_path,
                                                              monkeypatch):
    # On a pod the global batch is pod_batch_size x replicas: the error named batch_size.
    from petal.training import schedules

    monkeypatch.setattr(schedules, "POD_REPLICAS", 0)  # this one replica stands for a pod
    records = make_records(counts={"train": [30], "validation": [10]})
    cfg = tiny_config(records, pod_batch_size=48, steps_per_epoch=None)
    with pytest.raises(PetalError) as err:
        train(cfg, tmp_path / "run", log=lambda line: None)
    assert "fewer than one global batch of 48" in str(err.value)
    assert str(err.value).endswith("Received: pod_batch_size=48 per replica x 1 replica(s)")


def test_the_log_says_where_cache_auto_keeps_the_training_images(small_records, tmp_path,
                                                                 monkeypatch):
    """cache='auto' chose RAM or a file on local disk without a word in the log: a run that
    spilled to disk (slower epochs) did not say so, nor why."""
    import petal.models

    def stop(*args, **kwargs):
        raise PetalError("stopped after the start lines")

    monkeypatch.setattr(petal.models, "create_model", stop)
    cfg = tiny_config(small_records, model="dense", cache="auto")
    for memory, where in ((10**12, r"in RAM \(0\.0 GB decoded, within 40% of the 1000\.0 GB "
                                   r"of memory available\)$"),
                          (1, r"on local disk in .*petal-cache \(0\.0 GB decoded, over 40% of "
                              r"the 0\.0 GB of memory available; --set cache=false decodes")):
        monkeypatch.setattr("petal.data.pipeline._available_memory", lambda m=memory: m)
        lines = []
        with pytest.raises(PetalError, match="stopped after the start lines"):
            train(cfg, tmp_path / "run", log=lines.append)
        said = [line for line in lines if "cache=auto" in line]
        assert len(said) == 1 and re.search(
            "^petal train: cache=auto: the decoded training images are cached " + where, said[0]
        ), lines
    lines = []
    with pytest.raises(PetalError, match="stopped after"):
        train(cfg.replace(cache=True), tmp_path / "run", log=lines.append)
    assert not [line for line in lines if "cache" in line]


def test_a_validation_split_lost_to_crc_failures_is_refused_before_training(
    small_records, tmp_path, monkeypatch
):
    """--skip-corrupt with no validation record left to read: on one device it trained, then
    the closing line stopped on the null val_acc (a TypeError traceback); on two replicas the
    refusal blamed the --val-fraction. One refusal, up front, naming the shards."""
    import shutil

    from conftest import corrupt_record
    from petal.training import loop, strategy

    records = tmp_path / "records"
    shutil.copytree(small_records, records)
    shards = sorted(records.glob("validation-*.tfrec"))
    for shard in shards:
        corrupt_record(shard, 0)
    cfg = tiny_config(records, epochs=1, model="dense", skip_corrupt=True)
    expected = (
        f"The validation split of {records} cannot be read: its 10 record(s) are all corrupt "
        "(10 lost to CRC failures) and skipped (--skip-corrupt), and training validates every "
        f"epoch: restore its shards {shards[0]}, {shards[1]} or convert the photos again."
    )
    with pytest.raises(PetalError) as err:
        train(cfg, tmp_path / "run", **QUIET)
    assert str(err.value) == expected
    assert not (tmp_path / "run").exists()
    # Two replicas (said, not built: the check comes before the strategy is used).
    real = strategy.get_strategy

    def on_two(name):
        chosen, info = real(name)
        return chosen, {**info, "replicas": 2}

    with monkeypatch.context() as patch:
        patch.setattr(strategy, "get_strategy", on_two)
        with pytest.raises(PetalError) as err:
            train(cfg, tmp_path / "run", **QUIET)
    assert str(err.value) == expected
    # A run with no validation accuracy (were one to get past the check) ends with "n/a", not
    # a traceback.
    monkeypatch.setattr(loop, "_check_validation_readable", lambda *args: None)
    lines = []
    metrics = train(cfg, tmp_path / "run", log=lines.append)
    assert metrics["final_val_accuracy"] is None
    assert lines[-1].startswith("petal train: done in ") and "final val_acc n/a" in lines[-1]


def test_train_size_refusal_names_every_change_it_needs_at_once(small_records, tmp_path):
    """train_image_size without crop was refused naming only --set augment=...+crop; with that,
    it was refused again for model_options.any_size (or, for dense, led nowhere)."""
    cfg = tiny_config(small_records, train_image_size=24, augment="codelab")
    with pytest.raises(PetalError, match=r"^train_image_size 24 needs the 'crop' augmentation, "
                       r"which resizes its crops to that size, and a model that takes 24x24 "
                       r"crops as well as its 32x32 input: pass --set augment=codelab\+crop "
                       r"--set model_options\.any_size=true, or drop train_image_size\. "
                       r"Received: model='squeezenet', augment='codelab', "
                       r"train_image_size=24$"):  # fmt: skip
        train(cfg, tmp_path / "bad", **QUIET)
    with pytest.raises(PetalError, match=r"'dense' has no any_size option \(squeezenet and "
                       r"squeezenet_separable do\), so it cannot train at another size: drop "
                       r"train_image_size, or pass --model squeezenet --set "
                       r"model_options\.any_size=true --set augment=codelab\+crop\. "):  # fmt: skip
        train(cfg.replace(model="dense"), tmp_path / "bad", **QUIET)
    with pytest.raises(PetalError, match=r"needs the 'crop' augmentation, which resizes its "
                       r"crops to that size: pass --set augment=codelab\+crop, or drop"):  # fmt: skip
        train(cfg.replace(model_options={"any_size": True}), tmp_path / "bad", **QUIET)
    assert not (tmp_path / "bad").exists()


@pytest.mark.parametrize("per_execution", [1, 4])
def test_the_step_bar_counts_steps_when_an_execution_runs_several(per_execution):
    """Keras ends a batch once per execution, with its last step's index: with
    steps_per_execution 4 the bar stopped at 6/24 and its rate and time left were 4x off."""
    from petal.training.callbacks import StepProgress

    bar = StepProgress(24)
    bar.enabled = True  # as on a terminal
    bar.on_epoch_begin(0)
    seen = []
    for last in range(per_execution - 1, 24, per_execution):
        bar.on_train_batch_end(last)
        seen.append(bar._bar.n)
    assert seen == list(range(per_execution, 25, per_execution))
    bar.on_epoch_end(0)
    assert bar._bar is None
    # Keras versions that end an execution with its first step's index, and a last
    # execution cut short by the epoch's end (26 steps, 4 a call).
    import types

    bar = StepProgress(26)
    bar.enabled = True
    bar.set_model(types.SimpleNamespace(steps_per_execution=per_execution))
    bar.on_epoch_begin(1)
    seen = []
    for first in range(0, 26, per_execution):
        bar.on_train_batch_begin(first)
        bar.on_train_batch_end(first)
        seen.append(bar._bar.n)
    assert seen == [min(26, n) for n in range(per_execution, 26 + per_execution, per_execution)]
    bar.on_epoch_end(1)
