"""End to end through the command line on tiny real photos: convert, train one short epoch,
evaluate, predict, report; and ``petal demo`` (convert + quick preset + evaluate + report)."""

from __future__ import annotations

import json
import urllib.error
from pathlib import Path

import pytest

from petal.cli import main

# The quick preset shrunk to one short epoch at 32 px, its squeezenet to one fire module
# (Keras traces its steps in half the time).
SHORT = ["--set", "steps_per_epoch=3", "--set", "tensorboard=false",
         "--set", "model_options.fires=[[8,16]]"]


def test_convert_train_evaluate_predict_report(small_flowers, tmp_path, capsys):
    records, run = tmp_path / "records", tmp_path / "run"
    convert = ["--image-size", "48", "--shards", "2", "--workers", "1"]
    assert main(["convert", str(small_flowers), str(records), *convert]) == 0
    flags = ["--epochs", "1", "--batch-size", "10", "--image-size", "32", "--precision", "float32"]
    train = ["train", "--preset", "quick", "--data", str(records), "--workdir", str(run)]
    assert main([*train, *flags, *SHORT]) == 0
    out = capsys.readouterr().out
    assert "replicas=1" in out and "global_batch=10" in out and "epoch 1/1" in out
    assert "img/s" in out
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["epochs_completed"] == 1 and metrics["image_size"] == [32, 32]

    assert main(["evaluate", str(run)]) == 0  # defaults to the run's own records
    assert "precision" in capsys.readouterr().out
    assert json.loads((run / "eval" / "eval.json").read_text())["count"] == 10

    image = sorted((small_flowers / "roses").iterdir())[0]
    assert main(["predict", str(run), str(image), "--top-k", "2", "--json"]) == 0
    (result,) = json.loads(capsys.readouterr().out)
    assert result["file"] == str(image) and len(result["predictions"]) == 2

    assert main(["report", str(run)]) == 0
    html = Path(capsys.readouterr().out.strip())
    assert html == run / "report.html" and html.is_file()
    assert "plots/curves.png" in html.read_text()


def test_cli_errors_are_one_line_and_exit_2(small_flowers, tmp_path, capsys):
    assert main(["train", "--preset", "fast", "--workdir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "Unknown preset 'fast'" in err and "codelab-squeezenet" in err
    assert len(err.strip().splitlines()) == 1
    workdir = str(tmp_path / "r")
    bad = ["train", "--preset", "quick", "--data", str(small_flowers), "--strategy", "warp"]
    assert main([*bad, "--workdir", workdir]) == 2
    assert "Unknown strategy 'warp'" in capsys.readouterr().err
    assert main(["train", "--set", "epochs=x", "--workdir", workdir]) == 2
    assert "epochs must be a whole number" in capsys.readouterr().err
    assert main(["predict", str(tmp_path / "nowhere"), "a.jpg"]) == 2
    assert "not a petal work directory" in capsys.readouterr().err


def test_demo_on_a_local_folder(small_flowers, tmp_path, capsys):
    workdir = tmp_path / "demo"
    small = [
        f"--set={kv}" for kv in ("image_size=32", "epochs=1", "batch_size=10", "precision=float32")
    ]
    demo = ["demo", "--data", str(small_flowers), "--workdir", str(workdir)]
    assert main([*demo, *small, *SHORT]) == 0
    out = capsys.readouterr().out
    assert "report written to" in out
    manifest = json.loads((workdir / "records" / "manifest.json").read_text())
    assert manifest["image_size"] == [32, 32]
    for name in ("model.keras", "metrics.json", "eval/eval.json", "report.html"):
        assert (workdir / name).is_file(), name


def test_demo_offline_says_how_to_pass_data(tmp_path, monkeypatch):
    from petal import demo
    from petal.errors import PetalError

    def offline(*args, **kwargs):
        raise urllib.error.URLError("Temporary failure in name resolution")

    monkeypatch.delenv("PETAL_DATA", raising=False)
    monkeypatch.setenv("PETAL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(demo.urllib.request, "urlopen", offline)
    with pytest.raises(PetalError, match="offline.*--data FOLDER.*PETAL_DATA"):
        demo.resolve_data(None, log=lambda line: None)
    assert not list((tmp_path / "cache").glob("*.part"))
    monkeypatch.setenv("PETAL_DATA", str(tmp_path))
    assert demo.resolve_data(None, log=lambda line: None) == tmp_path


def test_demo_checks_its_settings_and_folder_before_the_download(tmp_path, monkeypatch):
    from petal import demo
    from petal.errors import PetalError

    def download(*args, **kwargs):
        raise AssertionError("the photos were downloaded before the settings were checked")

    monkeypatch.delenv("PETAL_DATA", raising=False)
    monkeypatch.setattr(demo, "download_flowers", download)
    quiet = {"log": lambda line: None}
    with pytest.raises(PetalError, match=r"epochs must be a whole number"):
        demo.run_demo(None, tmp_path / "demo", overrides=("epochs=x",), **quiet)
    with pytest.raises(PetalError, match=r"batch_size must be >= 1|batch_size.*positive"):
        demo.run_demo(None, tmp_path / "demo", overrides=("batch_size=0",), **quiet)
    with pytest.raises(PetalError, match=r"Unknown model 'resnet9000'"):
        demo.run_demo(None, tmp_path / "demo", overrides=("model=resnet9000",), **quiet)
    # It converted --data but trained on these, then evaluated on its own records.
    with pytest.raises(PetalError, match=r"--set data=... would train on other data than it "
                       r"evaluates\. Pass the photos as --data"):  # fmt: skip
        demo.run_demo(None, tmp_path / "demo", overrides=("data=/tmp/other",), **quiet)
    with pytest.raises(PetalError, match=r"^Demo folder /proc/petal-demo cannot be written: "
                       r"nothing can be written in /proc"):
        demo.run_demo(None, "/proc/petal-demo", **quiet)
    assert not (tmp_path / "demo").exists()


def test_demo_refuses_to_replace_a_run_it_did_not_write(small_flowers, tmp_path, monkeypatch):
    from petal import demo
    from petal.errors import PetalError

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"data": str(tmp_path / "records")}))
    (run / "model.keras").write_bytes(b"weeks of training")

    def replace(*args, **kwargs):
        raise AssertionError("the demo went on to replace the run")

    monkeypatch.setattr("petal.data.convert", replace)
    monkeypatch.setattr("petal.training.loop.train", replace)
    with pytest.raises(PetalError, match=r"run holds a petal train run that petal demo did not"):
        demo.run_demo(small_flowers, run, log=lambda line: None)
    assert (run / "model.keras").read_bytes() == b"weeks of training"
    with pytest.raises(PetalError, match=r"Demo data .*photo.jpg is a file; pass --data a folder"):
        (tmp_path / "photo.jpg").write_bytes(b"")
        demo.resolve_data(tmp_path / "photo.jpg")


def _photos(src: Path, dst: Path, classes: int, per_class: int) -> Path:
    from conftest import link_photos

    return link_photos(src, dst, per_class, classes)


@pytest.fixture
def demo_without_training(monkeypatch):
    """``run_demo`` converting for real (one worker) but neither training nor evaluating;
    yields the list of conversions' sources and a function that runs the demo and
    returns its log."""
    from petal import demo
    from petal.data import writer

    converted = []

    def convert(source, output, **kwargs):
        converted.append(Path(source))
        return writer.convert(source, output, **{**kwargs, "workers": 1, "progress": False})

    monkeypatch.setattr("petal.data.convert", convert)
    monkeypatch.setattr("petal.training.loop.train", lambda *a, **k: {})
    monkeypatch.setattr("petal.evaluation.evaluate.evaluate", lambda *a, **k: {})
    monkeypatch.setattr("petal.evaluation.report.build_report", lambda workdir: "report.html")

    def run(data, workdir):
        lines = []
        demo.run_demo(data, workdir, overrides=("image_size=32",), log=lines.append)
        return "\n".join(lines)

    return converted, run


def test_demo_never_replaces_records_it_did_not_write(
    small_records, small_flowers, tmp_path, demo_without_training
):
    import shutil

    from petal.errors import PetalError

    converted, run_demo = demo_without_training
    # Someone's 64 px records of the same photos, where the demo wants 32 px ones.
    workdir = tmp_path / "demo"
    shutil.copytree(small_records, workdir / "records")
    before = (workdir / "records" / "manifest.json").read_text()
    with pytest.raises(PetalError, match=r"^\S+/records holds records that petal demo did not "
                       r"write \(converted from \S+small_flowers\S*\); the demo would replace "
                       r"them \(they are 64x64, the demo needs 32x32\)\. Pass another "
                       r"--workdir, or delete \S+/records\.$"):  # fmt: skip
        run_demo(small_flowers, workdir)
    photos = _photos(small_flowers, tmp_path / "photos", classes=2, per_class=5)
    with pytest.raises(PetalError, match=r"would replace them \(with records of \S+photos\)"):
        run_demo(photos, workdir)
    assert (workdir / "records" / "manifest.json").read_text() == before
    assert not converted
    # Files that are no records at all are no more the demo's.
    (tmp_path / "notes" / "records").mkdir(parents=True)
    (tmp_path / "notes" / "records" / "notes.txt").write_text("mine")
    with pytest.raises(PetalError, match=r"records holds files that petal demo did not write"):
        run_demo(photos, tmp_path / "notes")
    assert not converted
    # A run trained on them, no demo.json: someone's too (the last test of this file).
    (workdir / "config.json").write_text(json.dumps({"data": str(workdir / "records")}))
    with pytest.raises(PetalError, match=r"holds a petal train run that petal demo did not"):
        run_demo(photos, workdir)
    assert not converted


def test_demo_converts_again_when_the_photos_change(small_flowers, tmp_path, demo_without_training):
    converted, run_demo = demo_without_training
    photos = _photos(small_flowers, tmp_path / "photos", classes=3, per_class=5)
    workdir = tmp_path / "demo"
    assert "converting" in run_demo(photos, workdir) and len(converted) == 1
    assert "reusing the records" in run_demo(photos, workdir) and len(converted) == 1
    extra = sorted((small_flowers / "roses").iterdir())[-1]
    (photos / "daisy" / extra.name).symlink_to(extra.resolve())
    log = run_demo(photos, workdir)
    assert "the photos changed: 16 image files now, 15 when they were converted" in log
    assert json.loads((workdir / "records" / "manifest.json").read_text())["written"] == 16
    for f in (photos / "daisy").iterdir():
        f.unlink()
    (photos / "daisy").rmdir()
    log = run_demo(photos, workdir)
    assert "the photos changed: their classes are now dandelion, roses" in log
    assert json.loads((workdir / "records" / "manifest.json").read_text())["classes"] == [
        "dandelion",
        "roses",
    ]
    # Records the demo converted from other photos are its own to replace.
    assert "converted from other photos" in run_demo(small_flowers, workdir)
    assert converted == [photos] * 3 + [small_flowers]


def test_demo_leaves_the_records_of_a_run_training_in_its_folder_alone(
    small_flowers, tmp_path, demo_without_training
):
    # It converted the new photos over the records the run was reading, then refused.
    import os
    import socket

    from petal.errors import PetalError
    from petal.running import RUNNING_FILE

    converted, run_demo = demo_without_training
    photos = _photos(small_flowers, tmp_path / "photos", classes=3, per_class=5)
    workdir = tmp_path / "demo"
    run_demo(photos, workdir)
    manifest = (workdir / "records" / "manifest.json").read_text()
    holder = {"pid": os.getppid(), "host": socket.gethostname(), "doing": "training in it"}
    (workdir / RUNNING_FILE).write_text(json.dumps(holder))
    with pytest.raises(PetalError, match=rf"is in use: process {os.getppid()} on .* is "
                                         "training in it; wait for it to end"):
        run_demo(small_flowers, workdir)
    assert converted == [photos]
    assert (workdir / "records" / "manifest.json").read_text() == manifest


def test_demo_errors_name_its_own_options(small_flowers, tmp_path, demo_without_training, capsys):
    from petal.errors import PetalError

    converted, run_demo = demo_without_training
    (tmp_path / "q.json").write_text("{}")
    with pytest.raises(PetalError, match=r"^Demo folder \S+q\.json is a file; pass --workdir"):
        run_demo(small_flowers, tmp_path / "q.json")
    photos = _photos(small_flowers, tmp_path / "photos", classes=2, per_class=5)
    for workdir in (photos, photos / "roses" / "demo"):
        with pytest.raises(PetalError, match=r"the photos folder \S+photos: its records would be "
                           r"read as a class\. Pass a --workdir outside --data\.$"):  # fmt: skip
            run_demo(photos, workdir)
    one = _photos(small_flowers, tmp_path / "one", classes=1, per_class=5)
    needs_two = r"holds one class sub-folder \('daisy'\); petal demo trains a classifier and "
    with pytest.raises(PetalError, match=needs_two + r"needs at least two: pass --data a folder"):
        run_demo(one, tmp_path / "demo")
    assert not converted
    two = _photos(small_flowers, tmp_path / "two", classes=2, per_class=1)
    with pytest.raises(PetalError, match=r"too few for petal demo: it keeps 0\.19 of each "
                       r"class's photos \(rounded\) to validate on, none here\. Add photos to a "
                       r"class sub-folder of --data \(at least 3 photos\)"):  # fmt: skip
        run_demo(two, tmp_path / "demo")
    # Through the command line: one line, no option that petal demo lacks.
    assert main(["demo", "--data", str(photos), "--workdir", str(photos / "demo")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("petal demo: error: Demo folder ") and len(err.splitlines()) == 1


def test_demo_warnings_name_no_option_it_lacks(small_flowers, tmp_path, demo_without_training):
    """convert's warnings about the split tell a demo user what the demo can change."""
    _, run_demo = demo_without_training
    photos = _photos(small_flowers, tmp_path / "photos", classes=2, per_class=8)
    for extra in sorted((photos / "dandelion").iterdir())[2:]:
        extra.unlink()  # 2 dandelions: 0.19 of them rounds to no validation image
    log = run_demo(photos, tmp_path / "demo")
    assert "no validation images for class dandelion" in log, log
    assert "raise --val-fraction" not in log and "lower --val-fraction" not in log
    assert "its accuracy is not measured; add photos to it (petal demo keeps 0.19 of each " in log
    assert "petal convert --val-fraction sets another share)" in log


def _archive(path: Path, members: dict[str, bytes]) -> Path:
    import io
    import tarfile

    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_demo_deletes_a_damaged_cached_archive(tmp_path, monkeypatch):
    from petal import demo
    from petal.errors import PetalError

    def no_network(*args, **kwargs):
        raise AssertionError("the test downloaded the archive")

    monkeypatch.setattr(demo.urllib.request, "urlopen", no_network)
    monkeypatch.setenv("PETAL_CACHE", str(tmp_path))
    archive = tmp_path / "flower_photos.tgz"
    good = {"flower_photos/roses/a.jpg": b"a", "flower_photos/tulips/b.jpg": b"b"}
    full = _archive(tmp_path / "full.tgz", good).read_bytes()
    quiet = {"log": lambda line: None}
    for content, reason in (
        (b"garbage\n", r"is damaged \(not a tar archive\)"),
        (full[: len(full) // 2], r"is damaged \("),
        (_archive(tmp_path / "other.tgz", {"photos/roses/a.jpg": b"a"}).read_bytes(),
         r"is not the tf_flowers archive \(no flower_photos/roses/ in it\)"),
    ):  # fmt: skip
        archive.write_bytes(content)
        with pytest.raises(PetalError, match=rf"^The cached (tf_flowers )?archive {archive} "
                           rf"{reason}.*; it was deleted, so the next petal demo downloads it "
                           r"again \(or pass --data FOLDER\)\.$"):  # fmt: skip
            demo.download_flowers(**quiet)
        assert not archive.exists() and not (tmp_path / "flower_photos").exists()
    archive.write_bytes(full)
    folder = demo.download_flowers(**quiet)
    assert folder == tmp_path / "flower_photos"
    assert (folder / "roses" / "a.jpg").read_bytes() == b"a"


def test_demo_replaces_no_run_or_records_without_its_marker(
    small_records, small_flowers, tmp_path, demo_without_training
):
    """petal convert into WORKDIR/records, petal train there, then petal demo in WORKDIR: it
    once took both for a demo's (the run trained on WORKDIR/records) and replaced them."""
    import shutil

    from petal.data import writer
    from petal.errors import PetalError

    converted, run_demo = demo_without_training
    workdir = tmp_path / "mine"
    shutil.copytree(small_records, workdir / "records")  # 64 px; the demo wants 32 px
    manifest = json.loads((workdir / "records" / "manifest.json").read_text())
    splits = manifest["splits"]
    resolved = {"records_source": manifest["source"], "classes": manifest["classes"],
                "records_size": manifest["image_size"], "train_count": splits["train"]["count"],
                "val_count": splits["validation"]["count"]}  # what petal train saves
    run = json.dumps({"data": str(workdir / "records"), "model": "codelab_convnet",
                      "resolved": resolved})  # fmt: skip
    (workdir / "config.json").write_text(run)
    (workdir / "model.keras").write_bytes(b"my run")
    with pytest.raises(PetalError, match=rf"^{workdir} holds a petal train run that petal demo "
                       rf"did not write \(its data is {workdir}/records\); the demo would "
                       r"replace it\. Pass another --workdir\.$"):  # fmt: skip
        run_demo(small_flowers, workdir)
    assert not converted and not (workdir / "demo.json").exists()
    assert (workdir / "config.json").read_text() == run
    assert (workdir / "model.keras").read_bytes() == b"my run"
    assert json.loads((workdir / "records" / "manifest.json").read_text()) == manifest
    # Someone's records of the very photos the demo converts are reused, not claimed: the
    # run trained on them is the demo's to replace, the records stay theirs.
    photos = _photos(small_flowers, tmp_path / "photos", classes=2, per_class=5)
    workdir = tmp_path / "reused"
    writer.convert(photos, workdir / "records", image_size=32, workers=1, progress=False)
    assert "reusing the records" in run_demo(photos, workdir)
    (workdir / "config.json").write_text(json.dumps({"data": str(workdir / "records")}))
    assert "reusing the records" in run_demo(photos, workdir)
    extra = sorted((small_flowers / "roses").iterdir())[-1]
    (photos / "daisy" / extra.name).symlink_to(extra.resolve())
    with pytest.raises(PetalError, match=r"holds records that petal demo did not write"):
        run_demo(photos, workdir)
    assert not converted


def test_demo_names_the_photos_it_skips(small_flowers, tmp_path, demo_without_training):
    """It said only "skipped 2 of 12 found"; petal convert names each file and its reason."""
    import os

    _, run_demo = demo_without_training
    photos = _photos(small_flowers, tmp_path / "photos", classes=2, per_class=5)
    (photos / "daisy" / "broken.jpg").write_text("not a photo")
    (photos / "dandelion" / os.fsdecode(b"bad\xff.jpg")).write_bytes(b"junk")
    workdir = tmp_path / "demo"
    lines = run_demo(photos, workdir).splitlines()
    assert "petal demo: skipped daisy/broken.jpg: not an image (no known image format in the " \
        "file)" in lines
    assert "petal demo: skipped dandelion/bad\\xff.jpg: file name is not valid UTF-8 (records " \
        "store it as UTF-8 text); rename it" in lines
    assert any(line.startswith("petal demo: written 10 (") for line in lines)
    # Past ten, the rest are in the manifest, named by its path.
    for i in range(10):
        (photos / "daisy" / f"broken{i}.jpg").write_text("not a photo")
    lines = run_demo(photos, workdir).splitlines()
    assert sum(line.startswith("petal demo: skipped ") for line in lines) == 10
    assert f"petal demo: ... 2 more skipped: see {workdir}/records/manifest.json" in lines


def test_demo_refuses_a_training_size_without_crop_before_converting(
    small_flowers, tmp_path, demo_without_training
):
    """train_image_size without the crop augmentation failed in training, after converting."""
    from petal import demo
    from petal.errors import PetalError

    converted, _ = demo_without_training
    photos = _photos(small_flowers, tmp_path / "photos", classes=2, per_class=5)
    workdir = tmp_path / "demo"
    quiet = {"log": lambda line: None}
    # Every change it needs at once: the crop augmentation passed, train then refused the
    # quick preset's squeezenet (no any_size), after converting.
    with pytest.raises(PetalError, match=r"^train_image_size 24 needs the 'crop' augmentation, "
                       r"which resizes its crops to that size, and a model that takes 24x24 "
                       r"crops as well as its 32x32 input: pass --set augment=codelab\+crop "
                       r"--set model_options\.any_size=true, or drop train_image_size\. "
                       r"Received: model='squeezenet', augment='codelab', "
                       r"train_image_size=24$"):  # fmt: skip
        demo.run_demo(photos, workdir, overrides=("image_size=32", "train_image_size=24"), **quiet)
    with pytest.raises(PetalError, match=r"pass --set model_options\.any_size=true, or drop"):
        overrides = ("image_size=32", "train_image_size=24", "augment=codelab+crop")
        demo.run_demo(photos, workdir, overrides=overrides, **quiet)
    with pytest.raises(PetalError, match=r"--set model=squeezenet --set model_options\.any_siz"):
        overrides = ("train_image_size=24", "augment=none", "model=dense")
        demo.run_demo(photos, workdir, overrides=overrides, **quiet)
    assert not converted and not workdir.exists()
    overrides = ("image_size=32", "train_image_size=24", "augment=codelab+crop",
                 "model_options.any_size=true")
    demo.run_demo(photos, workdir, overrides=overrides, **quiet)
    assert converted == [photos]


def test_demo_refused_by_a_conversion_into_its_records_names_workdir(
    small_flowers, tmp_path, demo_without_training
):
    # convert's refusal said "or pass another DST": the demo has no such argument.
    import os
    import socket

    from petal.errors import PetalError
    from petal.running import READING_PREFIX, RUNNING_FILE

    converted, run_demo = demo_without_training
    photos = _photos(small_flowers, tmp_path / "photos", classes=2, per_class=5)
    others = _photos(small_flowers, tmp_path / "others", classes=3, per_class=5)
    records = tmp_path / "demo" / "records"
    run_demo(photos, records.parent)
    host, pid = socket.gethostname(), os.getppid()
    holder = {"pid": pid, "host": host, "doing": "converting into it"}
    (records / RUNNING_FILE).write_text(json.dumps(holder))  # another demo, converting
    with pytest.raises(PetalError, match=(
        rf"^{records} is in use: process {pid} on .* is converting into it; wait for it to end "
        rf"or stop it, or pass another --workdir \(if it is not running, delete "
        rf"{records / RUNNING_FILE}\)\.$"
    )):
        run_demo(others, records.parent)
    (records / RUNNING_FILE).unlink()
    reader = records / f"{READING_PREFIX}{host}-{pid}"  # a run training from them
    reader.write_text(json.dumps({"pid": pid, "host": host, "doing": "training from it"}))
    with pytest.raises(PetalError, match=(
        rf"^{records} is in use: process {pid} on .* is training from it; wait for it to end "
        rf"or stop it, or pass another --workdir \(if it is not running, delete {reader}\)\.$"
    )):
        run_demo(others, records.parent)  # to convert the others over the records it reads
    assert converted == [photos, others]  # refused by convert itself, before it wrote


def test_demo_refuses_classes_before_converting(small_flowers, tmp_path, monkeypatch):
    # It converted every photo, then train refused the classes with advice of --classes,
    # an option the demo does not have.
    from petal import demo
    from petal.errors import PetalError

    def convert(*args, **kwargs):
        raise AssertionError("the photos were converted before the settings were checked")

    monkeypatch.setattr("petal.data.convert", convert)
    with pytest.raises(PetalError) as caught:
        demo.run_demo(small_flowers, tmp_path / "demo", overrides=("classes=daisy,roses",),
                      log=lambda line: None)
    assert str(caught.value) == (
        "petal demo converts every class folder of --data, and trains on them all: --set "
        "classes=... cannot choose among them. Pass --data a folder holding only those classes "
        "(links to their folders will do). Received: classes='daisy,roses'"
    )
    assert not (tmp_path / "demo").exists()


def test_demo_errors_and_warnings_name_its_set_not_train_s_options(
    small_flowers, tmp_path, monkeypatch
):
    """Train's messages named --strategy, --epochs, --image-size... which petal demo refuses."""
    from petal import demo
    from petal.errors import PetalError

    photos = _photos(small_flowers, tmp_path / "photos", classes=2, per_class=5)
    quiet = {"log": lambda line: None}
    with pytest.raises(PetalError, match=r"pass --set image_size=71 or more \(petal demo "
                       r"converts its photos at that size\)\. Received: image_size=32$"):
        demo.run_demo(photos, tmp_path / "x", overrides=("model=xception", "image_size=32"),
                      **quiet)  # fmt: skip
    assert not (tmp_path / "x" / "records").exists()  # refused before converting
    with pytest.raises(PetalError, match=r"^petal demo trains the quick preset, whose fields "
                       r"--set changes"):  # fmt: skip
        demo.run_demo(photos, tmp_path / "x", overrides=("preset=codelab-dense",), **quiet)

    def train(config, workdir, overwrite, log):
        log("petal train: warning: precision mixed_float16 trains slower than float32 on a "
            "CPU (...): use --precision auto or float32 unless you are checking numerics")
        raise PetalError("The learning-rate warm-up is longer than the 1 epoch(s) to train: "
                         "pass --epochs 3 or more, or pass --strategy cpu; `--weights none` "
                         "on the command line (`petal models --image-size 32`)")

    monkeypatch.setattr("petal.training.loop.train", train)
    monkeypatch.setattr("petal.data.convert", _one_worker_convert)
    lines = []
    with pytest.raises(PetalError) as caught:
        demo.run_demo(photos, tmp_path / "demo", overrides=("image_size=32",), log=lines.append)
    assert str(caught.value) == (
        "The learning-rate warm-up is longer than the 1 epoch(s) to train: pass --set epochs=3 "
        "or more, or pass --set strategy=cpu; `--set weights=null` (`petal models --image-size "
        "32`)"
    )
    assert "use --set precision=auto or float32 unless" in lines[-1]


def _one_worker_convert(source, output, **kwargs):
    from petal.data import writer

    return writer.convert(source, output, **{**kwargs, "workers": 1, "progress": False})


def test_demo_says_it_replaces_its_previous_run(small_flowers, tmp_path, demo_without_training):
    _, run_demo = demo_without_training
    photos = _photos(small_flowers, tmp_path / "photos", classes=2, per_class=5)
    workdir = tmp_path / "demo"
    assert "replacing" not in run_demo(photos, workdir)
    (workdir / "config.json").write_text(json.dumps({"data": str(workdir / "records")}))
    assert (f"petal demo: the previous demo run in {workdir} (its model, metrics, eval and "
            "report) is replaced once training's checks pass") in run_demo(
                photos, workdir)  # fmt: skip


def test_demo_data_from_petal_data_says_so(tmp_path, monkeypatch, capsys):
    missing, file = tmp_path / "nowhere", tmp_path / "photo.jpg"
    file.write_bytes(b"x")
    fix = "set PETAL_DATA to a folder of class sub-folders, or unset it, or pass --data.\n"
    monkeypatch.setenv("PETAL_DATA", str(missing))
    assert main(["demo", "--workdir", str(tmp_path / "demo")]) == 2
    assert capsys.readouterr().err == (
        f"petal demo: error: Demo data folder not found: {missing} (from $PETAL_DATA); {fix}"
    )
    monkeypatch.setenv("PETAL_DATA", str(file))
    assert main(["demo", "--workdir", str(tmp_path / "demo")]) == 2
    assert capsys.readouterr().err == (
        f"petal demo: error: Demo data {file} (from $PETAL_DATA) is a file; {fix}"
    )


def test_demo_names_its_set_for_skip_corrupt_and_evaluates_with_it(
    small_flowers, tmp_path, demo_without_training, monkeypatch
):
    """Train's "or train with --skip-corrupt" named an option petal demo refuses; and
    --set skip_corrupt=true trained, then the demo's evaluation stopped on the same record."""
    from petal import demo

    said = "Corrupt input in R: ...; restore it, or train with --skip-corrupt."
    assert demo.demo_options(said) == (
        "Corrupt input in R: ...; restore it, or train with --set skip_corrupt=true."
    )
    asked = []
    monkeypatch.setattr("petal.evaluation.evaluate.evaluate", lambda *a, **k: asked.append(k))
    photos = _photos(small_flowers, tmp_path / "photos", classes=2, per_class=5)
    for value in ("true", "false"):
        demo.run_demo(photos, tmp_path / "demo", overrides=("image_size=32",
                      f"skip_corrupt={value}"), log=lambda line: None)  # fmt: skip
    assert [k["skip_corrupt"] for k in asked] == [True, False]


def test_demo_refused_by_train_keeps_and_does_not_say_it_replaced_the_previous_run(
    small_flowers, tmp_path, monkeypatch
):
    """"replacing the previous demo run" was said, then train refused and kept it."""
    from petal import demo
    from petal.errors import PetalError

    monkeypatch.setattr("petal.data.convert", _one_worker_convert)
    photos = _photos(small_flowers, tmp_path / "photos", classes=2, per_class=5)
    workdir = tmp_path / "demo"
    with monkeypatch.context() as patch:  # a previous demo run (its config.json)
        patch.setattr("petal.training.loop.train", lambda *a, **k: {})
        patch.setattr("petal.evaluation.evaluate.evaluate", lambda *a, **k: {})
        patch.setattr("petal.evaluation.report.build_report", lambda workdir: "report.html")
        demo.run_demo(photos, workdir, overrides=("image_size=32",), log=lambda line: None)
    previous = json.dumps({"data": str(workdir / "records")})
    (workdir / "config.json").write_text(previous)
    lines = []
    with pytest.raises(PetalError, match="fewer than one global batch of 500"):
        demo.run_demo(photos, workdir, overrides=("image_size=32", "model=dense",
                      "batch_size=500"), log=lines.append)  # fmt: skip
    assert (workdir / "config.json").read_text() == previous
    assert not [line for line in lines if "replacing" in line]
    assert (f"petal demo: the previous demo run in {workdir} (its model, metrics, eval and "
            "report) is replaced once training's checks pass") in lines  # fmt: skip
