"""Class weights and starting from a weights file: fine-tuning with a head-only warm-up on a
tiny "pretrained" model, and a run's own weights on other classes (split from test_train.py
so that the test processes share its load)."""

from __future__ import annotations

import json
import types
from pathlib import Path

import numpy as np
import pytest

from conftest import Interrupt, interrupt_at, tiny_config, whole_and_resumed_at_epoch_1
from petal.errors import PetalError
from petal.training.config import get_preset
from petal.training.loop import class_weights, train

QUIET = {"log": lambda line: None}


def test_a_mixed_label_is_weighted_as_its_classes_mix():
    """With mixup or cutmix, the class of a label's larger share gave the whole sample its
    weight: a 0.45 daisy / 0.55 roses mix weighed as roses alone."""
    import tensorflow as tf

    from petal.training.loop import weighted_by_label

    labels = tf.constant([[0.45, 0.55], [1.0, 0.0]])
    _, _, weights = weighted_by_label([0.35, 1.87])(tf.zeros([2, 1]), labels)
    assert weights.numpy() == pytest.approx([0.45 * 0.35 + 0.55 * 1.87, 0.35])


def test_balanced_class_weights_golden():
    source = types.SimpleNamespace(
        manifest={"splits": {"train": {"per_class": {"a": 10, "b": 30}}}}, kind="records", path="x"
    )
    assert class_weights(source, ["a", "b"]) == pytest.approx({0: 2.0, 1: 40 / 60})
    source.manifest["splits"]["train"]["per_class"]["b"] = 0
    with pytest.raises(PetalError, match="no training images for b"):
        class_weights(source, ["a", "b"])
    codelab = types.SimpleNamespace(manifest=None, kind="codelab", path="shards")
    with pytest.raises(PetalError, match="per-class counts"):
        class_weights(codelab, ["a", "b"])


# --- fine-tuning: a tiny "pretrained" model with a backbone, weights from a saved file ----


@pytest.fixture
def tiny_backbone_model():
    """Registers a two-layer model with a nested ``backbone`` for the test, then removes it."""
    import keras
    from keras import layers

    from petal.models import registry

    name = "test_tiny_backbone"

    @registry.register(
        name,
        family="test",
        description="test only",
        normalization="unit",
        default_image_size=32,
        min_image_size=8,
        pretrained=True,
    )
    def build(num_classes, image_size, weights=None, **kwargs):
        x = inp = keras.Input((*image_size, 3))
        x = layers.Conv2D(8, 3, strides=2, name="conv")(x)
        x = layers.BatchNormalization(name="bn")(x)
        x = layers.GlobalAveragePooling2D()(x)
        backbone = keras.Model(inp, x, name=registry.BACKBONE_NAME)
        inputs = keras.Input((*image_size, 3))
        out = layers.Dense(num_classes, activation="softmax", dtype="float32", name="head")(
            backbone(inputs)
        )
        return keras.Model(inputs, out, name=name)

    yield name
    registry._INFOS.pop(name, None)
    registry._BUILDERS.pop(name, None)


def _part(model, layer: str, index: int = 0) -> np.ndarray:
    from petal.models import get_backbone

    owner = model if layer == "head" else get_backbone(model)
    return np.asarray(owner.get_layer(layer).weights[index])


@pytest.mark.slow  # 9 s in CI on a Zen 3 host (session 39: 775 s): `pytest -m slow` runs it
def test_head_warmup_then_fine_tune_from_a_saved_weights_file(
    small_records, tmp_path, tiny_backbone_model
):
    import keras

    from petal.models import create_model

    start = create_model(tiny_backbone_model, 5, 32)
    weights = tmp_path / "start.weights.h5"
    start.save_weights(weights)

    workdir = tmp_path / "run"
    cfg = tiny_config(
        small_records,
        model=tiny_backbone_model,
        weights=str(weights),
        fine_tune="head_then_all",
        head_epochs=1,
        epochs=2,
        class_weight="balanced",
        schedule="constant",
        schedule_options={},
        learning_rate=0.05,
    )
    # Stop after the head-only epoch, then resume into the fine-tuning phase.
    with pytest.raises(Interrupt):
        train(cfg, workdir, log=interrupt_at("epoch 1/2"))
    head_only = keras.saving.load_model(workdir / "last.keras", safe_mode=True)
    np.testing.assert_array_equal(_part(head_only, "conv"), _part(start, "conv"))
    assert not np.allclose(_part(head_only, "head"), _part(start, "head"))

    metrics = train(cfg, workdir, resume=True, **QUIET)
    assert metrics["epochs_completed"] == 2
    final = keras.saving.load_model(workdir / "model.keras", safe_mode=True)
    assert not np.allclose(_part(final, "conv"), _part(start, "conv"))  # unfrozen
    # BatchNorm stayed in inference mode: its moving mean (weights[2]) never moved.
    np.testing.assert_array_equal(_part(final, "bn", 2), _part(start, "bn", 2))
    resolved = json.loads((workdir / "config.json").read_text())["resolved"]
    assert resolved["class_weights"] == pytest.approx(
        {"0": 1.0, "1": 1.0, "2": 1.0, "3": 1.0, "4": 1.0}
    )


@pytest.mark.slow  # 7-52 s in the full suite (session 27): `pytest -m slow` runs it
def test_a_resumed_deterministic_fine_tuning_run_trains_on_what_an_uninterrupted_one_does(
    small_records, tmp_path, tiny_backbone_model
):
    from petal.models import create_model

    weights = tmp_path / "start.weights.h5"
    create_model(tiny_backbone_model, 5, 32).save_weights(weights)
    cfg = tiny_config(
        small_records,
        model=tiny_backbone_model,
        weights=str(weights),
        fine_tune="head_then_all",
        head_epochs=2,
        epochs=3,
        deterministic=True,
        seed=3,
    )
    # Stopped inside the head-only phase: the resumed run trains both phases' inputs.
    whole, resumed = whole_and_resumed_at_epoch_1(cfg, tmp_path)
    assert len(whole) == 3
    assert resumed == whole


def _tiny_backbone_weights(name: str, tmp_path: Path):
    """A weights file of the test's backbone model, and the model it holds."""
    from petal.models import create_model

    path = tmp_path / "start.weights.h5"
    model = create_model(name, 5, 32)
    model.save_weights(path)
    return str(path), model


@pytest.mark.slow  # 7-23 s in full suites (session 34): `pytest -m slow` runs it
def test_the_codelab_rule_is_scaled_by_the_factor_once_the_backbone_is_unfrozen(
    small_records, tmp_path, tiny_backbone_model
):
    """With codelab_ramp and no learning_rate (codelab-xception), the full phase ran at the
    codelab's rule undivided (2e-4 on one device) while the log said "lr x0.1"."""
    from petal.training.callbacks import read_history

    weights, _ = _tiny_backbone_weights(tiny_backbone_model, tmp_path)
    cfg = tiny_config(small_records, model=tiny_backbone_model, weights=weights,
                      fine_tune="head_then_all", head_epochs=2, epochs=4, steps_per_epoch=1,
                      learning_rate=None, schedule="codelab_ramp",
                      schedule_options={"rampup_epochs": 1})  # fmt: skip
    lines = []
    train(cfg, tmp_path / "rule", log=lines.append)
    lrs = [r["lr"] for r in read_history(tmp_path / "rule" / "history.csv")]
    # Each phase ramps from start_lr to its peak in one epoch: the full phase's rates are the
    # head phase's times the factor, start_lr (1e-5) too.
    assert lrs == pytest.approx([1e-5, 2e-4, 1e-6, 2e-5])
    assert ("petal train: unfreezing the backbone (BatchNorm kept in inference mode), peak lr "
            "2e-05 (x0.1 of the head phase's 0.0002)") in lines
    # Its only BatchNormalization layer is in the backbone, frozen in both phases.
    assert not [line for line in lines if "fused kernel" in line]

    # schedule_options.max_lr stands for the rule: it is scaled too.
    cfg = cfg.replace(schedule_options={"rampup_epochs": 1, "max_lr": 1e-3},
                      fine_tune_lr_factor=0.5)  # fmt: skip
    train(cfg, tmp_path / "max_lr", **QUIET)
    lrs = [r["lr"] for r in read_history(tmp_path / "max_lr" / "history.csv")]
    assert lrs == pytest.approx([1e-5, 1e-3, 5e-6, 5e-4])


@pytest.mark.slow  # 47 s in a loaded suite run (session 40): `pytest -m slow` runs it
def test_bn_frozen_false_trains_batchnorm_once_the_backbone_is_unfrozen(
    small_records, tmp_path, tiny_backbone_model
):
    """model_options.bn_frozen=false was ignored: BatchNorm stayed in inference mode."""
    import keras

    weights, start = _tiny_backbone_weights(tiny_backbone_model, tmp_path)
    cfg = tiny_config(small_records, model=tiny_backbone_model, weights=weights,
                      fine_tune="head_then_all", head_epochs=1, epochs=2,
                      model_options={"bn_frozen": False})  # fmt: skip
    lines = []
    train(cfg, tmp_path / "run", log=lines.append)
    unfreezing = next(i for i, line in enumerate(lines) if "unfreezing" in line)
    assert lines[unfreezing].startswith(
        "petal train: unfreezing the backbone (BatchNorm training), peak lr "
    )
    # The fused kernel is named when (and only once) a BatchNormalization layer trains.
    fused = [i for i, line in enumerate(lines) if "fused kernel" in line]
    assert fused == [unfreezing + 1]
    assert lines[unfreezing + 1] == (
        "petal train: 1 BatchNormalization layers train with the fused kernel"
    )
    final = keras.saving.load_model(tmp_path / "run" / "model.keras", safe_mode=True)
    # BatchNorm trained: its moving mean (weights[2]) moved.
    assert not np.allclose(_part(final, "bn", 2), _part(start, "bn", 2))


def test_head_then_all_is_refused_before_writing_when_it_cannot_run(
    tmp_path, tiny_backbone_model
):
    """A warm-up longer than a phase was named as longer than the whole run (--epochs 4
    asked for --epochs 2), and a model without a backbone failed once built: both after the
    work directory was made."""
    base = get_preset("quick").replace(
        data=str(tmp_path / "no-records-here"), model=tiny_backbone_model,
        weights=str(tmp_path / "w.weights.h5"), fine_tune="head_then_all", epochs=4,
        head_epochs=1, schedule_options={"warmup_epochs": 2},
    )  # fmt: skip
    cases = [
        # A phase as long as the warm-up would never decay: one more epoch.
        (base, r"^The learning-rate warm-up \(schedule_options\.warmup_epochs=2; warmup_cosine "
               r"decays after it\) does not fit in the head-only phase's 1 epoch "
               r"\(head_epochs=1; each phase of fine_tune='head_then_all' warms up anew\): pass "
               r"--set head_epochs=3 and --epochs 6 or more, or a shorter warm-up"),
        (base.replace(head_epochs=2, epochs=6), r"head-only phase's 2 epochs .* pass --set "
         r"head_epochs=3 or more"),
        (base.replace(head_epochs=3, epochs=4),
         r"does not fit in the 1 epoch after the head-only phase \(epochs 4 - head_epochs 3; "
         r"each phase of fine_tune='head_then_all' warms up anew\): pass --epochs 6 or more"),
        (base.replace(model="squeezenet", schedule_options={}),
         r"^fine_tune='head_then_all' trains a new head on a frozen pretrained backbone, which "
         r"'squeezenet' does not have \(models with one: .*mobilenet_v2.*\); use "
         r"fine_tune='all'"),
    ]
    for cfg, match in cases:
        with pytest.raises(PetalError, match=match):
            train(cfg, tmp_path / "run", **QUIET)
        assert not (tmp_path / "run").exists()


def test_head_then_all_on_a_pretrained_model_without_a_backbone_is_refused_before_writing(
    small_records, tmp_path
):
    """A registered pretrained model whose built model holds no backbone: found once built
    (the registry cannot tell), still before the work directory is made."""
    import keras

    from petal.models import registry

    @registry.register("test_flat_pretrained", family="test", description="test only",
                       normalization="unit", default_image_size=32, min_image_size=8,
                       pretrained=True)  # fmt: skip
    def build(num_classes, image_size, weights=None, **kwargs):
        inputs = keras.Input((*image_size, 3))
        x = keras.layers.GlobalAveragePooling2D()(inputs)
        return keras.Model(inputs, keras.layers.Dense(num_classes, activation="softmax")(x))

    try:
        from petal.models import create_model

        weights = tmp_path / "flat.weights.h5"
        create_model("test_flat_pretrained", 5, 32).save_weights(weights)
        cfg = tiny_config(small_records, model="test_flat_pretrained", fine_tune="head_then_all",
                          weights=str(weights), head_epochs=1, epochs=2)  # fmt: skip
        with pytest.raises(PetalError, match=r"^fine_tune='head_then_all' trains a new head on "
                           r"a frozen pretrained backbone, which 'test_flat_pretrained' does "
                           r"not have"):  # fmt: skip
            train(cfg, tmp_path / "run", **QUIET)
        assert not (tmp_path / "run").exists()
    finally:
        registry._INFOS.pop("test_flat_pretrained", None)
        registry._BUILDERS.pop("test_flat_pretrained", None)


def test_the_speed_of_a_fine_tuning_run_is_its_full_phases():
    """It was the median over both phases, which could be the frozen backbone's."""
    from petal.training.loop import _metrics

    speeds = {1: 5.0, 2: 300.0, 3: 310.0, 4: 4.0, 5: 30.0, 6: 31.0}  # epochs 1, 4 compile
    rows = [dict(epoch=e, loss=1.0, val_loss=1.0, val_accuracy=0.5, images_per_sec=v)
            for e, v in speeds.items()]  # fmt: skip
    state = {"epoch": 6, "compile_epochs": [1, 4]}
    resolved = dict.fromkeys(
        ("image_size", "replicas", "strategy", "precision", "global_batch", "steps_per_epoch",
         "train_count", "val_count", "classes")
    )  # fmt: skip
    cfg = get_preset("quick").replace(weights="w.h5", fine_tune="head_then_all", head_epochs=3,
                                      epochs=6)  # fmt: skip
    metrics = _metrics(rows, state, 1.0, resolved, cfg, 10)
    assert metrics["train_images_per_sec"] == 30.5
    assert metrics["train_images_per_sec_by_phase"] == {"head": 305.0, "full": 30.5}
    # One phase, resumed at epoch 4: the last session's steady epochs. The median of every
    # session's (165.5, of 30, 31, 300, 310) gave a speed of other settings (a batch size
    # or precision the resume changed) beside the last session's global_batch.
    quick = get_preset("quick").replace(epochs=6)
    metrics = _metrics(rows, state, 1.0, resolved, quick, 10)
    assert metrics["train_images_per_sec"] == 30.5
    assert "train_images_per_sec_by_phase" not in metrics
    # A last session of one epoch: its own speed (with compilation), not an earlier one's.
    state = {"epoch": 6, "compile_epochs": [1, 6]}
    assert _metrics(rows, state, 1.0, resolved, quick, 10)["train_images_per_sec"] == 31.0


def test_weights_file_of_another_model_is_refused(small_records, tmp_path):
    from petal.models import create_model

    other = create_model("dense", 5, 32)
    weights = tmp_path / "dense.weights.h5"
    other.save_weights(weights)
    with pytest.raises(PetalError, match="does not match"):
        train(tiny_config(small_records, weights=str(weights)), tmp_path / "run", **QUIET)
    assert not (tmp_path / "run" / "config.json").exists()  # a failed start leaves no run behind


@pytest.mark.slow  # 7-52 s in the full suite (session 27): `pytest -m slow` runs it
def test_a_runs_weights_start_a_run_on_other_classes_which_resumes_without_them(
    trained, make_records, tmp_path, monkeypatch
):
    import shutil

    # Fine-tuning one's own 5-class flowers model on 3 new classes: all but the head loads.
    records = make_records(classes=("cats", "dogs", "fish"), size=(32, 32))
    weights = tmp_path / "start.weights.h5"
    shutil.copy(trained / "best.weights.h5", weights)
    lines: list[str] = []
    import json

    options = json.loads((trained / "config.json").read_text())["model_options"]  # its model's
    monkeypatch.chdir(tmp_path)  # the file named relative to here
    cfg = tiny_config(records, weights=weights.name, epochs=1, steps_per_epoch=1, batch_size=4,
                      model_options=options)
    metrics = train(cfg, tmp_path / "run", log=lines.append)
    assert metrics["epochs_completed"] == 1
    # Stored absolute, as data is: a resume from another directory, of a run that saved no
    # epoch, looked for "start.weights.h5" there.
    assert json.loads((tmp_path / "run" / "config.json").read_text())["weights"] == str(weights)
    assert f"petal train: weights from {weights}: all but the 5-class head" in lines
    assert [line for line in lines if line.startswith("petal train: 1 steps/epoch x 1 epoch, ")]

    # A resume needs only the checkpoint, which holds every weight from here on: the file
    # may have moved. Another starting file would be recorded but never loaded: refused.
    weights.unlink()
    more = cfg.replace(epochs=2)
    with pytest.raises(PetalError, match=r"cannot change: weights .*other\.weights\.h5\" "
                       r"\(loaded once, at the start\)"):  # fmt: skip
        train(more.replace(weights=str(tmp_path / "other.weights.h5")), tmp_path / "run",
              resume=True, **QUIET)  # fmt: skip
    lines.clear()
    metrics = train(more, tmp_path / "run", resume=True, log=lines.append)
    assert metrics["epochs_completed"] == 2
    assert not [line for line in lines if "weights from" in line]

    # Five other classes: the head's size fits, but its outputs mean other flowers. Read
    # from the run folder the file lies in, the head starts fresh (it loaded).
    five = make_records("five", classes=("k0", "k1", "k2", "k3", "k4"), size=(32, 32))
    lines.clear()
    own = trained / "best.weights.h5"
    train(cfg.replace(data=str(five), weights=str(own)), tmp_path / "five-run", log=lines.append)
    assert (f"petal train: {own} comes from a run on other classes (daisy, dandelion, roses, "
            "sunflowers, tulips): its classifier head is not loaded") in lines
    assert f"petal train: weights from {own}: all but the 5-class head" in lines
