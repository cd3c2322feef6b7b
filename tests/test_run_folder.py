"""What a run folder promises: it works from any directory, a finished run is never rewritten,
a failed start does not block the next, and empty splits or missing runs say how to fix them."""

from __future__ import annotations

import json
import os
import shutil
import socket

import pytest

from conftest import tiny_config
from petal.cli import main
from petal.errors import PetalError
from petal.running import READING_PREFIX, RUNNING_FILE
from petal.training.callbacks import read_history
from petal.training.loop import (
    _mark_running,
    absolute_data,
    prepare_workdir,
    resume_config,
    train,
)
from test_train import QUIET

# What every config.json of petal train holds (another program's is not a run of petal's).
PETAL_CONFIG = json.dumps({"model": "dense", "resolved": {"classes": ["a", "b"]}})


def test_a_run_marks_the_local_records_it_reads_while_it_trains(small_records, tmp_path):
    """So that `petal convert --overwrite` into them is refused (test_writer) instead of
    replacing the shards under the run."""
    records = tmp_path / "records"
    shutil.copytree(small_records, records)
    seen: dict[str, str] = {}

    def log(line: str) -> None:
        seen.update((p.name, p.read_text()) for p in records.glob(".*"))

    train(tiny_config(records, epochs=1, model="dense"), tmp_path / "run", log=log)
    marker = f"{READING_PREFIX}{socket.gethostname()}-{os.getpid()}"
    assert list(seen) == [marker]  # while it trained: who and what
    assert json.loads(seen[marker]) == {
        "pid": os.getpid(), "host": socket.gethostname(), "doing": "training from it"
    }
    assert not [p for p in records.iterdir() if p.name.startswith(".")]  # gone at the end


@pytest.mark.slow  # 9 s in CI on a Zen 3 host (session 39: 611 s): `pytest -m slow` runs it
def test_run_folder_works_from_anywhere_and_a_finished_run_is_left_alone(
    small_records, tmp_path, monkeypatch
):
    run = tmp_path / "run"
    monkeypatch.chdir(small_records.parent)
    # Data given relative to the cwd; the model plays no part here: the fastest one.
    train(tiny_config("records", epochs=2, model="dense"), run, **QUIET)
    assert not (run / RUNNING_FILE).exists()  # the marker of a live run is gone at the end
    config_path = run / "config.json"
    saved = json.loads(config_path.read_text())["data"]
    assert os.path.isabs(saved) and os.path.samefile(saved, small_records)

    monkeypatch.chdir(tmp_path)  # elsewhere: "records" does not exist here
    before = config_path.read_bytes()
    lines: list[str] = []
    metrics = train(resume_config(run), run, resume=True, log=lines.append)
    assert metrics == json.loads((run / "metrics.json").read_text())
    assert any(line.endswith("already completed 2 epochs; nothing to do (to train it further, "
                             "pass --epochs 3 or more)") for line in lines)
    # Changes to a finished run would be ignored: refused instead, each named.
    other = tmp_path / "other-records"
    other.mkdir()
    with pytest.raises(PetalError, match=r"already completed its 2 epochs, so nothing would "
                       r"train and these changes would be ignored: data .*records\" -> "
                       r".*other-records\"; model \"dense\" -> \"squeezenet\"\. Its checkpoint "
                       r"holds the model, which --resume cannot change: leave that out, or "):
        train(resume_config(run).replace(model="squeezenet", data=str(other)), run,
              resume=True, **QUIET)
    # The same data by another path is no change.
    os.symlink(small_records, tmp_path / "link")
    train(resume_config(run).replace(data=str(tmp_path / "link")), run, resume=True, **QUIET)
    # Fewer epochs than completed: refused, and config.json still matches history.csv.
    with pytest.raises(PetalError, match=r"already completed 2 epochs.*--epochs 3 or more"):
        train(resume_config(run).replace(epochs=1), run, resume=True, **QUIET)
    assert config_path.read_bytes() == before
    assert len(read_history(run / "history.csv")) == 2

    # A run written before paths were stored absolute: its relative path is not found here.
    old = json.loads(before)
    old["data"] = "records"
    config_path.write_text(json.dumps(old))
    with pytest.raises(PetalError, match=r"records \(relative to .*not found; pass --data PATH"):
        train(resume_config(run).replace(epochs=3), run, resume=True, **QUIET)
    assert json.loads(config_path.read_text())["data"] == "records"  # refused: nothing written
    # Passing the data continues the run and stores the path absolute.
    metrics = train(
        resume_config(run).replace(epochs=3, data=str(small_records)), run, resume=True, **QUIET
    )
    assert metrics["epochs_completed"] == 3
    config = json.loads(config_path.read_text())
    assert config["epochs"] == 3 and config["data"] == str(small_records)


def test_absolute_data_keeps_urls(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert absolute_data("records/flowers-192") == str(tmp_path / "records" / "flowers-192")
    assert absolute_data("shards/*.tfrec") == str(tmp_path / "shards" / "*.tfrec")
    for url in ("gs://bucket/records", "http://host/records", "https://host/records"):
        assert absolute_data(url) == url
    assert absolute_data(None) is None


def test_resume_of_a_folder_without_a_run_says_it_is_not_a_run(small_records, tmp_path, capsys):
    missing = tmp_path / "does" / "not" / "exist"
    assert main(["train", "--workdir", str(missing), "--resume"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"petal train: error: {missing} is not a petal training run (no config.json); "
        "drop --resume to start one."
    )
    # The same when the config comes from elsewhere (a preset, --config).
    with pytest.raises(PetalError, match="is not a petal training run.*drop --resume"):
        train(tiny_config(small_records), missing, resume=True, **QUIET)
    assert not missing.exists()


def test_a_failed_start_is_replaced_but_a_run_with_a_checkpoint_is_not(tmp_path):
    run = tmp_path / "run"
    (run / "tensorboard" / "train").mkdir(parents=True)
    (run / "config.json").write_text(PETAL_CONFIG)
    (run / "history.csv").write_text("epoch,loss\n")
    (run / "notes.txt").write_text("mine")
    prepare_workdir(run, resume=False, overwrite=False, clear=False)  # checks only
    assert (run / "config.json").exists()
    lines: list[str] = []
    prepare_workdir(run, resume=False, overwrite=False, log=lines.append)
    assert not (run / "config.json").exists() and not (run / "history.csv").exists()
    assert not (run / "tensorboard").exists()
    assert (run / "notes.txt").read_text() == "mine"  # not petal's: kept
    assert lines and "completed no epoch" in lines[0]

    (run / "config.json").write_text(PETAL_CONFIG)
    (run / "state.json").write_text('{"epoch": 0}')
    prepare_workdir(run, resume=False, overwrite=False)  # no epoch completed either
    assert not (run / "state.json").exists()

    # Anything that holds training (or came after it) still needs --resume or --overwrite.
    for extra in ("last.keras", "best.weights.h5", "model.keras", "state.json", "eval"):
        (run / "config.json").write_text(PETAL_CONFIG)
        if extra == "eval":
            (run / "eval").mkdir()
        elif extra == "state.json":
            (run / "state.json").write_text('{"epoch": 1}')
        else:
            (run / extra).write_text("x")
        with pytest.raises(PetalError, match="already holds a training run"):
            prepare_workdir(run, resume=False, overwrite=False)
        prepare_workdir(run, resume=False, overwrite=True)


def test_overwrite_starts_a_run_in_a_folder_that_does_not_exist_yet(tmp_path):
    """A script that always passes --overwrite failed on its first run: "[Errno 2] No such
    file or directory: 'runs/new/.petal-replacing'"."""
    run = tmp_path / "runs" / "new"
    prepare_workdir(run, resume=False, overwrite=True, set_aside=True)
    assert run.is_dir() and not any(p.name == ".petal-replacing" for p in run.iterdir())


def test_a_folder_with_another_programs_config_json_is_neither_a_run_nor_deleted(tmp_path):
    """A settings file named config.json made the folder "a run that completed no epoch":
    it was replaced and the files in plots/ and tensorboard/ deleted without --overwrite."""
    proj = tmp_path / "proj"
    (proj / "plots").mkdir(parents=True)
    (proj / "tensorboard").mkdir()
    mine = {"config.json": '{"my": "app settings"}', "plots/figure1.png": "png",
            "tensorboard/other_events": "events", "notes.txt": "notes"}
    for name, text in mine.items():
        (proj / name).write_text(text)
    with pytest.raises(PetalError) as caught:
        prepare_workdir(proj, resume=False, overwrite=False, log=print)
    assert str(caught.value) == (
        f"{proj} holds files that are not a petal run ({proj / 'config.json'} was not "
        "written by petal train); pass another --workdir, or --overwrite to replace it.")
    assert {name: (proj / name).read_text() for name in mine} == mine
    # --overwrite (and the replacement of a failed start) delete what a run writes there,
    # and keep the rest.
    (proj / "history.csv").write_text("epoch,loss\n")
    (proj / "plots" / "curves.png").write_text("petal's")
    (proj / "tensorboard" / "train").mkdir()
    (proj / "tensorboard" / "train" / "events.out").write_text("petal's")
    prepare_workdir(proj, resume=False, overwrite=True)
    assert sorted(p.relative_to(proj).as_posix() for p in proj.rglob("*")) == [
        "notes.txt", "plots", "plots/figure1.png", "tensorboard", "tensorboard/other_events"]
    (proj / "config.json").write_text(PETAL_CONFIG)
    (proj / "plots" / "lr.png").write_text("petal's")
    prepare_workdir(proj, resume=False, overwrite=False)  # a failed start: replaced
    assert not (proj / "config.json").exists() and not (proj / "plots" / "lr.png").exists()
    assert (proj / "plots" / "figure1.png").exists()
    # Folders that hold nothing else go with the run.
    (proj / "plots" / "figure1.png").unlink()
    (proj / "tensorboard" / "other_events").unlink()
    (proj / "tensorboard" / "validation").mkdir()
    prepare_workdir(proj, resume=False, overwrite=True)
    assert sorted(p.name for p in proj.iterdir()) == ["notes.txt"]


def test_resume_refuses_another_programs_config_json_as_a_plain_start_does(
    small_records, tmp_path, capsys
):
    """--resume trained on a folder whose config.json another program wrote (replacing it
    with the run's), or stopped at one of its keys ("Unknown config key 'lr'")."""
    proj = tmp_path / "proj"
    proj.mkdir()
    refused = (
        f"{proj} holds files that are not a petal run ({proj / 'config.json'} was not "
        "written by petal train); pass another --workdir, or --overwrite to replace it."
    )
    for theirs in ('{"epochs": 3, "batch_size": 16}', '{"lr": 1}'):
        (proj / "config.json").write_text(theirs)
        args = ["train", "--resume", "--workdir", str(proj), "--data", str(small_records),
                "--image-size", "32", "--epochs", "1"]
        assert main(args) == 2
        assert capsys.readouterr().err.strip() == f"petal train: error: {refused}"
        with pytest.raises(PetalError) as caught:
            train(tiny_config(small_records, epochs=1), proj, resume=True, **QUIET)
        assert str(caught.value) == refused
        with pytest.raises(PetalError, match="holds files that are not a petal run"):
            resume_config(proj)
        assert sorted(p.name for p in proj.iterdir()) == ["config.json"]
        assert (proj / "config.json").read_text() == theirs


def test_a_first_epoch_still_running_in_another_process_is_not_a_failed_start(tmp_path):
    import socket
    import subprocess
    import sys

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(PETAL_CONFIG)
    (run / "history.csv").write_text("epoch,loss\n")
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (run / RUNNING_FILE).write_text(json.dumps({"pid": live.pid, "host": socket.gethostname()}))
        # Nor may a second process resume it or overwrite it: both rewrote the live run's
        # history (an epoch of one process was silently replaced by the other's).
        in_use = (f"{run} is in use: process {live.pid} on {socket.gethostname()} is training "
                  f"in it; wait for it to end or stop it, or pass another --workdir (if it is "
                  f"not running, delete {run / RUNNING_FILE}).")
        for resume, overwrite in ((False, False), (True, False), (False, True)):
            with pytest.raises(PetalError) as caught:
                prepare_workdir(run, resume=resume, overwrite=overwrite)
            assert str(caught.value) == in_use
        assert (run / "config.json").exists()
        # Before it wrote any file of its run too (it was let in, and took the marker over).
        fresh = tmp_path / "fresh"
        fresh.mkdir()
        (fresh / RUNNING_FILE).write_text((run / RUNNING_FILE).read_text())
        with pytest.raises(PetalError, match=rf"^{fresh} is in use: process {live.pid} "):
            prepare_workdir(fresh, resume=False, overwrite=False)
        # The marker is created exclusively: a process that got past the check meanwhile
        # is refused there, and the live process's marker stays.
        with pytest.raises(PetalError, match=rf"^{fresh} is in use: process {live.pid} "):
            _mark_running(fresh)
        assert json.loads((fresh / RUNNING_FILE).read_text())["pid"] == live.pid
    finally:
        live.kill()
        live.wait()
    # The same marker left by a process that has died no longer protects the files.
    prepare_workdir(run, resume=False, overwrite=False)
    assert not (run / "config.json").exists()
    # A marker of this very process (a second train() call) does not block either.
    (run / "config.json").write_text(PETAL_CONFIG)
    (run / RUNNING_FILE).write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname()}))
    prepare_workdir(run, resume=False, overwrite=False)
    assert not (run / "config.json").exists()
    # A dead process's marker is taken over; its removal leaves another process's marker.
    unmark = _mark_running(fresh)
    assert json.loads((fresh / RUNNING_FILE).read_text())["pid"] == os.getpid()
    (fresh / RUNNING_FILE).write_text('{"pid": 1, "host": "elsewhere"}')
    unmark()
    assert (fresh / RUNNING_FILE).exists()


def test_empty_splits_name_the_fix(make_records, tmp_path):
    no_val = make_records("no-val", counts={"train": [7, 6], "validation": []})
    manifest = json.loads((no_val / "manifest.json").read_text())
    manifest["val_fraction"] = 0.0
    (no_val / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(
        PetalError,
        match=r"validation split of .*no-val holds no images \(converted with --val-fraction "
        r"0\.0\); .*`petal convert SRC DST --val-fraction 0\.19` \(the default\)",
    ):
        train(tiny_config(no_val), tmp_path / "run", **QUIET)

    no_train = make_records("no-train", counts={"train": [], "validation": [5]})
    with pytest.raises(PetalError) as err:
        train(tiny_config(no_train, steps_per_epoch=None), tmp_path / "run", **QUIET)
    message = str(err.value)
    assert "training split of" in message and "holds no images" in message
    assert "smaller --val-fraction" in message and "batch_size" not in message
    assert not (tmp_path / "run").exists()


def test_training_above_the_records_size_warns_about_upscaling(small_records, tmp_path):
    class _Stop(Exception):
        pass

    def header(size: int, **changes) -> list[str]:
        """train()'s opening lines, stopping it before anything is built."""
        lines: list[str] = []

        def log(line: str) -> None:
            lines.append(line)
            if "steps/epoch" in line:  # the last line before the model is built
                raise _Stop

        cfg = tiny_config(small_records, image_size=size, epochs=1, **changes)
        with pytest.raises(_Stop):
            train(cfg, tmp_path / f"{size}-{len(changes)}", log=log)
        return lines

    assert [ln for ln in header(80) if "upscaled" in ln] == [
        "petal train: warning: the records are 64x64 and are upscaled to 80x80; for full "
        "detail convert at that size (petal convert SRC DST --image-size 80x80)"
    ]
    assert not [ln for ln in header(32) if "upscaled" in ln]
    # Crops larger than the image size are cut from images decoded at image_size, whatever
    # the records' size: the warning told the user to convert at the crops' size, which
    # changed nothing. The crops' own warning says what to do.
    crops = header(32, train_image_size=80, augment="flip+crop",
                   model_options={"any_size": True})
    assert not [ln for ln in crops if "upscaled" in ln]
    assert [ln for ln in crops if "80x80 crops, larger than the 32x32 images" in ln]


def test_a_run_whose_checkpoints_were_deleted_is_no_failed_start(tmp_path):
    """Its results (metrics.json of 3 completed epochs, history, report, plots) were deleted
    by a plain start once a report's files no longer marked a run."""
    run = tmp_path / "run"
    (run / "plots").mkdir(parents=True)
    (run / "config.json").write_text(PETAL_CONFIG)
    (run / "history.csv").write_text("epoch,loss\n1,1.0\n2,0.9\n3,0.8\n")
    (run / "metrics.json").write_text(json.dumps({"epochs_completed": 3}))
    (run / "report.html").write_text("<html></html>")
    with pytest.raises(PetalError, match="already holds a training run"):
        prepare_workdir(run, resume=False, overwrite=False)
    assert (run / "metrics.json").exists() and (run / "plots").is_dir()
    # The same files of a start that completed no epoch are replaced.
    (run / "metrics.json").write_text(json.dumps({"epochs_completed": 0}))
    prepare_workdir(run, resume=False, overwrite=False)
    assert not (run / "metrics.json").exists() and not (run / "plots").exists()


def test_a_non_finite_validation_loss_stops_the_run_before_its_checkpoint():
    """Weights that blew up in an epoch's last step gave a finite training loss (computed
    before the step) and a NaN validation loss: the epoch was saved and later called "the
    last good one"."""
    import keras

    from petal.training.callbacks import NanGuard

    guard = NanGuard()
    guard.set_model(keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)]))
    guard.on_epoch_begin(1)
    guard.on_epoch_end(1, {"loss": 0.5, "val_loss": float("nan")})
    assert (guard.nan_epoch, guard.nan_what, guard.model.stop_training) == (
        2, "validation loss", True
    )


def test_records_a_conversion_is_writing_are_refused_before_the_model_is_built(
    small_records, tmp_path, monkeypatch
):
    """Training while `petal convert --overwrite` replaced them failed when a shard vanished,
    or trained on the new split while its config.json recorded the old one."""
    records = tmp_path / "records"
    shutil.copytree(small_records, records)
    holder = {"pid": 1, "host": "elsewhere", "doing": "converting into it"}
    (records / RUNNING_FILE).write_text(json.dumps(holder))

    def built(*args, **kwargs):
        raise AssertionError("the model was built")

    monkeypatch.setattr("petal.models.create_model", built)
    with pytest.raises(PetalError) as caught:
        train(tiny_config(records, epochs=1, model="dense"), tmp_path / "run", **QUIET)
    assert str(caught.value) == (
        f"{records} is in use: process 1 on elsewhere is converting into it; wait for it to "
        f"end or stop it, or pass another --data (if it is not running, delete "
        f"{records / RUNNING_FILE})."
    )
    assert not (tmp_path / "run").exists()


def test_a_link_to_a_missing_folder_as_the_work_or_output_folder_names_it(tmp_path):
    """It said `[Errno 17] File exists` after building the model (train), or to pass a
    folder whose parents can be written (evaluate, export)."""
    from petal.evaluation.workdir import check_output_folder

    link = tmp_path / "link"
    link.symlink_to(tmp_path / "missing")
    said = f"{link} is a link to {tmp_path / 'missing'}, which does not exist"
    for folder in (link, link / "run"):
        with pytest.raises(PetalError) as caught:
            train(tiny_config(tmp_path / "records", epochs=1, model="dense"), folder, **QUIET)
        assert str(caught.value) == (
            f"Work directory {folder} cannot be created: {said}; create the folder it links "
            "to, or pass another --workdir."
        )
        with pytest.raises(PetalError) as caught:
            check_output_folder(folder, "export")
        assert str(caught.value) == (
            f"Cannot create export folder {folder}: {said}; create the folder it links to, or "
            "pass --out another folder."
        )
    assert not (tmp_path / "missing").exists()


def test_overwrite_is_refused_while_another_process_evaluates_or_exports_into_the_run(tmp_path):
    # --overwrite deletes eval/ and export/: it removed an evaluation's files as it wrote them.
    import socket
    import subprocess
    import sys

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(PETAL_CONFIG)
    (run / "model.keras").write_bytes(b"weights")
    (run / "eval").mkdir()
    (run / "eval" / "eval.json").write_text("{}")
    staging = run / "export" / ".export-abc123"
    staging.mkdir(parents=True)
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    holder = {"pid": live.pid, "host": socket.gethostname()}
    try:
        for folder, doing in ((run / "eval", "evaluating"), (staging, "exporting")):
            (folder / RUNNING_FILE).write_text(json.dumps({**holder, "doing": f"{doing} into it"}))
            with pytest.raises(PetalError) as caught:
                prepare_workdir(run, resume=False, overwrite=True)
            assert str(caught.value) == (
                f"{folder} is in use: process {live.pid} on {socket.gethostname()} is {doing} "
                f"into it; wait for it to end or stop it, or pass another --workdir (if it is "
                f"not running, delete {folder / RUNNING_FILE})."
            )
            assert (run / "eval" / "eval.json").exists() and (run / "model.keras").exists()
            (folder / RUNNING_FILE).unlink()
    finally:
        live.kill()
        live.wait()
    (run / "eval" / RUNNING_FILE).write_text(json.dumps(holder))  # its process has ended
    prepare_workdir(run, resume=False, overwrite=True)
    assert not (run / "eval").exists() and not (run / "model.keras").exists()


def test_a_run_marks_its_records_while_it_builds_its_model_and_unmarks_them_if_that_fails(
    small_records, tmp_path, monkeypatch
):
    # The marker was left only once the model was built: a conversion starting meanwhile
    # replaced the shards the run had opened.
    import petal.models

    records = tmp_path / "records"
    shutil.copytree(small_records, records)
    seen: list[list[str]] = []

    def failing_build(*args, **kwargs):
        seen.append(sorted(p.name for p in records.glob(f"{READING_PREFIX}*")))
        raise PetalError("no model today")

    monkeypatch.setattr(petal.models, "create_model", failing_build)
    with pytest.raises(PetalError, match="no model today"):
        train(tiny_config(records, epochs=1, model="dense"), tmp_path / "run", **QUIET)
    assert seen == [[f"{READING_PREFIX}{socket.gethostname()}-{os.getpid()}"]]
    assert not list(records.glob(f"{READING_PREFIX}*"))  # gone when the run failed


def test_a_refused_work_directory_names_the_library_arguments_too(tmp_path):
    # A notebook calling train() was told only the command's flags.
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(PETAL_CONFIG)
    (run / "last.keras").write_bytes(b"weights")
    with pytest.raises(PetalError) as caught:
        prepare_workdir(run, resume=False, overwrite=False)
    assert str(caught.value) == (
        f"{run} already holds a training run (config.json, last.keras); pass --resume "
        "(resume=True) to continue it or --overwrite (overwrite=True) to start again (deletes "
        "its checkpoints and results)."
    )
    with pytest.raises(PetalError, match=r"^Pass either --resume or --overwrite \(resume=True "
                       r"or overwrite=True\), not both\.$"):
        prepare_workdir(run, resume=True, overwrite=True)


def test_an_empty_training_split_asks_for_a_fraction_below_the_one_converted_with(
    make_records, tmp_path
):
    # It said "a smaller --val-fraction (default 0.19)" of records converted with 0.9.
    no_train = make_records("no-train-09", counts={"train": [], "validation": [5]})
    manifest = json.loads((no_train / "manifest.json").read_text())
    manifest["val_fraction"] = 0.9
    (no_train / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(PetalError, match=r"reconvert the images with a smaller --val-fraction "
                       r"than 0\.9 or add images"):
        train(tiny_config(no_train, steps_per_epoch=None), tmp_path / "run", **QUIET)


def test_overwrite_keeps_the_users_files_in_eval_and_export(tmp_path):
    """--overwrite removed eval/ and export/ whole, the user's notes there with them (README:
    it deletes only the files a run writes; export keeps other files in its folder)."""
    run = tmp_path / "run"
    (run / "export" / "saved_model" / "variables").mkdir(parents=True)
    (run / "eval").mkdir()
    (run / "config.json").write_text(PETAL_CONFIG)
    (run / "metrics.json").write_text("{}")
    # A plot a kill cut short stays under its temporary name (it stayed for good).
    petals = ["eval/eval.json", "eval/confusion_matrix.png", "eval/.pending-eval.json",
              "eval/.tmp-misclassified.png", "plots/.tmp-curves.png", "export/labels.txt",
              "export/saved_model/saved_model.pb", "export/saved_model/variables/variables.index",
              "export/.export-1234/x"]
    mine = ["eval/mynotes.txt", "export/NOTES.md", "export/model.tflite"]  # tflite: not listed
    for name in petals + mine:
        (run / name).parent.mkdir(parents=True, exist_ok=True)
        (run / name).write_text("x")
    (run / "export" / "export.json").write_text(json.dumps(
        {"written_by": "petal export", "run": str(run), "files": ["labels.txt", "saved_model"]}))
    prepare_workdir(run, resume=False, overwrite=True)
    assert sorted(p.relative_to(run).as_posix() for p in run.rglob("*") if p.is_file()) == sorted(
        mine)
    for name in mine:
        (run / name).unlink()
    (run / "config.json").write_text(PETAL_CONFIG)
    (run / "eval" / "eval.json").write_text("{}")
    prepare_workdir(run, resume=False, overwrite=True)  # folders holding nothing else go
    assert list(run.iterdir()) == []


def test_overwrite_removes_an_export_written_before_export_json(tmp_path):
    # An export without export.json (older petal) was left, the replaced model's; export
    # then refused its files as not its own.
    run = tmp_path / "run"
    (run / "export" / "saved_model").mkdir(parents=True)
    (run / "config.json").write_text(PETAL_CONFIG)
    (run / "metrics.json").write_text("{}")
    for name in ("labels.txt", "saved_model/saved_model.pb", "NOTES.md"):
        (run / "export" / name).write_text("x")
    prepare_workdir(run, resume=False, overwrite=True)
    assert [p.name for p in (run / "export").iterdir()] == ["NOTES.md"]


def test_a_workdir_holding_records_or_photos_is_refused(small_records, small_flowers,
                                                        tmp_path):
    """`petal train --workdir` into a records folder or a folder of photos wrote the run's
    files among them (a later convert of the photos read tensorboard/ as a class)."""
    records = tmp_path / "records"
    shutil.copytree(small_records, records)
    photos = tmp_path / "photos"
    shutil.copytree(small_flowers, photos, symlinks=True)
    daisy = photos / "daisy"
    first = sorted(os.listdir(daisy))[0]
    for workdir, holds in ((records, "records (manifest.json)"),
                           (daisy, f"photos ({first})"),
                           (photos, "class folders of photos (daisy/)")):  # fmt: skip
        with pytest.raises(PetalError) as caught:
            train(tiny_config(small_records), workdir, **QUIET)
        assert str(caught.value) == (
            f"Work directory {workdir} holds {holds}; pass a --workdir of its own (a new or "
            "empty folder) so that the run's files do not mix with the data."
        )
        assert not (workdir / "config.json").exists()
    # A run's own folder with an evaluation of PNGs beside it is no data.
    (tmp_path / "run" / "eval-copy").mkdir(parents=True)
    (tmp_path / "run" / "eval-copy" / "confusion_matrix.png").write_bytes(b"png")
    (tmp_path / "run" / "config.json").write_text(PETAL_CONFIG)
    from petal.training.loop import holds_data

    assert holds_data(tmp_path / "run") is None
    (tmp_path / "run" / "config.json").unlink()
    assert holds_data(tmp_path / "run") == "class folders of photos (eval-copy/)"


def test_a_rate_of_half_an_image_rounds_up_as_the_epoch_line_shows_it():
    # A QA report: epoch 2 printed 113 img/s (112.536), the closing line 112 (its stored
    # 112.5, rounded half to even).
    from petal.training.callbacks import per_second

    assert per_second(112.536) == "113"
    assert per_second(112.5) == "113"
    assert per_second(84.5) == "85"
    assert per_second(84.4) == "84"
    assert per_second(0.45) == "0.45"
    assert per_second(9.96) == "10"
    assert per_second(float("inf")) == "inf"
