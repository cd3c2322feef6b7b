"""Augmentations: same output eagerly and inside tf.data, per-image draws, label mixing."""

from __future__ import annotations

import re

import numpy as np
import pytest
import tensorflow as tf

from petal.data import augment
from petal.errors import PetalError

IMAGE_OPS = {
    "flip": augment.flip_left_right(),
    "saturation": augment.saturation(0.0, 2.0),
    "brightness": augment.brightness(),
    "contrast": augment.contrast(),
    "hue": augment.hue(),
    "crop": augment.random_resized_crop(),
    "rotate": augment.rotation(),
    "codelab": augment.codelab(),
}


@pytest.fixture(scope="module")
def batch() -> tf.Tensor:
    rng = np.random.default_rng(0)
    return tf.constant(rng.integers(0, 256, size=(4, 12, 10, 3), dtype=np.uint8))


SEED = tf.constant([3, 4], tf.int64)


@pytest.mark.parametrize("name", sorted(IMAGE_OPS))
def test_eager_equals_tf_data(name, batch):
    op = IMAGE_OPS[name]
    eager = op(batch, SEED).numpy()
    assert eager.shape == batch.shape
    assert eager.dtype == (np.uint8 if name == "flip" else np.float32)  # a flip keeps the dtype
    assert eager.min() >= -1e-3 and eager.max() <= 255.0 + 1e-3
    in_data = next(iter(tf.data.Dataset.from_tensors(batch).map(lambda x: op(x, SEED)))).numpy()
    np.testing.assert_allclose(eager, in_data, atol=1e-3)
    # A single image gives the same result as the first image of a batch of one.
    single = op(batch[0], SEED).numpy()
    np.testing.assert_allclose(single, op(batch[:1], SEED).numpy()[0], atol=1e-3)
    # A different seed gives a different result (these ops are never the identity).
    other = op(batch, tf.constant([5, 6], tf.int64)).numpy()
    assert not np.allclose(eager, other)


def test_flip_draws_per_image(batch):
    out = augment.flip_left_right()(batch, SEED).numpy()
    flipped = [np.array_equal(out[i], batch.numpy()[i, :, ::-1]) for i in range(4)]
    kept = [np.array_equal(out[i], batch.numpy()[i]) for i in range(4)]
    assert all(f or k for f, k in zip(flipped, kept, strict=True))
    always = augment.flip_left_right(1.0)(batch, SEED).numpy()
    np.testing.assert_array_equal(always, batch.numpy()[:, :, ::-1])


@pytest.mark.parametrize("factor", [0.0, 0.4, 1.0, 1.7, 5.0])
def test_saturation_matches_tf_image(batch, factor):
    op = augment.saturation(factor, factor)
    ours = op(batch, SEED).numpy()
    reference = tf.image.adjust_saturation(tf.cast(batch, tf.float32) / 255.0, factor) * 255.0
    np.testing.assert_allclose(ours, reference.numpy(), atol=0.05)


def test_rotation_by_zero_and_crop_of_whole_image_are_identity(batch):
    np.testing.assert_allclose(
        augment.rotation(0.0)(batch, SEED), tf.cast(batch, tf.float32), atol=1e-3
    )
    whole = augment.random_resized_crop(scale=(1.0, 1.0), ratio=(10 / 12, 10 / 12))(batch, SEED)
    np.testing.assert_allclose(whole, tf.cast(batch, tf.float32), atol=1e-3)
    resized = augment.random_resized_crop(size=(5, 6))(batch, SEED)
    assert resized.shape == (4, 5, 6, 3)


@pytest.mark.parametrize("name", ["mixup", "cutmix"])
def test_mixing_ops_mix_labels_consistently(name, batch):
    op = augment.BATCH_OPS[name]()
    labels = tf.one_hot([0, 1, 2, 3], 5)
    images, mixed = op(batch, labels, SEED)
    assert images.shape == batch.shape and mixed.shape == (4, 5)
    np.testing.assert_allclose(mixed.numpy().sum(axis=1), 1.0, atol=1e-5)
    eager = op(batch, labels, SEED)
    ds = tf.data.Dataset.from_tensors((batch, labels)).map(lambda x, y: op(x, y, SEED))
    in_data = next(iter(ds))
    for a, b in zip(eager, in_data, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-4)
    if name == "cutmix":
        # The label weight of each image is the share of its own pixels left.
        kept = np.mean(
            np.all(images.numpy() == batch.numpy().astype(np.float32), axis=-1), axis=(1, 2)
        )
        own = mixed.numpy()[np.arange(4), np.arange(4)]
        assert np.all(own >= kept - 1e-5)


@pytest.mark.parametrize("spec", ["codelab", "flip+color+mixup", "crop+rotate+cutmix"])
def test_pipeline_batch_function_matches_eager(spec, batch):
    """The pipeline's per-batch step (XLA-compiled where possible) equals the eager ops."""
    from petal.data import pipeline

    aug = augment.build(spec)
    finish = pipeline._finish_fn(5, "one_hot", "unit", aug, seed=11)
    labels = tf.constant([0, 1, 2, 3])
    images, mixed = finish(tf.constant(7, tf.int64), (batch, labels))
    key = tf.constant([11, 7], tf.int64)
    want_images, want_labels = aug(batch, tf.one_hot(labels, 5), key)
    np.testing.assert_allclose(images, want_images / 255.0, atol=1e-4)
    np.testing.assert_allclose(mixed, want_labels, atol=1e-5)
    assert aug.xla == (spec != "crop+rotate+cutmix")


def test_build_specs():
    assert augment.build(None) is None and augment.build("none") is None
    fn = augment.build("codelab")
    images, labels = fn(tf.zeros([2, 4, 4, 3], tf.uint8), tf.one_hot([0, 1], 2), SEED)
    assert images.dtype == tf.float32 and labels.shape == (2, 2)
    assert augment.build("flip+crop+mixup").mixes_labels
    custom = augment.build(lambda x, seed: tf.cast(x, tf.float32) + 1.0)
    assert float(custom(tf.zeros([1, 2, 2, 3]), None, SEED)[0][0, 0, 0, 0]) == 1.0
    with pytest.raises(PetalError, match="Unknown augmentation 'sharpen'"):
        augment.build("flip+sharpen")
    with pytest.raises(PetalError, match="alpha"):
        augment.mixup(0.0)


def test_none_joined_with_other_names_is_refused():
    """'none+flip' trained with flip: 'none' (no augmentation) beside other names says two
    things at once, so it is refused, naming the spec without it."""
    for spec, rest in (("none+flip", "flip"), ("codelab+None", "codelab")):
        given = re.escape(repr(spec))
        with pytest.raises(PetalError, match=rf"^augment 'none' means no augmentation.*drop "
                           rf"it \(augment={rest!r}\).*Received: augment={given}$"):  # fmt: skip
            augment.build(spec)
    assert augment.build(" None ") is None


@pytest.mark.parametrize(
    ("height", "width", "scale", "ratio"),
    [(96, 192, (0.35, 1.0), (3 / 4, 4 / 3)), (192, 96, (0.35, 1.0), (3 / 4, 4 / 3)),
     (64, 64, (0.08, 1.0), (3 / 4, 4 / 3)), (96, 192, (1.0, 1.0), (1.0, 1.0)),
     (64, 64, (0.9, 1.0), (2.0, 3.0))],
)  # fmt: skip
def test_crops_keep_their_aspect_in_ratio_on_any_image(height, width, scale, ratio):
    """A box that did not fit was clipped to the image's sides, which changed its area and
    aspect: a fifth of the crops of a 96x192 image had an aspect outside [3/4, 4/3]. Now the
    first of ten boxes that fits, else the largest centred one in range (torchvision's)."""
    yy, xx = np.meshgrid(np.arange(height), np.arange(width), indexing="ij")
    where = np.stack([yy, xx, np.zeros_like(yy)], axis=-1).astype(np.float32)
    out = augment.random_resized_crop(scale, ratio)(np.stack([where] * 200), SEED).numpy()
    # Each output pixel holds the input coordinates it sampled: the box's sides in pixels.
    rows = out[..., 0].max(axis=(1, 2)) - out[..., 0].min(axis=(1, 2)) + 1
    cols = out[..., 1].max(axis=(1, 2)) - out[..., 1].min(axis=(1, 2)) + 1
    aspect = cols / rows
    assert (aspect >= ratio[0] * 0.97).all() and (aspect <= ratio[1] * 1.03).all(), (
        aspect.min(), aspect.max())
    area = rows * cols / (height * width)
    if (height, width, scale) == (64, 64, (0.08, 1.0)):  # every box can fit: areas in range
        assert area.min() >= 0.08 * 0.9 and len(np.unique(area.round(2))) > 50
    if ratio == (2.0, 3.0):  # none fits: the widest box of aspect 2, centred
        assert np.allclose(aspect, 2.0, rtol=0.03) and np.allclose(area, 0.5, rtol=0.03)


def test_build_with_size_crops_to_the_training_size(batch):
    for spec in ("crop+flip+saturation", "light"):
        images, _ = augment.build(spec, size=(6, 5))(batch, tf.one_hot([0, 1, 2, 3], 4), SEED)
        assert images.shape == (4, 6, 5, 3)
    # One int is a square, as image_size takes it (it was refused).
    op = augment.random_resized_crop(size=5)
    assert op.apply(batch, op.draw(4, SEED)).shape == (4, 5, 5, 3)
    with pytest.raises(PetalError, match="needs the 'crop' augmentation.*codelab"):
        augment.build("codelab", size=(6, 5))


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: augment.flip_left_right(2), r"flip probability must be in \[0, 1\]"),
        (lambda: augment.brightness(-0.5), r"brightness max_delta must be in \[0, 1\]"),
        (lambda: augment.contrast(1.5, 0.5), r"contrast needs 0 <= lower <= upper"),
        (lambda: augment.hue(0.7), r"hue max_delta must be in \[0, 0\.5\]"),
        (lambda: augment.random_resized_crop(scale=(2, 3)), r"crop scale needs 0 < "),
        (lambda: augment.random_resized_crop(ratio=(0, 1)), r"crop ratio needs 0 < "),
        (lambda: augment.rotation(fill_mode="bogus"), r"rotation fill_mode must be one of "),
        (lambda: augment.rotation(-5), r"rotation max_degrees must be >= 0"),
        (lambda: augment.mixup("x"), r"mixup alpha must be a number > 0"),
    ],
)
def test_factories_check_their_arguments(make, message):
    with pytest.raises(PetalError, match=message):
        make()


def test_mixing_ops_refuse_class_ids(batch):
    labels = tf.constant([0, 1, 2, 3])
    for op in (augment.mixup(), augment.cutmix()):
        with pytest.raises(PetalError, match=r"needs one-hot labels \[batch, classes\]"):
            op(batch, labels, SEED)


INF = float("inf")


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: augment.rotation(INF), r"^rotation max_degrees must be >= 0 \(and finite\)\. "
                                        r"Received: inf$"),
        (lambda: augment.mixup(INF), r"^mixup alpha must be a number > 0 \(and finite\)\. "
                                     r"Received: alpha=inf$"),
        (lambda: augment.cutmix(INF), r"^cutmix alpha must be a number > 0 \(and finite\)"),
        (lambda: augment.random_resized_crop(ratio=(1, INF)),
         r"^crop ratio needs 0 < lower <= upper \(and finite\)\. Received: \(1, inf\)$"),
        (lambda: augment.saturation(0, INF),
         r"^saturation needs 0 <= lower <= upper \(and finite\)\. Received: \(0, inf\)$"),
        (lambda: augment.contrast(0, INF), r"^contrast needs 0 <= lower <= upper \(and finite"),
        (lambda: augment.saturation(-INF, 1), r"^saturation needs 0 <= lower <= upper"),
        (lambda: augment.rotation(float("nan")), r"^rotation max_degrees must be >= 0 \(and fin"),
    ],
)
def test_factories_refuse_infinite_values(make, message):
    # inf passed the lower bound and made all-NaN images (and, for mixup, labels).
    with pytest.raises(PetalError, match=message):
        make()


def test_compose_refuses_what_is_no_image_op(batch):
    # compose(flip, mixup) was taken, and failed at the first batch in a 12-line TypeError.
    with pytest.raises(PetalError, match=(
        r"^compose takes image ops \(flip_left_right, saturation, \.\.\.\); mixup mixes "
        r"labels too: join it after the image ops in build, e\.g\. augment='flip\+mixup'\. "
        r"Received: MixOp\(mixup\)$"
    )):
        augment.compose(augment.flip_left_right(), augment.mixup())
    with pytest.raises(PetalError, match=r"^compose takes image ops .*\. Received: 'flip'$"):
        augment.compose("flip")
    nested = augment.compose(augment.flip_left_right(), augment.codelab())
    assert nested(batch, SEED).shape == batch.shape


def test_a_training_size_without_crop_names_the_image_size_and_the_fix():
    """The message said the training size differed "from the records'" (the records were
    48x48, as the training size: image_size 40 differed) and named no fix."""
    with pytest.raises(PetalError, match=r"^A training size \(train_image_size\) other than "
                       r"the evaluation image_size needs the 'crop' augmentation, which "
                       r"resizes its crops to that size: pass --set augment=codelab\+crop, or "
                       r"drop train_image_size\. Received: augment='codelab', "
                       r"size=\(48, 48\)$"):  # fmt: skip
        augment.build("codelab", size=(48, 48))
    for spec in ("none", None, "", lambda x, seed: x):
        with pytest.raises(PetalError, match=r"pass --set augment=crop, or drop"):
            augment.build(spec, size=(48, 48))
    with pytest.raises(PetalError, match=r"pass --set augment=flip\+mixup\+crop, or drop"):
        augment.build("flip+mixup", size=(48, 48))
    # The fix it names works.
    assert augment.build("codelab+crop", size=(48, 48)) is not None


@pytest.mark.parametrize("spec", ["mixup", "cutmix", "flip+mixup"])
def test_a_mixing_augment_refuses_class_ids_and_names_the_fix(spec, batch):
    # Augment skipped the op's rank check: class ids [4] came back as labels of shape [4, 4].
    with pytest.raises(PetalError, match=(
        r"mixes labels and needs one-hot labels \[batch, classes\]: pass "
        r"tf\.one_hot\(labels, num_classes\) \(train_dataset: label_mode='one_hot'\)\. "
        r"Received: labels of shape \(4,\)$"
    )):
        augment.build(spec)(batch, tf.constant([0, 1, 2, 3]), SEED)
    images, labels = augment.build(spec)(batch, tf.one_hot([0, 1, 2, 3], 4), SEED)
    assert labels.shape == (4, 4)


@pytest.mark.parametrize("spec", ["mixup", "cutmix"])
def test_mixing_refuses_labels_of_another_batch_size(spec, batch):
    # 4 images with 3 labels failed in a raw "Incompatible shapes: [4,1] vs. [3,3]".
    message = (
        r"needs one label row per image: pass images and labels of the same batch\. "
        r"Received: images of shape \(4, 12, 10, 3\), labels of shape \(3, 4\)$"
    )
    labels = tf.one_hot([0, 1, 2], 4)
    for fn in (augment.build(spec), augment.BATCH_OPS[spec]()):
        with pytest.raises(PetalError, match=rf"^{spec} {message}"):
            fn(batch, labels, SEED)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: augment.random_resized_crop(size=(0, 4)), r"^crop size must be \(height, "
                                                          r"width\), two ints >= 1, one int "
                                                          r"\(a square\), or None \(the "
                                                          r"input's size\)\. "
                                                          r"Received: \(0, 4\)$"),
        (lambda: augment.random_resized_crop(size=0), r"^crop size must be .*Received: 0$"),
        (lambda: augment.random_resized_crop(size=(4.5, 4)), r"^crop size must be \(height, "),
        (lambda: augment.build("crop", size=(6, True)), r"^crop size must be \(height, "),
        (lambda: augment.color_jitter(contrast_range=1.0),
         r"^color_jitter contrast_range needs 0 <= lower <= upper \(and finite\)\. "
         r"Received: 1\.0$"),
        (lambda: augment.color_jitter(contrast_range=(1, 2, 3)),
         r"^color_jitter contrast_range needs 0 <= lower <= upper"),
        (lambda: augment.color_jitter(brightness_delta=2),
         r"^color_jitter brightness_delta must be in \[0, 1\]\. Received: 2$"),
        (lambda: augment.color_jitter(hue_delta=-0.1),
         r"^color_jitter hue_delta must be in \[0, 0\.5\]\. Received: -0\.1$"),
    ],
)
def test_crop_size_and_color_jitter_arguments_are_checked_at_build(make, message):
    # A crop side of 0 failed in CropAndResize at the first batch; an int size and
    # contrast_range=1.0 failed in bare TypeErrors.
    with pytest.raises(PetalError, match=message):
        make()


def test_crop_size_and_color_jitter_take_numpy_values_and_no_hue(batch):
    crop = augment.random_resized_crop(size=[np.int64(6), 5])
    assert crop(batch, SEED).shape == (4, 6, 5, 3)
    for hue_delta in (0, None):
        assert len(augment.color_jitter(hue_delta=hue_delta).ops) == 2
    assert augment.color_jitter(contrast_range=[1, 1])(batch, SEED).shape == batch.shape


def test_a_function_s_output_is_checked_against_the_batch_it_was_given(small_records):
    """A user function's output went on as it came: a 5-D "batch" or half-width images lost
    the pipeline's static shapes silently, and a string dtype failed inside tf.data."""
    from petal.data.pipeline import train_dataset

    def pair(images, seed):
        return images, images

    def half(images, seed):
        return images[:, :32]

    def text(images, seed):
        return tf.strings.as_string(images)

    def unknown(images, seed):  # a py_function's output has no static shape
        return tf.py_function(lambda x: x, [images], tf.uint8)

    def random_crop(images, seed):  # a height known only when it runs
        return images[:, : tf.random.stateless_uniform([], seed, 20, 40, tf.int32)]

    def darker(images, seed):
        return tf.cast(images, tf.float32) * 0.5

    def mixes(images, labels, seed):
        return images

    mixes.takes_labels = True
    batch = "images shaped as it was given, [4, 64, 64, 3] (pixels 0..255, uint8 or float"
    for fn, got in (
        (pair, "images of shape [2, 4, 64, 64, 3]"),
        (half, "images of shape [4, 32, 64, 3]"),
        (text, "images of dtype string, not numbers"),
    ):
        with pytest.raises(PetalError, match=rf"^augment function .*{fn.__name__} returned "
                           rf"{re.escape(got)}; it must return {re.escape(batch)}"):
            train_dataset(small_records, batch_size=4, augment=fn, seed=1)
    # A shape known in part: checked when the batch comes.
    ds = train_dataset(small_records, batch_size=4, augment=random_crop, seed=1)
    assert ds.element_spec[0].shape == (4, 64, 64, 3)
    with pytest.raises(tf.errors.InvalidArgumentError, match="Shape of tensor"):
        next(iter(ds))
    with pytest.raises(PetalError, match=r"takes labels \(takes_labels=True\), so it must "
                       r"return \(images, labels\)\. Received: "):
        train_dataset(small_records, batch_size=4, augment=mixes, seed=1)
    for fn in (unknown, darker):
        ds = train_dataset(small_records, batch_size=4, augment=fn, seed=1, normalization="raw")
        assert ds.element_spec[0].shape == (4, 64, 64, 3)
        images, _ = next(iter(ds))
        assert images.shape == (4, 64, 64, 3) and float(tf.reduce_min(images)) >= 0
    eager = augment.build(darker)(tf.fill([2, 5, 5, 3], tf.constant(200, tf.uint8)), None, SEED)
    assert np.allclose(eager[0].numpy(), 100.0)


def test_rotation_takes_its_fill_mode_in_any_case(batch):
    # "Reflect" was refused, where augment names, normalization and resize take any case.
    ours = augment.rotation(30.0, fill_mode=" Reflect")(batch, SEED)
    np.testing.assert_array_equal(ours, augment.rotation(30.0, fill_mode="reflect")(batch, SEED))
    with pytest.raises(PetalError, match=r"Received: 'Mirror'$"):
        augment.rotation(fill_mode="Mirror")


def test_ops_called_eagerly_name_a_bad_seed_or_image_shape(batch):
    # TensorFlow's errors: "seed must have shape [2], not []", and ReverseV2's axis.
    for op, args in ((augment.flip_left_right(), (batch,)),
                     (augment.mixup(), (tf.cast(batch, tf.float32), tf.one_hot([0, 1, 2, 3], 5)))):
        with pytest.raises(PetalError, match=r"takes a seed of two integers, such as "
                           r"tf\.constant\(\[1, 2\]\)\. Received: a int32 seed of shape \(\)$"):
            op(*args, tf.constant(3))
    with pytest.raises(PetalError, match=r"^ImageOp\(flip\) takes a batch of images \[batch, "
                       r"height, width, channels\] or one image \[height, width, channels\]\. "
                       r"Received: images of shape \(8, 8\)$"):
        augment.flip_left_right()(tf.zeros([8, 8]), SEED)
    assert augment.flip_left_right()(batch[0], [1, 2]).shape == batch.shape[1:]  # a list


def test_a_built_augmentation_takes_one_image_as_its_ops_do(batch):
    """build(spec) on one image [H, W, 3] (a dataset mapped before .batch()) took it for a
    batch of H rows: a [H, H, W, 3] result with flips of the colour axis, without an error."""
    image, label = batch[1], tf.one_hot(2, 5)
    for spec in ("codelab", "flip+crop"):
        out, same = augment.build(spec)(image, label, SEED)
        assert out.shape == image.shape and same is label
        # the pixels it gives the image as a batch of one
        np.testing.assert_array_equal(out, augment.build(spec)(image[None], label[None],
                                                               SEED)[0][0])  # fmt: skip
    with pytest.raises(PetalError, match=r"^Augment\('flip\+mixup'\) mixes the images of a batch "
                       r"\(mixup\): apply it to batches \[batch, height, width, 3\], after "
                       r"\.batch\(\)\. Received: one image of shape \(\d+, \d+, 3\)$"):
        augment.build("flip+mixup")(tf.cast(image, tf.float32), label, SEED)


@pytest.mark.parametrize("channels", [1, 4])
def test_ops_refuse_images_that_are_not_rgb(batch, channels):
    # saturation kept an empty slice of one channel (every pixel gone), took alpha for a
    # colour; hue raised TensorFlow's RGBToHSV error
    images = tf.fill([2, 8, 8, channels], 100.0)
    calls = (lambda: augment.saturation()(images, SEED), lambda: augment.hue()(images, SEED),
             lambda: augment.build("codelab")(images, tf.one_hot([0, 1], 5), SEED))
    for call in calls:
        with pytest.raises(PetalError, match=r"takes RGB images: 3 channels, the last axis\. "
                           rf"Received: images of shape \(2, 8, 8, {channels}\); convert grey"):
            call()


@pytest.mark.parametrize("make", [augment.mixup, augment.cutmix])
def test_a_small_alpha_barely_mixes(make):
    # Gamma(0.01) draws stop at float32's smallest normal number in 42% of draws: two such
    # draws gave a weight of exactly 0.5, the most mixing, for 18% of images.
    lam = make(0.01).draw(20000, tf.constant([1, 2]))["lam"].numpy()
    assert np.mean(lam == 0.5) < 1e-3 and not np.isnan(lam).any()
    assert abs(lam.var() - 0.2451) < 0.01  # Beta(a, a)'s variance: 1 / (4 (2a + 1))
    assert np.mean(np.abs(lam - 0.5) < 0.05) < 0.01
    # The smallest alpha taken draws no NaN; a smaller one overflowed float32 (NaN images).
    assert not np.isnan(make(1e-6).draw(20000, tf.constant([1, 2]))["lam"].numpy()).any()
    with pytest.raises(PetalError, match=r"alpha must be at least 1e-06 \(smaller overflows"):
        make(1e-7)


def test_an_ops_factory_passed_uncalled_is_refused_in_one_line():
    # augment=saturation ran saturation(images, seed) inside tf.data: a traceback, or "saturation
    # needs 0 <= lower <= upper" about a tensor the user never passed.
    for factory in (augment.saturation, augment.codelab, augment.mixup):
        with pytest.raises(PetalError) as caught:
            augment.build(factory)
        assert str(caught.value) == (
            f"augment={factory.__name__} is the op's factory, not the op: call it "
            f"(augment={factory.__name__}()). Received: augment=petal.data.augment."
            f"{factory.__name__}"
        )
    assert augment.build(augment.saturation()) is not None


def test_mixup_and_rotation_of_saturated_pixels_stay_within_0_to_255():
    # A QA report: mixing two white images gave 255.00002 and a bilinear rotation of white
    # 255.00002, which normalise to 1.0000001, outside the documented 0..1.
    white = tf.fill([8, 24, 24, 3], 255.0)
    labels = tf.one_hot(tf.range(8) % 4, 4)
    for seed in range(6):
        images, _ = augment.mixup(0.2)(white, labels, tf.constant([seed, 1]))
        assert float(tf.reduce_max(images)) <= 255.0
        assert float(tf.reduce_min(images)) >= 0.0
        rotated, _ = augment.build("rotate")(white, labels, tf.constant([seed, 2]))
        assert float(tf.reduce_max(rotated)) <= 255.0
