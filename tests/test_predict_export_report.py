"""Bad input to predict, export and report: one line naming the file and the fix, nothing
written half-way, nothing dropped silently. Uses the tiny trained run of conftest."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from petal.errors import PetalError


def _copy_run(trained: Path, dst: Path) -> Path:
    # Without what the evaluation tests write into the shared run.
    shutil.copytree(
        trained, dst, ignore=shutil.ignore_patterns("export", "eval", "plots", "report.html")
    )
    return dst


@pytest.fixture(scope="module")
def exported(trained, tmp_path_factory) -> dict:
    """`export(trained)`'s result, exported once for the tests that only serve an export or
    need an earlier one (each export takes seconds). Read only: copy it to change it."""
    from petal.evaluation.export import export

    return export(trained, out=tmp_path_factory.mktemp("exported") / "export")


# --- predict ---------------------------------------------------------------------------------


def test_predict_on_a_folder_accounts_for_every_file(trained, small_flowers, tmp_path, capsys):
    """Images in linked folders are predicted, other files and unreadable images are named."""
    from petal.cli import main
    from petal.evaluation.predict import predict

    good = sorted(small_flowers.rglob("*.jpg"))[:2]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "linked.jpg").write_bytes(good[0].read_bytes())
    photos = tmp_path / "photos"
    photos.mkdir()
    (photos / "a.jpg").write_bytes(good[1].read_bytes())
    (photos / "more").symlink_to(elsewhere)  # a linked folder, as convert follows
    (photos / "empty.jpg").write_bytes(b"")
    (photos / "cut.jpg").write_bytes(good[1].read_bytes()[:500])
    (photos / "notes.txt").write_text("not an image")

    # Unreadable files: every one named in one line, nothing predicted, the fix given.
    assert main(["predict", str(trained), str(photos)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith(f"petal predict: warning: 1 file(s) under {photos} are not image")
    assert err[0].endswith(str(photos / "notes.txt"))
    assert len(err) == 2 and err[1].startswith("petal predict: error: 2 of 4 images cannot be read")
    assert "cut.jpg: " in err[1] and "empty.jpg: empty file" in err[1]
    assert err[1].endswith("pass --skip-corrupt to predict the others.")

    # Hidden folders and macOS metadata files are not read, and named.
    (photos / ".ipynb_checkpoints").mkdir()
    (photos / ".ipynb_checkpoints" / "a-checkpoint.jpg").write_bytes(good[1].read_bytes())
    (photos / "._a.jpg").write_bytes(b"Mac OS X        \x00\x05\x16\x07")
    (photos / ".DS_Store").write_bytes(b"\x00\x00\x00\x01Bud1")  # in every macOS folder

    # Skipped files are in the results, in input order, marked; one warning counts them.
    warnings: list[str] = []
    results = predict(trained, [photos], skip_corrupt=True, warn=warnings.append)
    assert [r["file"] for r in results] == [
        str(photos / name) for name in ("a.jpg", "cut.jpg", "empty.jpg", "more/linked.jpg")
    ]
    assert [len(r["predictions"]) for r in results] == [3, 0, 0, 3]
    assert results[2]["skipped"] == "empty file (0 bytes)" and "skipped" not in results[0]
    assert len(warnings) == 3
    assert warnings[0] == (
        f"2 hidden folder(s) or image file(s) under {photos} are not read (names starting "
        f"with '.', or __MACOSX): {photos}/._a.jpg, {photos}/.ipynb_checkpoints/; pass them "
        "by name to predict them"
    )
    assert warnings[1] == (
        f"1 file(s) under {photos} are not image files (by extension: .bmp, .gif, .jpeg, "
        f".jpg, .png, .webp) and are not predicted: {photos}/notes.txt"
    )
    assert warnings[2].startswith("skipped 2 of 4 images that cannot be read (each marked ")
    assert main(["predict", str(trained), str(photos), "--skip-corrupt", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r.get("skipped", "") for r in out][1:3] == [results[1]["skipped"], results[2]["skipped"]]
    assert main(["predict", str(trained), str(photos), "--skip-corrupt"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[2] == f"{photos / 'empty.jpg'}: skipped: empty file (0 bytes)"
    with pytest.raises(PetalError, match=r"None of the 2 images can be read: .*empty.jpg"):
        predict(trained, [photos / "empty.jpg", photos / "cut.jpg"], skip_corrupt=True)


def test_predict_skips_fifos_and_devices_named_like_images(trained, small_flowers, tmp_path):
    """A FIFO would block the read for ever and a link to /dev/zero would fill the memory:
    both are unreadable files, named with the reason, without being opened."""
    import os

    from petal.evaluation.predict import predict

    photos = tmp_path / "photos"
    photos.mkdir()
    good = sorted((small_flowers / "daisy").iterdir())[0]
    (photos / "a.jpg").write_bytes(good.read_bytes())
    os.mkfifo(photos / "pipe.jpg")
    (photos / "zero.jpg").symlink_to("/dev/zero")
    warnings: list[str] = []
    results = predict(trained, [photos], skip_corrupt=True, warn=warnings.append)
    assert [r.get("skipped") for r in results] == [None] + ["not a regular file"] * 2
    assert len(results[0]["predictions"]) == 3
    with pytest.raises(PetalError, match=r"Cannot read image .*pipe.jpg: not a regular file"):
        predict(trained, [photos / "pipe.jpg"])


def test_predict_works_a_batch_at_a_time(trained, small_flowers, tmp_path, monkeypatch):
    """Pixels of one batch at a time (a large folder fits in memory); after an unreadable
    file the model runs no more, and every unreadable file is still named."""
    import petal.evaluation.predict as predict_module

    calls: list[int] = []
    load = predict_module.load_model

    def counting(run):
        model = load(run)

        class Counting:
            def predict_on_batch(self, batch):
                calls.append(len(batch))
                return model.predict_on_batch(batch)

        return Counting()

    monkeypatch.setattr(predict_module, "load_model", counting)
    good = sorted(small_flowers.rglob("*.jpg"))[:5]
    results = predict_module.predict(trained, good, batch_size=2)
    assert calls == [2, 2, 1] and [r["file"] for r in results] == list(map(str, good))
    (tmp_path / "bad1.jpg").write_bytes(b"")
    (tmp_path / "bad2.jpg").write_bytes(b"nope")
    calls.clear()
    files = [good[0], good[1], tmp_path / "bad1.jpg", good[2], good[3], tmp_path / "bad2.jpg"]
    with pytest.raises(PetalError, match=r"^2 of 6 images cannot be read: .*bad1.jpg: .*bad2.jpg"):
        predict_module.predict(trained, files, batch_size=2)
    assert calls == [2]
    calls.clear()
    results = predict_module.predict(
        trained, files, batch_size=2, skip_corrupt=True, warn=lambda line: None
    )
    assert calls == [2, 1, 1] and [bool(r["predictions"]) for r in results] == [1, 1, 0, 1, 1, 0]
    with pytest.raises(PetalError, match=r"^Cannot read image .*bad2.jpg: "):
        predict_module.predict(trained, [tmp_path / "bad2.jpg"])
    # Many: the first ten named, and where to see every one. An image over the pixel limit
    # names predict's --max-pixels, which reads it.
    from PIL import Image

    Image.new("1", (10_000, 9_000)).save(tmp_path / "bad0-huge.png")
    many = [tmp_path / "bad0-huge.png"]
    for i in range(11):
        many.append(tmp_path / f"bad{i + 3:02d}.jpg")
        many[-1].write_bytes(b"nope")
    with pytest.raises(PetalError) as caught:
        predict_module.predict(trained, [good[0], *many])
    message = str(caught.value)
    assert message.startswith(
        "12 of 13 images cannot be read: "
        f"{tmp_path}/bad0-huge.png: too many pixels (HxW 9000x10000 = 90,000,000 > max_pixels "
        "89,478,485, a guard against decompression bombs): --max-pixels N reads larger images; "
    )
    assert "petal convert" not in message
    huge = predict_module.predict(trained, [tmp_path / "bad0-huge.png"], max_pixels=10**8)
    assert len(huge) == 1 and huge[0]["predictions"]
    with pytest.raises(PetalError, match=r"max_pixels \(--max-pixels\) must be an integer >= 1"):
        predict_module.predict(trained, [good[0]], max_pixels=0)
    assert "bad12.jpg" not in message
    assert f"{tmp_path}/bad11.jpg: not an image (no known image format in the file) (and 2 more: " \
        "--skip-corrupt marks each skipped); replace or remove them" in message


# --- a damaged work directory ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda r: r.pop("image_size"), r"resolved: no 'image_size'"),
        (lambda r: r.update(image_size="big"), r"resolved: image_size is not \[height, width\] "
         r"in pixels: \"big\""),
        (lambda r: r.pop("normalization"), r"resolved: no 'normalization'"),
        (lambda r: r.update(records_size=7), r"resolved: records_size is not \[height, width\] "
         r"in pixels: 7\)"),
    ],
)
def test_a_damaged_config_is_one_line(tmp_path, capsys, edit, message):
    from petal.cli import main

    run = tmp_path / "run"
    run.mkdir()
    resolved = {"classes": ["a", "b"], "image_size": [32, 32], "records_size": [64, 64],
                "resize": "fill", "normalization": "unit"}
    edit(resolved)
    (run / "config.json").write_text(json.dumps({"model": "squeezenet", "resolved": resolved}))
    (run / "model.keras").write_bytes(b"never read: the config fails first")
    for command in (["predict", str(run), str(tmp_path / "photo.jpg")], ["export", str(run)]):
        assert main(command) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1, err
        assert err[0].startswith(f"petal {command[0]}: error: {run / 'config.json'} is damaged (")
        assert re.search(message, err[0]) and err[0].endswith("retrain it.")
    assert not (run / "export").exists()


# --- report ----------------------------------------------------------------------------------


def test_report_names_a_cut_short_empty_or_missing_history(trained, tmp_path, capsys):
    from petal.cli import main

    run = _copy_run(trained, tmp_path / "run")
    history = run / "history.csv"
    text = history.read_text()
    cases = {
        "cut short": (text[: text.rindex(",")], r"history.csv is not petal's history "
                      r"\(ValueError: line 2 does not have one cell per column\)"),
        "empty": ("", r"history.csv is not petal's history \(ValueError: empty file\)"),
        # A header only: the metrics say an epoch finished, so rows were lost.
        "rows lost": (text.splitlines()[0] + "\n", r"history.csv holds 0 epoch\(s\) but "
                      r".*metrics.json says 1 were completed"),
    }
    for name, (content, message) in cases.items():
        history.write_text(content)
        assert main(["report", str(run)]) == 2, name
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("petal report: error: "), (name, err)
        assert re.search(message, err[0]) and "retrain it" in err[0], (name, err)
        assert not (run / "report.html").exists()
    history.unlink()
    assert main(["report", str(run)]) == 2
    err = capsys.readouterr().err.strip()
    # It said the run's folder held no run, to be trained first: petal train refused that.
    assert err == (f"petal report: error: {history} is missing: the run's epoch history is "
                   f"gone; the run is damaged: retrain it (`petal train --config "
                   f"{run / 'config.json'} --workdir {run} --overwrite`).")
    # '{}' made a report with an empty table (metrics.json) or none (config.json).
    history.write_text(text)
    metrics = (run / "metrics.json").read_text()
    (run / "metrics.json").write_text("{}")
    assert main(["report", str(run)]) == 2
    assert capsys.readouterr().err.strip().startswith(
        f"petal report: error: {run / 'metrics.json'} is not petal's metrics (no "
        "epochs_completed); the run is damaged: retrain it (`petal train --config ")
    (run / "metrics.json").write_text(metrics)
    (run / "config.json").write_text("{}")
    assert main(["report", str(run)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"petal report: error: {run / 'config.json'} has no resolved classes; it was not "
        "written by petal train: the run is damaged: retrain it with its preset and data "
        f"(`petal train --preset PRESET --data DATA --workdir {run} --overwrite`).")
    assert not (run / "report.html").exists()
    # A path that is no folder was "holds no training run (config.json ... missing)".
    for path, what in ((run / "gone", "does not exist; pass"),
                       (run / "config.json", "is a file, not")):
        assert main(["report", str(path)]) == 2
        assert capsys.readouterr().err.strip() == (
            f"petal report: error: Run folder {path} {what} a folder petal train wrote "
            "(its --workdir).")


# --- export ----------------------------------------------------------------------------------


@pytest.mark.slow  # 16-18 s in CI on a Zen 3 host (session 39: 775 s): `pytest -m slow` runs it
def test_export_replaces_an_earlier_export_whole_or_not_at_all(trained, tmp_path, monkeypatch):
    from petal.evaluation import export as export_module

    out = tmp_path / "out"
    (out / "saved_model").mkdir(parents=True)
    (out / "saved_model" / "stale.pb").write_bytes(b"an earlier export's file")
    (out / "model.tflite").write_bytes(b"an earlier model")
    (out / "mine.txt").write_text("not the export's")
    earlier = {"written_by": "petal export", "files": ["model.tflite", "saved_model"]}
    (out / "export.json").write_text(json.dumps(earlier))

    def broken(*args):
        raise PetalError("TFLite conversion failed")

    # A failure part-way leaves the folder as it was, with no temporary folder behind.
    monkeypatch.setattr(export_module, "_to_tflite", broken)
    with pytest.raises(PetalError, match="TFLite conversion failed"):
        export_module.export(trained, out=out, tflite=True)
    assert sorted(p.name for p in out.iterdir()) == [
        "export.json", "mine.txt", "model.tflite", "saved_model"
    ]
    assert [p.name for p in (out / "saved_model").iterdir()] == ["stale.pb"]
    assert json.loads((out / "export.json").read_text()) == earlier
    # Interrupted (Ctrl-C, SIGTERM) while writing into new folders: none is left behind.
    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(export_module, "_to_tflite", interrupted)
    with pytest.raises(KeyboardInterrupt):
        export_module.export(trained, out=tmp_path / "new" / "deeper" / "export", tflite=True)
    assert not (tmp_path / "new").exists()
    monkeypatch.undo()

    # A new export replaces the earlier one: nothing stale mixed in, the old TFLite named.
    got = export_module.export(trained, out=out)
    assert not (out / "saved_model" / "stale.pb").exists()
    assert (out / "saved_model" / "saved_model.pb").is_file()
    assert got["removed"] == [str(out / "model.tflite")] and not (out / "model.tflite").exists()
    assert sorted(p.name for p in out.iterdir()) == [
        "export.json", "labels.txt", "mine.txt", "saved_model"
    ]
    marker = json.loads((out / "export.json").read_text())
    assert marker["files"] == ["export.json", "labels.txt", "saved_model"]
    assert marker["run"] == str(trained.absolute())


def test_evaluate_and_export_refuse_an_out_that_holds_data(trained, small_flowers, tmp_path,
                                                            capsys):
    """--out an image folder or a records folder took the evaluation's PNGs and files (a
    later convert of the photos listed them) or the export, as train's --workdir is not."""
    from petal.cli import main

    photos = tmp_path / "photos"
    (photos / "daisy").mkdir(parents=True)
    first = sorted((small_flowers / "daisy").iterdir())[0]
    (photos / "daisy" / first.name).symlink_to(first.resolve())
    records = tmp_path / "records"
    records.mkdir()
    (records / "manifest.json").write_text("{}")
    for out, kind in ((photos, "class folders of photos (daisy/)"),
                      (records, "records (manifest.json)")):
        before = sorted(out.rglob("*"))
        for command, what in (("evaluate", "evaluation"), ("export", "export")):
            capsys.readouterr()
            assert main([command, str(trained), "--out", str(out)]) == 2
            assert capsys.readouterr().err == (
                f"petal {command}: error: --out {out} holds {kind}; pass --out a folder of its "
                f"own (a new or empty folder) so that the {what}'s files do not mix with the "
                "data.\n")
        assert sorted(out.rglob("*")) == before
    # A folder holding an evaluation's own PNGs is no image folder: evaluated into again,
    # exported into, and a folder of such evaluations (--out evals/a) is none either.
    from petal.evaluation.evaluate import WRITTEN
    from petal.evaluation.export import _check_out
    from petal.training.loop import holds_data

    again = tmp_path / "evals" / "a"
    assert main(["evaluate", str(trained), "--out", str(again)]) == 0
    assert (again / "confusion_matrix.png").is_file()
    assert main(["evaluate", str(trained), "--out", str(again)]) == 0
    _check_out(again, overwrite=False)
    assert holds_data(again.parent, WRITTEN) is None
    assert holds_data(again.parent) == "class folders of photos (a/)"
    # A data set's own config.json is no run's: its photos are still data.
    (photos / "config.json").write_text('{"name": "my flowers"}')
    assert holds_data(photos, WRITTEN) == "class folders of photos (daisy/)"


@pytest.mark.slow  # 8 s in CI on a Zen 3 host (session 39: 611 s): `pytest -m slow` runs it
def test_export_refuses_files_no_export_wrote_unless_overwrite(trained, tmp_path, capsys):
    """A folder of the user's own saved_model/ (with notes in it), labels.txt and
    model.tflite: replaced and deleted as "an earlier export" without a word."""
    from petal.cli import main
    from petal.evaluation.export import export

    out = tmp_path / "deploy"
    (out / "saved_model" / "variables").mkdir(parents=True)
    (out / "saved_model" / "saved_model.pb").write_text("mine")
    (out / "saved_model" / "NOTES.md").write_text("important")
    (out / "labels.txt").write_text("cat\ndog\n")
    (out / "model.tflite").write_text("x")
    (out / "mine.txt").write_text("kept")

    def files():
        return sorted(str(p.relative_to(out)) for p in out.rglob("*"))

    before = files()
    assert main(["export", str(trained), "--out", str(out)]) == 2
    said = (
        f"petal export: error: {out}/saved_model and {out}/labels.txt and {out}/model.tflite "
        f"were not written by petal export (not listed in {out}/export.json, which it writes; "
        "an older petal's export has none): pass --out another folder, or --overwrite to "
        "replace the export's files there (saved_model, labels.txt, model.tflite, "
        "export.json; other files stay).\n"
    )
    assert capsys.readouterr().err == said
    assert files() == before and (out / "labels.txt").read_text() == "cat\ndog\n"
    # A marker of something else (or none) is not an export's.
    (out / "export.json").write_text('{"files": ["saved_model"]}')
    with pytest.raises(PetalError, match=r"saved_model and .*/export.json were not written by"):
        export(trained, out=out)

    # Asked to: the export's names are replaced, a stale model.tflite removed, the rest kept.
    assert main(["export", str(trained), "--out", str(out), "--overwrite"]) == 0
    assert f"removed {out}/model.tflite, which would not match this export (pass --tflite" in (
        capsys.readouterr().out
    )
    assert files()[:4] == ["export.json", "labels.txt", "mine.txt", "saved_model"]
    assert not (out / "saved_model" / "NOTES.md").exists() and (out / "mine.txt").is_file()
    assert (out / "labels.txt").read_text().split() == json.loads(
        (trained / "config.json").read_text()
    )["resolved"]["classes"]


def test_export_refuses_another_runs_export_unless_overwrite(trained, tmp_path, capsys):
    """--out RUN_B/export replaced run B's export with this run's without a word (its
    export.json, which names run B, made every file there an earlier export's)."""
    from petal.cli import main
    from petal.evaluation.export import _check_out
    from petal.evaluation.workdir import open_run

    other = _copy_run(trained, tmp_path / "run b")
    out = other / "export"
    out.mkdir()
    marker = {"written_by": "petal export", "run": str(other), "files": ["labels.txt"]}
    (out / "export.json").write_text(json.dumps(marker))
    (out / "labels.txt").write_text("run b's\n")
    assert main(["export", str(trained), "--out", str(out)]) == 2
    assert capsys.readouterr().err == (
        f"petal export: error: --out {out} holds the export of another run, {other} (as its "
        "export.json says): pass --out another folder, or --overwrite to replace that export "
        "with this run's (saved_model, labels.txt, model.tflite, export.json; other files "
        "stay).\n"
    )
    assert sorted(p.name for p in out.iterdir()) == ["export.json", "labels.txt"]
    assert (out / "labels.txt").read_text() == "run b's\n"
    # Asked to replace it; run B exported into its own folder again; a copy of run B, whose
    # export names run B, into its own folder: none refused.
    _check_out(out, overwrite=True, run=open_run(trained))
    _check_out(out, overwrite=False, run=open_run(other))
    copy = shutil.copytree(other, tmp_path / "copy of b")
    _check_out(copy / "export", overwrite=False, run=open_run(copy))


@pytest.mark.parametrize("overwrite", [False, True])
def test_export_refuses_a_link_where_it_writes_before_the_work(
    trained, tmp_path, monkeypatch, overwrite
):
    """OUT/saved_model a link to a folder: "Cannot call rmtree on a symbolic link" after
    the whole export, naming neither the path nor the fix."""
    import keras

    from petal.evaluation.export import export

    def no_work(*args, **kwargs):
        raise AssertionError("the export was built before the check")

    monkeypatch.setattr(keras.export, "ExportArchive", no_work)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("kept")
    out = tmp_path / "out"
    out.mkdir()
    (out / "saved_model").symlink_to(elsewhere)
    with pytest.raises(PetalError, match=(
        rf"^{re.escape(str(out / 'saved_model'))} is a link, where the export writes its "
        r"saved_model; move it away or pass --out another folder.$"
    )):
        export(trained, out=out, **({"overwrite": True} if overwrite else {}))
    assert (out / "saved_model").is_symlink() and (elsewhere / "keep.txt").is_file()


def test_export_refuses_what_is_in_the_way_and_writes_nothing_for_a_damaged_model(
    trained, tmp_path
):
    from petal.evaluation.export import export

    out = tmp_path / "out"
    out.mkdir()
    (out / "saved_model").write_text("someone's file")
    with pytest.raises(PetalError, match=r"out/saved_model is a file, where the export writes "
                       r"its saved_model; move it away or pass --out another folder"):
        export(trained, out=out)
    assert (out / "saved_model").read_text() == "someone's file"
    assert [p.name for p in out.iterdir()] == ["saved_model"]

    run = _copy_run(trained, tmp_path / "run")
    (run / "model.keras").write_bytes((run / "model.keras").read_bytes()[:3000])
    with pytest.raises(PetalError, match=r"model.keras \(not a .keras zip archive"):
        export(run, out=tmp_path / "new" / "export")
    assert not (tmp_path / "new").exists()


_SERVE_SCRIPT = """
import json, sys
from pathlib import Path
import tensorflow as tf

model = tf.saved_model.load({saved_model!r})
results = {{}}
for path in sorted(Path({inputs!r}).iterdir()):
    print(path.name, file=sys.stderr, flush=True)  # the last name is the one that crashed
    try:
        got = model.serve(tf.constant([path.read_bytes()]))
        results[path.name] = "served: " + got["label"].numpy()[0].decode()
    except tf.errors.InvalidArgumentError as err:
        results[path.name] = err.message
print(json.dumps(results))
"""


@pytest.mark.slow  # 8-9 s in CI on a Zen 3 host (session 39: 775 s): `pytest -m slow` runs it
def test_the_savedmodel_refuses_animated_webp_and_empty_input(exported, tmp_path):
    """TensorFlow 2.21's WebP decoder corrupts the heap on an animated WebP: the serving
    process died (exit 134 or 139) where predict takes the first frame. The SavedModel now
    refuses one, saying so, before decoding it; an input too short to be an image was
    refused with "pos 8 out of range". Served in a process of its own: a crash fails this
    test, not the test run."""
    import numpy as np
    from PIL import Image

    from conftest import run_script

    out = exported
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    rng = np.random.default_rng(0)
    frames = [Image.fromarray(rng.integers(0, 256, (20, 30, 4), dtype=np.uint8), "RGBA")
              for _ in range(2)]
    rgb = [frame.convert("RGB") for frame in frames]
    rgb[0].save(inputs / "still.webp", "WEBP")
    rgb[0].save(inputs / "animated-lossy.webp", "WEBP", save_all=True, append_images=rgb[1:])
    rgb[0].save(inputs / "animated-lossless.webp", "WEBP", save_all=True,
                append_images=rgb[1:], lossless=True)
    frames[0].save(inputs / "animated-alpha.webp", "WEBP", save_all=True,
                   append_images=frames[1:])
    # Its animation flag cleared: found by its ANIM chunk.
    data = bytearray((inputs / "animated-lossy.webp").read_bytes())
    assert data[12:16] == b"VP8X" and data[20] & 0x02 and b"ANIM" in data
    data[20] &= ~0x02
    (inputs / "animated-unflagged.webp").write_bytes(bytes(data))
    (inputs / "empty.jpg").write_bytes(b"")
    (inputs / "short.gif").write_bytes(b"GIF89")

    script = tmp_path / "serve.py"
    script.write_text(_SERVE_SCRIPT.format(saved_model=out["saved_model"], inputs=str(inputs)))
    proc = run_script(script)
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert results.pop("still.webp").startswith("served: ")
    refused = ("animated WebP is not supported by the SavedModel; send a still image (its "
               "first frame)")
    for name in ("animated-lossy", "animated-lossless", "animated-alpha", "animated-unflagged"):
        assert refused in results.pop(f"{name}.webp"), name
    too_short = ("the image is empty or too short to be one ({} bytes); send the bytes of an "
                 "image file")
    assert too_short.format(0) in results.pop("empty.jpg")
    assert too_short.format(5) in results.pop("short.gif")
    assert not results


@pytest.mark.parametrize(
    ("edit", "reason"),
    [
        ({"confusion_matrix": "x"}, r"a confusion matrix of 1 rows for 2 classes"),
        ({"classes": ["a"]}, r"a confusion matrix of 2 rows for 1 classes"),
        ({"macro": {}}, r"no 'f1'"),
        ({"per_class": {"a": {}}}, r"no 'precision'"),
        ({"accuracy": "high"}, r"accuracy 'high' is not a number"),
        ({"confusion_matrix": [[1, "1"], [1, 1]]}, r"a confusion matrix that holds other "
                                                   r"values than counts"),
    ],
)
def test_report_names_an_eval_json_with_values_of_the_wrong_kind(trained, tmp_path, edit, reason):
    from petal.evaluation.report import build_report

    run = _copy_run(trained, tmp_path / "run")
    (run / "eval").mkdir()
    good = {
        "count": 4, "accuracy": 0.5, "classes": ["a", "b"], "confusion_matrix": [[1, 1], [1, 1]],
        "per_class": {c: {"precision": 0.5, "recall": 0.5, "f1": 0.5, "support": 2}
                      for c in "ab"},
        "macro": {"precision": 0.5, "recall": 0.5, "f1": 0.5},
    }
    (run / "eval" / "eval.json").write_text(json.dumps({**good, **edit}))
    with pytest.raises(PetalError, match=rf"eval.json is damaged \({reason}.*\); run `petal "
                       r"evaluate .*` again."):
        build_report(run)
    assert not (run / "report.html").exists()


@pytest.mark.slow  # 43 s in a loaded suite run (session 40): `pytest -m slow` runs it
def test_report_says_when_the_evaluation_scored_an_earlier_model(trained, tmp_path, capsys):
    """After a resume, eval/ still holds the scores of the model before it."""
    import os

    from petal.evaluation.evaluate import evaluate
    from petal.evaluation.report import build_report

    run = _copy_run(trained, tmp_path / "run")
    evaluate(run, json.loads((run / "config.json").read_text())["data"], log=lambda line: None)
    build_report(run)
    assert "scored an earlier model" not in (run / "report.html").read_text()
    eval_time = (run / "eval" / "eval.json").stat().st_mtime
    os.utime(run / "model.keras", (eval_time + 60, eval_time + 60))  # saved again since,
    build_report(run)  # but the same model (eval.json holds its hash): nothing to say
    assert "scored an earlier model" not in (run / "report.html").read_text()
    with open(run / "model.keras", "ab") as f:  # trained further (report loads no model)
        f.write(b"\0")
    capsys.readouterr()
    build_report(run)
    said = (f"{run / 'eval' / 'eval.json'} scored an earlier model: {run / 'model.keras'} was "
            f"saved after it (the run was trained further); run `petal evaluate {run}` again.")
    assert f"petal report: warning: {said}" in capsys.readouterr().err
    assert "scored an earlier model" in (run / "report.html").read_text()


def test_report_says_when_a_resume_did_not_finish(trained, tmp_path, capsys):
    """Resumed for more epochs and interrupted: the curves showed the new epochs, the table
    the old metrics.json as if current."""
    from petal.evaluation.report import build_report

    run = _copy_run(trained, tmp_path / "run")
    done = json.loads((run / "metrics.json").read_text())["epochs_completed"]
    history = run / "history.csv"
    last = history.read_text().strip().splitlines()[-1].split(",")
    last[0] = str(done + 1)  # one more epoch, trained by the resume
    history.write_text(history.read_text() + ",".join(last) + "\n")
    state = json.loads((run / "state.json").read_text())
    (run / "state.json").write_text(json.dumps({**state, "epoch": done + 1}))
    capsys.readouterr()
    build_report(run)
    said = (f"{run / 'metrics.json'} describes the run after epoch {done}; it was resumed and "
            f"trained 1 more epoch(s) without finishing (history.csv and the curves hold "
            f"them): finish it with `petal train --resume --workdir {run}`.")
    assert f"petal report: warning: {said}" in capsys.readouterr().err
    assert "<b>Not finished:</b>" in (run / "report.html").read_text()


def test_report_leaves_out_an_epoch_the_run_did_not_save(trained, tmp_path, capsys,
                                                          monkeypatch):
    """history.csv gets an epoch's row before its checkpoint: interrupted in between, the
    report plotted an epoch that --resume trains again."""
    from petal.evaluation import plots
    from petal.evaluation.report import build_report

    drawn = []
    real = plots.plot_history
    monkeypatch.setattr(plots, "plot_history",
                        lambda rows, out: drawn.append([r["epoch"] for r in rows]) or real(rows, out))
    run = _copy_run(trained, tmp_path / "run")
    done = json.loads((run / "state.json").read_text())["epoch"]
    history = run / "history.csv"
    last = history.read_text().strip().splitlines()[-1].split(",")
    last[0] = str(done + 1)
    history.write_text(history.read_text() + ",".join(last) + "\n")
    said = (f"{history} holds epoch {done + 1}, which the run did not save (it stopped before "
            "the checkpoint): left out of this report; `petal train --resume{more} --workdir "
            f"{run}` trains it again.")
    # A finished run extended and stopped: --resume alone had nothing to do. A run stopped
    # before its end: --resume goes on to its epochs.
    for finished, more in ((True, f" --epochs {done + 1}"), (False, "")):
        if not finished:
            (run / "metrics.json").unlink()
        capsys.readouterr()
        build_report(run)
        assert drawn.pop() == list(range(1, done + 1))
        assert capsys.readouterr().err == f"petal report: warning: {said.format(more=more)}\n"
        page = (run / "report.html").read_text()
        assert "<b>Not saved:</b>" in page and "Not finished" not in page
    # A start interrupted in its first epoch saved none.
    (run / "state.json").unlink()
    build_report(run)
    assert not drawn and "No epoch has finished yet" in (run / "report.html").read_text()


def test_a_run_still_training_elsewhere_is_not_told_to_resume(trained, tmp_path, capsys):
    """`petal evaluate` said to resume it, which is refused while the run trains."""
    import socket
    import subprocess
    import sys

    from petal.cli import main
    from petal.running import RUNNING_FILE

    run = _copy_run(trained, tmp_path / "run")
    (run / "model.keras").unlink()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (run / RUNNING_FILE).write_text(json.dumps(
            {"pid": live.pid, "host": socket.gethostname(), "doing": "training in it"}))
        assert main(["evaluate", str(run)]) == 2
        assert capsys.readouterr().err == (
            f"petal evaluate: error: {run} has no model.keras yet: the run is still training "
            f"(process {live.pid} on {socket.gethostname()} is training in it); run this again "
            "when it finishes.\n")
    finally:
        live.kill()
        live.wait()
    assert main(["evaluate", str(run)]) == 2  # the process has ended: resume it
    assert "the run has not finished. Resume it with" in capsys.readouterr().err


def test_a_model_file_that_is_a_folder_is_named_as_such(trained, tmp_path):
    from petal.evaluation.workdir import open_run

    run = _copy_run(trained, tmp_path / "run")
    (run / "model.keras").unlink()
    (run / "model.keras").mkdir()
    with pytest.raises(PetalError, match=r"model.keras is a folder, not the model file"):
        open_run(run)


@pytest.mark.parametrize(("name", "make"), [("plots", "file"), ("report.html", "folder")])
def test_report_names_a_file_or_folder_in_its_way_before_drawing(trained, tmp_path, name, make):
    from petal.evaluation.report import build_report

    run = _copy_run(trained, tmp_path / "run")
    (run / "report.html").unlink(missing_ok=True)
    if make == "file":
        (run / name).write_text("mine")
    else:
        (run / name).mkdir()
    with pytest.raises(PetalError, match=rf"{name} is a {make}, where the report writes its "):
        build_report(run)
    assert not (run / "plots").is_dir()  # nothing drawn


_DOLLARS = ["price_$1_to_$5", "save$ 50% off $", "$5-$10 bills"]


def _write_eval(run: Path, classes=("a", "b"), **changes) -> Path:
    """A small eval/eval.json (and misclassified.npz) of ``classes`` in a copied run."""
    import numpy as np

    (run / "eval").mkdir(exist_ok=True)
    n = len(classes)
    evaluation = {
        "count": 2 * n, "accuracy": 0.5, "classes": list(classes),
        "confusion_matrix": [[1 if i == j else (1 if j == (i + 1) % n else 0)
                              for j in range(n)] for i in range(n)],
        "per_class": {c: {"precision": 0.5, "recall": 0.5, "f1": 0.5, "support": 2}
                      for c in classes},
        "macro": {"precision": 0.5, "recall": 0.5, "f1": 0.5},
        "data": "/elsewhere/records", "split": "validation", "workdir": str(run),
        **changes,
    }
    (run / "eval" / "eval.json").write_text(json.dumps(evaluation))
    np.savez_compressed(
        run / "eval" / "misclassified.npz", images=np.zeros((2, 8, 8, 3), np.uint8),
        true=np.array([0, 1]), pred=np.array([1, 0]), prob=np.array([0.6, 0.7]),
        classes=np.asarray(list(classes)),
    )
    return run / "eval" / "eval.json"


def test_class_names_with_dollars_are_drawn_as_written(trained, tmp_path, capsys):
    """matplotlib read text between two "$" as mathematics: `price_$1_to_$5` crashed
    evaluate's plots (and report called eval.json damaged), `$5-$10 bills` drew "5 - 10"."""
    from matplotlib import cbook

    from petal.display import plot_labels
    from petal.evaluation import plots
    from petal.evaluation.report import build_report

    assert not any(cbook.is_math_text(label) for label in plot_labels(_DOLLARS))
    plots.plot_confusion_matrix([[1, 0, 0], [0, 1, 0], [0, 0, 1]], _DOLLARS, tmp_path / "cm.png")
    run = _copy_run(trained, tmp_path / "run")
    _write_eval(run, classes=_DOLLARS)
    capsys.readouterr()
    page = build_report(run).read_text()
    assert capsys.readouterr().err == ""
    assert (run / "plots" / "confusion_matrix.png").is_file()
    assert (run / "plots" / "misclassified.png").is_file()
    assert "price_$1_to_$5" in page


def test_a_class_name_holding_a_control_character_is_drawn_escaped(capsys):
    # A newline in a class name: plots drew "class 0" and told the user to install CJK fonts.
    from petal.display import plot_labels

    assert plot_labels(["new\nline", "tab\there", "ok"]) == ["new\\nline", "tab\\there", "ok"]
    assert capsys.readouterr().err == ""


def test_report_does_not_call_eval_json_damaged_for_a_plot_it_cannot_draw(
    trained, tmp_path, capsys, monkeypatch
):
    """A drawing error was reported as "eval.json is damaged (...)"; the page is written
    without that plot, which is named."""
    from petal.evaluation import plots
    from petal.evaluation.report import build_report

    def fails(*args, **kwargs):
        raise ValueError("matplotlib could not lay it out")

    monkeypatch.setattr(plots, "plot_confusion_matrix", fails)
    run = _copy_run(trained, tmp_path / "run")
    _write_eval(run)
    capsys.readouterr()
    page = build_report(run).read_text()
    assert capsys.readouterr().err == (
        f"petal report: warning: cannot draw {run / 'plots' / 'confusion_matrix.png'} "
        "(matplotlib could not lay it out); the report leaves it out.\n"
    )
    assert "Confusion matrix" not in page and "<h3>Misclassified" in page


def test_report_on_a_run_still_training_does_not_say_to_resume(trained, tmp_path, capsys):
    """A live `petal train` in the folder: report told to finish it with --resume (refused
    while it trains), for a resumed run and for a first run alike."""
    import socket
    import subprocess
    import sys

    from petal.evaluation.report import build_report
    from petal.running import RUNNING_FILE

    run = _copy_run(trained, tmp_path / "run")
    done = json.loads((run / "metrics.json").read_text())["epochs_completed"]
    history = run / "history.csv"
    last = history.read_text().strip().splitlines()[-1].split(",")
    for epoch in (done + 1, done + 2):  # the resume saved one epoch and is in the next
        last[0] = str(epoch)
        history.write_text(history.read_text() + ",".join(last) + "\n")
    state = json.loads((run / "state.json").read_text())
    (run / "state.json").write_text(json.dumps({**state, "epoch": done + 1}))
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    who = f"process {live.pid} on {socket.gethostname()} is training in it"
    try:
        (run / RUNNING_FILE).write_text(json.dumps(
            {"pid": live.pid, "host": socket.gethostname(), "doing": "training in it"}))
        capsys.readouterr()
        build_report(run)
        said = (f"{run} is still training ({who}): {run / 'metrics.json'} and model.keras are "
                f"of its last finish (epoch {done}), the curves show the {done + 1} epoch(s) "
                f"it has saved so far; run `petal report {run}` again when it finishes.")
        assert capsys.readouterr().err == f"petal report: warning: {said}\n"
        page = (run / "report.html").read_text()
        assert "<b>Still training:</b>" in page and "--resume" not in page
        (run / "metrics.json").unlink()  # a first run, in its epoch done + 2
        build_report(run)
        said = (f"{run} is still training ({who}): the curves show the {done + 1} epoch(s) it "
                f"has saved so far; run `petal report {run}` again when it finishes.")
        assert capsys.readouterr().err == f"petal report: warning: {said}\n"
        assert "--resume" not in (run / "report.html").read_text()
    finally:
        live.kill()
        live.wait()


def test_report_names_the_split_scored_and_what_it_skipped(trained, tmp_path):
    """The heading said "Evaluation on REC" for the train split too, and the records
    evaluate --skip-corrupt dropped were nowhere."""
    from petal.evaluation.report import build_report

    run = _copy_run(trained, tmp_path / "run")
    own = json.loads((run / "config.json").read_text())["data"]
    for data, split, shown in (
        (own, "train", f"<code>{own}</code> (train split: images the model trained on)"),
        (own, "all", f"<code>{own}</code> (all images: the model trained on some of them)"),
        (own, "validation", f"<code>{own}</code> (validation split)"),
        ("/elsewhere/new", "all", "<code>/elsewhere/new</code> (all images)"),
    ):
        _write_eval(run, data=data, split=split, skipped_corrupt_records=11,
                    skipped_undecodable_records=["r-0: not an image", "r-1: not an image"])
        page = build_report(run).read_text()
        assert f"<h2>Evaluation on {shown}</h2>" in page
        assert ("<tr><th>images</th><td class='num'>4</td></tr>"
                "<tr><th>skipped: corrupt records</th><td class='num'>11</td></tr>"
                "<tr><th>skipped: undecodable records</th><td class='num'>2</td></tr>") in page


def test_report_tells_a_copied_run_from_one_trained_since_its_evaluation(trained, tmp_path,
                                                                         capsys):
    """`cp -r RUN COPY` gives the copy new times, model.keras's possibly after eval.json's:
    report said eval.json scored an earlier model."""
    import os

    from petal.evaluation.report import build_report

    run = _copy_run(trained, tmp_path / "run")
    eval_json = _write_eval(run, workdir=str(trained))  # evaluated, then copied
    later = eval_json.stat().st_mtime + 60
    os.utime(run / "model.keras", (later, later))
    capsys.readouterr()
    assert "scored an earlier model" not in build_report(run).read_text()
    assert capsys.readouterr().err == ""
    # Where eval.json names its model by content: a copy matches, another model does not.
    from petal.evaluation.workdir import file_sha256

    for digest, stale in ((file_sha256(run / "model.keras"), False), ("0" * 64, True)):
        _write_eval(run, model_sha256=digest)
        os.utime(run / "model.keras", (later, later))
        assert ("scored an earlier model" in build_report(run).read_text()) == stale


def test_report_titles_its_misclassified_grid_and_writes_names_as_they_are(
    trained, tmp_path, monkeypatch
):
    """The grid had no title (evaluate's own says "Misclassified (N of M)"), and the
    configuration table showed "ros\\u00e9" for "rosé"."""
    from petal.evaluation import plots
    from petal.evaluation.report import build_report

    titles = []
    real = plots.plot_image_grid
    monkeypatch.setattr(plots, "plot_image_grid",
                        lambda data, out, title="": titles.append(title) or real(data, out, title))
    run = _copy_run(trained, tmp_path / "run")
    config = json.loads((run / "config.json").read_text())
    config["resolved"]["classes"][0] = "rosé"
    (run / "config.json").write_text(json.dumps(config))
    _write_eval(run)
    page = build_report(run).read_text()
    assert "rosé" in page and "\\u00e9" not in page
    assert titles == ["Misclassified (2 of 4)"]
    assert "<h3>Misclassified (2 of 4)</h3>" in page


def test_predictions_of_a_file_with_a_newline_in_its_name_stay_on_one_line():
    from petal.evaluation.predict import format_predictions

    results = [
        {"file": "new\nphoto.jpg", "predictions": [{"label": "roses", "probability": 0.9}]},
        {"file": "tab\there.jpg", "predictions": [], "skipped": "empty file (0 bytes)"},
    ]
    assert format_predictions(results).splitlines() == [
        "new\\nphoto.jpg: roses 0.900",
        "tab\\there.jpg: skipped: empty file (0 bytes)",
    ]


def _resumed_unfinished(trained: Path, run: Path, more: int) -> tuple[Path, int]:
    """A copy of the run, resumed for more epochs and stopped after ``more`` of them: its
    state.json is ahead of metrics.json and model.keras. Returns it and the epochs done."""
    _copy_run(trained, run)
    done = json.loads((run / "metrics.json").read_text())["epochs_completed"]
    config = json.loads((run / "config.json").read_text())
    (run / "config.json").write_text(json.dumps({**config, "epochs": 30}))
    state = json.loads((run / "state.json").read_text())
    (run / "state.json").write_text(json.dumps({**state, "epoch": done + more}))
    return run, done


def test_predict_evaluate_and_export_say_the_model_is_not_the_latest(
    trained, small_flowers, small_records, tmp_path, capsys
):
    """An unfinished resume, or a training still running in the folder: the model used is
    the one of the run's last finish, as report says; used all the same."""
    import socket
    import subprocess
    import sys

    from petal.cli import main
    from petal.evaluation.evaluate import evaluate
    from petal.evaluation.export import export
    from petal.evaluation.predict import predict
    from petal.running import RUNNING_FILE

    run, done = _resumed_unfinished(trained, tmp_path / "run", 9)
    photo = sorted((small_flowers / "roses").iterdir())[0]
    said = (
        f"{run / 'metrics.json'} describes the run after epoch {done}; it was resumed and "
        f"trained 9 more epoch(s) without finishing (model.keras is the model of epoch {done}, "
        f"its last finish): finish it with `petal train --resume --workdir {run}`."
    )
    warnings: list[str] = []
    [result] = predict(run, [photo], warn=warnings.append)
    assert warnings == [said] and len(result["predictions"]) == 3
    assert main(["predict", str(run), str(photo)]) == 0
    assert capsys.readouterr().err == f"petal predict: warning: {said}\n"
    warnings.clear()
    report = evaluate(run, small_records, warn=warnings.append, log=lambda line: None,
                      out_dir=tmp_path / "eval")
    assert warnings[0] == said and report["warnings"][0] == said
    in_the_way = tmp_path / "a-file"
    in_the_way.write_text("")
    with pytest.raises(PetalError, match="is a file"):  # warned first, then refused
        export(run, out=in_the_way)
    assert capsys.readouterr().err == f"petal export: warning: {said}\n"

    # A training running in the folder (a resume: its model.keras is of its last finish).
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (run / RUNNING_FILE).write_text(json.dumps(
            {"pid": live.pid, "host": socket.gethostname(), "doing": "training in it"}))
        warnings.clear()
        predict(run, [photo], warn=warnings.append)
        assert warnings == [
            f"{run} is still training (process {live.pid} on {socket.gethostname()} is "
            f"training in it): {run / 'model.keras'} is the model of epoch {done}, its last "
            "finish, not of the epochs training now; run this again when it finishes to use "
            "the new one."
        ]
    finally:
        live.kill()
        live.wait()
    # Finished (or as trained): nothing to say.
    warnings.clear()
    predict(trained, [photo], warn=warnings.append)
    assert warnings == []


def test_a_folder_of_no_images_names_what_it_holds_and_how_to_pass_it(tmp_path):
    """Only hidden images and other types: the error said "holds no image files" without
    the note that carries the fix (pass them by name)."""
    from petal.evaluation.predict import expand_images

    photos = tmp_path / "photos"
    (photos / ".ipynb_checkpoints").mkdir(parents=True)
    (photos / ".ipynb_checkpoints" / "a.jpg").write_bytes(b"x")
    (photos / "._b.jpg").write_bytes(b"x")
    (photos / "c.tiff").write_bytes(b"x")
    (photos / "d.jpe").write_bytes(b"x")
    warnings: list[str] = []
    with pytest.raises(PetalError) as err:
        expand_images([photos], warn=warnings.append)
    assert str(err.value) == (
        f"Folder {photos} holds no image files (.bmp, .gif, .jpeg, .jpg, .png, .webp); "
        f"2 hidden folder(s) or image file(s) under {photos} are not read (names starting "
        f"with '.', or __MACOSX): {photos}/._b.jpg, {photos}/.ipynb_checkpoints/; pass them "
        f"by name to predict them; 2 file(s) under {photos} are not image files (by "
        f"extension: .bmp, .gif, .jpeg, .jpg, .png, .webp) and are not predicted: "
        f"{photos}/c.tiff, {photos}/d.jpe; pass them by name to predict them; pass image "
        "files or a folder of them."
    )
    assert warnings == []


def test_predict_names_a_folder_link_back_to_its_own_path_as_such(tmp_path):
    """`ln -s .. DIR/nested/loop` was one of the files "not image files (by extension)"."""
    from petal.evaluation.predict import expand_images

    photos = tmp_path / "photos"
    (photos / "nested").mkdir(parents=True)
    (photos / "a.jpg").write_bytes(b"x")
    (photos / "nested" / "loop").symlink_to("..")
    warnings: list[str] = []
    assert expand_images([photos], warn=warnings.append) == [photos / "a.jpg"]
    assert warnings == [
        f"1 folder link(s) under {photos} lead back to a folder that holds them and are not "
        f"followed: {photos}/nested/loop/ (images in {photos} are predicted once, where they "
        "lie; none above it)"
    ]
    (photos / "a.jpg").unlink()
    with pytest.raises(PetalError, match=re.escape(
        f"holds no image files (.bmp, .gif, .jpeg, .jpg, .png, .webp); 1 folder link(s) under "
        f"{photos} lead back to a folder that holds them and are not followed: "
        f"{photos}/nested/loop/; pass image files"
    )):
        expand_images([photos], warn=warnings.append)


def test_predict_writes_a_name_that_is_not_utf8_as_convert_does(
    trained, small_flowers, tmp_path, capsys
):
    """--json wrote the name's lone surrogate ("bad\\udcffn.jpg"), which no UTF-8 text holds;
    the file is predicted, its name written with \\xff as in convert's manifest."""
    import os

    from petal.cli import main

    photos = tmp_path / "photos"
    photos.mkdir()
    photo = sorted((small_flowers / "roses").iterdir())[0]
    with open(os.path.join(os.fsencode(photos), b"bad\xffn.jpg"), "wb") as f:
        f.write(photo.read_bytes())
    assert main(["predict", str(trained), str(photos), "--json"]) == 0
    captured = capsys.readouterr()
    assert "\\udcff" not in captured.out
    [result] = json.loads(captured.out)
    assert result["file"] == f"{photos}/bad\\xffn.jpg" and len(result["predictions"]) == 3
    assert captured.err == (
        "petal predict: warning: 1 file name(s) are not valid UTF-8: the results write each "
        f"byte that is not as \\xNN: {photos}/bad\\xffn.jpg\n"
    )
    assert main(["predict", str(trained), str(photos)]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith(f"{photos}/bad\\xffn.jpg: ")
    assert "not valid UTF-8" in captured.err


def test_the_readme_serves_the_export_with_tensorflow_alone(
    trained, exported, small_flowers, tmp_path
):
    """README's snippet, run as written (in a process without petal) on an export: the
    signature names, input key and outputs it gives are the SavedModel's."""
    from conftest import run_script

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    [snippet] = [block for block in re.findall(r"```python\n(.*?)```", readme, re.S)
                 if "tf.saved_model.load(" in block]
    # export(trained):
    shutil.copytree(Path(exported["saved_model"]).parent, tmp_path / "runs" / "quick" / "export")
    shutil.copy(sorted((small_flowers / "roses").iterdir())[0], tmp_path / "photo.jpg")
    h, w = json.loads((trained / "config.json").read_text())["resolved"]["image_size"]
    checks = f"""
import os, sys
assert not any(name.startswith("petal") for name in sys.modules)
other = model.signatures["serving_default"](image_bytes=images)
assert sorted(other) == sorted(out) == ["label", "probabilities", "score"], (other, out)
assert other["label"].numpy().tolist() == out["label"].numpy().tolist()
pixels = model.serve_pixels(tf.zeros([2, {h}, {w}, 3]))
assert list(pixels) == ["probabilities"] and pixels["probabilities"].shape == (2, 5)
assert probabilities.shape == (1, 5)
"""
    script = tmp_path / "serve.py"
    script.write_text(f"import os\nos.chdir({str(tmp_path)!r})\n{snippet}{checks}")
    done = run_script(script)
    assert done.returncode == 0, done.stderr[-2000:]
    label, score = done.stdout.split()
    classes = (tmp_path / "runs" / "quick" / "export" / "labels.txt").read_text().split()
    assert label in classes and 0 < float(score) <= 1


@pytest.mark.parametrize(  # 34-42 s a case in a loaded suite run (session 40): one in CI
    "where", ["saved_model", pytest.param("labels.txt", marks=pytest.mark.slow)]
)
def test_export_on_a_full_disk_is_one_line_naming_the_folder(
    trained, tmp_path, monkeypatch, capsys, where
):
    """--out on a full disk: a 45-line traceback ending in TensorFlow's ResourceExhaustedError
    (SaveV2), exit 1; or "[Errno 28] No space left on device", naming no folder."""
    import errno

    import keras
    import tensorflow as tf

    from petal.cli import main

    if where == "saved_model":
        make = keras.export.ExportArchive

        def archive():
            made = make()
            write_out = made.write_out

            def full(path, **kwargs):
                write_out(path, **kwargs)  # files written part-way, then the disk is full
                raise tf.errors.ResourceExhaustedError(
                    None, None, f"{path}/variables/variables.data-00000-of-00001.tempstate; "
                    "No space left on device [Op:SaveV2]"
                )

            made.write_out = full
            return made

        monkeypatch.setattr(keras.export, "ExportArchive", archive)
    else:
        write_text = Path.write_text

        def full(self, *args, **kwargs):
            if self.name == "labels.txt":
                raise OSError(errno.ENOSPC, "No space left on device")
            return write_text(self, *args, **kwargs)

        monkeypatch.setattr(Path, "write_text", full)
    out = tmp_path / "full" / "export"
    assert main(["export", str(trained), "--out", str(out)]) == 2
    assert capsys.readouterr().err == (
        f"petal export: error: Cannot write the export in {out}: no space left on its disk; "
        "free some space there or pass --out a folder on another disk.\n"
    )
    assert not (tmp_path / "full").exists()


@pytest.mark.slow  # 46 s in a loaded suite run (session 40): `pytest -m slow` runs it
def test_export_removes_what_killed_exports_left_not_what_running_ones_write(
    trained, tmp_path
):
    """kill -9 during an export left its .export-XXXXXXXX/ (a partial SavedModel) in the
    output folder, and no later export removed it."""
    import os
    import socket
    import subprocess
    import sys
    import time

    from petal.evaluation.export import export

    out = tmp_path / "out"
    out.mkdir()

    def staging(name: str, pid: int | None = None, age: float = 0) -> Path:
        folder = out / name
        (folder / "saved_model" / "variables").mkdir(parents=True)
        (folder / "saved_model" / "variables" / "variables.data").write_bytes(b"x" * 1000)
        if pid is not None:
            holder = {"pid": pid, "host": socket.gethostname(), "doing": "exporting into it"}
            (folder / ".petal-running").write_text(json.dumps(holder))
        if age:
            os.utime(folder, (time.time() - age,) * 2)
        return folder

    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                           capture_output=True, text=True, check=True)
    killed = staging(".export-killed01", int(ended.stdout))
    # Left by a petal before the staging folder held a marker, two hours ago.
    unmarked = staging(".export-unmarked", age=7200)
    staging(".export-running", os.getppid())  # another export, running
    staging(".export-thread01", os.getpid())  # another export of this process
    staging(".export-justmade")  # made a moment ago by an export about to mark it
    (out / ".export-notes.txt").write_text("a file of that name is not a staging folder")
    (tmp_path / "elsewhere").mkdir()
    (out / ".export-link").symlink_to(tmp_path / "elsewhere")
    said = []
    export(trained, out=out, warn=said.append)
    assert said == [
        f"removed {folder}, left by an export that was stopped before it ended"
        for folder in (killed, unmarked)
    ]
    assert sorted(p.name for p in out.iterdir()) == [
        ".export-justmade", ".export-link", ".export-notes.txt", ".export-running",
        ".export-thread01", "export.json", "labels.txt", "saved_model",
    ]
    # Its own staging folder held its marker while it wrote (and is gone with it).
    assert (out / "saved_model" / "saved_model.pb").is_file()
    assert not (out / ".petal-running").exists()


def test_a_run_a_nan_loss_stopped_is_told_how_to_go_on_not_to_resume_as_it_is(
    trained, small_flowers, tmp_path, capsys
):
    """evaluate, predict and export said that a run a NaN/inf loss stopped in its first
    epoch had not finished and to resume it (which stops at the same loss): it saved no
    model, and starts again with new settings, as train said. One that saved epochs goes on
    from its last checkpoint with new settings; one resumed from its model, used still."""
    from petal.cli import main

    photo = sorted((small_flowers / "roses").iterdir())[0]
    commands = (["evaluate"], ["predict", str(photo)], ["export"])
    fixes = ("Lower the learning rate (--set learning_rate=...; its peak was 1e+12) or clip "
             "the gradients (--set clipnorm=1.0)")

    def stopped(run: Path, completed: int, at: str) -> Path:
        """``run`` with metrics.json as a NaN/inf loss at ``at`` leaves it."""
        config = json.loads((run / "config.json").read_text())
        config["resolved"]["peak_lr"] = 1e12
        (run / "config.json").write_text(json.dumps({**config, "clipnorm": None}))
        metrics = json.loads((run / "metrics.json").read_text())
        stop = {"epochs_completed": completed, "stopped": f"non-finite loss at {at}"}
        (run / "metrics.json").write_text(json.dumps({**metrics, **stop}))
        return run

    def errors(run: Path) -> list[str]:
        said = []
        for command in commands:
            assert main([command[0], str(run), *command[1:]]) == 2
            said.append(capsys.readouterr().err)
        return said

    # Stopped in its first epoch: config.json, history.csv and metrics.json, no checkpoint.
    first = tmp_path / "first"
    first.mkdir()
    for name in ("config.json", "history.csv", "metrics.json"):
        shutil.copy(trained / name, first / name)
    stopped(first, 0, "epoch 1/4 (step 3)")
    assert errors(first) == [
        f"petal {command[0]}: error: {first} has no model.keras: the run stopped at a "
        f"non-finite loss at epoch 1/4 (step 3), with no checkpoint saved to go on from. "
        f"{fixes}, and start it again with the new settings (`petal train --workdir {first} "
        "--overwrite ...`).\n"
        for command in commands
    ]
    # Stopped in its second epoch: the first is in last.keras.
    second = stopped(_copy_run(trained, tmp_path / "second"), 1, "epoch 2/3 (step 1)")
    (second / "model.keras").unlink()
    go_on = (
        f"{fixes}, and go on from {second / 'last.keras'} (epoch 1, the last good one) with "
        f"`petal train --resume --workdir {second}` and the new settings."
    )
    assert errors(second) == [
        f"petal {command[0]}: error: {second} has no model.keras: the run stopped at a "
        f"non-finite loss at epoch 2/3 (step 1). {go_on}\n"
        for command in commands
    ]
    # Resumed since and stopped before its end: resume it (with the settings it has now).
    state = json.loads((second / "state.json").read_text())
    (second / "state.json").write_text(json.dumps({**state, "epoch": 2}))
    assert "the run has not finished. Resume it with" in errors(second)[0]
    # A finished run resumed for more epochs and stopped: its model is used, and said to be
    # of its last finish.
    resumed = stopped(_copy_run(trained, tmp_path / "resumed"), 1, "epoch 2/2 (step 1)")
    assert main(["predict", str(resumed), str(photo)]) == 0
    go_on = go_on.replace(str(second), str(resumed))
    assert capsys.readouterr().err == (
        f"petal predict: warning: {resumed / 'model.keras'} is the model of the run's last "
        f"finish, before a resume: the run stopped at a non-finite loss at epoch 2/2 (step 1). "
        f"{go_on}\n"
    )


def test_report_removes_the_plots_of_an_earlier_evaluation_it_no_longer_draws(
    trained, tmp_path, capsys
):
    """plots/ kept misclassified.png of an evaluation with mistakes after one with none (and
    the evaluation's plots once eval/ was gone): a grid the page no longer showed, which
    contradicted it. The user's own files there stay."""
    import numpy as np

    from petal.evaluation.report import build_report

    run = _copy_run(trained, tmp_path / "run")
    _write_eval(run)
    plot_dir = run / "plots"
    plot_dir.mkdir()
    (plot_dir / "mine.png").write_bytes(b"the user's")
    build_report(run)
    drawn = {"curves.png", "lr.png", "confusion_matrix.png", "misclassified.png"}
    assert {p.name for p in plot_dir.iterdir()} == drawn | {"mine.png"}
    # Evaluated again, with no mistakes: evaluate writes no grid of them.
    (run / "eval" / "eval.json").write_text(json.dumps({
        **json.loads((run / "eval" / "eval.json").read_text()),
        "accuracy": 1.0, "confusion_matrix": [[2, 0], [0, 2]],
    }))
    np.savez_compressed(
        run / "eval" / "misclassified.npz", images=np.zeros((0, 8, 8, 3), np.uint8),
        true=np.zeros(0, np.int64), pred=np.zeros(0, np.int64), prob=np.zeros(0),
        classes=np.asarray(["a", "b"]),
    )
    page = build_report(run).read_text()
    assert "misclassified.png" not in page
    assert {p.name for p in plot_dir.iterdir()} == drawn - {"misclassified.png"} | {"mine.png"}
    shutil.rmtree(run / "eval")
    page = build_report(run).read_text()
    assert "confusion_matrix.png" not in page
    assert {p.name for p in plot_dir.iterdir()} == {"curves.png", "lr.png", "mine.png"}
    assert (plot_dir / "mine.png").read_bytes() == b"the user's"
    assert capsys.readouterr().err == ""


def test_an_empty_path_is_refused_by_the_library_not_taken_as_the_current_folder(
    trained, tmp_path, monkeypatch
):
    """Path("") is ".": predict read every image under the working directory, and
    evaluate and export wrote their files into it."""
    from petal.evaluation.export import export
    from petal.evaluation.predict import expand_images, predict
    from petal.evaluation.workdir import check_output_folder, open_run

    monkeypatch.chdir(tmp_path)
    (tmp_path / "photo.jpg").write_bytes(b"\xff\xd8 never read")
    for images in ("", [""], ["photo.jpg", ""]):
        with pytest.raises(PetalError, match=r"^An image path is empty \(an unset shell"):
            expand_images(images)
    with pytest.raises(PetalError, match=r"^An image path is empty"):
        predict(trained, [""])
    with pytest.raises(PetalError, match=r"^--out is empty; pass a folder path for the export"):
        check_output_folder("", "export")
    with pytest.raises(PetalError, match=r"^--out is empty; pass a folder path for the export"):
        export(trained, "")
    with pytest.raises(PetalError, match=r"^workdir is empty; pass the work directory"):
        open_run("")
    assert [p.name for p in tmp_path.iterdir()] == ["photo.jpg"]


@pytest.mark.parametrize("size", ["32", [32], [32, 0], [32.0, 32], [True, 32]])
def test_an_image_size_that_is_not_two_positive_ints_is_a_damaged_config(
    trained, small_flowers, tmp_path, capsys, size
):
    """"32" was read as (3, 2): predict and export ended in Keras' shape traceback."""
    from petal.cli import main

    run = _copy_run(trained, tmp_path / "run")
    config = json.loads((run / "config.json").read_text())
    config["resolved"]["image_size"] = size
    (run / "config.json").write_text(json.dumps(config))
    photo = str(next((small_flowers / "daisy").iterdir()))
    for command in (["predict", str(run), photo], ["export", str(run)]):
        assert main(command) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [
            f"petal {command[0]}: error: {run / 'config.json'} is damaged (resolved: "
            f"image_size is not [height, width] in pixels: {json.dumps(size)}); the work "
            "directory cannot be used, retrain it."
        ]
    assert not (run / "export").exists()


def test_a_model_that_takes_another_size_than_its_config_says_is_refused(
    trained, small_flowers, tmp_path, capsys
):
    from petal.cli import main

    run = _copy_run(trained, tmp_path / "run")
    config = json.loads((run / "config.json").read_text())
    config["resolved"]["image_size"] = [48, 48]
    (run / "config.json").write_text(json.dumps(config))
    photo = str(next((small_flowers / "daisy").iterdir()))
    assert main(["predict", str(run), photo]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"petal predict: error: {run / 'model.keras'} takes 32x32 images but "
        f"{run / 'config.json'} gives image_size 48x48; the work directory is inconsistent, "
        "retrain it."
    ]


def test_evaluating_a_folder_of_more_classes_names_the_classes_that_read_the_others(
    trained, small_flowers, tmp_path, capsys
):
    """Refused with "Evaluate on class folders named after those" alone: --classes, which
    reads only the folders of the model's classes, was not named."""
    import dataclasses

    from conftest import link_photos
    from petal.cli import main
    from petal.evaluation.workdir import class_index, open_run

    photos = link_photos(small_flowers, tmp_path / "photos", 2, classes=1)
    link_photos(small_flowers, tmp_path / "more", 1)
    (tmp_path / "more" / "dandelion").rename(photos / "roses")
    (tmp_path / "more" / "daisy").rename(photos / "cactus")
    args = ["evaluate", str(trained), "--data", str(photos), "--out", str(tmp_path / "eval")]
    assert main(args) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"petal evaluate: error: {photos} holds classes the model in {trained} does not know: "
        "cactus; its classes are daisy, dandelion, roses, sunflowers, tulips. Pass --classes "
        "daisy,roses to read only those of its folders, or evaluate on class folders (or "
        "records) named after those."
    ]
    assert main([*args, "--classes", "daisy,roses"]) == 0
    # Records are converted again with those classes; none known: no --classes to name.
    run = dataclasses.replace(open_run(trained), classes=("daisy", "red roses"))
    with pytest.raises(PetalError, match=r"are daisy, red roses\. Convert the photos again "
                       r"with --classes 'daisy,red roses', or evaluate on class folders \(or "
                       r"records\) named after those\.$"):
        class_index(["daisy", "red roses", "x"], run, "recs", "records")
    with pytest.raises(PetalError, match=r"red roses\. Evaluate on class folders"):
        class_index(["x"], run, "photos", "folder")


def test_a_file_that_does_not_decode_over_http_is_named(
    trained, small_flowers, tmp_path, caplog, capsys
):
    """Read over http, an image folder's file that did not decode was named nowhere: the
    error gave the decoder's reason alone, and --skip-corrupt's warning said to run without
    it to name the file."""
    import logging

    from conftest import link_photos
    from petal.cli import main
    from petal.data import remote

    folder = link_photos(small_flowers, tmp_path / "photos", 2)
    (folder / "daisy" / "zz-bad.jpg").write_bytes(b"plain text, not a JPEG")
    caplog.set_level(logging.WARNING, logger="petal")
    with remote.ObjectServer({"photos": folder}) as server:
        url = server.url("photos")
        out = str(tmp_path / "eval")
        assert main(["evaluate", str(trained), "--data", url, "--out", out]) == 2
        err = capsys.readouterr().err
        assert f"{url}/daisy/zz-bad.jpg: not an image" in err, err
        assert main(["evaluate", str(trained), "--data", url, "--skip-corrupt", "--out", out]) == 0
    said = [r.getMessage() for r in caplog.records if "petal: skipped" in r.getMessage()]
    assert said == [
        f"petal: skipped {url}/daisy/zz-bad.jpg of {url}: it cannot be decoded (not an image "
        "(no known image format in the file)); 1 file(s) skipped so far"
    ]


def test_an_empty_workdir_is_refused_by_build_report(trained, tmp_path, monkeypatch):
    """build_report("") redrew the run in the working directory (Path("") is ".")."""
    from petal.evaluation.report import build_report

    shutil.copytree(trained, tmp_path / "run")
    monkeypatch.chdir(tmp_path / "run")
    before = sorted(p.name for p in Path().rglob("*"))
    with pytest.raises(PetalError, match=r"^workdir is empty; pass the work directory of a "):
        build_report("")
    assert sorted(p.name for p in Path().rglob("*")) == before


@pytest.mark.slow  # 44 s in a loaded suite run (session 40): `pytest -m slow` runs it
def test_report_on_a_damaged_run_names_a_retrain_command_that_works(
    small_records, tmp_path, capsys
):
    """`petal train --workdir RUN --overwrite` asked for --data, and with it trained the
    default preset: the fix trains the run again from its own config.json."""
    import shlex

    from conftest import tiny_config
    from petal.cli import main
    from petal.training.loop import train

    run = tmp_path / "my run"
    train(tiny_config(small_records, model="dense", epochs=1), run, log=lambda line: None)
    (run / "history.csv").write_text("garbage\n1,2\n")
    assert main(["report", str(run)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    command = f"petal train --config '{run}/config.json' --workdir '{run}' --overwrite"
    assert err.endswith(f"; the run is damaged: retrain it (`{command}`).")
    assert main(shlex.split(command)[1:]) == 0
    assert json.loads((run / "config.json").read_text())["model"] == "dense"
    assert main(["report", str(run)]) == 0
    capsys.readouterr()
    (run / "config.json").write_text("{")  # the run's preset and data are unknown
    assert main(["report", str(run)]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(
        "; the run is damaged: retrain it with its preset and data (`petal train --preset "
        f"PRESET --data DATA --workdir '{run}' --overwrite`)."
    )


def test_report_in_a_run_folder_it_cannot_write_says_to_make_it_writable(
    trained, tmp_path, capsys, monkeypatch
):
    # It said `error: [Errno 1] Operation not permitted: 'RUN/plots'`, with no fix.
    import errno

    from petal.cli import main

    run = _copy_run(trained, tmp_path / "run")
    mkdir, write_text = Path.mkdir, Path.write_text

    def refused(path):
        raise PermissionError(errno.EPERM, "Operation not permitted", str(path))

    def no_plots(self, *args, **kwargs):  # as in a run folder made immutable (chattr +i)
        return refused(self) if self.name == "plots" else mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", no_plots)
    assert main(["report", str(run)]) == 2
    assert capsys.readouterr().err == (
        f"petal report: error: Cannot write the report in {run} (Operation not permitted: "
        f"{run / 'plots'}); make {run} and its plots/ folder writable and run petal report "
        "again.\n"
    )
    monkeypatch.setattr(Path, "mkdir", mkdir)

    def no_page(self, *args, **kwargs):  # written as .tmp-report.html, then renamed
        refuse = self.name.endswith("report.html")
        return refused(self) if refuse else write_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", no_page)
    assert main(["report", str(run)]) == 2
    assert f"(Operation not permitted: {run / 'report.html'}); make {run} and its" in (
        capsys.readouterr().err
    )


def test_prediction_lines_keep_odd_class_names_on_one_line_and_apart():
    # A class named with a newline split a result over two lines; a comma or an edge space
    # made the comma-separated list ambiguous.
    from petal.evaluation.predict import format_predictions

    labels = ["new\nline", "com,ma", " lead", "ünï 🌸", "plain"]
    chances = (0.5, 0.2, 0.1, 0.1, 0.1)
    result = {"file": "a/x.jpg", "predictions": [
        {"label": label, "probability": p} for label, p in zip(labels, chances, strict=True)
    ]}
    assert format_predictions([result]) == (
        'a/x.jpg: new\\nline 0.500, "com,ma" 0.200, " lead" 0.100, ünï 🌸 0.100, plain 0.100'
    )


def test_predict_on_records_or_a_run_folder_is_not_told_to_pass_those_files_by_name(
    small_records, tmp_path
):
    # Predicting a records folder said "pass them by name to predict them": the shards then
    # failed as "not an image".
    from petal.evaluation.predict import expand_images

    with pytest.raises(PetalError) as caught:
        expand_images([small_records])
    assert str(caught.value) == (
        f"Folder {small_records} holds records, not image files: evaluate the run on them "
        f"with `petal evaluate WORKDIR --data {small_records}`, or pass image files or a "
        "folder of them."
    )
    # `petal predict RUN RUN` said the run "holds no image files" and told the user to pass
    # its TensorBoard events files by name (or, once exported, that it "holds a model
    # export").
    run = tmp_path / "run"
    (run / "tensorboard" / "train").mkdir(parents=True)
    for name in ("history.csv", "best.weights.h5", "model.keras",
                 "tensorboard/train/events.out.tfevents.1765000000.host.123.0.v2"):
        (run / name).write_text("x")
    (run / "config.json").write_text('{"model": "squeezenet", "resolved": {"classes": ["a"]}}')
    for export in (False, True):
        if export:
            (run / "export" / "saved_model").mkdir(parents=True)
            (run / "export" / "saved_model" / "saved_model.pb").write_text("x")
            (run / "eval").mkdir()  # evaluated: its plots were predicted, with a warning
            (run / "eval" / "confusion_matrix.png").write_bytes(b"\x89PNG\r\n\x1a\n")
        with pytest.raises(PetalError) as caught:
            expand_images([run])
        assert str(caught.value) == (
            f"Folder {run} is a training run, not a folder of images: the run comes first, "
            f"then the images (`petal predict {run} IMAGE...`)."
        )
    # Without petal's config.json, the folder's files are named; TensorBoard's are no photos.
    (run / "config.json").write_text('{"license": "CC-BY"}')  # a data set's own file
    shutil.rmtree(run / "eval")
    with pytest.raises(PetalError, match="holds a model export") as caught:
        expand_images([run])
    shutil.rmtree(run / "export")
    with pytest.raises(PetalError, match="holds no image files") as caught:
        expand_images([run])
    assert "by name" not in str(caught.value)
    (run / "scan").write_text("x")  # a photo saved without an extension, perhaps
    with pytest.raises(PetalError, match="; pass them by name to predict them;"):
        expand_images([run])


def test_predict_refuses_a_file_named_as_a_folder(tmp_path):
    # `petal predict RUN photo.jpg/` predicted photo.jpg (a Path drops the '/'), where
    # `cat photo.jpg/` fails: a script that meant a folder went on with a file.
    from petal.evaluation.predict import expand_images

    photo = tmp_path / "photo.jpg"
    photo.write_bytes(b"not read")
    for given in (f"{photo}/", f"{photo}/."):
        with pytest.raises(PetalError) as caught:
            expand_images([given])
        assert str(caught.value) == (
            f"{given} ends with '/' but is a file, not a folder: drop the '/' to predict the "
            "file."
        )
    assert expand_images([str(photo)]) == [photo]


def test_predict_names_each_file_as_it_was_given(trained, small_flowers, tmp_path, monkeypatch):
    # "./imgs/a.jpg" and "imgs//b.jpg" came back as "imgs/a.jpg" and "imgs/b.jpg": a script
    # found none of its own paths among the results.
    from petal.evaluation.predict import expand_images, predict

    imgs = tmp_path / "imgs"
    (imgs / "more").mkdir(parents=True)
    photo = sorted(small_flowers.glob("*/*.jpg"))[0].read_bytes()
    for name in ("a.jpg", "b.jpg", "more/c.jpg"):
        (imgs / name).write_bytes(photo)
    (imgs / "d.jpg").write_bytes(b"")
    monkeypatch.chdir(tmp_path)
    given = ["./imgs/a.jpg", "imgs//b.jpg", "./imgs/more/", "imgs/d.jpg", "./imgs/a.jpg"]
    results = predict(trained, given, skip_corrupt=True, warn=lambda line: None)
    assert [r["file"] for r in results] == [
        "./imgs/a.jpg", "imgs//b.jpg", "./imgs/more/c.jpg", "imgs/d.jpg", "./imgs/a.jpg"
    ]
    assert [len(r["predictions"]) for r in results] == [3, 3, 3, 0, 3]
    # The same photo at other places in a batch: the same classes, and probabilities equal to
    # float32 rounding (oneDNN's kernels sum in an order that depends on the batch position).
    same = [results[i]["predictions"] for i in (0, 1, 4)]
    assert [[p["index"] for p in each] for each in same] == [[p["index"] for p in same[0]]] * 3
    for each in same[1:]:
        assert [p["probability"] for p in each] == pytest.approx(
            [p["probability"] for p in same[0]], rel=1e-5)
    assert expand_images(given[:3]) == [Path("imgs/a.jpg"), Path("imgs/b.jpg"),
                                        Path("imgs/more/c.jpg")]


@pytest.mark.slow  # 30 s in a loaded suite run (session 40): `pytest -m slow` runs it
def test_report_reads_an_evaluation_written_elsewhere(trained, small_records, tmp_path,
                                                       capsys):
    # `petal evaluate RUN --out DIR` and then `petal report RUN`: the page had no evaluation
    # and nothing said where the report looked for one.
    from petal.cli import main
    from petal.evaluation.evaluate import evaluate

    run = _copy_run(trained, tmp_path / "run")
    out = tmp_path / "evalout"
    evaluate(run, small_records, out_dir=out, log=lambda line: None)
    capsys.readouterr()
    assert main(["report", str(run)]) == 0
    none = (f"no evaluation in {run / 'eval'}: run `petal evaluate {run}` to add one, or pass "
            "--eval DIR for one written with `petal evaluate --out DIR`.")
    assert capsys.readouterr().out == f"petal report: {none}\n{run / 'report.html'}\n"
    page = (run / "report.html").read_text()
    assert "N" + none[1:] in page and "Confusion matrix" not in page
    assert main(["report", str(run), "--eval", str(out)]) == 0
    assert capsys.readouterr().out == f"{run / 'report.html'}\n"
    page = (run / "report.html").read_text()
    assert "<h2>Evaluation on" in page and "No evaluation" not in page
    assert {"confusion_matrix.png", "samples.png"} <= {p.name for p in (run / "plots").iterdir()}
    assert main(["report", str(run), "--eval", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (
        f"petal report: error: --eval {tmp_path} holds no eval.json; pass the folder `petal "
        "evaluate --out` wrote, or leave --eval out for WORKDIR/eval.\n"
    )


def test_report_of_an_unfinished_or_stopped_run_says_what_to_do(trained, tmp_path):
    # An unfinished run's page did not say how to finish it, and a NaN loss in epoch 1 (no
    # epoch completed) showed `null` for its accuracies and images/s.
    import html

    from petal.evaluation.report import build_report

    run = _copy_run(trained, tmp_path / "run")
    metrics = json.loads((run / "metrics.json").read_text())
    (run / "metrics.json").unlink()
    page = build_report(run).read_text()
    assert html.escape("metrics.json missing: the run has not finished. Resume it with "
                       f"`petal train --resume --workdir {run}`.") in page
    nones = ("final_val_accuracy", "mean_last5_val_accuracy", "best_val_accuracy",
             "best_epoch", "train_images_per_sec")
    (run / "metrics.json").write_text(json.dumps({**metrics, **dict.fromkeys(nones)}))
    page = build_report(run).read_text()
    training = page[page.index("<h2>Training</h2>"):page.index("</table>")]
    assert "null" not in training
    assert "<tr><th>best validation accuracy</th><td class='num'>n/a</td></tr>" in training
    assert "<tr><th>training images/s</th><td class='num'>n/a</td></tr>" in training


@pytest.mark.slow  # 38 s in a loaded suite run (session 40): `pytest -m slow` runs it
def test_ctrl_c_as_an_export_replaces_another_leaves_one_of_them_whole(
    trained, exported, tmp_path, monkeypatch
):
    # Ctrl-C during the replacement left some of the earlier export's files and some of
    # this one's.
    import os

    from conftest import interrupt_when_called
    from petal.evaluation import export as export_module

    out = tmp_path / "export"
    shutil.copytree(Path(exported["saved_model"]).parent, out)  # an earlier export of the run
    first = (out / "saved_model" / "saved_model.pb").stat().st_mtime_ns
    interrupt_when_called(monkeypatch, os, "replace")
    with pytest.raises(KeyboardInterrupt):
        export_module.export(trained, out=out)
    listed = json.loads((out / "export.json").read_text())
    assert all((out / name).exists() for name in listed["files"])
    assert (out / "saved_model" / "saved_model.pb").stat().st_mtime_ns != first  # this one's


def test_a_folder_argument_that_is_not_a_path_is_named(trained, small_records):
    """None or a number as a folder ended in pathlib's "expected str, bytes or os.PathLike
    object, not NoneType", naming no argument."""
    from petal.evaluation.evaluate import evaluate
    from petal.evaluation.export import export
    from petal.evaluation.predict import predict
    from petal.evaluation.report import build_report

    run = r"the work directory of a `petal train` run\)\. Received: workdir=None$"
    for call in (lambda: evaluate(None, small_records), lambda: predict(None, ["a.jpg"]),
                 lambda: export(None), lambda: build_report(None)):
        with pytest.raises(PetalError, match=r"^workdir must be a folder path \(" + run):
            call()
    for call, name, value in (
        (lambda: export(trained, 5), "out", 5),
        (lambda: evaluate(trained, small_records, out_dir=5), "out_dir", 5),
    ):
        with pytest.raises(PetalError, match=rf"^{name} must be a folder path \(new or not\)\. "
                           rf"Received: {name}={value}$"):
            call()
    with pytest.raises(PetalError, match=r"^eval_dir must be a folder path \(the folder `petal "
                       r"evaluate --out` wrote\)\. Received: eval_dir=3$"):
        build_report(trained, eval_dir=3)


def test_an_image_that_is_not_a_path_is_named(trained):
    # predict(run, [None]) ended in pathlib's TypeError.
    from petal.evaluation.predict import predict

    with pytest.raises(PetalError) as info:
        predict(trained, ["a.jpg", None])
    assert str(info.value) == ("images must be image files or folders of them (str or Path). "
                               "Received: None among images=['a.jpg', None]")


def test_a_folder_that_is_no_run_is_refused_without_an_option_they_refuse(tmp_path, capsys):
    """evaluate, predict and export take WORKDIR as an argument and refuse --workdir: their
    error told the user to pass "the work directory (--workdir)"."""
    from petal.cli import main

    nowhere = tmp_path / "nowhere"
    said = (f"{nowhere} is not a petal work directory (no config.json); pass the folder a "
            "`petal train --workdir` run wrote.")
    for command in (["evaluate", str(nowhere)], ["predict", str(nowhere), "a.jpg"],
                    ["export", str(nowhere)]):
        assert main(command) == 2
        assert capsys.readouterr().err == f"petal {command[0]}: error: {said}\n"


def test_predict_on_records_names_the_run_to_evaluate_them_with(trained, small_records):
    """The command to evaluate the run on a folder of records said `petal evaluate WORKDIR`,
    not the run being predicted with."""
    import shlex

    from petal.evaluation.predict import predict

    with pytest.raises(PetalError) as caught:
        predict(trained, [small_records])
    assert str(caught.value) == (
        f"Folder {small_records} holds records, not image files: evaluate the run on them "
        f"with `petal evaluate {shlex.quote(str(trained))} --data {small_records}`, or pass "
        "image files or a folder of them."
    )


def test_predict_on_an_export_is_not_told_to_pass_its_files_by_name(tmp_path):
    """An export folder listed saved_model.pb, variables.data-00000-of-00001... then said
    "pass them by name to predict them": no photo is among them."""
    from petal.evaluation.predict import expand_images

    export = tmp_path / "export"
    (export / "saved_model" / "variables").mkdir(parents=True)
    for name in ("export.json", "labels.txt", "model.tflite", "saved_model/saved_model.pb",
                 "saved_model/fingerprint.pb", "saved_model/variables/variables.index",
                 "saved_model/variables/variables.data-00000-of-00001"):
        (export / name).write_text("x")
    for folder in (export, export / "saved_model"):
        with pytest.raises(PetalError) as caught:
            expand_images([folder])
        assert str(caught.value) == (
            f"Folder {folder} holds a model export (SavedModel), not image files: pass image "
            "files or a folder of them."
        )
    (export / "saved_model" / "saved_model.pb").unlink()
    with pytest.raises(PetalError) as caught:  # variables alone: no photos either
        expand_images([export / "saved_model" / "variables"])
    assert "holds no image files" in str(caught.value)
    assert "by name" not in str(caught.value)


def test_report_on_a_run_with_no_model_says_to_resume_it_not_to_evaluate_it(
    trained, tmp_path, capsys
):
    """An interrupted run (no model.keras, no metrics.json): report said to run `petal
    evaluate RUN`, which refuses it and says to resume it."""
    from petal.evaluation.report import build_report

    run = _copy_run(trained, tmp_path / "run")
    (run / "model.keras").unlink()
    (run / "metrics.json").unlink()
    capsys.readouterr()
    build_report(run)
    out = capsys.readouterr().out
    assert out == (
        f"petal report: no evaluation in {run / 'eval'}, and no model to evaluate: {run} has "
        f"no model.keras: the run has not finished. Resume it with `petal train --resume "
        f"--workdir {run}`.\n"
    )
    assert "petal evaluate" not in (run / "report.html").read_text()


def test_report_of_another_runs_evaluation_says_so_and_leaves_it_alone(trained, tmp_path,
                                                                        capsys):
    """`petal report RUN --eval OTHER/eval`: report said eval.json scored an earlier model of
    RUN and told the user to `petal evaluate RUN --out OTHER/eval`, over the other run's."""
    from petal.evaluation.report import build_report

    run = _copy_run(trained, tmp_path / "run")
    other = tmp_path / "other"
    other.mkdir()
    eval_json = _write_eval(other, workdir=str(other), model_sha256="0" * 64)
    capsys.readouterr()
    page = build_report(run, eval_dir=other / "eval").read_text()
    said = (f"{eval_json} is an evaluation of another run ({other}), whose model is not "
            f"{run / 'model.keras'}; evaluate this run with `petal evaluate {run}` (it writes "
            f"{run / 'eval'}) and run `petal report {run}` again.")
    assert capsys.readouterr().err == f"petal report: warning: {said}\n"
    assert "another run" in page and "scored an earlier model" not in page
    assert "--out" not in said


def test_report_of_a_moved_runs_own_evaluation_says_it_scored_an_earlier_model(trained,
                                                                               tmp_path, capsys):
    # A run moved (its eval.json naming the old folder) and trained further: its own eval/
    # was called "an evaluation of another run".
    from petal.evaluation.report import build_report

    run = _copy_run(trained, tmp_path / "moved")
    eval_json = _write_eval(run, workdir=str(tmp_path / "before"), model_sha256="0" * 64)
    capsys.readouterr()
    build_report(run)
    err = capsys.readouterr().err
    assert f"{eval_json} scored an earlier model" in err and "another run" not in err


def test_report_of_another_runs_evaluation_in_this_runs_eval_says_it_is_another_runs(
    trained, tmp_path, capsys
):
    """`petal evaluate OTHER --out RUN/eval`: report said RUN's model was saved after it (the
    run trained further), though eval.json names OTHER, a run that is there."""
    from petal.evaluation.report import build_report

    run = _copy_run(trained, tmp_path / "run")
    other = _copy_run(trained, tmp_path / "other")
    eval_json = _write_eval(run, workdir=str(other), model_sha256="0" * 64)
    capsys.readouterr()
    build_report(run)
    err = capsys.readouterr().err
    assert f"{eval_json} is an evaluation of another run ({other})" in err
    assert "scored an earlier model" not in err


def test_predicts_records_hint_quotes_a_path_with_a_space(trained, tmp_path):
    from petal.evaluation.predict import predict

    records = tmp_path / "my recs"
    records.mkdir()
    (records / "manifest.json").write_text("{}")
    (records / "train-00000-of-00001-1.tfrec").write_bytes(b"x")
    with pytest.raises(PetalError) as info:
        predict(trained, [records])
    assert f"--data '{records}'`" in str(info.value)


def _largest_tensor(graph, fetch, feed) -> int:
    """The bytes of the largest tensor ``graph`` makes computing ``fetch`` from ``feed``."""
    import tensorflow as tf

    stats = tf.compat.v1.RunMetadata()
    with tf.compat.v1.Session(graph=graph) as session:
        session.run(fetch, feed, options=tf.compat.v1.RunOptions(trace_level=3),
                    run_metadata=stats)
    return max(
        out.tensor_description.allocation_description.requested_bytes
        for device in stats.step_stats.dev_stats
        for node in device.node_stats
        for out in node.output
    )

def test_the_exported_fill_resize_computes_only_the_kept_window():
    """A 1x4000 strip fitted to 24x32: the SavedModel resized it whole to 24x96000 (a
    1x40000 PNG of 914 bytes took 2.8 GB at 64 px) before cropping; now only the window
    kept is computed, as images.resize_bilinear does, with the converter's pixels."""
    import numpy as np
    import tensorflow as tf

    from petal.data import images
    from petal.evaluation.export import _fit_tf

    rng = np.random.default_rng(0)
    fit = tf.function(lambda x: _fit_tf(x, (24, 32), "fill"),
                      input_signature=[tf.TensorSpec([None, None, 3], tf.float32)])
    for h, w in ((1, 4000), (4000, 1), (50, 41), (7, 9), (1, 1)):
        pixels = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        got = np.clip(fit(tf.constant(pixels, tf.float32)).numpy(), 0, 255).astype(np.uint8)
        np.testing.assert_array_equal(got, images.resize(pixels, (24, 32), "fill"),
                                      err_msg=str((h, w)))
    # The largest tensor it makes is the input's size, not the cover size's (1.1 MB).
    graph = tf.Graph()
    with graph.as_default():
        image = tf.compat.v1.placeholder(tf.float32, [None, None, 3])
        fitted = _fit_tf(image, (24, 32), "fill")
    largest = _largest_tensor(graph, fitted, {image: np.zeros((1, 4000, 3), np.float32)})
    assert 0 < largest <= 4 * 4000 * 3


def test_the_exported_decoder_reads_a_long_exif_orientation():
    """Orientation 6 stored as a LONG in big-endian ("MM") EXIF: the SavedModel read its
    high half (0) and served the photo sideways; PIL and predict turn it upright."""
    import io
    import struct

    import numpy as np
    import tensorflow as tf
    from PIL import Image

    from petal.data import images
    from petal.evaluation.export import exif_orientation

    buffer = io.BytesIO()
    Image.fromarray(np.zeros((8, 16, 3), np.uint8)).save(buffer, "JPEG")
    plain = buffer.getvalue()
    for order, kind in ((">", 4), ("<", 4), (">", 3), ("<", 3)):
        value = struct.pack(order + ("I" if kind == 4 else "HH"), *((6,) if kind == 4 else (6, 0)))
        tiff = (b"MM\0\x2a" if order == ">" else b"II\x2a\0") + struct.pack(order + "IH", 8, 1)
        tiff += struct.pack(order + "HHI", 0x0112, kind, 1) + value + bytes(4)
        app1 = b"\xff\xe1" + struct.pack(">H", 8 + len(tiff)) + b"Exif\0\0" + tiff
        data = plain[:2] + app1 + plain[2:]
        assert images.decode_rgb(data)[0].shape == (16, 8, 3)  # PIL turns it upright
        assert int(exif_orientation(tf.constant(data))) == 6, (order, kind)


def test_the_exported_decoder_reads_the_orientation_of_every_tiff_type_as_pil_does():
    """The SavedModel read an orientation as a SHORT, or a LONG: stored as another type
    (SBYTE, SSHORT, SLONG, RATIONAL, FLOAT, DOUBLE, ...), or with a count whose values lie
    outside the entry, it served the photo sideways (or, for a BYTE 6 in "II" data, turned
    one that PIL and predict leave as it is)."""
    import io
    import struct

    import numpy as np
    import tensorflow as tf
    from PIL import Image

    from petal.data import images
    from petal.evaluation.export import exif_orientation

    buffer = io.BytesIO()
    Image.fromarray(np.zeros((8, 16, 3), np.uint8)).save(buffer, "JPEG")
    plain = buffer.getvalue()
    orientation = tf.function(exif_orientation)
    # TIFF type: its struct format and the values stored (the first is PIL's orientation).
    cases = {1: ("B", [6]), 3: ("H", [6, 0, 0]), 5: ("I", [12, 2]), 6: ("b", [6]),
             7: ("B", [6]), 8: ("h", [6]), 9: ("i", [6]), 10: ("i", [6, 1, 0, 1]),
             11: ("f", [6.0]), 12: ("d", [6.0]), 13: ("I", [6]), 16: ("Q", [6])}
    for order in "<>":
        for kind, (fmt, values) in cases.items():
            value = struct.pack(order + fmt * len(values), *values)
            count = len(values) // (2 if kind in (5, 10) else 1)
            tiff = (b"MM\0\x2a" if order == ">" else b"II\x2a\0") + struct.pack(order + "IH", 8, 1)
            if len(value) > 4:  # after the directory, at the offset the entry holds
                value, extra = struct.pack(order + "I", 26), value
            else:
                value, extra = value.ljust(4, b"\0"), b""
            tiff += struct.pack(order + "HHI", 0x0112, kind, count) + value + bytes(4) + extra
            app1 = b"\xff\xe1" + struct.pack(">H", 8 + len(tiff)) + b"Exif\0\0" + tiff
            data = plain[:2] + app1 + plain[2:]
            turned = images.decode_rgb(data)[0].shape == (16, 8, 3)  # as predict
            assert turned == (kind not in (1, 7)), (order, kind)  # BYTE, UNDEFINED: bytes
            assert int(orientation(tf.constant(data))) == (6 if turned else 1), (order, kind)


def _header_bombs():
    """Small images of each format whose header states 30000x20000 pixels (600 million, over
    predict's limit; a WebP 10000x16000), as decompression bombs do: ``{format: bytes}``."""
    import io
    import struct
    import zlib

    import numpy as np
    from PIL import Image

    def saved(fmt, **options):
        buffer = io.BytesIO()
        Image.fromarray(np.zeros((4, 6, 3), np.uint8)).save(buffer, fmt, **options)
        return bytearray(buffer.getvalue())

    h, w = 30000, 20000
    png = saved("PNG")
    png[16:24] = struct.pack(">II", w, h)
    png[29:33] = struct.pack(">I", zlib.crc32(png[12:29]))
    jpeg = saved("JPEG")
    sof = jpeg.index(b"\xff\xc0")
    jpeg[sof + 5 : sof + 9] = struct.pack(">HH", h, w)
    gif = saved("GIF")
    gif[6:10] = struct.pack("<HH", w, h)
    bmp = saved("BMP")
    bmp[18:26] = struct.pack("<ii", w, -h)  # rows stored top-down
    webp = saved("WEBP", lossless=True)
    assert webp[12:16] == b"VP8L"
    # Sides of 14 bits: 10000x16000 (160 million).
    webp[21:25] = struct.pack("<I", (webp[24] >> 4 << 28) | (10000 - 1) << 14 | (16000 - 1))
    return {"png": png, "jpeg": jpeg, "gif": gif, "bmp": bmp, "webp": webp}


def test_the_exported_decoder_refuses_images_over_predicts_pixel_limit():
    """The SavedModel decoded whatever size a header stated (a 30000x30000 PNG of 110 KB took
    GBs), where predict and convert refuse images over their pixel limit. It reads the size
    from the header now and refuses, naming it and the limit, before decoding."""
    import io

    import numpy as np
    import tensorflow as tf
    from PIL import Image

    from petal.data.images import DEFAULT_MAX_PIXELS
    from petal.evaluation.export import decode_like_predict, header_size

    decode = tf.function(decode_like_predict)
    for fmt, data in _header_bombs().items():
        want = (10000, 16000) if fmt == "webp" else (30000, 20000)
        assert tuple(int(x) for x in header_size(tf.constant(bytes(data)))) == want, fmt
        with pytest.raises(tf.errors.InvalidArgumentError) as caught:
            decode(tf.constant(bytes(data)))
        assert (f"the image has too many pixels (HxW {want[0]}x{want[1]} = "
                f"{want[0] * want[1]} > {DEFAULT_MAX_PIXELS}, the pixel limit of petal predict: "
                "a guard against decompression bombs); send a smaller image"
                ) in caught.value.message, fmt
    # An image of as many pixels as the limit is decoded; one over it is not.
    buffer = io.BytesIO()
    Image.fromarray(np.full((4, 6, 3), 200, np.uint8)).save(buffer, "PNG")
    data = tf.constant(buffer.getvalue())
    assert decode_like_predict(data, max_pixels=24).shape == (4, 6, 3)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"HxW 4x6 = 24 > 23,"):
        decode_like_predict(data, max_pixels=23)


@pytest.mark.slow  # 9-10 s in CI on a Zen 3 host (session 39: 775 s): `pytest -m slow` runs it
def test_the_exported_preprocessing_holds_no_float_copy_of_the_whole_photo():
    """The SavedModel converted the decoded photo to float32 before resizing it (4 bytes a
    channel: a 12-megapixel photo took 144 MB more); now only the resize's output is float,
    with the same pixels (test_evaluate_on_a_folder_sees_the_pixels_predict_sees)."""
    import io
    from types import SimpleNamespace

    import numpy as np
    import tensorflow as tf
    from PIL import Image

    from petal.evaluation.export import make_preprocess

    buffer = io.BytesIO()
    Image.fromarray(np.zeros((300, 400, 3), np.uint8)).save(buffer, "PNG")
    for mode in ("fill", "pad", "stretch", "none"):
        run = SimpleNamespace(records_size=(24, 32), image_size=(16, 16), fit_mode=mode,
                              normalization="unit")
        graph = tf.Graph()
        with graph.as_default():
            data = tf.compat.v1.placeholder(tf.string, [])
            out = make_preprocess(run)(data)
        largest = _largest_tensor(graph, out, {data: buffer.getvalue()})
        assert largest <= 300 * 400 * 3, (mode, largest)  # the decoded uint8 photo


@pytest.mark.slow  # 52 s in a loaded suite run (session 40): `pytest -m slow` runs it
def test_a_second_export_into_a_folder_is_refused_and_a_clash_is_not_a_permission_problem(
    trained, tmp_path, monkeypatch
):
    """Two exports into one --out: the loser's swap failed with "Cannot write the export in OUT
    (Directory not empty); pass --out a folder you can write", blaming permissions."""
    import errno
    import os
    import socket

    from petal.evaluation import export as export_module

    out = tmp_path / "out"
    out.mkdir()
    holder = {"pid": os.getppid(), "host": socket.gethostname(), "doing": "exporting into it"}
    (out / ".petal-running").write_text(json.dumps(holder))
    with pytest.raises(PetalError, match=(
        rf"^{re.escape(str(out))} is in use: process {os.getppid()} on .* is exporting into it; "
        r"wait for it to end or stop it, or pass another --out \(if it is not running, delete "
        rf"{re.escape(str(out / '.petal-running'))}\)\.$"
    )):
        export_module.export(trained, out=out, warn=lambda line: None)
    assert sorted(p.name for p in out.iterdir()) == [".petal-running"]

    # Something writing into saved_model as it is replaced.
    class Os:
        def __getattr__(self, name):
            return getattr(os, name)

        def replace(self, src, dst):
            if Path(dst).name == "saved_model":
                raise OSError(errno.ENOTEMPTY, "Directory not empty")
            return os.replace(src, dst)

    monkeypatch.setattr(export_module, "os", Os())
    with pytest.raises(PetalError, match=(
        rf"^Cannot replace {re.escape(str(tmp_path / 'two' / 'saved_model'))} with the new "
        r"export: something else wrote into it meanwhile \(Directory not empty\); let it "
        r"finish and run petal export again\.$"
    )):
        export_module.export(trained, out=tmp_path / "two", warn=lambda line: None)
    assert not (tmp_path / "two" / ".petal-running").exists()


@pytest.mark.slow  # 12-15 s in CI (session 37, which took 612 s): `pytest -m slow` runs it
def test_export_and_report_write_utf8_whatever_the_locale(trained, tmp_path):
    # Under LC_ALL=C (UTF-8 mode off) labels.txt and report.html were written in the locale's
    # encoding: a traceback (UnicodeEncodeError) for classes named other than in ASCII.
    import os
    import subprocess
    import sys

    run = tmp_path / "run"
    shutil.copytree(trained, run, ignore=shutil.ignore_patterns("export", "eval"))
    config = json.loads((run / "config.json").read_text())
    # and a newline in a class's name split it over two lines of labels.txt; a backslash
    # was written as it is, so a name holding a backslash and an n read back as a newline
    names = ["Gänseblümchen", "向日葵", "rose\nred", "tulip\\nred",
             *config["resolved"]["classes"][4:]]  # fmt: skip
    config["resolved"]["classes"] = names
    (run / "config.json").write_text(json.dumps(config))
    env = {**os.environ, "LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0"}
    env.pop("PYTHONIOENCODING", None)
    for argv in (["export", str(run)], ["report", str(run)]):
        done = subprocess.run([sys.executable, "-m", "petal", *argv], capture_output=True,
                              text=True, env=env, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
    lines = (run / "export" / "labels.txt").read_text(encoding="utf-8").splitlines()
    assert lines == [*names[:2], "rose\\nred", "tulip\\\\nred", *names[4:]]
    assert "向日葵" in (run / "report.html").read_text(encoding="utf-8")


def test_records_holding_one_known_class_suggest_evaluating_the_photo_folder(
    trained, small_flowers, tmp_path, capsys
):
    """Said "Convert the photos again with --classes daisy", which convert refuses (a
    classifier needs at least two classes); an image folder may be evaluated on one."""
    import shlex

    from conftest import link_photos
    from petal.cli import main

    photos = link_photos(small_flowers, tmp_path / "photos", 2, classes=2)
    (photos / "dandelion").rename(photos / "lilies")
    records = tmp_path / "records"
    assert main(["convert", str(photos), str(records), "--image-size", "32"]) == 0
    capsys.readouterr()
    args = ["evaluate", str(trained), "--data", str(records), "--out", str(tmp_path / "e")]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "Convert the photos again" not in err
    hint = f"`petal evaluate {trained} --data PHOTO_FOLDER --classes daisy`"
    assert hint in err
    followed = shlex.split(hint.strip("`").replace("PHOTO_FOLDER", str(photos)))
    assert main([*followed[1:], "--out", str(tmp_path / "e2")]) == 0


def test_suggested_commands_quote_a_run_folder_with_a_space(trained, tmp_path, capsys):
    """`petal report "my run"` said "run `petal evaluate /.../my run` to add one": the
    command, followed verbatim, named two folders."""
    import shlex
    import shutil

    from petal.cli import main
    from petal.evaluation.workdir import no_model, non_finite_stop, unfinished_resume
    from petal.training.loop import _non_finite_loss, resume_config

    run = tmp_path / "my run"
    shutil.copytree(trained, run, ignore=shutil.ignore_patterns("eval", "export", "plots",
                                                                "report.html", "tensorboard"))
    assert main(["report", str(run)]) == 0
    quoted = shlex.quote(str(run))
    assert f"run `petal evaluate {quoted}` to add one" in capsys.readouterr().out
    assert f"`petal train --resume --workdir {quoted}`" in unfinished_resume(run, 1, 2, "x")
    config = json.loads((run / "config.json").read_text())
    (run / "model.keras").unlink()
    assert no_model(run, config).endswith(f"`petal train --resume --workdir {quoted}`.")
    (run / "metrics.json").write_text('{"stopped": "non-finite loss", "epochs_completed": 1}')
    (run / "last.keras").unlink()
    assert f"(`petal train --workdir {quoted} --overwrite" in non_finite_stop(run, config)
    resolved = {"peak_lr": 0.1, "precision": "float32"}
    (run / "last.keras").touch()
    message = str(_non_finite_loss(run, "epoch 2/2", resume_config(run), resolved, 1))
    assert f"`petal train --resume --workdir {quoted}` and the new settings" in message


def _palette_bmp(indices, bits, palette, top_down=False, core=False, colours=None):
    """A BMP of colour-table ``indices`` [H, W] at ``bits`` a pixel, written by hand (PIL
    writes no 4-bit, top-down or OS/2 ones)."""
    import struct

    h, w = indices.shape
    stride = (bits * w + 31) // 32 * 4
    rows = b""
    for row in indices if top_down else indices[::-1]:
        packed = "".join(format(int(v), f"0{bits}b") for v in row).ljust(stride * 8, "0")
        rows += int(packed, 2).to_bytes(stride, "big")
    if core:
        info = struct.pack("<IHHHH", 12, w, h, 1, bits)
        table = b"".join(bytes([b, g, r]) for r, g, b in palette)
    else:
        count = len(palette) if colours is None else colours
        info = struct.pack("<IiiHHIIiiII", 40, w, -h if top_down else h, 1, bits, 0,
                           len(rows), 2835, 2835, count, 0)
        table = b"".join(bytes([b, g, r, 0]) for r, g, b in palette)
    start = 14 + len(info) + len(table)
    return b"BM" + struct.pack("<IHHI", start + len(rows), 0, 0, start) + info + table + rows


def test_the_exported_decoder_looks_up_bmp_colour_tables_as_predict_does():
    """TensorFlow's BMP decoder returned an 8-bit palette BMP's indices as grey (79% of a
    photo's pixels off, by up to 148) and refused 1- and 4-bit ones."""
    import io

    import numpy as np
    import tensorflow as tf
    from PIL import Image

    from petal.data import images
    from petal.evaluation.export import decode_like_predict

    rng = np.random.default_rng(0)
    photo = Image.fromarray(rng.integers(0, 256, (6, 13, 3), np.uint8))
    cases = {}
    for mode in ("P", "1"):  # PIL's own: 8 and 1 bits, bottom-up
        buffer = io.BytesIO()
        photo.convert(mode).save(buffer, "BMP")
        cases[mode] = buffer.getvalue()
    for bits in (1, 4, 8):
        for full in (True, False):  # all 2**bits colours (count 0), or fewer
            count = 2**bits if full else 2**bits // 2 + 1
            palette = [tuple(int(v) for v in rng.integers(0, 256, 3)) for _ in range(count)]
            indices = rng.integers(0, count, (5, 11))
            for top_down in (False, True):
                cases[bits, full, top_down] = _palette_bmp(
                    indices, bits, palette, top_down, colours=0 if full else None
                )
            cases[bits, full, "os2"] = _palette_bmp(
                indices, bits, palette + [(0, 0, 0)] * (2**bits - count), core=True
            )
    for name, data in cases.items():
        expected = images.decode_rgb(data)[0]
        np.testing.assert_array_equal(decode_like_predict(tf.constant(data)).numpy(),
                                      expected, err_msg=str(name))
    # An index past the table is black in PIL.
    data = _palette_bmp(np.array([[0, 1, 5]]), 8, [(10, 20, 30), (40, 50, 60)])
    assert images.decode_rgb(data)[0].tolist() == [[[10, 20, 30], [40, 50, 60], [0, 0, 0]]]
    assert decode_like_predict(tf.constant(data)).numpy().tolist() == [
        [[10, 20, 30], [40, 50, 60], [0, 0, 0]]
    ]
    with pytest.raises(tf.errors.InvalidArgumentError, match="the BMP is truncated"):
        decode_like_predict(tf.constant(cases[4, True, False][:-3]))
    rle = bytearray(cases[8, True, False])
    rle[30] = 1  # BI_RLE8: read as uncompressed rows, it was served as noise
    with pytest.raises(tf.errors.InvalidArgumentError, match="RLE-compressed BMP is not"):
        decode_like_predict(tf.constant(bytes(rle)))


def test_the_library_s_flags_take_true_or_false_only(trained, small_records, small_flowers,
                                                     tmp_path):
    """progress="no" drew progress bars, skip_corrupt="no" skipped, verify="no" verified and
    tflite="no" converted: any other value was taken by its truth, as overwrite no longer is."""
    from petal.data import convert
    from petal.data.inspect import inspect_records
    from petal.evaluation.evaluate import evaluate
    from petal.evaluation.export import export
    from petal.evaluation.predict import predict

    photo = next(small_flowers.glob("*/*.jpg"))
    run = _copy_run(trained, tmp_path / "run")
    before = sorted(p.name for p in run.iterdir())  # (trained's own holds what others wrote)
    for call, name in (
        (lambda v: convert(small_flowers, tmp_path / "out", progress=v), "progress"),
        (lambda v: evaluate(run, small_records, progress=v), "progress"),
        (lambda v: evaluate(run, small_records, skip_corrupt=v), "skip_corrupt"),
        (lambda v: predict(run, [photo], progress=v), "progress"),
        (lambda v: predict(run, [photo], skip_corrupt=v), "skip_corrupt"),
        (lambda v: inspect_records(small_records, progress=v), "progress"),
        (lambda v: inspect_records(small_records, verify=v), "verify"),
        (lambda v: export(run, tflite=v), "tflite"),
    ):
        with pytest.raises(PetalError, match=rf"^{name} must be True or False\. Received: "
                           rf"{name}='no'$"):
            call("no")
    assert sorted(p.name for p in run.iterdir()) == before
    assert not (tmp_path / "out").exists()


@pytest.mark.slow  # 47 s in a loaded suite run (session 40): `pytest -m slow` runs it
def test_a_leading_tilde_is_the_home_folder(trained, small_flowers, tmp_path, monkeypatch,
                                            capsys):
    """Only weights expanded ~: a shell leaves --workdir=~/runs (and a config file
    "data": "~/records") as written, and petal made a folder named ~ in the current one, or
    said a source was not found at a path under it."""
    from conftest import tiny_config
    from petal.cli import main
    from petal.data import convert, find_images, read_manifest
    from petal.data.inspect import inspect_records
    from petal.data.pipeline import load_image, train_dataset
    from petal.demo import run_demo
    from petal.evaluation.evaluate import evaluate
    from petal.evaluation.predict import predict
    from petal.evaluation.report import build_report
    from petal.models import create_model
    from petal.training.config import read_config_file
    from petal.training.loop import train

    home, cwd = tmp_path / "home", tmp_path / "cwd"
    cwd.mkdir()
    shutil.copytree(trained, home / "run")
    (home / "photos").symlink_to(small_flowers)
    (home / "config.json").write_text('{"epochs": 1}')
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(cwd)
    convert("~/photos", "~/records", image_size=32, workers=1, progress=False)
    assert read_manifest("~/records")["image_size"] == [32, 32]
    assert inspect_records("~/records", grid="~/grid.png").grid == str(home / "grid.png")
    next(iter(train_dataset("~/records", batch_size=8, cache="~/cache")))
    assert (home / "cache").is_dir()
    create_model("dense", 5, 32).save_weights(home / "w.weights.h5")
    said = []
    train(tiny_config("~/records", epochs=1, steps_per_epoch=1, model="dense",
                      weights="~/w.weights.h5"), "~/run2", log=said.append)  # fmt: skip
    assert (home / "run2" / "model.keras").is_file()
    assert any(f"weights from {home / 'w.weights.h5'}" in line for line in said), said
    # The demo's checks of whose run WORKDIR holds look where it writes (a run that no demo
    # wrote is refused, not replaced).
    with pytest.raises(PetalError, match=rf"^{re.escape(str(home / 'run2'))} holds a petal "
                       "train run that petal demo did not write"):
        run_demo("~/photos", "~/run2", log=lambda line: None)
    evaluate("~/run", "~/records", out_dir="~/eval", log=lambda line: None, warn=lambda _: None)
    assert (home / "eval" / "eval.json").is_file()
    assert build_report("~/run", eval_dir="~/eval") == home / "run" / "report.html"
    photo = sorted(small_flowers.glob("daisy/*.jpg"))[0]
    assert predict("~/run", [f"~/photos/daisy/{photo.name}"])[0]["file"] == str(
        home / "photos" / "daisy" / photo.name
    )
    assert read_config_file("~/config.json") == {"epochs": 1}
    assert len(find_images("~/photos").files) == len(find_images(home / "photos").files)
    assert load_image(f"~/photos/daisy/{photo.name}").shape[-1] == 3
    assert main(["inspect", "--grid=~/grid2.png", "~/records"]) == 0
    assert (home / "grid2.png").is_file()
    capsys.readouterr()
    assert list(cwd.iterdir()) == []


@pytest.mark.slow  # 9-10 s in CI on a Zen 3 host (session 39: 775 s): `pytest -m slow` runs it
def test_predictions_cut_short_by_a_closed_pipe_exit_141(trained, small_flowers, tmp_path):
    """`petal predict ... --json | head -1` exited 0: CPython took the kernel's partial write
    of the whole JSON (larger than the pipe's buffer) for the end, and no error came."""
    import subprocess
    import sys

    photo = str(sorted(small_flowers.glob("daisy/*.jpg"))[0])
    (tmp_path / "photos.txt").write_text("\n".join([photo] * 600))  # about 280 kB of JSON
    petal = f"{sys.executable} -c 'import sys; from petal.cli import main; sys.exit(main())'"
    done = subprocess.run(
        ["bash", "-c", f"set -o pipefail; {petal} predict {trained} --json $(cat photos.txt) "
         "| head -1"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.stdout == "[\n" and done.returncode == 141, done.stderr[-2000:]
    assert "error" not in done.stderr
