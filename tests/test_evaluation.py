"""Metrics (golden values), and evaluate / predict / export / report on a tiny trained model."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from conftest import settled, tiny_config, titles_apart
from petal.errors import PetalError
from petal.evaluation import metrics

# --- metrics: golden values worked out by hand ---------------------------------------------

Y_TRUE = np.array([0, 0, 1, 1, 2, 2])
PROBS = np.array(
    [
        [0.6, 0.3, 0.1],  # true 0, predicted 0
        [0.3, 0.5, 0.2],  # true 0, predicted 1 (0 is second)
        [0.1, 0.8, 0.1],  # true 1, predicted 1
        [0.2, 0.7, 0.1],  # true 1, predicted 1
        [0.1, 0.2, 0.7],  # true 2, predicted 2
        [0.5, 0.4, 0.1],  # true 2, predicted 0 (2 is last)
    ]
)


def test_confusion_matrix_and_accuracy():
    pred = PROBS.argmax(1)
    cm = metrics.confusion_matrix(Y_TRUE, pred, 3)
    np.testing.assert_array_equal(cm, [[1, 1, 0], [0, 2, 0], [1, 0, 1]])
    assert metrics.accuracy(Y_TRUE, pred) == pytest.approx(4 / 6)


def test_top_k_accuracy():
    assert metrics.top_k_accuracy(Y_TRUE, PROBS, 1) == pytest.approx(4 / 6)
    assert metrics.top_k_accuracy(Y_TRUE, PROBS, 2) == pytest.approx(5 / 6)
    assert metrics.top_k_accuracy(Y_TRUE, PROBS, 3) == 1.0
    assert metrics.top_k_accuracy(Y_TRUE, PROBS, 10) == 1.0  # k capped at the classes
    # Ties go to the lower class index, whatever the sort does.
    assert metrics.top_k_accuracy([1], [[0.4, 0.4, 0.2]], 1) == 0.0
    assert metrics.top_k_accuracy([0], [[0.4, 0.4, 0.2]], 1) == 1.0


def test_accuracies_of_inputs_of_other_lengths_are_refused():
    # NumPy broadcast one label over three: 1/3, where confusion_matrix refused them.
    probs = np.array([[0.9, 0.1], [0.1, 0.9], [0.2, 0.8]])
    for call, said in (
        (lambda: metrics.accuracy([0, 1, 2], [0]), "y_pred differ in length. Received: 3 and 1"),
        (lambda: metrics.accuracy([0, 1], [0, 1, 1]), "y_pred differ in length. Received: 2 and 3"),
        (lambda: metrics.top_k_accuracy([0], probs, 1), "probs differ in length. Received: 1 "
                                                        "and 3"),
        (lambda: metrics.top_k_accuracy([0, 1, 1], probs[:1], 1), "Received: 3 and 1"),
    ):  # fmt: skip
        with pytest.raises(PetalError, match=rf"^y_true and .*{said}$"):
            call()


def test_per_class_precision_recall_f1():
    cm = np.array([[1, 1, 0], [0, 2, 0], [1, 0, 1]])
    got = metrics.per_class_metrics(cm, ["a", "b", "c"])
    pc = got["per_class"]
    assert pc["a"] == pytest.approx({"precision": 0.5, "recall": 0.5, "f1": 0.5, "support": 2})
    assert pc["b"] == pytest.approx({"precision": 2 / 3, "recall": 1.0, "f1": 0.8, "support": 2})
    assert pc["c"] == pytest.approx({"precision": 1.0, "recall": 0.5, "f1": 2 / 3, "support": 2})
    assert got["macro"]["f1"] == pytest.approx((0.5 + 0.8 + 2 / 3) / 3)
    assert got["macro"]["precision"] == pytest.approx((0.5 + 2 / 3 + 1.0) / 3)
    assert got["weighted"]["recall"] == pytest.approx(4 / 6)  # equals accuracy


def test_macro_averages_are_over_the_classes_in_the_data():
    # Class c has no images (data of some of a model's classes): no recall to average.
    cm = metrics.confusion_matrix([0, 0, 1, 1], [0, 2, 1, 1], 3)
    got = metrics.per_class_metrics(cm, ["a", "b", "c"])
    assert got["macro"]["recall"] == pytest.approx((0.5 + 1.0) / 2)
    assert got["macro"]["precision"] == pytest.approx((1.0 + 1.0) / 2)
    assert got["per_class"]["c"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 0}


def test_zero_division_is_zero():
    # Class 2 is never predicted and never present: its ratios are 0, not NaN.
    cm = metrics.confusion_matrix([0, 1, 1], [0, 1, 0], 3)
    pc = metrics.per_class_metrics(cm, ["a", "b", "c"])["per_class"]
    assert pc["c"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 0}
    assert pc["a"]["precision"] == 0.5


def test_a_class_with_images_the_model_never_predicted_is_said():
    """Its precision (0/0) was reported as 0.000 and pulled the macro averages down without
    a word; a class neither in the data nor predicted is said elsewhere (no image scored)."""
    from petal.evaluation.evaluate import _unpredicted_warning

    probs = np.eye(4)[[0, 0, 1, 0, 1]]  # b and a predicted; c and d never
    report = metrics.classification_report([0, 1, 1, 2, 2], probs, ["a", "b", "c", "d"])
    assert report["per_class"]["c"]["precision"] == 0.0
    assert report["macro"]["precision"] == pytest.approx((1 / 3 + 1 / 2 + 0.0) / 3)
    assert _unpredicted_warning(report, "validation", "recs") == (
        "Split 'validation' of recs: the model predicted no image as c; its precision (no "
        "predictions to count) is reported as 0.000 and counted so in the macro averages"
    )
    both = metrics.classification_report([0, 1, 2, 3], probs[:4], ["a", "b", "c", "d"])
    assert "as c, d; their precision" in _unpredicted_warning(both, "all", "x")
    everyone = np.eye(4)
    full = metrics.classification_report([0, 1, 2, 3], everyone, ["a", "b", "c", "d"])
    assert _unpredicted_warning(full, "all", "x") is None


def test_classification_report_is_json_ready():
    report = metrics.classification_report(Y_TRUE, PROBS, ["a", "b", "c"], ks=(1, 2))
    assert report["count"] == 6
    assert report["top_k_accuracy"] == pytest.approx({"top_1": 4 / 6, "top_2": 5 / 6})
    json.dumps(report)
    with pytest.raises(PetalError, match="probs must be"):
        metrics.classification_report(Y_TRUE, PROBS, ["a", "b"])
    with pytest.raises(PetalError, match="class index 3, outside the model's 3 classes"):
        metrics.confusion_matrix([0, 3], [0, 1], 3)


def test_top_k_k_must_be_a_whole_number_of_at_least_one():
    # 1.5 and "2" failed inside NumPy ("slice indices must be integers", "'<' not supported").
    for k in (1.5, "2", 0, True, None):
        with pytest.raises(PetalError, match=rf"^k must be an integer >= 1 \(the k of a "
                           rf"top-k\)\. Received: k={re.escape(repr(k))}$"):  # fmt: skip
            metrics.top_k_accuracy(Y_TRUE, PROBS, k)
        with pytest.raises(PetalError, match="^k must be an integer >= 1"):
            metrics.top_k(PROBS, k)
        with pytest.raises(PetalError, match="^k must be an integer >= 1"):
            metrics.classification_report(Y_TRUE, PROBS, ["a", "b", "c"], ks=(1, k))
    assert metrics.top_k_accuracy(Y_TRUE, PROBS, np.int64(2)) == pytest.approx(5 / 6)


def test_classification_report_names_a_k_above_the_classes_by_the_k_counted():
    # top_5 of 3 classes is their top-3 (1.0): named so, as `petal evaluate --top-k 5` does.
    report = metrics.classification_report(Y_TRUE, PROBS, ["a", "b", "c"], ks=(1, 5))
    assert report["top_k_accuracy"] == pytest.approx({"top_1": 4 / 6, "top_3": 1.0})
    report = metrics.classification_report(Y_TRUE, PROBS, ["a", "b", "c"], ks=(5, 3, 1, 2))
    assert list(report["top_k_accuracy"]) == ["top_1", "top_2", "top_3"]


def test_labels_outside_the_model_classes_say_which_and_what_to_do():
    y_true = np.array([0, 1, 2, 0, 1, 3])  # a record's class index beyond the model's head
    with pytest.raises(PetalError, match=r"^The data's labels \(y_true, the records' class "
                       r"index\) hold class index 3, outside the model's 3 classes \(0\.\.2\); "
                       r"find the records with a bad class index \(petal inspect DATA "
                       r"--verify\) and convert the images again \(petal convert\), or "
                       r"evaluate data of the model's classes\. "
                       r"Received: y_true min=0, max=3$"):  # fmt: skip
        metrics.classification_report(y_true, PROBS, ["a", "b", "c"])
    with pytest.raises(PetalError, match=r"^y_pred holds class index -1, .*; pass predicted "
                       r"class indices in 0\.\.2\. Received: y_pred min=-1, max=1$"):  # fmt: skip
        metrics.confusion_matrix([0, 1], [-1, 1], 3)


# --- evaluate / predict / export / report on conftest's tiny trained run ------------------


#: For evaluate calls checked for their warnings and counts alone: no misclassified grid
#: (its plot takes about a second a call, the test's other evaluations a second or two).
NO_GRID = {"max_misclassified": 0}


def _image_files(folder: Path, n: int) -> list[Path]:
    return sorted(p for p in folder.rglob("*.jpg"))[:n]


def test_evaluate_on_records_matches_training_validation(trained, small_records):
    from petal.evaluation.evaluate import evaluate
    from petal.training.callbacks import read_history

    report = evaluate(trained, small_records, log=lambda line: None)
    assert report["count"] == 10 and report["split"] == "validation"
    assert np.sum(report["confusion_matrix"]) == 10
    assert set(report["per_class"]) == {"daisy", "dandelion", "roses", "sunflowers", "tulips"}
    # Same model, same images, same preprocessing as the validation pass in training.
    val_acc = read_history(trained / "history.csv")[-1]["val_accuracy"]
    assert report["accuracy"] == pytest.approx(val_acc, abs=0.1 + 1e-6)
    for name in ("eval.json", "confusion_matrix.png", "samples.npz", "misclassified.npz"):
        assert (trained / "eval" / name).is_file(), name
    assert json.loads((trained / "eval" / "eval.json").read_text())["count"] == 10


def test_evaluate_and_predict_show_progress_when_asked(
    trained, small_records, small_flowers, tmp_path, capsys
):
    from petal.evaluation.evaluate import evaluate
    from petal.evaluation.predict import predict

    evaluate(trained, small_records, out_dir=tmp_path, log=lambda line: None, progress=True)
    err = capsys.readouterr().err
    assert "evaluate: 100%" in err and "10/10" in err
    evaluate(trained, small_records, out_dir=tmp_path, log=lambda line: None)  # not a terminal
    assert "evaluate" not in "\n".join(settled(capsys.readouterr().err))
    predict(trained, [small_flowers / "daisy"], progress=True)
    err = capsys.readouterr().err
    assert "predict: 100%" in err and "12/12" in err


def test_evaluate_on_image_folders_never_scores_training_images_unasked(
    trained, small_flowers, tmp_path
):
    from petal.evaluation.evaluate import evaluate

    quiet = lambda line: None  # noqa: E731
    # `trained`'s records were converted from small_flowers: 50 of its 60 images were trained
    # on, and the folder's own validation split is not the records' one.
    for split in (None, "validation", "train"):
        with pytest.raises(PetalError, match=r"records were converted from: .*--split all"):
            evaluate(trained, small_flowers, split=split, out_dir=tmp_path / "x", log=quiet)
    # In any case, as the data library takes split names ("All" was refused here).
    report = evaluate(trained, small_flowers, split="All", out_dir=tmp_path / "all", log=quiet)
    assert report["count"] == 60 and report["split"] == "all"
    # A run trained before config.json noted the source: the records' manifest names it.
    old = tmp_path / "old-run"
    shutil.copytree(trained, old, ignore=shutil.ignore_patterns("eval", "export", "plots"))
    config = json.loads((old / "config.json").read_text())
    del config["resolved"]["records_source"]
    (old / "config.json").write_text(json.dumps(config))
    with pytest.raises(PetalError, match="records were converted from"):
        evaluate(old, small_flowers, out_dir=tmp_path / "x", log=quiet)
    # Any other folder of images is new data: all of it by default.
    new = tmp_path / "new"
    for cls in sorted(p.name for p in small_flowers.iterdir()):
        (new / cls).mkdir(parents=True)
        for f in sorted((small_flowers / cls).iterdir())[:2]:
            (new / cls / f.name).symlink_to(f.resolve())
    report = evaluate(trained, new, out_dir=tmp_path / "new-eval", log=quiet)
    assert report["count"] == 10 and report["split"] == "all"


@pytest.mark.slow  # 9 s in CI on a Zen 3 host (session 39: 775 s): `pytest -m slow` runs it
def test_evaluate_warns_when_records_of_the_same_images_are_split_differently(
    trained, small_records, small_flowers, tmp_path
):
    from petal.data import convert
    from petal.evaluation.evaluate import evaluate
    from petal.evaluation.report import build_report

    quiet = lambda line: None  # noqa: E731
    # `trained` used small_records: small_flowers at 64 px, seed 0.
    for seed, size, split_differs in ((1, 64, True), (0, 48, False)):
        again = tmp_path / f"seed{seed}-{size}"
        convert(small_flowers, again, image_size=size, seed=seed, workers=1, progress=False)
        warnings: list[str] = []
        report = evaluate(trained, again, out_dir=again.with_suffix(".eval"), log=quiet,
                          warn=warnings.append, **NO_GRID)
        assert report["split"] == "validation" and report["count"] == 10
        assert report.get("warnings", []) == warnings
        warnings = settled(warnings)
        if split_differs:
            assert len(warnings) == 1
            assert f"like the run's records {small_records}, but split differently (seed 1 vs 0" \
                in warnings[0]
            # The report shows it above the scores.
            run = shutil.copytree(trained, tmp_path / "run", ignore=shutil.ignore_patterns("eval"))
            evaluate(run, again, log=quiet, warn=quiet)
            assert "<b>Warning:</b> " in build_report(run).read_text()
        else:  # the same split at another size: held out as well
            assert warnings == []
        # All of it holds the 50 photos the run trained on, however it was split.
        warnings.clear()
        report = evaluate(trained, again, split="all", out_dir=again.with_suffix(".all"),
                          log=quiet, warn=warnings.append, **NO_GRID)
        warnings = settled(warnings)
        assert report["count"] == 60 and len(warnings) == 1, warnings
        assert (f"{again} was converted from {small_flowers} like the run's records "
                f"{small_records}: the all split scored holds 50 of its 60 images the model "
                "trained on") in warnings[0]


def test_evaluate_a_run_trained_on_an_image_folder_scores_what_it_held_out(
    small_flowers, tmp_path
):
    from petal.data.reader import open_source
    from petal.evaluation.evaluate import evaluate
    from petal.training.loop import train

    quiet = lambda line: None  # noqa: E731
    run = tmp_path / "run"
    train(tiny_config(small_flowers, epochs=1, steps_per_epoch=1, model="dense"), run, log=quiet)
    report = evaluate(run, small_flowers, log=quiet)  # what `petal evaluate RUN` passes
    held_out = open_source(str(small_flowers)).count("validation")
    assert report["split"] == "validation" and report["count"] == held_out < 60


def test_photos_added_to_a_class_never_move_the_file_its_split_kept_in_training(
    small_flowers, tmp_path
):
    """A class whose every name hashes below the fraction keeps its highest in training, a
    class of one file its file; a photo added later took its place, and evaluate scored the
    photo the run trained on as held out, without a word."""
    import json
    import shutil

    from petal.data.reader import _name_hash, open_source
    from petal.evaluation.evaluate import _trained_names, evaluate
    from petal.evaluation.workdir import open_run
    from petal.training.loop import train

    def names(cls, below, n):  # n names of cls whose hash is below 0.19 (or not)
        found = (f"p{i:04d}.jpg" for i in range(10_000))
        return [x for x in found if (_name_hash(f"{cls}/{x}") < 0.19) == below][:n]

    folder = tmp_path / "photos"
    photos = iter(sorted(small_flowers.glob("*/*.jpg")))

    def add(cls, name):
        (folder / cls).mkdir(parents=True, exist_ok=True)
        (folder / cls / name).symlink_to(next(photos).resolve())

    for cls, picked in (("apple", names("apple", True, 2)), ("cherry", names("cherry", True, 1)),
                        ("banana", names("banana", True, 2) + names("banana", False, 8))):
        for name in picked:
            add(cls, name)
    kept = open_source(str(folder)).kept_in_train
    apple = [k for k in kept if k.startswith("apple/")]
    assert len(kept) == 2 and len(apple) == 1 and f"cherry/{names('cherry', True, 1)[0]}" in kept

    def validated(run):
        return {os.path.relpath(f, folder) for f in open_source(
            str(folder), train_names=kept_in_train_of(run)).files("validation")}  # fmt: skip

    def kept_in_train_of(run):
        from petal.training.loop import kept_in_train

        return kept_in_train(json.loads((run / "config.json").read_text()), str(folder))

    quiet = lambda line: None  # noqa: E731
    run = tmp_path / "run"
    train(tiny_config(folder, epochs=1, steps_per_epoch=1, batch_size=4, model="dense"), run,
          log=quiet)  # fmt: skip
    assert kept_in_train_of(run) == list(kept)
    held_out = validated(run)
    assert len(held_out) == evaluate(run, folder, log=quiet)["count"] == 3  # 1 apple, 2 banana
    add("apple", names("apple", False, 1)[0])
    add("cherry", names("cherry", False, 1)[0])
    # By name alone, each would validate now.
    assert not set(kept) & set(open_source(str(folder)).kept_in_train)
    assert validated(run) == held_out | {f"cherry/{names('cherry', False, 1)[0]}"}
    assert evaluate(run, folder, log=quiet)["count"] == 4
    assert set(kept) <= _trained_names(open_run(run), str(folder))  # the copies' check
    # A resume keeps them in training and recorded, also when one is away while it runs.
    away = tmp_path / "away"
    shutil.move(folder / apple[0], away)
    train(tiny_config(folder, epochs=2, steps_per_epoch=1, batch_size=4, model="dense"), run,
          resume=True, log=quiet)  # fmt: skip
    shutil.move(away, folder / apple[0])
    assert kept_in_train_of(run) == list(kept)
    assert validated(run) == held_out | {f"cherry/{names('cherry', False, 1)[0]}"}


def test_evaluate_warns_when_records_are_upscaled_to_the_model(trained, make_records, tmp_path):
    from petal.evaluation.evaluate import evaluate

    small = make_records("small", size=(16, 16))  # the model reads 32x32
    warned = []
    report = evaluate(trained, small, out_dir=tmp_path / "eval", log=lambda line: None,
                      warn=warned.append)
    assert warned == report["warnings"]
    assert settled(warned) == [
        "the records are 16x16 and are upscaled to 32x32; for full detail convert at that "
        "size (petal convert SRC DST --image-size 32x32): the model may score lower on them"
    ]


def test_evaluate_warns_when_records_were_fitted_otherwise_than_the_run_s(
    trained, make_records, tmp_path
):
    """Records converted with --resize pad scored a run trained on fill records without a
    word: framed otherwise than in training, and than predict and the SavedModel fit them."""
    from petal.evaluation.evaluate import evaluate

    assert json.loads((trained / "config.json").read_text())["resolved"]["resize"] == "fill"
    for mode in ("pad", "stretch", "none", "fill"):
        records = make_records(f"r-{mode}", size=(32, 32))
        manifest = json.loads((records / "manifest.json").read_text())
        (records / "manifest.json").write_text(json.dumps({**manifest, "resize": mode}))
        warned = []
        evaluate(trained, records, out_dir=tmp_path / f"e-{mode}", log=lambda line: None,
                 warn=warned.append)  # fmt: skip
        said = [w for w in warned if "--resize" in w]
        if mode in ("fill", "none"):  # none: fitted by the pipeline's fill
            assert said == [], said
        else:
            assert said == [
                f"the records were fitted to their size with --resize {mode}, and the run's "
                "fitted to their size with --resize fill: the model sees the photos framed "
                "otherwise than in training (and than predict and the exported model frame "
                "them); convert with --resize fill to score it as it is used"
            ], said


def test_evaluate_scores_new_photos_of_some_classes_by_name(trained, small_flowers, tmp_path):
    import shutil

    from petal.evaluation.evaluate import evaluate

    photos = tmp_path / "photos"
    for cls, n in (("roses", 3), ("tulips", 2)):  # folder indices 0 and 1; the model's 2, 4
        (photos / cls).mkdir(parents=True)
        for f in sorted((small_flowers / cls).iterdir())[:n]:
            (photos / cls / f.name).symlink_to(f.resolve())
    warned = []
    report = evaluate(trained, photos, out_dir=tmp_path / "eval", log=lambda line: None,
                      warn=warned.append)
    assert report["count"] == 5 and report["classes"][2] == "roses"
    assert [sum(row) for row in report["confusion_matrix"]] == [0, 0, 3, 0, 2]
    assert report["per_class"]["daisy"]["support"] == 0
    present = [report["per_class"][c]["recall"] for c in ("roses", "tulips")]
    assert report["macro"]["recall"] == pytest.approx(np.mean(present))
    # Copies of photos it trained on (the same names and sizes as in the folder its records
    # were converted from) are said to be so.
    assert settled(warned) == [
        f"5 of the 5 images of {photos} have the names and sizes of training photos in "
        f"{small_flowers}, the folder the run's records were converted from: most likely "
        "copies of the images the model trained on, so the score overstates how it does on "
        "new photos. For a held-out score evaluate on the run's records (omit --data) or on "
        "new photos.",
        f"{photos} holds 2 of the model's 5 classes (roses, tulips); the macro averages are "
        "over those",
    ]
    assert report["warnings"] == warned
    # New photos of one class (a classifier needs two to train, not to be scored).
    shutil.rmtree(photos / "tulips")
    report = evaluate(trained, photos, out_dir=tmp_path / "eval1", log=lambda line: None,
                      warn=lambda line: None)
    assert report["count"] == 3 and [sum(row) for row in report["confusion_matrix"]] == [
        0, 0, 3, 0, 0]
    assert report["macro"]["recall"] == pytest.approx(report["per_class"]["roses"]["recall"])
    # Files the folder holds that are not read are named (as convert names them).
    (photos / "roses" / "scan.tiff").write_bytes(b"II*\x00")
    (photos / "stray.jpg").write_bytes(b"x")
    warned = []
    evaluate(trained, photos, out_dir=tmp_path / "eval1", log=lambda line: None,
             warn=warned.append)  # fmt: skip
    assert f"{photos}: files not read: 1 directly in the folder, in no class (stray.jpg); 1 " \
        "not of a type petal reads (roses/scan.tiff). Images are read from class sub-folders, " \
        "with the extensions .bmp, .gif, .jpeg, .jpg, .png, .webp" in warned
    (photos / "cactus").mkdir()
    (photos / "cactus" / "c.jpg").symlink_to(next((small_flowers / "daisy").iterdir()).resolve())
    with pytest.raises(PetalError, match=r"photos holds classes the model in .* does not know: "
                       r"cactus; its classes are daisy, dandelion, roses, sunflowers, tulips"):
        evaluate(trained, photos, out_dir=tmp_path / "eval", log=lambda line: None)
    # A refused evaluation leaves no empty folder behind.
    with pytest.raises(PetalError, match=r"does not know: cactus"):
        evaluate(trained, photos, out_dir=tmp_path / "new" / "eval", log=lambda line: None)
    assert not (tmp_path / "new").exists()


def _record_names(records: Path, split: str) -> set[str]:
    """The ``filename`` of every record of a split of a petal records folder."""
    import tensorflow as tf

    spec = {"filename": tf.io.FixedLenFeature([], tf.string)}
    shards = sorted(str(p) for p in records.glob(f"{split}-*.tfrec"))
    return {
        tf.io.parse_single_example(r, spec)["filename"].numpy().decode()
        for r in tf.data.TFRecordDataset(shards)
    }


def test_evaluate_names_records_converted_from_a_copy_of_the_training_photos(
    trained, small_records, small_flowers, tmp_path
):
    """A copy of the training folder converted again: its validation split is another
    split of the same photos. Photos of other names (new ones) and of the run's validation
    split are not counted: only what it trained on."""
    from petal.data import convert
    from petal.evaluation.evaluate import evaluate

    held_out = _record_names(small_records, "validation")
    copy = tmp_path / "copy"
    for cls in ("daisy", "roses"):
        (copy / cls).mkdir(parents=True)
        photos = sorted((small_flowers / cls).iterdir())
        # 3 training photos, 1 validation photo, 1 training photo under a new name.
        picked = [f for f in photos if f"{cls}/{f.name}" not in held_out][:4]
        picked.append(next(f for f in photos if f"{cls}/{f.name}" in held_out))
        for i, f in enumerate(picked):
            name = f"new-{f.name}" if i == 3 else f.name  # renamed: not counted
            (copy / cls / name).symlink_to(f.resolve())
    records = tmp_path / "records"
    convert(copy, records, image_size=32, workers=1, progress=False)
    warned = []
    evaluate(trained, records, split="all", out_dir=tmp_path / "eval", log=lambda line: None,
             warn=warned.append, **NO_GRID)
    assert warned[0].startswith(
        f"6 of the 10 images of {records} (converted from {copy}) have the names "
        f"and sizes of training photos in {small_flowers}, the folder the run's records were "
        "converted from: most likely copies"
    )
    # By default its validation split is scored: only those images are counted.
    scored = _record_names(records, "validation")
    n = len([name for name in scored if "new-" not in name and name not in held_out])
    warned.clear()
    evaluate(trained, records, out_dir=tmp_path / "eval", log=lambda line: None,
             warn=warned.append, **NO_GRID)
    copies = [w for w in warned if "most likely copies" in w]
    assert copies == ([] if n == 0 else [copies[0]])
    if n:
        assert copies[0].startswith(f"{n} of the {len(scored)} images of {records} (validation "
                                    f"split, converted from {copy}) have the names and sizes")
    warned.clear()
    evaluate(trained, copy, out_dir=tmp_path / "eval", log=lambda line: None,
             warn=warned.append, **NO_GRID)
    assert [w for w in warned if w.startswith(f"6 of the 10 images of {copy} have")]
    # Renamed, they are new photos; a folder of the run's validation photos only is held
    # out still: no warning.
    for cls in ("daisy", "roses"):
        for f in (copy / cls).iterdir():
            if not f.name.startswith("new-"):
                f.rename(f.with_name(f"new-{f.name}"))
    for name in sorted(held_out)[:4]:
        (tmp_path / "held_out" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "held_out" / name).symlink_to((small_flowers / name).resolve())
    for folder in (copy, tmp_path / "held_out"):
        warned.clear()
        evaluate(trained, folder, out_dir=tmp_path / "eval", log=lambda line: None,
                 warn=warned.append, **NO_GRID)
        assert not [w for w in warned if "most likely copies" in w], folder


@pytest.mark.slow  # 9 s in CI on a Zen 3 host (session 39: 775 s): `pytest -m slow` runs it
def test_evaluate_names_a_copy_of_the_image_folder_a_run_trained_on(small_flowers, tmp_path):
    from conftest import tiny_config
    from petal.evaluation.evaluate import evaluate
    from petal.training.loop import train

    photos, copy = tmp_path / "photos", tmp_path / "copy"
    for root in (photos, copy):
        for cls in ("daisy", "roses"):
            (root / cls).mkdir(parents=True)
            for f in sorted((small_flowers / cls).iterdir())[:5]:
                (root / cls / f.name).symlink_to(f.resolve())
    run = tmp_path / "run"
    train(tiny_config(photos, epochs=1, model="dense", batch_size=4), run, log=lambda line: None)
    from petal.data import open_source

    trained_on = open_source(photos).files("train")
    assert 0 < len(trained_on) < 10
    warned = []
    evaluate(run, copy, out_dir=tmp_path / "eval", log=lambda line: None,
             warn=warned.append, **NO_GRID)
    assert settled(warned) == [
        f"{len(trained_on)} of the 10 images of {copy} have the names and sizes of training "
        f"photos in {photos}, the image folder the run trained on: most likely copies of the "
        "images the model trained on, so the score overstates how it does on new photos. For "
        "a held-out score evaluate on its validation split (omit --data) or on new photos."
    ]
    # Records converted from the folder it trained on: split by petal convert, otherwise.
    from petal.data import convert

    convert(photos, tmp_path / "records", image_size=32, workers=1, progress=False)
    warned.clear()
    evaluate(run, tmp_path / "records", split="all", out_dir=tmp_path / "eval",
             log=lambda line: None, warn=warned.append, **NO_GRID)
    assert settled(warned) == [
        f"{len(trained_on)} of the 10 images of {tmp_path / 'records'} (converted from "
        f"{photos}) are photos the model trained on: petal convert split {photos}, the image "
        "folder the run trained on, otherwise than training did; so the score overstates how "
        "it does on new photos. For a held-out score evaluate on its validation split (omit "
        "--data) or on new photos."
    ]
    # A copy of its validation photos only is held out still.
    held_out = tmp_path / "held_out"
    for path in open_source(photos).files("validation"):
        rel = Path(path).relative_to(photos)
        (held_out / rel).parent.mkdir(parents=True, exist_ok=True)
        (held_out / rel).symlink_to(Path(path).resolve())
    warned.clear()
    evaluate(run, held_out, out_dir=tmp_path / "eval", log=lambda line: None,
             warn=warned.append, **NO_GRID)
    assert settled(warned) == []
    # On its own folder: its validation split, as it was split for training; a run split
    # the way earlier builds split folders is told that this may differ.
    warned.clear()
    evaluate(run, photos, out_dir=tmp_path / "eval", log=lambda line: None,
             warn=warned.append, **NO_GRID)
    assert settled(warned) == []
    config = json.loads((run / "config.json").read_text())
    del config["resolved"]["folder_split"]
    (run / "config.json").write_text(json.dumps(config))
    evaluate(run, photos, out_dir=tmp_path / "eval", log=lambda line: None,
             warn=warned.append, **NO_GRID)
    assert settled(warned) == [
        f"{run} was trained when petal split image folders another way: the validation split "
        "read now may hold images it trained on. Train it again for a held-out score."
    ]
    # Which photos it trained on is not known then: any copy of its photos is named.
    warned.clear()
    evaluate(run, held_out, out_dir=tmp_path / "eval", log=lambda line: None,
             warn=warned.append, **NO_GRID)
    n = 10 - len(trained_on)
    assert len(settled(warned)) == 1 and settled(warned)[0].startswith(
        f"{n} of the {n} images of {held_out} have the names and sizes of photos in {photos},"
    )
    # Resumed, it is told the same.
    lines = []
    train(tiny_config(photos, epochs=2, model="dense", batch_size=4), run, resume=True,
          log=lines.append)  # fmt: skip
    assert (f"petal train: warning: {run} began when petal split image folders another way: "
            "from here on some of its validation images train, and some training images "
            "validate (start a new run for a clean held-out split)") in lines


def test_evaluate_counts_a_record_whose_image_does_not_decode(trained, make_records):
    """A record with a sound CRC but an image that is no JPEG: the error says why (not
    TensorFlow's op names); skipped, it is counted (it was dropped uncounted)."""
    from conftest import break_image
    from petal.evaluation.evaluate import evaluate

    records = make_records("bad-image", size=(32, 32), fmt="jpeg")  # validation: 5 records
    shard = sorted(records.glob("validation-*.tfrec"))[0]
    break_image(shard, 2)
    # One in the training split too, which evaluate does not read: not named (it was).
    break_image(sorted(records.glob("train-*.tfrec"))[0], 0)
    quiet = dict(log=lambda line: None, warn=lambda line: None)
    with pytest.raises(PetalError) as caught:
        evaluate(trained, records, **quiet)
    message = str(caught.value)
    assert message.startswith(f"Corrupt input in {records}: 1 record(s) whose image cannot be "
                              f"decoded: {shard}: record 2: Unknown image file format")
    assert "Run `petal inspect" in message
    assert "[[" not in message and "function_node" not in message
    warnings = []
    report = evaluate(trained, records, skip_corrupt=True, log=lambda line: None,
                      warn=warnings.append)
    assert report["count"] == 4 and report["skipped_corrupt_records"] == 1
    # Named, with the shard and record, in the warning and in eval.json.
    [named] = report["skipped_undecodable_records"]
    assert named.startswith(f"{shard}: record 2: Unknown image file format. One of JPEG")
    assert warnings[0] == (
        f"--skip-corrupt: 1 of 5 records cannot be decoded and are skipped: {named}")
    # The one image of its class was the one skipped: that class scores nothing.
    warnings = settled(warnings)
    assert len(warnings) == 2 and re.fullmatch(
        rf"Split 'validation' of {re.escape(str(records))}: no image of \w+ was scored \(none "
        r"in the split, or skipped as corrupt\); the macro averages are over the other 4 "
        r"classes", warnings[1])


def test_evaluate_names_a_renamed_codelab_shard_with_or_without_skip_corrupt(
    trained, make_records, tmp_path
):
    """A shard renamed to more records than it holds was corrupt ("record 4 could not be
    read"), and skipped its missing records: "24 images ... 2 corrupt records skipped" of
    24 records. It is sound: evaluate stops, naming it, the count it holds and its name."""
    from petal.evaluation.evaluate import evaluate

    shards = make_records("shards", counts={"all": [4] * 6}, codelab=True, fmt="jpeg")
    (shards / "flowers03-4.tfrec").rename(shards / "flowers03-6.tfrec")
    for skip_corrupt in (False, True):
        out = tmp_path / f"eval-{skip_corrupt}"
        with pytest.raises(PetalError) as caught:
            evaluate(trained, shards, split="all", skip_corrupt=skip_corrupt, out_dir=out,
                     log=lambda line: None, warn=lambda line: None)  # fmt: skip
        assert str(caught.value) == (
            f"Codelab shard {shards}/flowers03-6.tfrec holds 4 records, not the 6 its file "
            "name says: it is not corrupt (every record reads, and the file ends after the "
            "last); rename it to flowers03-4.tfrec (or copy it again, if it lost records)."
        )
        assert not (out / "eval.json").exists()


def test_evaluate_cli_names_a_corrupt_record_or_skips_and_counts(
    trained, small_records, tmp_path, capsys, monkeypatch
):
    import shutil

    from conftest import corrupt_record
    from petal.cli import main

    records = tmp_path / "records"
    shutil.copytree(small_records, records)
    shard = sorted(records.glob("validation-*.tfrec"))[0]
    corrupt_record(shard, 3)
    out = tmp_path / "eval"
    args = ["evaluate", str(trained), "--data", str(records), "--out", str(out)]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert f"corrupt or truncated shard {shard}: record 3" in err[0] and "--skip-corrupt" in err[0]

    assert main([*args, "--skip-corrupt"]) == 0
    report = json.loads((out / "eval.json").read_text())
    # Records 0-2 of the shard are read; the CRC failure loses record 3 and everything after.
    in_shard = int(shard.stem.rsplit("-", 1)[1])
    assert report["skipped_corrupt_records"] == in_shard - 3
    assert report["count"] == 10 - (in_shard - 3)
    # The reader's line is kept with the rest of what the evaluation left out (report shows
    # eval.json's warnings; this one was only logged).
    assert report["warnings"][0] == (
        f"--skip-corrupt: skipped {in_shard - 3} record(s) of {shard}: record 3 is corrupt (CRC "
        "failure or truncation) and the reader cannot resume inside a shard"
    )
    # Then any class whose every validation image was in the part skipped.
    assert all("was scored (none in the split, or skipped as corrupt)" in line
               for line in settled(report["warnings"][1:]))
    # Paths as absolute as train's config.json's, whatever was typed: report reads eval.json
    # from elsewhere.
    monkeypatch.chdir(tmp_path)
    assert main(["evaluate", str(trained), "--data", "records", "--out", "eval2",
                 "--skip-corrupt"]) == 0  # fmt: skip
    again = json.loads((tmp_path / "eval2" / "eval.json").read_text())
    assert again["data"] == str(records) and again["workdir"] == str(trained)
    assert again["model"] == str(trained / "model.keras")
    # The model scored, by its bytes (report tells a copied run from one trained since).
    assert again["model_sha256"] == hashlib.sha256((trained / "model.keras").read_bytes()
                                                   ).hexdigest()  # fmt: skip


def test_evaluate_on_a_folder_names_undecodable_files_or_skips_and_counts(
    trained, small_flowers, tmp_path, capfd
):
    from petal.cli import main

    folder = tmp_path / "photos"
    for cls in sorted(p.name for p in small_flowers.iterdir()):
        (folder / cls).mkdir(parents=True)
        for f in sorted((small_flowers / cls).iterdir())[:3]:
            (folder / cls / f.name).symlink_to(f.resolve())
    good = sorted((small_flowers / "roses").iterdir())[0].read_bytes()
    (folder / "daisy" / "zz-not-an-image.jpg").write_bytes(b"plain text, not a JPEG")
    (folder / "roses" / "zz-truncated.jpg").write_bytes(good[:200])
    out = tmp_path / "eval"
    args = ["evaluate", str(trained), "--data", str(folder), "--out", str(out)]
    assert main(args) == 2
    err = capfd.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"petal evaluate: error: 2 image(s) in {folder} cannot be decoded: ")
    assert "daisy/zz-not-an-image.jpg: not an image (no known image format in the file)" in err
    assert "roses/zz-truncated.jpg: " in err and "function_node" not in err
    assert "--skip-corrupt" in err

    assert main([*args, "--skip-corrupt"]) == 0
    report = json.loads((out / "eval.json").read_text())
    assert report["count"] == 15 and report["skipped_corrupt_records"] == 2
    assert report["skipped_corrupt_files"] == [
        f"{folder}/daisy/zz-not-an-image.jpg: not an image (no known image format in the file)",
        f"{folder}/roses/zz-truncated.jpg: {report['skipped_corrupt_files'][1].split(': ', 1)[1]}",
    ]
    printed = capfd.readouterr()
    assert "2 corrupt files skipped" in printed.out
    # Named once up front, not in a Python traceback from inside tf.data for each file.
    assert f"petal evaluate: warning: --skip-corrupt: 2 of 17 files cannot be decoded and are " \
        f"skipped: {folder}/daisy/zz-not-an-image.jpg: not an image" in printed.err
    assert "Traceback" not in printed.err
    (folder / "daisy" / "zz-not-an-image.jpg").unlink()
    assert main([*args, "--skip-corrupt"]) == 0
    assert ", 1 corrupt file skipped -> " in capfd.readouterr().out  # not "1 corrupt files"


@pytest.mark.slow  # 37 s in a loaded suite run (session 40): `pytest -m slow` runs it
def test_an_unreadable_folder_file_is_named_by_evaluate_and_train(
    trained, small_flowers, tmp_path, capfd
):
    """A looping symlink fails ReadFile with UnknownError (not a decode error): it is named
    in one line like an undecodable file, not a TensorFlow traceback."""
    from petal.cli import main

    folder = tmp_path / "photos"
    for cls in sorted(p.name for p in small_flowers.iterdir()):
        (folder / cls).mkdir(parents=True)
        for f in sorted((small_flowers / cls).iterdir())[:4]:
            (folder / cls / f.name).symlink_to(f.resolve())
    (folder / "tulips" / "loop.jpg").symlink_to("loop.jpg")
    args = ["evaluate", str(trained), "--data", str(folder), "--out", str(tmp_path / "eval")]
    assert main(args) == 2
    err = capfd.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"petal evaluate: error: 1 image(s) in {folder} cannot be decoded: ")
    assert f"{folder}/tulips/loop.jpg: unreadable: " in err and "--skip-corrupt" in err
    train_args = ["train", "--data", str(folder), "--workdir", str(tmp_path / "run"), "--set",
                  "epochs=1", "--set", "batch_size=4", "--set", "image_size=32", "--preset",
                  "quick", "--set", "model=dense", "--set", "tensorboard=false"]
    assert main(train_args) == 2
    err = capfd.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"petal train: error: 1 image(s) in {folder} cannot be decoded: ")
    # New photos of one class: named the same way (it was a records message).
    one = tmp_path / "one"
    (one / "tulips").mkdir(parents=True)
    for f in (folder / "tulips").iterdir():
        (one / "tulips" / f.name).symlink_to(f.readlink())
    args = ["evaluate", str(trained), "--data", str(one), "--out", str(tmp_path / "eval1")]
    assert main(args) == 2
    err = capfd.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"petal evaluate: error: 1 image(s) in {one} cannot be decoded: "
                          f"{one}/tulips/loop.jpg: unreadable: ")


def test_a_folder_photo_over_the_pixel_limit_names_the_option_that_reads_it(
    trained, small_flowers, tmp_path
):
    from PIL import Image

    from conftest import link_photos
    from petal.evaluation.evaluate import evaluate

    folder = link_photos(small_flowers, tmp_path / "photos", 2)
    Image.new("1", (10_000, 9_000)).save(folder / "daisy" / "huge.png")  # 90 MP, a few kB
    with pytest.raises(PetalError) as caught:
        evaluate(trained, folder, log=lambda line: None, warn=lambda line: None)
    assert str(caught.value) == (
        f"1 image(s) in {folder} cannot be decoded: {folder}/daisy/huge.png: too many pixels "
        "(HxW 9000x10000 = 90,000,000 > max_pixels 89,478,485, a guard against decompression "
        "bombs). Remove or replace them, convert the folder with `petal convert` (it skips "
        "and lists unreadable files in manifest.json; its --max-pixels N converts larger "
        "photos), or evaluate with --skip-corrupt."
    )


def test_evaluate_on_a_folder_sees_the_pixels_predict_sees(trained, originals_dir):
    """The run's records are 64 px and its model 32 px: a new photo is fitted to 64 as the
    converter did, then resized to 32 (predict, training, the export); evaluate once
    fitted it straight to 32 (a mean difference of 4-13 levels on real photos)."""
    from petal.data.pipeline import eval_dataset
    from petal.evaluation.predict import _decode
    from petal.evaluation.workdir import open_run

    run = open_run(trained)
    assert run.records_size == (64, 64) and run.image_size == (32, 32)
    ds = eval_dataset(originals_dir, batch_size=100, image_size=run.image_size,
                      normalization="raw", label_mode="sparse", split="all",
                      resize=run.fit_mode, fit_size=run.records_size)
    images = np.concatenate([np.asarray(x) for x, _ in ds])
    from petal.data.reader import open_source

    files = open_source(str(originals_dir)).files("all")
    expected = np.stack([_decode(Path(f), run) for f in files[:8]]).astype(np.float32)
    np.testing.assert_array_equal(images[:8], expected)


@pytest.mark.slow  # 13-14 s in CI on a Zen 3 host (session 39: 775 s): `pytest -m slow` runs it
def test_new_photos_are_resized_as_records_at_the_photos_sizes_were(
    trained, originals_dir, tmp_path, monkeypatch
):
    """Records of `--resize none` keep each photo at its size, and the input pipeline
    resizes them with resize_fill (antialiased). Predict, evaluate on a folder and the
    SavedModel fitted new photos with the converter's "fill" instead: 7 levels apart on
    average on real photos. Now all see the pipeline's pixels: exactly, for plain JPEGs
    kept as they are (decoded with the accurate DCT, as PIL decodes) and for PNGs in raw
    records."""
    import tensorflow as tf

    import petal.evaluation.evaluate as evaluate_module
    from petal.data import convert, schema
    from petal.data.pipeline import eval_dataset, open_source
    from petal.evaluation.export import make_preprocess
    from petal.evaluation.predict import _decode
    from petal.evaluation.workdir import open_run

    # The tiny run, as if trained on such records (its model's input is unchanged).
    run_dir = tmp_path / "run"
    shutil.copytree(trained, run_dir, ignore=shutil.ignore_patterns("export", "eval", "plots"))
    config = json.loads((run_dir / "config.json").read_text())
    config["resolved"].update(resize="none", records_size=None)
    (run_dir / "config.json").write_text(json.dumps(config))
    run = open_run(run_dir)
    assert run.records_size is None and run.image_size == (32, 32)

    # Photos of several sizes and shapes: the original JPEGs, and PNGs cut from them.
    jpegs, pngs = tmp_path / "jpegs", tmp_path / "pngs"
    for cls in ("daisy", "roses"):
        (jpegs / cls).mkdir(parents=True)
        (pngs / cls).mkdir(parents=True)
        for k, f in enumerate(sorted((originals_dir / cls).iterdir())[:3]):
            (jpegs / cls / f.name).write_bytes(f.read_bytes())
            with Image.open(f) as photo:
                w, h = photo.size
                photo.crop((k, 0, w - 7 * k, h // (k + 1))).save(pngs / cls / f"{f.stem}.png")

    def pipeline_pixels(folder: Path, fmt: str) -> dict[str, np.ndarray]:
        records = tmp_path / f"records-{fmt}"
        convert(folder, records, resize="none", format=fmt, val_fraction=0.0, shards=1,
                workers=1, progress=False)
        ds = eval_dataset(records, batch_size=8, image_size=run.image_size, split="train",
                          normalization="raw", label_mode="sparse", dtype="uint8")
        images = np.concatenate([np.asarray(x) for x, _ in ds])
        parse = {schema.FILENAME: tf.io.FixedLenFeature([], tf.string)}
        (shard,) = sorted(records.glob("train-*"))
        names = [tf.io.parse_single_example(r, parse)[schema.FILENAME].numpy().decode()
                 for r in tf.data.TFRecordDataset(str(shard))]
        return dict(zip(names, images, strict=True))

    want = {**pipeline_pixels(jpegs, "jpeg"), **pipeline_pixels(pngs, "raw")}
    assert len(want) == 12
    files = {name: (jpegs if name.endswith(".jpg") else pngs) / name for name in want}

    # predict
    for name, f in files.items():
        np.testing.assert_array_equal(_decode(f, run), want[name], err_msg=name)
    # the SavedModel's preprocessing, traced as in the SavedModel
    preprocess = tf.function(make_preprocess(run))
    for name, f in files.items():
        got = np.round(preprocess(tf.constant(f.read_bytes())).numpy() * 255.0)
        np.testing.assert_array_equal(got, want[name], err_msg=name)
    # evaluate on a folder: the pixels its model is given
    seen = []

    class Recorder:
        def predict_on_batch(self, images):
            seen.append(np.asarray(images))
            return np.full((len(images), len(run.classes)), 1 / len(run.classes))

    monkeypatch.setattr(evaluate_module, "load_model", lambda run: Recorder())
    for folder in (jpegs, pngs):
        seen.clear()
        evaluate_module.evaluate(run_dir, folder, out_dir=tmp_path / "eval", num_samples=0,
                                 max_misclassified=0, log=lambda line: None,
                                 warn=lambda line: None)
        got = np.round(np.concatenate(seen) * 255.0)
        names = [str(Path(f).relative_to(folder)) for f in open_source(str(folder)).files("all")]
        expected = np.stack([want[name] for name in names])
        np.testing.assert_array_equal(got, expected, err_msg=str(folder))


def test_predict_top_k(trained, originals_dir):
    from petal.evaluation.predict import format_predictions, predict

    files = _image_files(originals_dir, 2)
    results = predict(trained, files, top_k=3)
    assert [r["file"] for r in results] == [str(f) for f in files]
    for r in results:
        probs = [p["probability"] for p in r["predictions"]]
        assert len(probs) == 3 and probs == sorted(probs, reverse=True)
        assert 0.0 < sum(probs) <= 1.0 + 1e-5
    assert str(files[0]) in format_predictions(results)
    # More than the 5 classes: all 5, and a word that it was reduced (the default says none).
    warned = []
    results = predict(trained, files[:1], top_k=7, warn=warned.append)
    assert len(results[0]["predictions"]) == 5
    assert warned == ["--top-k 7 is more than the model's 5 classes; using 5"]
    warned.clear()
    assert len(predict(trained, files[:1], warn=warned.append)[0]["predictions"]) == 3
    assert warned == []


def test_evaluate_top_k_above_the_class_count_is_said(trained, small_records, tmp_path):
    from petal.evaluation.evaluate import evaluate

    warned = []
    report = evaluate(trained, small_records, top_k=9, out_dir=tmp_path / "eval",
                      log=lambda line: None, warn=warned.append)  # fmt: skip
    assert list(report["top_k_accuracy"]) == ["top_1", "top_5"]
    assert report["top_k_accuracy"]["top_5"] == 1.0
    assert warned == report["warnings"]
    assert settled(warned) == ["--top-k 9 is more than the model's 5 classes; using 5"]


def test_predict_takes_folders_of_images(trained, small_flowers, tmp_path, capsys):
    from petal.cli import main
    from petal.evaluation.predict import predict

    folder = tmp_path / "photos"
    (folder / "b" / "deeper").mkdir(parents=True)
    sources = sorted(small_flowers.rglob("*.jpg"))[:3]
    for name, src in zip(["b/deeper/x.JPG", "a.jpg", "b/c.jpeg"], sources, strict=True):
        (folder / name).write_bytes(src.read_bytes())
    (folder / "notes.txt").write_text("not an image")
    single = sources[0]
    results = predict(trained, [single, folder], top_k=1)
    assert [r["file"] for r in results] == [
        str(single), str(folder / "a.jpg"), str(folder / "b" / "c.jpeg"),
        str(folder / "b" / "deeper" / "x.JPG"),
    ]
    (tmp_path / "empty").mkdir()
    assert main(["predict", str(trained), str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"petal predict: error: Folder {tmp_path / 'empty'} holds no image")


def test_predict_names_an_unreadable_image(trained, tmp_path):
    from petal.evaluation.predict import predict

    bad = tmp_path / "broken.jpg"
    bad.write_bytes(b"not a jpeg at all")
    with pytest.raises(PetalError, match="broken.jpg"):
        predict(trained, [bad])
    with pytest.raises(PetalError) as err:  # it named no fix
        predict(trained, [tmp_path / "missing.jpg"])
    assert str(err.value) == (f"Image not found: {tmp_path / 'missing.jpg'}; pass an image file "
                              "or a folder of them that exists (check the path and its "
                              "spelling).")  # fmt: skip
    (tmp_path / "link.jpg").symlink_to(tmp_path / "unmounted" / "photo.jpg")
    with pytest.raises(PetalError) as err:  # spelled right: "check the spelling" misled
        predict(trained, [tmp_path / "link.jpg"])
    assert str(err.value) == (f"Cannot read image {tmp_path / 'link.jpg'}: a link whose target "
                              f"is missing ({tmp_path / 'unmounted' / 'photo.jpg'}): mount or "
                              "fix it")  # fmt: skip


@pytest.mark.slow  # 8-14 s in CI on a Zen 3 host (session 39: 775 s): `pytest -m slow` runs it
def test_the_exported_decoder_gives_predicts_pixels():
    """JPEG: accurate DCT and every EXIF orientation, inside a traced function as in the
    SavedModel; PNG: transparency on white; bytes that are no JPEG: orientation 1."""
    import io
    import struct

    import tensorflow as tf

    from petal.data import images
    from petal.evaluation.export import decode_like_predict, exif_orientation

    pixels = np.zeros((24, 40, 3), np.uint8)
    pixels[:12, :20] = (250, 0, 0)
    pixels[12:, 30:] = (0, 0, 250)
    pixels[:, 20:22] = 128
    decode = tf.function(lambda d: tf.map_fn(
        decode_like_predict, d, fn_output_signature=tf.TensorSpec([None, None, 3], tf.uint8)))

    plain = io.BytesIO()
    Image.fromarray(pixels).save(plain, "JPEG", quality=90)
    for orientation in range(1, 9):
        buffer = io.BytesIO()
        exif = Image.Exif()
        exif[0x010F] = "a camera"  # another tag before the orientation
        exif[0x0112] = orientation
        Image.fromarray(pixels).save(buffer, "JPEG", quality=90, exif=exif)  # little-endian
        # Big-endian ("MM") EXIF, built by hand.
        tiff = b"MM\x00\x2a" + struct.pack(">IH", 8, 2)
        tiff += struct.pack(">HHIHH", 0x010F, 2, 4, 0, 0)
        tiff += struct.pack(">HHIHH", 0x0112, 3, 1, orientation, 0) + bytes(4)
        app1 = b"\xff\xe1" + struct.pack(">H", 8 + len(tiff)) + b"Exif\x00\x00" + tiff
        big = plain.getvalue()[:2] + app1 + plain.getvalue()[2:]
        for data in (buffer.getvalue(), big):
            want = images.decode_rgb(data)[0]
            assert int(exif_orientation(tf.constant(data))) == orientation
            got = decode(tf.constant([data]))[0].numpy()
            np.testing.assert_array_equal(got, want, err_msg=f"orientation {orientation}")

    rgba = np.dstack([pixels, np.full((24, 40), 255, np.uint8)])
    rgba[:, 25:, 3] = 0
    rgba[:, 5:9, 3] = 100
    png = io.BytesIO()
    Image.fromarray(rgba, "RGBA").save(png, "PNG")
    got = decode(tf.constant([png.getvalue()]))[0].numpy().astype(int)
    assert np.abs(got - images.decode_rgb(png.getvalue())[0]).max() <= 1
    # PNGs of 1, 2 and 4 bits (TensorFlow gave them an alpha of 2**bits - 1: nearly
    # white), and colour keys (tRNS: a palette entry, a grey level or an RGB colour that
    # stands for transparent), which become white for both.
    grey = (np.arange(24 * 40).reshape(24, 40) % 256).astype(np.uint8)
    variants = {f"grey {bits}-bit": (Image.fromarray(grey), {"bits": bits}) for bits in (1, 2, 4)}
    variants["black and white"] = (Image.fromarray(grey).convert("1"), {})
    palette = Image.fromarray(pixels).convert("P", palette=Image.Palette.ADAPTIVE, colors=4)
    variants["2-bit palette"] = (palette, {"bits": 2})
    variants["2-bit palette, key"] = (palette, {"bits": 2, "transparency": 1})
    variants["grey, key"] = (Image.fromarray(grey), {"transparency": int(grey[0, 5])})
    variants["grey 2-bit, key"] = (Image.fromarray(grey), {"bits": 2, "transparency": 0})
    variants["RGB, key"] = (Image.fromarray(pixels), {"transparency": (250, 0, 0)})
    for name, (image, options) in variants.items():
        buffer = io.BytesIO()
        image.save(buffer, "PNG", **options)
        want = images.decode_rgb(buffer.getvalue())[0]
        got = decode(tf.constant([buffer.getvalue()]))[0].numpy()
        np.testing.assert_array_equal(got, want, err_msg=name)
        if "transparency" in options:
            assert (want == 255).all(axis=-1).sum() > (np.asarray(image.convert("RGB")) == 255
                                                       ).all(axis=-1).sum(), name
    # WebP: RGBA on white (TensorFlow's decoder refused 3 channels of it: the whole batch
    # failed), RGB as is.
    for name, image, options in (
        ("WebP RGBA", Image.fromarray(rgba, "RGBA"), {"lossless": True}),
        ("WebP RGB", Image.fromarray(pixels), {"lossless": True}),
        ("WebP RGB lossy", Image.fromarray(pixels), {"quality": 80}),
    ):
        buffer = io.BytesIO()
        image.save(buffer, "WEBP", **options)
        want = images.decode_rgb(buffer.getvalue())[0]
        got = decode(tf.constant([buffer.getvalue()]))[0].numpy().astype(int)
        assert np.abs(got - want).max() <= 1, name
    for data in (b"", b"\xff\xd8", plain.getvalue(), png.getvalue()):
        assert int(exif_orientation(tf.constant(data))) == 1


@pytest.mark.slow  # 38 s in a loaded suite run (session 40): `pytest -m slow` runs it
def test_the_exported_decoder_finds_exif_after_much_other_metadata():
    """EXIF orientation after two 60 KiB APP2 segments (an ICC profile split in two) or
    after 40 other segments: the SavedModel looked in the first 64 KiB and 32 segments
    only, and served such phone photos sideways where predict turned them upright."""
    import io
    import struct

    import tensorflow as tf

    from petal.data import images
    from petal.evaluation.export import decode_like_predict, exif_orientation

    pixels = np.zeros((24, 40, 3), np.uint8)
    pixels[:12, :20] = (250, 0, 0)
    pixels[12:, 30:] = (0, 0, 250)
    exif = Image.Exif()
    exif[0x0112] = 6
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "JPEG", quality=90, exif=exif)
    data = buffer.getvalue()
    at = data.index(b"\xff\xe1\x00")  # the EXIF segment, after the JFIF one

    def segment(marker: int, size: int) -> bytes:
        return bytes([0xFF, marker]) + struct.pack(">H", size) + b"x" * (size - 2)

    decode = tf.function(decode_like_predict)
    for name, before in (
        ("ICC profile of 2 x 60 KiB", segment(0xE2, 60_000) * 2),
        ("40 small segments", segment(0xEC, 10) * 40),
        ("no other segment", b""),
    ):
        moved = data[:at] + before + data[at:]
        want = images.decode_rgb(moved)[0]
        assert want.shape == (40, 24, 3)  # PIL turns it upright
        assert int(exif_orientation(tf.constant(moved))) == 6, name
        np.testing.assert_array_equal(decode(tf.constant(moved)).numpy(), want, err_msg=name)


@pytest.mark.parametrize("mode", ["pad", "fill", "stretch"])
def test_the_exported_resize_fits_like_the_converter(mode):
    """The SavedModel's resize has the converter's geometry, a 3000x10 strip included
    (resize_with_pad made its short side 0 pixels and failed)."""
    import tensorflow as tf

    from petal.data import images
    from petal.evaluation.export import _fit_tf

    rng = np.random.default_rng(0)
    fit = tf.function(lambda x: _fit_tf(x, (24, 32), mode),
                      input_signature=[tf.TensorSpec([None, None, 3], tf.float32)])
    for h, w in ((10, 3000), (3000, 10), (24, 32), (50, 41), (7, 9), (1, 1)):
        pixels = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        got = fit(tf.constant(pixels, tf.float32)).numpy()
        got = np.clip(got, 0, 255).astype(np.uint8)  # truncated as the SavedModel does
        want = images.resize(pixels, (24, 32), mode)
        assert got.shape == want.shape == (24, 32, 3), (h, w)
        assert np.abs(got.astype(int) - want).max() <= 1, (h, w)


@pytest.mark.slow  # 11-13 s in CI on a Zen 3 host (session 39: 611 s): `pytest -m slow` runs it
def test_export_serves_encoded_bytes_like_predict(trained, originals_dir, tmp_path):
    import warnings

    import tensorflow as tf

    from petal.evaluation.export import export
    from petal.evaluation.predict import predict

    out = export(trained, tflite=True)
    files = _image_files(originals_dir, 2)
    # A phone photo: stored turned a quarter, with the EXIF tag that turns it upright; and a
    # PNG with transparent parts (on white for predict).
    with Image.open(files[0]) as photo:
        exif = Image.Exif()
        exif[0x0112] = 6
        turned = tmp_path / "turned.jpg"
        photo.transpose(Image.Transpose.ROTATE_90).save(turned, quality=95, exif=exif)
        rgba = np.array(photo.convert("RGBA"))
    rgba[: rgba.shape[0] // 2, :, 3] = 0
    rgba[:, : rgba.shape[1] // 3, 3] = 120
    Image.fromarray(rgba, "RGBA").save(tmp_path / "cutout.png")
    files += [turned, tmp_path / "cutout.png"]
    loaded = tf.saved_model.load(out["saved_model"])
    got = loaded.serve(tf.constant([f.read_bytes() for f in files]))
    probs = got["probabilities"].numpy()
    assert probs.shape == (4, 5)
    np.testing.assert_allclose(probs.sum(1), 1.0, atol=1e-5)
    classes = Path(out["labels"]).read_text().split()
    assert [s.decode() for s in got["label"].numpy()] == [classes[i] for i in probs.argmax(1)]
    # The same pixels as `petal predict`, so the same probabilities.
    expected = predict(trained, files, top_k=5)
    for row, r in zip(probs, expected, strict=True):
        for p in r["predictions"]:
            assert row[p["index"]] == pytest.approx(p["probability"], abs=1e-4), r["file"]
    # No images, no probabilities (TensorFlow's CPU convolution of an empty batch failed).
    empty = loaded.serve(tf.constant([], tf.string))
    assert [empty[k].shape for k in ("probabilities", "label", "score")] == [(0, 5), (0,), (0,)]
    # model.tflite computes serve_pixels', with the output's shape known before a run (a
    # guard for empty batches there made it unknown).
    pixels = np.random.default_rng(0).uniform(0, 255, (1, 32, 32, 3)).astype(np.float32)
    with warnings.catch_warnings():  # "deprecated ... use the LiteRT interpreter"
        warnings.simplefilter("ignore", UserWarning)
        lite = tf.lite.Interpreter(model_path=out["tflite"])
    lite.allocate_tensors()
    assert list(lite.get_output_details()[0]["shape_signature"]) == [-1, 5]
    lite.set_tensor(lite.get_input_details()[0]["index"], pixels)
    lite.invoke()
    np.testing.assert_allclose(
        lite.get_tensor(lite.get_output_details()[0]["index"]),
        loaded.serve_pixels(tf.constant(pixels))["probabilities"].numpy(),
        atol=1e-5,
    )


def test_report_from_saved_files(trained, small_records):
    from petal.evaluation.evaluate import evaluate
    from petal.evaluation.report import build_report

    evaluate(trained, small_records, log=lambda line: None)
    html = build_report(trained)
    text = html.read_text()
    for png in ("curves.png", "lr.png", "confusion_matrix.png", "samples.png"):
        assert (trained / "plots" / png).is_file(), png
        assert f"plots/{png}" in text
    # One epoch: it said "mean of last 5".
    assert "mean of last 1 validation accuracies" in text and "tulips" in text
    assert "data:image/png;base64," in build_report(trained, embed=True).read_text()


def test_history_plots_take_the_file_or_its_rows(trained, tmp_path):
    from PIL import Image

    from petal.evaluation import plots
    from petal.training.callbacks import read_history

    history = trained / "history.csv"
    rows = read_history(history)
    for plot in (plots.plot_history, plots.plot_lr):
        from_file = plot(history, tmp_path / f"{plot.__name__}-file.png")
        from_rows = plot(rows, tmp_path / f"{plot.__name__}-rows.png")
        for out in (from_file, from_rows):
            with Image.open(out) as image:
                assert image.format == "PNG" and image.width > 100
        assert from_file.read_bytes() == from_rows.read_bytes()


def test_history_plots_of_one_epoch_have_whole_epoch_ticks_and_the_lr_it_ran(
    tmp_path, monkeypatch
):
    """One epoch's curves had ticks 0.96 ... 1.04, and the learning rate was one point at
    0.0 (the warm-up's first step) although the epoch ended at 3e-3."""
    from petal.evaluation import plots

    ticks = []
    save = plots._save

    def keep_ticks(fig, out):
        fig.canvas.draw()
        ticks.extend(t for ax in fig.axes for t in ax.get_xticks()
                     if ax.get_xlim()[0] <= t <= ax.get_xlim()[1])
        return save(fig, out)

    monkeypatch.setattr(plots, "_save", keep_ticks)
    rows = [{"epoch": 1, "loss": 1.6, "accuracy": 0.3, "val_loss": 1.5, "val_accuracy": 0.4,
             "lr": 0.0, "lr_end": 3e-3}]
    plots.plot_history(rows, tmp_path / "curves.png")
    plots.plot_lr(rows, tmp_path / "lr.png")
    assert ticks and all(float(t).is_integer() for t in ticks), ticks
    x, y = plots.lr_points(rows)
    assert x.tolist() == [0, 1] and y.tolist() == [0.0, 3e-3]
    # Histories written before lr_end was kept: the first steps only.
    x, y = plots.lr_points([{"epoch": 1, "lr": 0.0}, {"epoch": 2, "lr": 3e-3}])
    assert x.tolist() == [0, 1] and y.tolist() == [0.0, 3e-3]


def test_report_without_a_run(tmp_path):
    from petal.evaluation.report import build_report

    with pytest.raises(PetalError, match="holds no training run"):
        build_report(tmp_path)


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("top_k", 0, r"top_k \(--top-k\) must be an integer >= 1. Received: 0"),
        ("batch_size", -2, r"batch_size \(--batch-size\) must be an integer >= 1"),
        # tf.data's batch failed on it with a traceback.
        ("batch_size", 2**63, r"^batch_size \(--batch-size\) must be at most 2147483647. "
                              r"Received: 9223372036854775808$"),
        ("split", "bogus", r"split \(--split\) must be 'train', 'validation' or 'all'"),
        ("num_samples", "4", r"num_samples must be an integer >= 0. Received: num_samples='4'"),
        ("max_misclassified", -1, r"max_misclassified must be an integer >= 0"),
    ],
)
def test_evaluate_checks_its_arguments_before_the_data(tmp_path, option, value, message):
    from petal.evaluation.evaluate import evaluate

    with pytest.raises(PetalError, match=message):
        evaluate(tmp_path / "no-run", tmp_path / "no-data", **{option: value})


def test_export_refuses_a_file_as_its_folder(trained, tmp_path):
    from petal.evaluation.export import export

    target = tmp_path / "model.bin"
    target.write_bytes(b"keep me")
    with pytest.raises(PetalError, match=r"Export folder .*model.bin is a file; pass --out"):
        export(trained, out=target)
    assert target.read_bytes() == b"keep me"
    # A file where a parent folder should be: one line naming the folder and the fix.
    with pytest.raises(PetalError, match=r"Cannot create export folder .*model.bin/export: "
                       r".*model.bin is a file, not a folder; pass --out a folder path whose "):
        export(trained, out=target / "export")
    assert target.read_bytes() == b"keep me"


def test_evaluate_refuses_a_file_as_its_folder_before_evaluating(trained, tmp_path, monkeypatch):
    from petal.evaluation import evaluate as evaluate_module

    target = tmp_path / "eval.txt"
    target.write_bytes(b"keep me")

    def no_data(*args, **kwargs):
        raise AssertionError("the data was opened before the output folder was checked")

    monkeypatch.setattr("petal.data.pipeline.open_source", no_data)
    with pytest.raises(PetalError, match=r"Evaluation folder .*eval.txt is a file; pass --out"):
        evaluate_module.evaluate(trained, tmp_path / "no-data", out_dir=target)
    with pytest.raises(PetalError, match=r"Cannot create evaluation folder .*eval.txt/eval: "
                       r".*eval.txt is a file, not a folder; pass --out a folder path whose "):
        evaluate_module.evaluate(trained, tmp_path / "no-data", out_dir=target / "eval")
    assert target.read_bytes() == b"keep me"
    # Where nothing can be created, whatever the permission bits say (root passes them).
    with pytest.raises(PetalError, match=r"^Cannot create evaluation folder /proc/petal/eval: "
                       r"nothing can be written in /proc \("):
        evaluate_module.evaluate(trained, tmp_path / "no-data", out_dir="/proc/petal/eval")


def test_evaluate_refuses_an_out_folder_inside_the_data(trained, tmp_path):
    """Its PNGs in an image folder would make a class of their own for the next run."""
    from petal.evaluation.evaluate import evaluate

    photos = tmp_path / "photos"
    (photos / "daisy").mkdir(parents=True)
    with pytest.raises(PetalError, match=r"evaluation folder .*photos/eval is inside the data "
                       r".*photos; pass --out a folder outside it"):
        evaluate(trained, photos, out_dir=photos / "eval", log=lambda line: None)
    assert [p.name for p in photos.iterdir()] == ["daisy"]


def test_evaluate_on_a_run_folder_names_it_as_a_run(trained):
    # `petal evaluate RUN --data RUN` said "The evaluation folder RUN/eval is inside the data
    # RUN; pass --out a folder outside it"; with --out elsewhere, the run was named.
    from petal.evaluation.evaluate import evaluate

    with pytest.raises(PetalError) as caught:
        evaluate(trained, trained, log=lambda line: None)
    assert str(caught.value) == (
        f"--data {trained} is the work directory of a `petal train` run, not data; pass --data "
        "a records folder, codelab shards or a folder of class sub-folders of images."
    )


def test_evaluate_cli_names_a_missing_training_data_path_and_the_fix(trained, tmp_path, capsys):
    import shutil

    from petal.cli import main

    run = tmp_path / "old-run"
    shutil.copytree(trained, run)
    config = json.loads((run / "config.json").read_text())
    config["data"] = "records/flowers-192"  # as runs before absolute paths stored it
    (run / "config.json").write_text(json.dumps(config))
    assert main(["evaluate", str(run)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == (
        f"petal evaluate: error: The training data of {run}, records/flowers-192 (relative to "
        "the folder the run was started in), is not found; pass --data PATH to evaluate on."
    )


def test_a_damaged_run_is_named_in_one_line(trained, tmp_path, capsys):
    import shutil

    from petal.cli import main
    from petal.evaluation.export import export
    from petal.evaluation.predict import predict

    image = tmp_path / "photo.jpg"  # never read: the run fails first
    run = tmp_path / "run"
    shutil.copytree(trained, run, ignore=shutil.ignore_patterns("export", "eval", "plots"))
    model = (run / "model.keras").read_bytes()
    (run / "model.keras").write_bytes(model[:4000])  # an interrupted copy
    with pytest.raises(PetalError, match=r"Cannot load .*model.keras \(not a .keras zip archive"):
        export(run)
    (run / "model.keras").write_bytes(model)
    (run / "config.json").write_text('{"data": ')
    with pytest.raises(PetalError, match=r"config.json is not valid JSON .*retrain it"):
        predict(run, [image])
    assert main(["predict", str(run), str(image)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("petal predict: error: ") and "config.json" in err[0]
    (run / "config.json").write_text("[1, 2]")
    with pytest.raises(PetalError, match=r"config.json holds no JSON object; the work "
                       r"directory is damaged \(petal train writes one\), retrain it"):
        export(run)


def test_predict_names_the_top_k_option(trained, tmp_path):
    from petal.evaluation.predict import predict

    with pytest.raises(PetalError, match=r"top_k \(--top-k\) must be an integer >= 1. Received: 0"):
        predict(trained, [tmp_path / "photo.jpg"], top_k=0)
    with pytest.raises(PetalError, match=r"^batch_size must be an integer >= 1. Received: 0$"):
        predict(trained, [tmp_path / "photo.jpg"], batch_size=0)


def test_predict_takes_one_path_as_a_str_or_path(trained, small_flowers, tmp_path, monkeypatch):
    """A str is one path, not a sequence of one-character paths ('.' walked the working
    folder, '/' the whole disk)."""
    from petal.evaluation.predict import predict

    photo = sorted((small_flowers / "roses").iterdir())[0]
    monkeypatch.chdir(tmp_path)
    for given in (str(photo), photo):
        [result] = predict(trained, given, top_k=2)
        assert result["file"] == str(photo) and len(result["predictions"]) == 2


def test_report_on_a_history_without_epochs_or_damaged(trained, tmp_path):
    import shutil

    from petal.evaluation.report import build_report

    run = tmp_path / "run"
    shutil.copytree(trained, run, ignore=shutil.ignore_patterns("export", "plots"))
    history = run / "history.csv"
    header = history.read_text().splitlines()[0]
    history.write_text(header + "\n")  # a run stopped before its first epoch:
    (run / "metrics.json").unlink()  # no metrics either
    html = build_report(run).read_text()
    assert "No epoch has finished yet" in html and not (run / "plots" / "curves.png").exists()
    history.write_text(header + "\nnot,numbers,at,all\n")
    with pytest.raises(PetalError, match=r"history.csv is not petal's history .*retrain it"):
        build_report(run)
    history.write_text("something else\n1\n")
    with pytest.raises(PetalError, match=r"history.csv is not petal's history"):
        build_report(run)


def test_report_on_an_unfinished_run_shows_the_epochs_it_saved(trained, tmp_path):
    # It said only "metrics.json missing", though history.csv holds the epochs done.
    import shutil

    from petal.evaluation.report import build_report
    from petal.training.callbacks import read_history

    run = tmp_path / "run"
    shutil.copytree(trained, run, ignore=shutil.ignore_patterns("export", "plots", "eval"))
    (run / "metrics.json").unlink()
    config = json.loads((run / "config.json").read_text())
    config["epochs"] = 6  # stopped after its first of 6
    (run / "config.json").write_text(json.dumps(config))
    [row] = read_history(run / "history.csv")
    html = build_report(run).read_text()
    assert "<h2>Training so far</h2>" in html
    assert "<tr><th>epochs done</th><td class='num'>1 of 6</td></tr>" in html
    acc = f"{row['val_accuracy']:.4g}"
    assert (f"<tr><th>best validation accuracy (epoch {row['epoch']})</th>"
            f"<td class='num'>{acc}</td></tr>") in html


def test_report_names_a_damaged_saved_file(trained, small_records, tmp_path):
    import shutil

    from petal.evaluation.evaluate import evaluate
    from petal.evaluation.report import build_report

    evaluate(trained, small_records, log=lambda line: None)
    run = tmp_path / "run"
    shutil.copytree(trained, run, ignore=shutil.ignore_patterns("export"))
    samples = (run / "eval" / "samples.npz").read_bytes()
    (run / "eval" / "samples.npz").write_bytes(b"xx\n")
    with pytest.raises(PetalError, match=r"samples.npz is damaged \(not an .npz archive.*petal evaluate"):
        build_report(run)
    (run / "eval" / "samples.npz").write_bytes(samples[: len(samples) // 2])
    with pytest.raises(PetalError, match=r"samples.npz is damaged"):
        build_report(run)
    (run / "eval" / "eval.json").write_text("{}")
    with pytest.raises(PetalError, match=r"eval.json has no count, .*run `petal evaluate"):
        build_report(run)
    (run / "eval" / "eval.json").write_text("{")
    with pytest.raises(PetalError, match=r"eval.json is not valid JSON"):
        build_report(run)
    (run / "metrics.json").write_text('{"acc')
    with pytest.raises(PetalError, match=r"metrics.json is not valid JSON .*retrain it"):
        build_report(run)


def test_evaluate_fits_a_folder_of_new_photos_as_the_runs_records_were(
    trained, small_flowers, tmp_path, monkeypatch
):
    """Records converted with --resize pad: new photos are padded too (predict's fit)."""
    from petal.data import pipeline
    from petal.evaluation.evaluate import evaluate

    run = tmp_path / "run"
    shutil.copytree(trained, run)
    config = json.loads((run / "config.json").read_text())
    config["resolved"]["resize"] = "pad"
    (run / "config.json").write_text(json.dumps(config))
    folder = tmp_path / "photos"
    for cls in sorted(p.name for p in small_flowers.iterdir()):
        (folder / cls).mkdir(parents=True)
        first = sorted((small_flowers / cls).iterdir())[0]
        (folder / cls / first.name).symlink_to(first.resolve())
    seen = []
    real = pipeline.eval_dataset

    def spy(*args, **kwargs):
        seen.append(kwargs.get("resize"))
        return real(*args, **kwargs)

    monkeypatch.setattr(pipeline, "eval_dataset", spy)
    report = evaluate(run, folder, out_dir=tmp_path / "eval", log=lambda line: None,
                      progress=False)
    assert seen == ["pad"] and report["count"] == len(list(folder.iterdir()))


@pytest.mark.slow  # 30 s in a loaded suite run (session 40): `pytest -m slow` runs it
def test_an_interrupted_evaluation_leaves_no_eval_json_beside_another_ones_plots(
    trained, small_records, tmp_path, monkeypatch
):
    """Ctrl-C while evaluate drew its plots left its new eval.json (validation, 10 images)
    beside the previous evaluation's misclassified.png ("Misclassified (n of 60)")."""
    from petal.evaluation import evaluate as evaluate_module
    from petal.evaluation.report import build_report

    run = tmp_path / "run"
    shutil.copytree(trained, run, ignore=shutil.ignore_patterns("eval", "plots", "report.html"))
    out = run / "eval"
    evaluate_module.evaluate(run, small_records, split="all", log=lambda line: None)
    (out / "notes.txt").write_text("the user's")
    drawn = []

    def interrupted(*args, **kwargs):
        drawn.append(args[1])
        raise KeyboardInterrupt

    monkeypatch.setattr(evaluate_module.plots, "plot_image_grid", interrupted)
    with pytest.raises(KeyboardInterrupt):
        evaluate_module.evaluate(run, small_records, log=lambda line: None)
    assert drawn == [out / "misclassified.png"]
    # Neither evaluation's files: none of the earlier one beside the new one's.
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
    monkeypatch.undo()
    # The report of a run whose evaluation did not finish: the training only.
    text = build_report(run).read_text()
    assert "Confusion matrix" not in text and "curves.png" in text
    evaluate_module.evaluate(run, small_records, log=lambda line: None)
    assert json.loads((out / "eval.json").read_text())["count"] == 10


def test_evaluate_on_a_full_disk_removes_what_it_wrote_and_says_so(
    trained, small_records, tmp_path, monkeypatch, capsys
):
    """--out on a full disk: eval.json, the .npz files and confusion_matrix.png were left,
    looking complete, without misclassified.png; the error, "[Errno 28] No space left on
    device", named no folder."""
    import errno

    from petal.cli import main
    from petal.evaluation import plots

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(plots, "plot_image_grid", full)
    out = tmp_path / "eval"
    out.mkdir()
    (out / "notes.txt").write_text("the user's")
    args = ["evaluate", str(trained), "--data", str(small_records), "--out", str(out)]
    assert main(args) == 2
    assert settled(capsys.readouterr().err) == [
        f"petal evaluate: error: Cannot write the evaluation in {out}: no space left on its "
        "disk; free some space there or pass --out a folder on another disk."
    ]
    assert [p.name for p in out.iterdir()] == ["notes.txt"]


@pytest.mark.slow  # 31 s in a loaded suite run (session 40): `pytest -m slow` runs it
def test_evaluating_the_runs_own_data_on_its_training_images_is_warned_about(
    trained, small_records, small_flowers, tmp_path
):
    """`--split train` or `all` of the run's own records (or image folder) scored the
    images it trained on without a word, though the same images converted elsewhere were
    warned about; the warning is said and kept in eval.json, and its validation split has
    none."""
    from conftest import link_photos
    from petal.data import open_source
    from petal.evaluation.evaluate import evaluate
    from petal.training.loop import train

    def warned(run: Path, data: Path, split: str | None) -> list[str]:
        said: list[str] = []
        report = evaluate(run, data, split=split, out_dir=tmp_path / f"eval-{split}",
                          log=lambda line: None, warn=said.append, **NO_GRID)
        assert report.get("warnings", []) == said
        return settled(said)

    def overstated(data: Path, split: str, trained_on: int, scored: int) -> str:
        return (
            f"{data} is the data the run trained on: the {split} split scored holds "
            f"{trained_on} of its {scored} images the model trained on, so the score "
            "overstates how it does on new photos. For a held-out score evaluate on the "
            "validation split (omit --split)."
        )

    # Records: 50 training and 10 validation records.
    assert warned(trained, small_records, "train") == [
        overstated(small_records, "train", 50, 50)
    ]
    assert warned(trained, small_records, "all") == [overstated(small_records, "all", 50, 60)]
    assert warned(trained, small_records, None) == []
    # An image folder the run trained on, split as petal splits it.
    photos = link_photos(small_flowers, tmp_path / "photos", 5, classes=2)
    run = tmp_path / "run"
    train(tiny_config(photos, epochs=1, model="dense", batch_size=4), run, log=lambda line: None)
    held = len(open_source(photos).files("train"))
    assert 0 < held < 10
    assert warned(run, photos, "all") == [overstated(photos, "all", held, 10)]
    assert warned(run, photos, None) == []


def test_the_copy_warning_counts_the_split_scored_over_http_as_on_disk(
    trained, small_records, small_flowers, tmp_path
):
    """Records read over http: their names were not read, so the warning counted every image
    of the folder (245 of 3,119) instead of those of the split scored (44 of 593)."""
    from petal.data import convert, remote
    from petal.evaluation.evaluate import evaluate

    held_out = _record_names(small_records, "validation")
    copy = tmp_path / "copy"
    for cls in ("daisy", "roses"):
        (copy / cls).mkdir(parents=True)
        photos = [f for f in sorted((small_flowers / cls).iterdir())
                  if f"{cls}/{f.name}" not in held_out][:5]  # fmt: skip
        for f in photos:
            (copy / cls / f.name).symlink_to(f.resolve())
    records = tmp_path / "records"
    convert(copy, records, image_size=32, val_fraction=0.4, workers=1, progress=False)
    scored = len(_record_names(records, "validation"))
    assert 0 < scored < 10
    with remote.ObjectServer({"records": records}) as server:
        for data in (records, server.url("records")):
            warned = []
            evaluate(trained, data, out_dir=tmp_path / "eval", log=lambda line: None,
                     warn=warned.append, **NO_GRID)  # fmt: skip
            assert [w for w in warned if "most likely copies" in w][0].startswith(
                f"{scored} of the {scored} images of {data} (validation split, converted from "
                f"{copy}) have the names and sizes of training photos in {small_flowers}"
            ), warned


@pytest.mark.slow  # 43 s in a loaded suite run (session 40): `pytest -m slow` runs it
def test_evaluate_warns_when_the_runs_own_records_were_converted_again_with_another_split(
    small_flowers, tmp_path
):
    """The run's records converted again in place with another seed: evaluate read their
    manifest now as the run's, so their validation split (photos it trained on) was scored as
    held out without a word, and so were other records split as they are now."""
    from petal.data import convert
    from petal.evaluation.evaluate import evaluate
    from petal.training.loop import train

    def converted(out, seed, **kw):
        convert(small_flowers, out, image_size=32, seed=seed, workers=1, progress=False,
                shards=1, **kw)
        return out

    def warned(run, data):
        warnings = []
        evaluate(run, data, out_dir=tmp_path / "eval", log=lambda line: None,
                 warn=warnings.append, **NO_GRID)
        return settled(warnings)

    records = converted(tmp_path / "records", 0)
    run = tmp_path / "run"
    train(tiny_config(records, model="dense", epochs=1, steps_per_epoch=1), run,
          log=lambda line: None)
    assert warned(run, records) == []
    converted(records, 1, overwrite=True)
    again = (f"convert {small_flowers} again with --seed 0 --val-fraction 0.19 (as {records} "
             "were split when the run trained) and evaluate on those")
    assert warned(run, records) == [
        f"{records}, the records the run trained on, were converted again from {small_flowers} "
        "since and split differently (seed 1 vs 0): its validation split holds images the "
        "model trained on, so the score overstates how it does on new photos. For a held-out "
        f"score {again}, or evaluate on new photos."
    ]
    # Other records split as the run's are now: split otherwise than it trained.
    seed1 = converted(tmp_path / "seed1", 1)
    assert [w.endswith(f"For a held-out score {again}.") and "(seed 1 vs 0):" in w
            for w in warned(run, seed1)] == [True]
    # Split as the run's were: its held-out photos.
    assert warned(run, converted(tmp_path / "seed0", 0)) == []
    # A run saved before records_split was kept: how it was split is not known, as before.
    config = json.loads((run / "config.json").read_text())
    del config["resolved"]["records_split"]
    (run / "config.json").write_text(json.dumps(config))
    assert warned(run, records) == []


def test_evaluate_refuses_a_folder_where_it_writes_a_file_before_it_evaluates(
    trained, small_records, tmp_path, capsys, monkeypatch
):
    """A folder named eval.json in --out: the whole evaluation ran, then failed naming only
    the output folder ("Is a directory")."""
    from petal.cli import main
    from petal.evaluation import evaluate as evaluate_module

    out = tmp_path / "evdir"
    (out / "eval.json").mkdir(parents=True)
    (out / "confusion_matrix.png").mkdir()

    def no_evaluation(*args, **kwargs):
        raise AssertionError("the data was read before the output folder was checked")

    monkeypatch.setattr("petal.data.pipeline.eval_dataset", no_evaluation)
    assert main(["evaluate", str(trained), "--data", str(small_records), "--out",
                 str(out)]) != 0  # fmt: skip
    assert capsys.readouterr().err.strip().splitlines() == [
        f"petal evaluate: error: {out / 'eval.json'} is a folder, where the evaluation writes "
        "its eval.json; move it away or pass --out another folder."
    ]
    (out / "eval.json").rmdir()
    with pytest.raises(PetalError, match=re.escape(
        f"{out / 'confusion_matrix.png'} is a folder, where the evaluation writes its "
        "confusion_matrix.png; move it away")):
        evaluate_module.evaluate(trained, small_records, out_dir=out, log=lambda line: None)
    assert sorted(p.name for p in out.iterdir()) == ["confusion_matrix.png"]


def test_evaluate_cli_takes_the_runs_glob_of_shards_as_its_data(
    trained, make_records, tmp_path, capsys
):
    """A run trained on a quoted glob (`--data 'shards/*.tfrec'`) keeps the pattern as its
    data: evaluate reads it again, and names the pattern when it matches no file."""
    from petal.cli import main

    shards = make_records("shards", counts={"all": [10] * 6}, codelab=True, fmt="jpeg")
    run = tmp_path / "glob-run"
    shutil.copytree(trained, run)
    config = json.loads((run / "config.json").read_text())
    config["data"] = str(shards / "*.tfrec")
    (run / "config.json").write_text(json.dumps(config))
    assert main(["evaluate", str(run), "--json", "--out", str(tmp_path / "eval")]) == 0
    assert json.loads(capsys.readouterr().out)["count"] == 10
    config["data"] = str(shards / "*.tfrecord")
    (run / "config.json").write_text(json.dumps(config))
    assert main(["evaluate", str(run)]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"petal evaluate: error: The training data of {run}, {shards}/*.tfrecord, is not "
        "found; pass --data PATH to evaluate on."
    )


def test_a_second_evaluation_into_a_folder_is_refused(trained, small_records, tmp_path):
    # Two at once each removed the other's files as it wrote its own: the folder ended empty.
    import os
    import socket

    from petal.evaluation.evaluate import evaluate
    from petal.running import RUNNING_FILE

    out = tmp_path / "eval"
    evaluate(trained, small_records, out_dir=out, log=lambda line: None)
    assert not (out / RUNNING_FILE).exists()  # this evaluation's marker is gone at its end
    written = sorted(os.listdir(out))
    holder = {"pid": os.getppid(), "host": socket.gethostname(), "doing": "evaluating into it"}
    (out / RUNNING_FILE).write_text(json.dumps(holder))
    with pytest.raises(PetalError, match=(
        rf"^{out} is in use: process {os.getppid()} on .* is evaluating into it; wait for it to "
        r"end or stop it, or pass another --out \(if it is not running, delete "
    )):
        evaluate(trained, small_records, out_dir=out, log=lambda line: None)
    assert sorted(os.listdir(out)) == sorted([RUNNING_FILE, *written])  # left alone
    zebras = tmp_path / "photos" / "zebra"  # a class the model does not know: refused
    zebras.mkdir(parents=True)
    Image.new("RGB", (40, 40)).save(zebras / "z.jpg")
    with pytest.raises(PetalError, match="zebra"):
        evaluate(trained, zebras.parent, out_dir=tmp_path / "new" / "eval", log=lambda line: None)
    assert not (tmp_path / "new").exists()  # the folder held while it ran is gone again


def test_evaluate_refuses_records_a_conversion_is_writing(trained, small_records, tmp_path):
    import os
    import socket

    from petal.evaluation.evaluate import evaluate
    from petal.running import RUNNING_FILE

    records = tmp_path / "records"
    shutil.copytree(small_records, records)
    holder = {"pid": os.getppid(), "host": socket.gethostname(), "doing": "converting into it"}
    (records / RUNNING_FILE).write_text(json.dumps(holder))
    with pytest.raises(PetalError, match=(
        rf"^{records} is in use: process {os.getppid()} on .* is converting into it; "
        rf"wait for it to end or stop it, or pass another --data \(if it is not running, "
        rf"delete {records / RUNNING_FILE}\)\.$"
    )):
        evaluate(trained, records, out_dir=tmp_path / "eval", log=lambda line: None)
    assert not (tmp_path / "eval").exists()


def test_evaluate_marks_the_records_it_reads_so_a_conversion_into_them_is_refused(
    trained, small_records, tmp_path, monkeypatch
):
    """Only train left a reading marker: a conversion started during an evaluation replaced
    the shards under it."""
    from petal.data import pipeline
    from petal.evaluation.evaluate import evaluate
    from petal.running import READING_PREFIX

    records = tmp_path / "records"
    shutil.copytree(small_records, records)
    held = []
    real = pipeline.eval_dataset

    def reading(*args, **kwargs):
        held.append(sorted(p.name for p in records.glob(f"{READING_PREFIX}*")))
        return real(*args, **kwargs)

    monkeypatch.setattr(pipeline, "eval_dataset", reading)
    evaluate(trained, records, out_dir=tmp_path / "eval", log=lambda line: None)
    assert len(held) == 1 and len(held[0]) == 1, held
    assert not list(records.glob(f"{READING_PREFIX}*"))  # removed when it ends


def test_a_plot_that_cannot_be_saved_closes_its_figure(tmp_path):
    # A notebook plotting into a bad place kept one open figure per failed call.
    import matplotlib.pyplot as plt

    from petal.evaluation.plots import plot_confusion_matrix

    (tmp_path / "file").write_text("not a folder")
    plt.close("all")
    for out in (tmp_path / "file" / "cm.png", tmp_path / "cm.unknown-format"):
        with pytest.raises((OSError, ValueError)):
            plot_confusion_matrix(np.eye(2, dtype=int), ["a", "b"], out)
        assert plt.get_fignums() == []


def test_classes_picked_from_a_folder_are_said_to_be_picked_not_all_it_holds(
    trained, small_flowers, tmp_path
):
    # The folder held all five classes; the warning said it held the two --classes picked.
    from petal.evaluation.evaluate import evaluate

    photos = tmp_path / "photos"
    for cls in ("daisy", "dandelion", "roses", "sunflowers", "tulips"):
        (photos / cls).mkdir(parents=True)
        for f in sorted((small_flowers / cls).iterdir())[:1]:
            (photos / cls / f.name).symlink_to(f.resolve())
    warned: list[str] = []
    report = evaluate(trained, photos, classes="roses,daisy", out_dir=tmp_path / "eval",
                      log=lambda line: None, warn=warned.append)
    assert report["count"] == 2
    assert settled(warned)[-1] == (
        f"--classes picks 2 of the model's 5 classes (roses, daisy) from {photos}; the macro "
        "averages are over those"
    )


def test_evaluate_refuses_data_that_is_not_one_path(trained):
    # None and a list failed with pathlib's TypeError; '' read the current folder.
    from petal.evaluation.evaluate import evaluate

    ours = json.loads((trained / "config.json").read_text())["data"]
    for data in (None, [str(trained)], ""):
        with pytest.raises(PetalError) as caught:
            evaluate(trained, data, log=lambda line: None, warn=lambda line: None)
        assert str(caught.value) == (
            "evaluate needs data as one records folder, codelab shards or image folder (the "
            f"run trained on {ours}). Received: data={data!r}"
        )


def test_per_class_metrics_refuses_class_names_that_do_not_fit_the_matrix():
    """Fewer names than the matrix's classes dropped classes from per_class while the macro
    averages kept them; more raised an IndexError."""
    cm = metrics.confusion_matrix(Y_TRUE, np.argmax(PROBS, axis=1), 3)
    for classes in (["a", "b"], ["a", "b", "c", "d"]):
        n = len(classes)
        with pytest.raises(PetalError, match=rf"^cm must be \[{n}, {n}\] for {n} classes\. "
                           r"Received: shape=\(3, 3\)$"):  # fmt: skip
            metrics.per_class_metrics(cm, classes)
    with pytest.raises(PetalError, match=r"Received: shape=\(3,\)$"):
        metrics.per_class_metrics(np.array([1, 2, 3]), ["a", "b", "c"])
    assert list(metrics.per_class_metrics(cm, ["a", "b", "c"])["per_class"]) == ["a", "b", "c"]


def test_lr_plot_places_an_epochs_last_step_before_the_next_epochs_first(
    trained, tmp_path, monkeypatch
):
    # The last step of epoch e was drawn at x=e, where epoch e+1's first step is: a warm-up
    # showed a vertical drop at each epoch boundary instead of the step between them.
    import shutil

    from petal.evaluation import plots
    from petal.evaluation.report import build_report

    rows = [{"epoch": 1, "lr": 0.0, "lr_end": 2.56e-3}, {"epoch": 2, "lr": 2.07e-3,
            "lr_end": 1.1e-4}, {"epoch": 3, "lr": 1e-4, "lr_end": 1e-5}]
    batches = [{"from_epoch": 1, "steps_per_epoch": 5}, {"from_epoch": 3, "steps_per_epoch": 2}]
    x, y = plots.lr_points(rows, batches)
    assert x.tolist() == [0, 0.8, 1, 1.8, 2, 2.5]
    assert y.tolist() == [0.0, 2.56e-3, 2.07e-3, 1.1e-4, 1e-4, 1e-5]
    # One step per epoch: its first step is its last.
    x, _ = plots.lr_points(rows[:1], [{"from_epoch": 1, "steps_per_epoch": 1}])
    assert x.tolist() == [0]
    # The report places them by the run's own steps per epoch.
    given = []
    real = plots.plot_lr
    monkeypatch.setattr(plots, "plot_lr",
                        lambda rows, out, batches=None: given.append(batches) or real(rows, out))
    run = tmp_path / "run"
    shutil.copytree(trained, run, ignore=shutil.ignore_patterns("export", "eval", "plots"))
    build_report(run)
    steps = json.loads((run / "config.json").read_text())["resolved"]["steps_per_epoch"]
    assert [b["steps_per_epoch"] for b in given[0]] == [steps]


def test_a_class_named_in_another_unicode_form_is_the_model_s_class(tmp_path):
    # A run trained on a folder unzipped on macOS (NFD names) refused new photos in a
    # folder typed elsewhere (NFC) as classes it did not know, listing look-alike names.
    import types
    import unicodedata

    from petal.evaluation.workdir import class_index

    nfd = unicodedata.normalize("NFD", "rosé")
    run = types.SimpleNamespace(classes=("daisy", nfd, "tulips"), workdir=tmp_path)
    assert class_index(("rosé", "daisy"), run, "photos", "folder").tolist() == [1, 0]
    assert class_index((nfd, "tulips"), run, "photos", "folder").tolist() == [1, 2]
    with pytest.raises(PetalError, match="does not know: lily; "):
        class_index(("rosé", "lily"), run, "photos", "folder")


def test_evaluating_all_of_the_folder_the_records_came_from_is_warned_about(
    trained, small_records, small_flowers, tmp_path
):
    """`--split all` of the image folder the run's records were converted from scored the
    50 photos it trained on with no warning, though the same photos through the records
    were warned about."""
    from petal.evaluation.evaluate import evaluate

    report = evaluate(trained, small_flowers, split="all", out_dir=tmp_path / "eval",
                      log=lambda line: None)  # fmt: skip
    assert settled(report["warnings"]) == [
        f"{small_flowers} is the image folder the run's records {small_records} were converted "
        "from: the all split scored holds 50 of its 60 images the model trained on, so the "
        "score overstates how it does on new photos. For a held-out score evaluate on "
        f"{small_records}, or evaluate on new photos."
    ]
    saved = json.loads((tmp_path / "eval" / "eval.json").read_text())
    assert saved["warnings"] == report["warnings"]


@pytest.mark.slow  # 9 s in CI on a Zen 3 host (session 39: 611 s): `pytest -m slow` runs it
def test_a_run_on_shards_that_name_no_classes_warns_in_train_and_evaluate(
    make_records, tmp_path, capsys
):
    """Shards of class ids alone trained a model whose classes were the codelab's flower
    names (7 classes: daisy, ..., tulips, class_5, class_6) without a word; evaluate and
    predict then called another's class 0 "daisy"."""
    from conftest import keep_only
    from petal.cli import main

    names = ("cat", "dog", "fox", "owl", "bee", "ant", "elk")
    folder = keep_only(make_records("seven", counts={"all": [7] * 6}, codelab=True,
                                    fmt="jpeg", classes=names))  # fmt: skip
    workdir = tmp_path / "run"
    assert main(["train", "--preset", "quick", "--model", "dense", "--data", str(folder),
                 "--workdir", str(workdir), "--epochs", "1", "--image-size", "16",
                 "--batch-size", "8", "--precision", "float32", "--set", "steps_per_epoch=2",
                 "--set", "tensorboard=false"]) == 0  # fmt: skip
    note = (
        f"the shards at {folder} name no classes (no label in their records, no manifest.json): "
        "their 7 classes are called class_0 ... class_6, by index; pass --classes NAMES "
        "(comma-separated, in index order) to name them"
    )
    assert f"petal train: warning: {note}" in capsys.readouterr().err.splitlines()
    classes = [f"class_{i}" for i in range(7)]
    assert json.loads((workdir / "metrics.json").read_text())["classes"] == classes
    assert main(["evaluate", str(workdir), "--json"]) == 0
    assert settled(json.loads(capsys.readouterr().out)["warnings"]) == [note]
    # --classes with names the model does not know was told to pass --classes.
    given = "class_0,class_1,class_2,class_3,class_4,ant,elk"
    assert main(["evaluate", str(workdir), "--classes", given]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"petal evaluate: error: --classes names ant, elk, not a class of the model: the shards "
        f"at {folder} name no classes (no label in their records), and the model in {workdir} "
        f"knows them by name ({', '.join(classes)}); pass --classes naming the shards' classes "
        f"in index order with those names. Received: --classes {given}"
    )


def test_the_progress_bar_counts_the_images_scored_not_those_skipped(
    trained, small_flowers, tmp_path, capsys
):
    """With undecodable files skipped the bar ended short of its total (99% 300/302)."""
    from petal.evaluation.evaluate import evaluate

    folder = tmp_path / "photos"
    for cls in sorted(p.name for p in small_flowers.iterdir()):
        (folder / cls).mkdir(parents=True)
        for f in sorted((small_flowers / cls).iterdir())[:2]:
            (folder / cls / f.name).symlink_to(f.resolve())
    (folder / "daisy" / "zz-not-an-image.jpg").write_bytes(b"plain text, not a JPEG")
    report = evaluate(trained, folder, out_dir=tmp_path / "eval", skip_corrupt=True,
                      log=lambda line: None, progress=True)
    assert report["count"] == 10
    err = capsys.readouterr().err.replace("\r", "\n")
    last = [line for line in err.splitlines() if line.startswith("evaluate:")][-1]
    assert last.startswith("evaluate: 100%") and " 10/10 " in last, last


def test_ctrl_c_as_an_evaluation_replaces_another_leaves_one_of_them_whole(
    trained, small_records, tmp_path, monkeypatch
):
    # Ctrl-C while the files were written left the folder empty: the earlier evaluation
    # removed, this one not written.
    from conftest import interrupt_when_called
    from petal.evaluation import plots
    from petal.evaluation.evaluate import evaluate

    out = tmp_path / "ev"
    evaluate(trained, small_records, out_dir=out, log=lambda line: None)
    interrupt_when_called(monkeypatch, plots, "plot_confusion_from_json")
    with pytest.raises(KeyboardInterrupt):
        evaluate(trained, small_records, out_dir=out, log=lambda line: None)
    assert (out / "eval.json").is_file() and (out / "confusion_matrix.png").is_file()


def test_records_of_some_of_the_runs_classes_split_alike_are_held_out(
    trained, small_records, small_flowers, tmp_path
):
    """Records of two of the run's classes, split as its records were, drew "split
    differently (seed 0 vs 0, validation fraction 0.19 vs 0.19, or other images)": the whole
    split was compared, though each class is split on its own. Only what differs is named."""
    from petal.data import convert
    from petal.evaluation.evaluate import evaluate

    warnings: list[str] = []
    for seed in (0, 1):
        some = tmp_path / f"some{seed}"
        convert(small_flowers, some, classes=("roses", "daisy"), image_size=32, seed=seed,
                workers=1, progress=False)
        evaluate(trained, some, out_dir=tmp_path / f"eval{seed}", log=lambda line: None,
                 warn=warnings.append)
    warnings = [w for w in warnings if "split" in w]  # (not the classes they lack)
    assert len(warnings) == 1, warnings
    assert (f"{tmp_path / 'some1'} was converted from {small_flowers} like the run's records "
            f"{small_records}, but split differently (seed 1 vs 0): its validation") \
        in warnings[0]


def test_report_counts_the_corrupt_files_of_an_image_folder_once(trained, tmp_path):
    """evaluate --skip-corrupt on an image folder writes a count (skipped_corrupt_records)
    and the list of the same files (skipped_corrupt_files): the report showed both rows."""
    from petal.evaluation.report import build_report

    run = tmp_path / "run"
    shutil.copytree(trained, run, ignore=shutil.ignore_patterns("export", "eval", "plots"))
    (run / "eval").mkdir()
    evaluation = {
        "count": 4, "accuracy": 0.5, "classes": ["a", "b"], "confusion_matrix": [[1, 1], [1, 1]],
        "per_class": {c: {"precision": 0.5, "recall": 0.5, "f1": 0.5, "support": 2}
                      for c in "ab"},
        "macro": {"precision": 0.5, "recall": 0.5, "f1": 0.5},
        "data": "/elsewhere/photos", "split": "all", "workdir": str(run),
        "skipped_corrupt_records": 2,
        "skipped_corrupt_files": ["a/zero.jpg: empty file", "b/huge.png: too many pixels"],
    }
    (run / "eval" / "eval.json").write_text(json.dumps(evaluation))
    page = build_report(run).read_text()
    assert ("<tr><th>images</th><td class='num'>4</td></tr>"
            "<tr><th>skipped: corrupt files</th><td class='num'>2</td></tr>"
            "<tr><th>accuracy</th>") in page
    assert "corrupt records" not in page


def test_an_image_grid_shortens_long_class_names_to_its_columns(tmp_path, monkeypatch):
    """~30-character names ran into the next image's title, and the suptitle into them."""
    from petal.evaluation import plots

    drawn = []
    save = plots._save

    def check(fig, out):
        drawn.append([ax.get_title() for ax in fig.axes if ax.get_title()])
        titles_apart(fig)
        return save(fig, out)

    monkeypatch.setattr(plots, "_save", check)
    classes = np.array(["Abyssinian_long_haired_domestic_cat_breed", "WWWWWWWWWWWWWWWWWWWWWWWW",
                        "price_$5_to_$10_long_haired_domestic_cat"])
    samples = dict(images=np.full((8, 48, 48, 3), 128, np.uint8), true=np.arange(8) % 3,
                   pred=np.full(8, 0), prob=np.full(8, 0.6), classes=classes)
    plots.plot_image_grid(samples, tmp_path / "grid.png", "Misclassified (8 of 8)")
    # Shortened in the middle (as far as each line needs), "$" still escaped.
    pred, true = drawn[0][1].split("\n")
    assert pred.startswith("Abyssinian") and pred.endswith("…_cat_breed (0.60)"), pred
    assert true.startswith("true: WWW") and "…" in true, true
    assert drawn[0][2].split("\n")[1].startswith(r"true: price_\$5_"), drawn[0][2]


def test_the_lr_plot_says_its_axis_counts_epochs_trained(tmp_path, monkeypatch):
    """lr.png's "epoch" axis placed epoch e's first rate at e - 1 (curves.png draws epoch e
    at e): at x=2 it showed epoch 3's rate under the same label."""
    from petal.evaluation import plots

    labels = {}
    save = plots._save

    def keep_label(fig, out):
        labels[Path(out).name] = [ax.get_xlabel() for ax in fig.axes]
        return save(fig, out)

    monkeypatch.setattr(plots, "_save", keep_label)
    rows = [{"epoch": e, "loss": 1.0, "accuracy": 0.5, "val_loss": 1.0, "val_accuracy": 0.5,
             "lr": 1e-3, "lr_end": 1e-3} for e in (1, 2, 3)]
    plots.plot_history(rows, tmp_path / "curves.png")
    plots.plot_lr(rows, tmp_path / "lr.png")
    assert labels == {"curves.png": ["epoch", "epoch"], "lr.png": ["epochs trained"]}


def test_plots_shorten_long_names_name_the_split_and_keep_best_inside(tmp_path, monkeypatch):
    """The confusion matrix drew 70-character names in full (the matrix got half the
    figure), said nothing of the split it scored, and the curves' "best" label of a first
    epoch was centred on the axis, over its tick labels."""
    from petal.evaluation import plots

    drawn = {}
    save = plots._save

    def keep(fig, out):
        ax = fig.axes[0]
        drawn[Path(out).name] = (
            [t.get_text() for t in ax.get_xticklabels()], ax.get_title(),
            [(t.get_text(), t.get_horizontalalignment()) for t in ax.texts])  # fmt: skip
        return save(fig, out)

    monkeypatch.setattr(plots, "_save", keep)
    classes = ["a" * 35 + "_middle_" + "z" * 30, "daisy"]
    report = {"classes": classes, "confusion_matrix": [[3, 1], [0, 4]], "accuracy": 0.875,
              "split": "train"}  # fmt: skip
    (tmp_path / "eval.json").write_text(json.dumps(report))
    plots.plot_confusion_from_json(tmp_path / "eval.json", tmp_path / "cm.png")
    ticks, title, _ = drawn["cm.png"]
    assert ticks == ["a" * 12 + "…" + "z" * 11, "daisy"]
    assert title == "Confusion matrix: train (accuracy 0.875)"
    rows = [{"epoch": e, "loss": 1.0, "accuracy": 0.5, "val_loss": 1.0, "val_accuracy": v}
            for e, v in ((1, 0.6), (2, 0.4), (3, 0.5))]  # fmt: skip
    plots.plot_history(rows, tmp_path / "curves.png")
    assert drawn["curves.png"][2] == [("best 0.600", "left")]
    rows[2]["val_accuracy"] = 0.7
    plots.plot_history(rows, tmp_path / "curves.png")
    assert drawn["curves.png"][2] == [("best 0.700", "right")]


def test_the_misclassified_grid_says_when_it_shows_fewer_than_all(
    trained, small_records, tmp_path, monkeypatch
):
    """"Misclassified (29 of 30)" over the 24 images max_misclassified keeps."""
    from petal.evaluation import plots
    from petal.evaluation.evaluate import evaluate
    from petal.evaluation.report import build_report

    titles = []
    real = plots.plot_image_grid
    monkeypatch.setattr(plots, "plot_image_grid",
                        lambda data, out, title="": titles.append(title) or real(data, out, title))
    run = tmp_path / "run"
    shutil.copytree(trained, run, ignore=shutil.ignore_patterns("export", "eval", "plots"))
    report = evaluate(run, small_records, log=lambda line: None, max_misclassified=1)
    wrong = report["count"] - sum(row[i] for i, row in enumerate(report["confusion_matrix"]))
    assert wrong >= 2, report["confusion_matrix"]  # more than the grid shows
    title = f"Misclassified ({wrong} of {report['count']}; first 1 shown)"
    page = build_report(run).read_text()
    assert [t for t in titles if t] == [title, title]  # evaluate's, then the report's
    assert f"<h3>{title}</h3>" in page
    assert plots.misclassified_title(3, 10, 3) == "Misclassified (3 of 10)"


def test_evaluate_warns_of_a_class_with_no_image_in_the_split(trained, make_records, tmp_path):
    """A class of the records with no validation image scored 0.000, left out of the macro
    averages without a word (a folder lacking classes was warned about)."""
    from petal.evaluation.evaluate import evaluate

    # Validation images 5 to 8: labels 0 to 3, none of tulips (4).
    records = make_records(counts={"train": [5], "validation": [4]}, size=(32, 32))
    warned = []
    report = evaluate(trained, records, out_dir=tmp_path / "eval", log=lambda line: None,
                      warn=warned.append)
    assert report["per_class"]["tulips"]["support"] == 0
    assert warned == report["warnings"]
    assert settled(warned) == [
        f"Split 'validation' of {records}: no image of tulips was scored (none in the split); "
        "the macro averages are over the other 4 classes"
    ]
    # The classes with images the model never predicted (which, depends on the run) are
    # said as such: their precision is 0/0, reported as 0.000.
    cm = np.array(report["confusion_matrix"])
    never = [c for i, c in enumerate(report["classes"]) if cm[i].sum() and not cm[:, i].sum()]
    assert [line for line in warned if line not in settled(warned)] == [
        f"Split 'validation' of {records}: the model predicted no image as {', '.join(never)}; "
        f"{'its' if len(never) == 1 else 'their'} precision (no predictions to count) is "
        "reported as 0.000 and counted so in the macro averages"
    ][: len(never)]
    assert all(report["per_class"][c]["precision"] == 0.0 for c in never)


@pytest.mark.parametrize("scan", [True, False], ids=["checked-first", "too-many-to-check"])
def test_a_class_whose_every_image_is_skipped_as_corrupt_is_said_to_be(
    trained, small_flowers, tmp_path, monkeypatch, scan
):
    """A class of a folder whose only photos were truncated was "none in the split, or
    skipped as corrupt" (either, for files known one by one), and the folder's classes were
    said first to be what "the macro averages are over", then the other 1 class. In a folder
    too large to check up front, skipped as read, it was "none in the split"."""
    from petal.data import pipeline
    from petal.evaluation.evaluate import evaluate

    if not scan:
        monkeypatch.setattr(pipeline, "MAX_DECODE_SCAN", 1)

    photos = tmp_path / "photos"
    for cls in ("daisy", "roses"):
        (photos / cls).mkdir(parents=True)
        for n, f in enumerate(sorted((small_flowers / cls).iterdir())[:2]):
            data = f.read_bytes()  # renamed: no copy of a photo the model trained on
            (photos / cls / f"{n}.jpg").write_bytes(data[:300] if cls == "roses" else data)
    warned: list[str] = []
    report = evaluate(trained, photos, skip_corrupt=True, out_dir=tmp_path / "eval",
                      log=lambda line: None, warn=warned.append)  # fmt: skip
    assert report["count"] == 2 and report["per_class"]["roses"]["support"] == 0
    assert report["macro"]["recall"] == report["per_class"]["daisy"]["recall"]
    assert warned == report["warnings"]
    warned = settled(warned)
    assert len(warned) == 3
    assert warned[0].startswith("--skip-corrupt: 2 of 4 files cannot be decoded and are skipped"
                                if scan else "--skip-corrupt: ")  # fmt: skip
    assert warned[1:] == [
        f"{photos} holds 2 of the model's 5 classes (daisy, roses)",
        f"Split 'all' of {photos}: no image of roses was scored (all 2 skipped as corrupt); the "
        "macro averages are over the other 1 class",
    ]


@pytest.mark.parametrize("scan", [True, False], ids=["checked-first", "too-many-to-check"])
def test_a_folder_whose_every_image_is_skipped_as_corrupt_says_so(
    trained, small_flowers, tmp_path, monkeypatch, scan
):
    # It said the split "holds no images to evaluate", after a line naming every file.
    from petal.data import pipeline
    from petal.errors import PetalError
    from petal.evaluation.evaluate import evaluate

    if not scan:
        monkeypatch.setattr(pipeline, "MAX_DECODE_SCAN", 1)

    photos = tmp_path / "photos"
    (photos / "roses").mkdir(parents=True)
    for n, f in enumerate(sorted((small_flowers / "roses").iterdir())[:2]):
        (photos / "roses" / f"{n}.jpg").write_bytes(f.read_bytes()[:300])
    with pytest.raises(PetalError) as caught:
        evaluate(trained, photos, skip_corrupt=True, out_dir=tmp_path / "eval",
                 log=lambda line: None, warn=lambda line: None)  # fmt: skip
    assert str(caught.value) == (
        f"Split 'all' of {photos}: every image was skipped as corrupt (the lines above name "
        "them); replace those files, or evaluate other data."
    )


def test_a_plot_whose_write_fails_leaves_the_earlier_one(tmp_path, monkeypatch):
    """Ctrl-C during `petal report` left a plot cut short over the earlier one."""
    import matplotlib.pyplot as plt
    from matplotlib.figure import Figure

    from petal.evaluation import plots

    out = tmp_path / "loss.png"
    out.write_bytes(b"earlier")

    def savefig(self, fname, **kwargs):
        with open(fname, "wb") as f:
            f.write(b"cut short")
        raise KeyboardInterrupt

    monkeypatch.setattr(Figure, "savefig", savefig)
    fig = plt.figure()
    with pytest.raises(KeyboardInterrupt):
        plots._save(fig, out)
    assert not plt.fignum_exists(fig.number)  # closed all the same
    assert out.read_bytes() == b"earlier"
    assert [p.name for p in tmp_path.iterdir()] == ["loss.png"]


def test_an_atomic_write_goes_through_a_link_and_into_a_device(tmp_path, monkeypatch):
    """Written through a temporary file renamed over the path, a link became a file (the
    file it named kept its old bytes) and a link to a device (/dev/stdout) would have
    become one too; a plot named without an extension left its temporary file."""
    import errno

    import matplotlib.pyplot as plt

    from petal.evaluation import plots
    from petal.jsonfile import save_atomically, write_json

    target, link = tmp_path / "target.json", tmp_path / "link.json"
    target.write_text("old")
    link.symlink_to(target)
    write_json(link, {"new": 1})
    assert link.is_symlink() and json.loads(target.read_text()) == {"new": 1}
    device = tmp_path / "null"
    device.symlink_to(os.devnull)
    write_json(device, {"new": 1})
    assert device.is_symlink() and os.readlink(device) == os.devnull
    # A plot named without an extension: matplotlib writes PNG and names it so.
    assert plots._save(plt.figure(), tmp_path / "cm") == tmp_path / "cm.png"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "cm.png", "link.json", "null", "target.json"]  # fmt: skip
    # A failed rename names both files, not the path twice.
    def refused(src, dst):
        raise OSError(errno.EXDEV, "Invalid cross-device link", str(src), None, str(dst))

    monkeypatch.setattr(os, "replace", refused)
    with pytest.raises(OSError) as caught:
        save_atomically(tmp_path / "x.json", lambda tmp: Path(tmp).write_text("{}"))
    assert f"'{tmp_path / '.tmp-x.json'}' -> '{tmp_path / 'x.json'}'" in str(caught.value)
    assert not (tmp_path / ".tmp-x.json").exists()
