"""Model registry: codelab parameter counts, a training step per model, weights files, FLOPs."""

from __future__ import annotations

import json

import keras
import numpy as np
import pytest

from petal.errors import PetalError
from petal.models import (
    count_flops,
    count_params,
    create_model,
    get_backbone,
    list_models,
    model_info,
    set_backbone_trainable,
)
from petal.models.registry import model_summary


def _tiny_size(name: str) -> int:
    return max(model_info(name).min_image_size, 32)


@pytest.fixture(autouse=True)
def _float32_policy():
    """Every test starts and ends with the default policy (some set mixed precision)."""
    keras.mixed_precision.set_global_policy("float32")
    yield
    keras.mixed_precision.set_global_policy("float32")


@pytest.mark.parametrize(
    "name, size, total, trainable",
    [
        ("dense", 192, 55_321_805, 55_321_805),  # 110,592*500+500 + 500*50+50 + 50*5+5
        ("convnet", 192, 293_233, 293_233),
        ("squeezenet", 192, 120_613, 119_301),
        ("xception", 331, 20_871_725, 20_817_197),
    ],
)
def test_codelab_parameter_counts(name, size, total, trainable):
    model = create_model(name, num_classes=5, image_size=size)
    assert count_params(model) == (total, trainable)
    assert model.count_params() == total


# convnext_tiny (28M parameters): 11-12 CPU-s of a 2-core Zen 3's CI run, with the slow tests.
@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.slow) if n == "convnext_tiny" else n
             for n in list_models()],
)  # fmt: skip
def test_every_model_builds_and_takes_a_training_step(name):
    size = _tiny_size(name)
    model = create_model(name, num_classes=3, image_size=size)
    assert model.name == name
    assert model.output_shape == (None, 3)
    # run_eagerly: one step of a big graph is far quicker eagerly than traced and optimised.
    model.compile(
        optimizer=keras.optimizers.SGD(0.01), loss="categorical_crossentropy", run_eagerly=True
    )
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 1, (2, size, size, 3)).astype("float32")
    y = np.eye(3, dtype="float32")[[0, 2]]
    before = [w.numpy().copy() for w in model.trainable_weights[-2:]]
    loss = model.train_on_batch(x, y)
    assert np.isfinite(loss)
    after = [w.numpy() for w in model.trainable_weights[-2:]]
    assert any(not np.allclose(a, b) for a, b in zip(before, after, strict=True))


def test_head_is_float32_under_mixed_bfloat16():
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    model = create_model("squeezenet", num_classes=5, image_size=32)
    assert model.get_layer("stem_conv").compute_dtype == "bfloat16"
    assert model.layers[-1].compute_dtype == "float32"
    out = model(np.zeros((1, 32, 32, 3), "float32"))
    assert keras.backend.standardize_dtype(out.dtype) == "float32"
    np.testing.assert_allclose(np.sum(np.asarray(out), axis=-1), 1.0, rtol=1e-5)


def test_model_info_and_registry_errors():
    info = model_info("squeezenet")
    assert (info.normalization, info.default_image_size, info.pretrained) == ("unit", 192, False)
    assert model_info("xception").pretrained and model_info("xception").normalization == "symmetric"
    assert list_models()[:3] == ["dense", "convnet", "squeezenet"]
    with pytest.raises(PetalError, match="Unknown model 'resnet9'.*squeezenet"):
        create_model("resnet9", 5)
    with pytest.raises(PetalError, match="at least 71x71.*image_size=64"):
        create_model("xception", 5, 64)
    # The size may be the records' (no --image-size given): both ways out are named.
    with pytest.raises(PetalError, match=r"at least 71x71 pixels \(default 331\): pass "
                       r"--image-size 71 or more \(image_size=71; smaller records are upscaled\)"
                       r", or convert the photos .*petal convert SRC DST --image-size 71\)\. "
                       r"Received: image_size=\(64, 64\)$"):  # fmt: skip
        create_model("xception", 5, (64, 64))
    with pytest.raises(PetalError, match=r"at least 16x16 pixels \(default 192\): pass --set "
                       r"train_image_size=16 or more\. Received: train_image_size=8$"):  # fmt: skip
        model_info("squeezenet").image_hw(8, "train_image_size")
    with pytest.raises(PetalError, match="image_size=-3"):
        create_model("squeezenet", 5, -3)
    with pytest.raises(PetalError, match="image_size=0"):
        create_model("convnet", 5, 0)
    with pytest.raises(PetalError, match="num_classes=1"):
        create_model("squeezenet", 1, 32)
    with pytest.raises(PetalError, match="no published ImageNet weights"):
        create_model("squeezenet", 5, 32, weights="imagenet")
    # Named with the options it takes (it said "build_squeezenet() got an unexpected ...").
    with pytest.raises(PetalError, match=r"^model_options.dropuot is not an option of squeezenet; "
                       r"its options: fires, stem_filters, stem_stride, separable, dropout, "
                       r"any_size\. Received: model_options=\{'dropuot': 0.2\}$"):
        create_model("squeezenet", 5, 32, dropuot=0.2)
    with pytest.raises(PetalError, match=r"^model_options.a, model_options.b are not options of "
                       r"convnet; it takes none\. Received: "):
        create_model("convnet", 5, 32, b=1, a=2)
    # A known option with a value the layers refuse: one line, not Keras' ValueError.
    with pytest.raises(PetalError, match=r"model_options \{'dropout': 5\} \(.*rate.*fix or drop"):
        create_model("squeezenet", 5, 32, dropout=5)
    with pytest.raises(PetalError, match="Weights file not found: .*nope.weights.h5"):
        create_model("squeezenet", 5, 32, weights="nope.weights.h5")
    # Loading into a built model: the same words (Keras' error read as a mismatch).
    from petal.models import load_weights_file

    with pytest.raises(PetalError, match="^Weights file not found: nope.weights.h5 "):
        load_weights_file(create_model("dense", 5, 32), "nope.weights.h5")


def test_numpy_integers_are_taken_as_ints():
    # np.int64 passed the Integral check, then Keras' Dense refused it ("units=5").
    model = create_model("squeezenet", np.int64(5), np.int64(32))
    assert model.output_shape == (None, 5)
    assert model_summary("convnet", np.int32(3), 32)["params"] > 0


def test_an_empty_weights_path_is_refused_as_given():
    """Path("") is the current folder: it read "Weights file . is a folder ... weights='.'"."""
    from petal.models import load_weights_file

    said = (r"^weights is empty and names no file; pass the path of a \.weights\.h5 file"
            r"{}\. Received: weights=''$")  # fmt: skip
    others = r", 'imagenet', or None: `--weights none` on the command line"
    with pytest.raises(PetalError, match=said.format(others)):
        create_model("squeezenet", 5, 32, weights="")
    with pytest.raises(PetalError, match=said.format("")):
        load_weights_file(create_model("squeezenet", 5, 32), "")


def test_rectangular_image_size():
    model = create_model("convnet", 5, (48, 64))
    assert model.input_shape == (None, 48, 64, 3)


def test_imagenet_weights_offline_is_a_clear_error(monkeypatch):
    from keras.src.utils import file_utils

    URL = (  # noqa: N806
        "https://storage.googleapis.com/tensorflow/keras-applications/mobilenet_v2/"
        "mobilenet_v2_weights_tf_dim_ordering_tf_kernels_1.0_96_no_top.h5"
    )

    def offline(*args, **kwargs):
        # What keras.utils.get_file raises when there is no network.
        raise Exception(f"URL fetch failure on {URL}: None -- [Errno -2] Name or service not known")

    monkeypatch.setattr(file_utils, "get_file", offline)
    # The whole reason, however long the address (it was cut at 200 characters, mid-word).
    # Words for the command line and for Python: it said only weights=PATH, weights=None.
    with pytest.raises(
        PetalError, match="Cannot download the ImageNet weights of 'mobilenet_v2' .*Name or "
        r"service not known\. Copy the published file into .*models/, or pass --weights PATH "
        r"\(weights=PATH\) .*--weights none \(weights=None\) to train from scratch"
    ):
        create_model("mobilenet_v2", 5, 96, weights="imagenet")


def _randomized(model: keras.Model, seed: int = 0) -> keras.Model:
    """``model`` with every variable (BatchNorm statistics too) set to distinct values."""
    rng = np.random.default_rng(seed)
    for variable in model.weights:
        variable.assign(rng.uniform(0.5, 1.5, variable.shape).astype(variable.dtype))
    return model


def _save_legacy_h5(model: keras.Model, path) -> None:
    """Save weights in tf.keras 2's .h5 layout, that of the published keras.applications
    files (Keras 3 saves only .weights.h5)."""
    import h5py
    from keras.src.legacy.saving import legacy_h5_format

    with h5py.File(path, "w") as file:
        legacy_h5_format.save_weights_to_hdf5_group(file, model)


def _assert_backbone_holds(model: keras.Model, source: keras.Model) -> None:
    """Every weighted layer of ``model``'s backbone holds the weights of ``source``'s layer
    of the same name."""
    layers = [layer for layer in get_backbone(model).layers if layer.weights]
    assert layers
    for layer in layers:
        for a, b in zip(layer.weights, source.get_layer(layer.name).weights, strict=True):
            np.testing.assert_array_equal(a.numpy(), b.numpy())


@pytest.mark.slow  # 36 s in a loaded suite run (session 40): `pytest -m slow` runs it
def test_a_cached_imagenet_file_that_does_not_fit_is_named(tmp_path, monkeypatch):
    """petal's offline message says to copy the file into Keras' cache: one that does not load
    was a ValueError traceback ("Layer count mismatch ... found 0 saved layers") or h5py's
    "Unable to synchronously open file (truncated file ...)", naming neither file nor fix."""
    import re

    from keras.src.backend import config
    from keras.src.utils import file_utils

    def no_network(*args, **kwargs):
        raise AssertionError("the test tried to download")

    monkeypatch.setattr(config, "_KERAS_DIR", str(tmp_path / "keras"))
    monkeypatch.setattr(file_utils, "urlretrieve", no_network)
    cached = tmp_path / "keras" / "models" / (
        "mobilenet_v2_weights_tf_dim_ordering_tf_kernels_1.0_96_no_top.h5"
    )
    cached.parent.mkdir(parents=True)
    source = _randomized(
        keras.applications.MobileNetV2(include_top=False, weights=None, input_shape=(96, 96, 3))
    )
    keras3 = tmp_path / "keras3.weights.h5"
    source.save_weights(keras3)
    legacy = tmp_path / "legacy.h5"
    _save_legacy_h5(source, legacy)
    cases = {
        keras3.read_bytes(): "it is a Keras 3 .weights.h5 file",
        legacy.read_bytes()[:100_000]: "it holds 100,000 of its ",
        b"not weights\n": "file signature not found",
    }
    for data, reason in cases.items():
        cached.write_bytes(data)
        with pytest.raises(PetalError, match=(
            f"^The cached ImageNet weights file {re.escape(str(cached))} does not fit "
            f"'mobilenet_v2' \\({reason}.*\\); delete it .* or replace it with the published "
            "file. Received: weights='imagenet'$"
        )):  # fmt: skip
            create_model("mobilenet_v2", 5, 96, weights="imagenet")
    cached.write_bytes(legacy.read_bytes())  # the published layout loads
    _assert_backbone_holds(create_model("mobilenet_v2", 5, 96, weights="imagenet"), source)


def test_keras_published_file_with_its_top_fills_the_backbone(tmp_path):
    """The legacy .h5 file Keras downloads for include_top=True was refused as another model
    ("Model expected 104 layers, found 105 saved layers"): it is the same backbone."""
    source = _randomized(keras.applications.MobileNetV2(weights=None, input_shape=(32, 32, 3)))
    path = tmp_path / "mobilenet_v2_top.h5"
    _save_legacy_h5(source, path)
    lines = []
    model = create_model("mobilenet_v2", 3, 32, weights=path, log=lines.append)
    assert lines == [f"weights from {path}: backbone (the file's top left out: predictions)"]
    _assert_backbone_holds(model, source)
    # Loaded by layer name, but only where every layer fits: another width is refused.
    narrow = tmp_path / "narrow_top.h5"
    _save_legacy_h5(
        keras.applications.MobileNetV2(alpha=0.5, weights=None, input_shape=(32, 32, 3)), narrow
    )
    with pytest.raises(PetalError, match="narrow_top.h5 does not match model 'mobilenet_v2' .*"
                       "backbone by layer name: .*Conv1"):  # fmt: skip
        create_model("mobilenet_v2", 3, 32, weights=narrow)
    # Another model's file, its layers named otherwise, loads nothing (by name, Keras would
    # skip every layer and say nothing).
    other = tmp_path / "other_top.h5"
    _save_legacy_h5(
        keras.Sequential([keras.Input((32, 32, 3)), keras.layers.Conv2D(4, 3, name="conv"),
                          keras.layers.GlobalAveragePooling2D(),
                          keras.layers.Dense(10, name="predictions")]),
        other,
    )  # fmt: skip
    with pytest.raises(PetalError, match="other_top.h5 does not match model 'mobilenet_v2'"):
        create_model("mobilenet_v2", 3, 32, weights=other)


@pytest.mark.slow  # 48 s in a loaded suite run (session 40): `pytest -m slow` runs it
def test_a_weights_file_named_for_the_other_layout_loads(tmp_path):
    """Keras picks its loader from the name: a Keras 3 file renamed to .h5 (or a published
    .h5 renamed to .weights.h5) read as holding no layers, "does not match model"."""
    source = _randomized(
        keras.applications.MobileNetV2(include_top=False, weights=None, input_shape=(32, 32, 3))
    )
    keras3_as_h5 = tmp_path / "keras3.h5"
    source.save_weights(tmp_path / "keras3.weights.h5")
    (tmp_path / "keras3.weights.h5").rename(keras3_as_h5)
    legacy_as_keras3 = tmp_path / "legacy.weights.h5"
    _save_legacy_h5(source, legacy_as_keras3)
    for path in (keras3_as_h5, legacy_as_keras3):
        lines = []
        model = create_model("mobilenet_v2", 3, 32, weights=path, log=lines.append)
        assert lines == [f"weights from {path}: backbone"]
        _assert_backbone_holds(model, source)
    # A whole petal model's file too, with the head (no backbone to fall back on).
    petal_model = _randomized(create_model("squeezenet", 3, 32), seed=1)
    renamed = tmp_path / "squeezenet.h5"
    petal_model.save_weights(tmp_path / "squeezenet.weights.h5")
    (tmp_path / "squeezenet.weights.h5").rename(renamed)
    loaded = create_model("squeezenet", 3, 32, weights=renamed)
    for a, b in zip(loaded.weights, petal_model.weights, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


@pytest.mark.slow  # 11-13 s in CI on a Zen 3 host (session 39: 775 s): `pytest -m slow` runs it
def test_fine_tune_from_saved_backbone_and_model_weights(tmp_path):
    source = create_model("mobilenet_v2", 5, 32)
    backbone_file = tmp_path / "backbone.weights.h5"
    model_file = tmp_path / "model.weights.h5"
    get_backbone(source).save_weights(backbone_file)
    source.save_weights(model_file)
    reference = [w.numpy() for w in source.weights]

    from_backbone = create_model("mobilenet_v2", 5, 32, weights=backbone_file)
    for a, b in zip(get_backbone(from_backbone).weights, get_backbone(source).weights, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())

    from_model = create_model("mobilenet_v2", 5, 32, weights=str(model_file))
    for a, b in zip(from_model.weights, reference, strict=True):
        np.testing.assert_array_equal(a.numpy(), b)

    # A whole-model file for another class count fills everything but the classifier head,
    # which keeps its fresh weights (fine-tuning one's own model on a new set of classes).
    lines = []
    keras.utils.set_random_seed(0)
    fresh = create_model("mobilenet_v2", 3, 32)
    fresh_head = [w.numpy() for w in fresh.layers[-1].weights]
    keras.utils.set_random_seed(0)
    three = create_model("mobilenet_v2", 3, 32, weights=model_file, log=lines.append)
    assert lines == [f"weights from {model_file}: all but the 5-class head"]
    for a, b in zip(three.weights[:-2], source.weights[:-2], strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert three.layers[-1].kernel.shape == (1280, 3)
    for a, b in zip(three.layers[-1].weights, fresh_head, strict=True):
        np.testing.assert_array_equal(a.numpy(), b)  # the seeded fresh head, untouched

    # Without a builder for other class counts (load_weights_file alone), it does not fit.
    from petal.models import load_weights_file

    with pytest.raises(PetalError, match=r"model.weights.h5 does not match model 'mobilenet_v2'"
                       r".* same model \(at the same image size where its weights depend on "
                       r"it, as dense's do\), and classes\.$"):  # fmt: skip
        load_weights_file(create_model("mobilenet_v2", 3, 32), model_file)


def test_weights_of_another_architecture_are_refused(tmp_path):
    path = tmp_path / "squeeze.weights.h5"
    create_model("squeezenet", 5, 32).save_weights(path)
    with pytest.raises(PetalError, match="squeeze.weights.h5 does not match model 'convnet'"
                       r".*Example error message for object <Conv2D .*>: The shape of the target "
                       r"variable .*Received: value\.shape="):  # fmt: skip  (Keras' reason kept)
        create_model("convnet", 5, 32, weights=path)
    # Nor for another class count: only the head may differ, and every other layer must fit.
    for name in ("convnet", "squeezenet_separable"):
        with pytest.raises(PetalError, match=f"does not match model '{name}'.*any number of"):
            create_model(name, 3, 32, weights=path)
    model = create_model("squeezenet", 5, 32, weights=path)  # same architecture loads
    assert model.name == "squeezenet"


def test_a_damaged_weights_file_or_a_folder_is_named_as_such(tmp_path):
    """They read as a model mismatch ("does not match model ... file signature not found",
    "... truncated file: eof = 100000"), or as a missing file, and one damaged inside its
    structure as h5py's RuntimeError traceback."""
    import re

    from petal.models import load_weights_file

    good = tmp_path / "good.weights.h5"
    create_model("squeezenet", 5, 32).save_weights(good)
    data = good.read_bytes()
    text = tmp_path / "notweights.h5"
    text.write_text("not weights\n")
    cut = tmp_path / "cut.weights.h5"
    cut.write_bytes(data[:100_000])
    scribbled = tmp_path / "scribbled.weights.h5"  # overwritten in part: its index is gone
    scribbled.write_bytes(data[:2000] + b"\xff" * 4000 + data[6000:])
    folder = tmp_path / "folder.weights.h5"
    folder.mkdir()
    expected = {
        text: "is not an HDF5 weights file (it has no HDF5 signature); pass a file saved by "
              "model.save_weights('name.weights.h5').",
        cut: f"is damaged or truncated (it holds 100,000 of its {len(data):,} bytes); save it "
             "again, or copy it again from where it was saved.",
        scribbled: "is damaged or truncated (",
        folder: "is a folder; pass a .weights.h5 file",
    }
    for path, said in expected.items():
        start = re.escape(f"Weights file {path} {said}")
        with pytest.raises(PetalError, match=f"^{start}"):
            create_model("squeezenet", 5, 32, weights=path)
        with pytest.raises(PetalError, match=f"^{start}"):
            load_weights_file(create_model("squeezenet", 5, 32), path)
    assert create_model("squeezenet", 5, 32, weights=good).name == "squeezenet"


def test_head_only_warmup_then_fine_tune_with_frozen_batchnorm():
    model = create_model("mobilenet_v2", 4, 32)
    set_backbone_trainable(model, False)
    assert count_params(model)[1] == 1280 * 4 + 4  # head only
    set_backbone_trainable(model, True, bn_frozen=True)
    bns = [x for x in get_backbone(model).layers if isinstance(x, keras.layers.BatchNormalization)]
    assert bns and not any(x.trainable for x in bns)
    model.compile(keras.optimizers.SGD(0.01), "categorical_crossentropy", run_eagerly=True)
    stats = bns[0].moving_mean.numpy().copy()
    x = np.random.default_rng(1).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
    model.train_on_batch(x, np.eye(4, dtype="float32")[[0, 1]])
    np.testing.assert_array_equal(bns[0].moving_mean.numpy(), stats)
    with pytest.raises(PetalError, match="no pretrained backbone"):
        set_backbone_trainable(create_model("convnet", 5, 32), False)


def test_unfreezing_with_bn_frozen_false_trains_batchnorm_frozen_before():
    """A backbone already trainable kept the BatchNorm layers an earlier call froze."""
    model = create_model("mobilenet_v2", 4, 32)
    everything = count_params(model)[1]
    set_backbone_trainable(model, True)  # bn_frozen=True by default
    assert count_params(model)[1] < everything
    set_backbone_trainable(model, True, bn_frozen=False)
    assert count_params(model)[1] == everything
    frozen = create_model("mobilenet_v2", 4, 32, bn_frozen=True)
    set_backbone_trainable(frozen, True, bn_frozen=False)
    assert count_params(frozen)[1] == everything


def test_keras_file_round_trip_in_safe_mode(tmp_path):
    model = create_model("squeezenet_separable", 5, 32)
    path = tmp_path / "m.keras"
    model.save(path)
    loaded = keras.saving.load_model(path, safe_mode=True)
    x = np.random.default_rng(2).uniform(0, 1, (2, 32, 32, 3)).astype("float32")
    np.testing.assert_allclose(loaded.predict(x, verbose=0), model.predict(x, verbose=0), rtol=1e-5)


def test_count_flops_matches_a_hand_count():
    inputs = keras.Input((8, 8, 3))
    x = keras.layers.Conv2D(4, 3, padding="same")(inputs)  # 64 positions * 4 * 27 = 6,912 MACs
    x = keras.layers.DepthwiseConv2D(3, padding="same")(x)  # 64 * 4 * 9 = 2,304
    x = keras.layers.SeparableConv2D(6, 3, padding="valid")(x)  # 36 * (9*4 + 4*6) = 2,160
    x = keras.layers.GlobalAveragePooling2D()(x)
    outputs = keras.layers.Dense(2)(x)  # 6 * 2 = 12
    assert count_flops(keras.Model(inputs, outputs)) == 2 * (6912 + 2304 + 2160 + 12)


def test_count_flops_of_known_architectures():
    # MobileNetV2 at 224: ~300M multiply-adds published; convnet is hand-countable.
    assert 590 < count_flops(create_model("mobilenet_v2", 5, 224)) / 1e6 < 610
    macs = 192 * 192 * 27 * 16 + 192 * 192 * 144 * 30 + 96 * 96 * 270 * 60 + 48 * 48 * 540 * 90
    macs += 24 * 24 * 810 * 110 + 12 * 12 * 990 * 130 + 12 * 12 * 130 * 40 + 40 * 5
    assert count_flops(create_model("convnet", 5, 192)) == 2 * macs


@pytest.mark.parametrize("count", [count_flops, count_params])
def test_counts_refuse_a_name_or_other_non_models(count):
    # A name counted 0 FLOPs silently, and raised AttributeError for the parameters.
    name = count.__name__
    with pytest.raises(PetalError, match=rf"^{name} counts a built keras.Model, not a name: "
                       r"build it first \(create_model\('squeezenet', num_classes, "
                       r"image_size\)\), or use model_summary\('squeezenet'\) as `petal "
                       r"models` does\. Received: model='squeezenet'$"):  # fmt: skip
        count("squeezenet")
    with pytest.raises(PetalError, match=r"Received: model of type NoneType$"):
        count(None)


def test_squeezenet_stem_stride_keeps_the_weights_and_quarters_the_work():
    codelab = create_model("squeezenet", 5, 192)
    strided = create_model("squeezenet", 5, 192, stem_stride=2)
    assert count_params(strided) == count_params(codelab) == (120_613, 119_301)
    # Every convolution sees a quarter of the positions (the stem writes 96x96, not 192x192).
    assert count_flops(strided) == pytest.approx(count_flops(codelab) / 4, rel=0.01)
    any_size = create_model("squeezenet", 5, 192, stem_stride=2, any_size=True)
    out = any_size.predict(np.zeros((2, 160, 160, 3), "float32"), verbose=0)
    assert out.shape == (2, 5)


def test_model_summary_row():
    row = model_summary("squeezenet", 5, 64)
    assert row["params"] == 120_613 and row["image_size"] == 64 and row["mflops"] > 0


def test_models_command(capsys, monkeypatch):
    from petal.cli import main

    # Two rows are enough to check the table; building all nine takes a while on 2 cores.
    monkeypatch.setattr("petal.models.list_models", lambda: ["squeezenet", "convnet", "xception"])
    assert main(["models", "--image-size", "40", "--num-classes", "5"]) == 0
    out = capsys.readouterr().out
    assert "squeezenet" in out and "120,613" in out and "293,233" in out
    assert "needs >= 71 px" in out  # xception cannot take 40x40
    # The columns line up, a note in place of the parameters included.
    header, *rows = out.splitlines()[:4]
    size_end, norm_start = header.index("size") + 4, header.index("normalization")
    assert [line[size_end - 2:size_end] for line in rows] == ["40"] * 3, out
    assert [line[norm_start:].split()[0] for line in rows] == ["unit", "unit", "symmetric"], out
    # --json: every row has the same keys, null where not measured (xception's had fewer).
    assert main(["models", "--image-size", "40", "--num-classes", "5", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [set(r) for r in rows] == [set(rows[0])] * 3
    assert rows[2]["note"] == "needs >= 71 px" and rows[2]["trainable_params"] is None
    assert rows[2]["family"] and rows[0]["note"] is None
    assert main(["models", "--image-size", "-3"]) == 2
    assert "image_size=-3" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("name", "option"), [("squeezenet", "separable"), ("squeezenet_separable", "any_size"),
                         ("mobilenet_v2", "bn_frozen"), ("mobilenet_v2", "backbone_trainable")],
)  # fmt: skip
def test_true_false_model_options_refuse_other_values(name, option):
    with pytest.raises(PetalError, match=f"option {option} must be true or false.*'False'"):
        create_model(name, 3, 32, **{option: "False"})


def test_a_number_option_given_text_says_it_takes_a_number():
    """--set model_options.dropout=abc said "('<=' not supported between instances of 'int'
    and 'str')", Python's words for it."""
    with pytest.raises(PetalError, match=r"^model_options\.dropout must be a number, as its "
                       r"default 0\.0 is\. Received: model_options=\{'dropout': 'abc'\}$"):
        create_model("squeezenet", 3, 32, dropout="abc")
    with pytest.raises(PetalError, match=r"^model_options\.stem_filters must be a number"):
        create_model("squeezenet", 3, 32, stem_filters="wide")
    # Another kind that is no text is not blamed (a stride of [2, 2] builds): the layers'
    # own reason is given.
    with pytest.raises(PetalError, match=r"^Model 'squeezenet' cannot be built with "
                       r"model_options \{'stem_stride': \[2, 2\], 'dropout': 5\}"):
        create_model("squeezenet", 3, 32, stem_stride=[2, 2], dropout=5)


def test_imagenet_weights_of_a_model_without_them_name_the_command_line_fix():
    """A preset's weights='imagenet' with another --model said to use weights=None, not how
    to say it on the command line (the weights file messages say `--weights none`)."""
    with pytest.raises(PetalError, match=r"^Model 'squeezenet' has no published ImageNet "
                       r"weights; use weights=None \(`--weights none` on the command line\), a "
                       r"local weights file, or a model that has them: xception, mobilenet_v2, "
                       r".*Received: weights='imagenet'$"):  # fmt: skip
        create_model("squeezenet", 5, 32, weights="imagenet")


@pytest.mark.slow  # 29 s in a loaded suite run (session 40): `pytest -m slow` runs it
def test_a_weights_file_is_read_by_its_content_whatever_its_name(tmp_path):
    """tf.keras 2's usual checkpoint name (.hdf5), .H5 or no suffix was refused as "not a Keras
    weights file" before its content was read."""
    import re

    source = _randomized(create_model("squeezenet", 3, 32), seed=2)
    keras3 = tmp_path / "sq.weights.h5"
    source.save_weights(keras3)
    legacy = tmp_path / "sq_legacy.h5"
    _save_legacy_h5(source, legacy)
    for layout in (keras3, legacy):
        for name in ("sq.hdf5", "sq.H5", "sq"):
            path = tmp_path / name
            path.write_bytes(layout.read_bytes())
            lines = []
            loaded = create_model("squeezenet", 3, 32, weights=path, log=lines.append)
            assert lines == [f"weights from {path}: model"], layout
            for a, b in zip(loaded.weights, source.weights, strict=True):
                np.testing.assert_array_equal(a.numpy(), b.numpy())
    text = tmp_path / "notes.txt"  # no HDF5 file: still refused, by its content
    text.write_text("not weights\n")
    with pytest.raises(PetalError, match=f"^Weights file {re.escape(str(text))} is not a Keras "
                       r"weights file: save one with model\.save_weights\('name\.weights\.h5'\)"):
        create_model("squeezenet", 3, 32, weights=text)


def _assert_weighted_layers_hold(backbone: keras.Model, source: keras.Model) -> None:
    """``backbone``'s weighted layers hold, in order, the weights of ``source``'s first ones
    (whatever their names)."""
    mine = [layer for layer in backbone.layers if layer.weights]
    theirs = [layer for layer in source.layers if layer.weights][: len(mine)]
    assert mine
    for a, b in zip(mine, theirs, strict=True):
        for x, y in zip(a.weights, b.weights, strict=True):
            np.testing.assert_array_equal(x.numpy(), y.numpy())


@pytest.mark.slow  # 61 s in a loaded suite run (session 40): `pytest -m slow` runs it
def test_a_published_top_file_fills_the_backbone_whatever_its_layer_names(tmp_path):
    """Matched by name only, a file with the ImageNet top was refused ("Model expected 95
    layers, found 96 saved layers"): ConvNeXt's no-top backbone ends in an unnamed
    layer_normalization (the file's convnext_tiny_head_layernorm), and Keras numbers
    Xception's unnamed conv2d_N layers per build, so a second build in one process differs."""
    source = _randomized(keras.applications.ConvNeXtTiny(
        include_preprocessing=True, weights=None, input_shape=(32, 32, 3)))  # fmt: skip
    convnext = tmp_path / "convnext_tiny_top.h5"
    _save_legacy_h5(source, convnext)
    lines = []
    model = create_model("convnext_tiny", 3, 32, weights=convnext, log=lines.append)
    assert lines == [
        f"weights from {convnext}: backbone (the file's top left out: convnext_tiny_head_dense)"
    ]
    _assert_weighted_layers_hold(get_backbone(model), source)

    create_model("xception", 3, 71)  # the next Xception's unnamed layers get other numbers
    source = _randomized(keras.applications.Xception(weights=None, input_shape=(71, 71, 3)))
    xception = tmp_path / "xception_top.h5"
    _save_legacy_h5(source, xception)
    lines = []
    model = create_model("xception", 3, 71, weights=xception, log=lines.append)
    mine = {layer.name for layer in get_backbone(model).layers if layer.weights}
    assert mine - {layer.name for layer in source.layers}  # (else loaded by name)
    assert lines == [f"weights from {xception}: backbone (the file's top left out: predictions)"]
    _assert_weighted_layers_hold(get_backbone(model), source)
    # In layer order only where every weight's shape fits: the reason names the layer.
    with pytest.raises(PetalError, match=r"convnext_tiny_top.h5 does not match model 'xception' "
                       r".*backbone in layer order: weighted layer #0, the backbone's "
                       r"block1_conv1 of shapes \[\(3, 3, 3, 32\)\], is the file's "
                       r"convnext_tiny_stem of shapes \[\(4, 4, 3, 96\), "):  # fmt: skip
        create_model("xception", 3, 71, weights=convnext)


def test_imagenet_weights_at_an_unpublished_size_print_no_keras_warning(monkeypatch):
    """MobileNetV2 at 32 pixels printed Keras' raw "input_shape is undefined or non-square
    ... will be loaded as the default" warning, with its source line, before petal's line."""
    import warnings

    from keras.src.utils import file_utils

    def offline(*args, **kwargs):
        raise Exception("URL fetch failure on https://example.invalid/x.h5: None")

    monkeypatch.setattr(file_utils, "get_file", offline)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(PetalError, match="^Cannot download the ImageNet weights"):
            create_model("mobilenet_v2", 5, 32, weights="imagenet")
    assert [str(w.message) for w in caught if w.category is UserWarning] == []


@pytest.mark.slow  # 29 s in a loaded suite run (session 40): `pytest -m slow` runs it
def test_a_keras3_file_with_the_imagenet_top_says_its_top_was_left_out(tmp_path):
    """It loaded into the backbone but said only "backbone", as if it held no more; the
    legacy file says what it left out. (Keras 3 files name layers by class: `dense`.)"""
    source = _randomized(keras.applications.MobileNetV2(weights=None, input_shape=(32, 32, 3)))
    path = tmp_path / "mobilenet_v2_top.weights.h5"
    source.save_weights(path)
    lines = []
    model = create_model("mobilenet_v2", 3, 32, weights=path, log=lines.append)
    assert lines == [f"weights from {path}: backbone (the file's top left out: dense)"]
    _assert_backbone_holds(model, source)


def test_load_weights_file_refuses_a_name_and_create_model_weights_of_the_wrong_kind(tmp_path):
    """A name gave "AttributeError: 'str' object has no attribute 'layers'" (count_params
    named the mistake); weights=True or a list, pathlib's "expected str, bytes or
    os.PathLike" TypeError."""
    import re

    from petal.models.registry import load_weights_file

    path = str(tmp_path / "x.weights.h5")
    with pytest.raises(PetalError, match=r"^load_weights_file loads weights into a built "
                       r"keras\.Model, not a name: build it with the file \(create_model\("
                       r"'dense', num_classes, image_size, weights='.*x\.weights\.h5'\)\)\. "
                       r"Received: model='dense'$"):  # fmt: skip
        load_weights_file("dense", path)
    with pytest.raises(PetalError, match=r"Received: model of type NoneType$"):
        load_weights_file(None, path)
    for weights in (True, [path]):
        with pytest.raises(PetalError, match=r"^weights must be the path of a \.weights\.h5 "
                           r"file, 'imagenet', or None: `--weights none` on the command line\. "
                           rf"Received: weights={re.escape(repr(weights))}$"):  # fmt: skip
            create_model("dense", 5, 32, weights=weights)


def test_a_cached_imagenet_file_keras_finds_stale_offline_is_named(monkeypatch, tmp_path):
    # Keras checks the published file's hash, removes a file that fails it and downloads it
    # again: offline, petal said only "Cannot download", and the user's copy was gone.
    import re

    from keras.src.utils import file_utils

    from petal.models import applications

    name = "mobilenet_v2_weights_tf_dim_ordering_tf_kernels_1.0_96_no_top.h5"
    (tmp_path / name).write_bytes(b"not the published file")
    monkeypatch.setattr(applications, "_cache_folder", lambda: str(tmp_path))

    def stale(fname, origin, **kwargs):
        (tmp_path / fname).unlink()  # as Keras does before downloading again
        raise Exception(f"URL fetch failure on {origin}: None -- [Errno -2] Name unknown")

    monkeypatch.setattr(file_utils, "get_file", stale)
    with pytest.raises(PetalError, match=(
        rf"^The ImageNet weights file {re.escape(str(tmp_path / name))} in Keras' cache is not "
        r"the published file of 'mobilenet_v2' \(its hash does not match: damaged, or another "
        r"file\), and Keras removed it to download it again, which failed \(offline\?\): URL "
        r"fetch failure on .*Name unknown\. Copy the published file there again, or pass "
        r"--weights PATH"
    )):
        create_model("mobilenet_v2", 5, 96, weights="imagenet")


@pytest.mark.slow  # 12-19 s in CI on a Zen 3 host (session 39: 775 s): `pytest -m slow` runs it
def test_models_are_built_channels_last_whatever_keras_image_data_format():
    # keras.json's (or the caller's) channels_first made convolutions run over the width of
    # (height, width, 3) images: a silently wrong squeezenet, a crash for convnet.
    from petal.models.registry import walk_layers

    keras.config.set_image_data_format("channels_first")
    try:
        for name in list_models():
            model = create_model(name, 5, _tiny_size(name))
            assert keras.config.image_data_format() == "channels_first"  # the caller's, back
            formats = {
                layer.data_format for layer in walk_layers(model) if hasattr(layer, "data_format")
            }
            assert formats <= {"channels_last"}, (name, formats)
            assert tuple(model.outputs[0].shape) == (None, 5), name
            if name == "squeezenet":
                assert count_params(model)[0] == 120_613  # 127,181 built channels_first
            del model
            keras.backend.clear_session()
    finally:
        keras.config.set_image_data_format("channels_last")


def test_an_option_a_variant_sets_itself_is_not_listed_as_its_option():
    """squeezenet_separable listed `separable` among its options, then refused it with
    Python's "got multiple values for keyword argument" (it passes separable=True itself)."""
    from petal.models.registry import model_options

    assert "separable" in model_options("squeezenet")
    assert "separable" not in model_options("squeezenet_separable")
    with pytest.raises(PetalError, match=r"^model_options\.separable is not an option of "
                       r"squeezenet_separable; its options: fires, stem_filters, stem_stride, "
                       r"dropout, any_size\. "):
        create_model("squeezenet_separable", 5, image_size=32, separable=True)


def test_squeezenet_minimum_size_counts_the_strided_stem():
    # squeezenet-plus's stem_stride=2 halves the input before the four 2x2 max-pools: at
    # 24 px its last pool met a 1x1 map and failed with a traceback ("Negative dimension").
    with pytest.raises(PetalError, match=(
        r"^Model 'squeezenet' needs images of at least 31x31 pixels with model_options "
        r"stem_stride=2, any_size=True \(default 192\): pass --image-size 31 or more"
    )):
        create_model("squeezenet", 5, 30, stem_stride=2, any_size=True)
    model = create_model("squeezenet", 5, 31, stem_stride=2)
    assert model.predict(np.zeros([1, 31, 31, 3], np.float32), verbose=0).shape == (1, 5)
    create_model("squeezenet", 5, 16)  # stride 1: the registered minimum
    keras.backend.clear_session()


def test_a_saved_model_given_as_weights_is_named_as_one(tmp_path):
    # A run's model.keras was "not a Keras weights file": it holds weights, in another form.
    import re
    import zipfile

    from petal.models.registry import check_weights_file

    run = tmp_path / "run"
    run.mkdir()
    with zipfile.ZipFile(run / "model.keras", "w") as archive:
        archive.writestr("config.json", "{}")
        archive.writestr("model.weights.h5", b"")
    with pytest.raises(PetalError) as caught:
        check_weights_file(run / "model.keras")
    assert str(caught.value).startswith(
        f"Weights file {run / 'model.keras'} is a whole saved model (a .keras archive), not a "
        f"weights file: save its weights with keras.models.load_model('{run / 'model.keras'}')"
        ".save_weights('name.weights.h5'). Received: weights="
    )
    (run / "best.weights.h5").write_bytes(b"")
    with pytest.raises(PetalError, match=re.escape(
        f"not a weights file: pass {run / 'best.weights.h5'} (its run's best epoch), or save "
    )):
        check_weights_file(run / "model.keras")
    with zipfile.ZipFile(tmp_path / "photos.zip", "w") as archive:  # a zip, not a model
        archive.writestr("a.jpg", b"")
    with pytest.raises(PetalError, match=r"is not a Keras weights file: save one with"):
        check_weights_file(tmp_path / "photos.zip")
