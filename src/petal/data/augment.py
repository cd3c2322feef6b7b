"""Augmentations: small factories that return functions, usable eagerly and inside tf.data.

Every image op is ``op(images, seed) -> images``:

- ``images``: one image ``[H, W, 3]`` or a batch ``[B, H, W, 3]``, uint8 or float, in pixel
  units (0..255); the result is float32 in 0..255. Ops work on whole batches with one
  random draw per image, because in tf.data one vectorised op over a batch costs far less
  than the same op run once per image.
- ``seed``: an int32/int64 tensor of shape ``[2]``. Randomness comes only from stateless ops
  keyed by it, so the same (images, seed) gives the same output eagerly and inside
  tf.data, and a seeded pipeline is reproducible (the pipeline derives the seed from its
  own seed and the batch index, which counts across epochs).

Mixing ops (mixup, cutmix) act on a batch and its one-hot labels:
``op(images, labels, seed) -> (images, labels)``.

:func:`build` turns a spec (``"codelab"``, ``"none"``, ``"flip+saturation+crop"``, ...) into
one function ``fn(images, labels, seed) -> (images, labels)`` over batches.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import tensorflow as tf

from petal.errors import PetalError

ImageOp = Callable[[tf.Tensor, tf.Tensor], tf.Tensor]
BatchOp = Callable[[tf.Tensor, tf.Tensor, tf.Tensor], tuple[tf.Tensor, tf.Tensor]]


def _as_batch(images) -> tuple[tf.Tensor, bool]:
    images = tf.convert_to_tensor(images)
    single = images.shape.rank == 3
    images = tf.cast(images, tf.float32)
    return (images[None] if single else images), single


def _unbatch(images: tf.Tensor, single: bool) -> tf.Tensor:
    return images[0] if single else images


def _seeds(seed, n: int) -> tf.Tensor:
    """``n`` independent stateless seeds from one, one per random draw of an op."""
    return tf.random.experimental.stateless_split(tf.cast(seed, tf.int64), n)


def _per_image(batch: tf.Tensor) -> tf.Tensor:
    """Shape ``[B, 1, 1, 1]`` for per-image factors broadcast over pixels."""
    return tf.stack([tf.shape(batch)[0], 1, 1, 1])


# --- image ops -------------------------------------------------------------------------------


def flip_left_right(probability: float = 0.5) -> ImageOp:
    """Mirror each image left-right with ``probability``."""

    def op(images, seed):
        batch, single = _as_batch(images)
        draw = tf.random.stateless_uniform(_per_image(batch), seed)
        out = tf.where(draw < probability, tf.reverse(batch, axis=[2]), batch)
        return _unbatch(out, single)

    return op


def saturation(lower: float = 0.0, upper: float = 2.0) -> ImageOp:
    """Scale each image's HSV saturation by a factor uniform in [lower, upper).

    Same result as ``tf.image.random_saturation`` (what the codelab uses) up to rounding,
    computed without an HSV round trip: with hue and value fixed, every channel is
    ``v - (v - c) * k``, so scaling saturation by ``f`` (clipped at 1) scales ``v - c`` by
    ``min(f, v / (v - min))``. That is a few element-wise ops over the whole batch.
    """
    if not 0.0 <= lower <= upper:
        raise PetalError(f"saturation needs 0 <= lower <= upper. Received: lower={lower}, upper={upper}")

    def op(images, seed):
        batch, single = _as_batch(images)
        factor = tf.random.stateless_uniform(_per_image(batch), seed, lower, upper)
        v = tf.reduce_max(batch, axis=-1, keepdims=True)
        spread = v - tf.reduce_min(batch, axis=-1, keepdims=True)
        scale = tf.where(spread > 0, tf.minimum(factor, v / tf.maximum(spread, 1e-6)), 1.0)
        out = tf.clip_by_value(v - (v - batch) * scale, 0.0, 255.0)
        return _unbatch(out, single)

    return op


def brightness(max_delta: float = 0.2) -> ImageOp:
    """Add a per-image offset uniform in [-max_delta, max_delta) x 255, then clip."""

    def op(images, seed):
        batch, single = _as_batch(images)
        delta = tf.random.stateless_uniform(_per_image(batch), seed, -max_delta, max_delta) * 255.0
        return _unbatch(tf.clip_by_value(batch + delta, 0.0, 255.0), single)

    return op


def contrast(lower: float = 0.8, upper: float = 1.2) -> ImageOp:
    """Scale each image's deviation from its per-channel mean by a factor in [lower, upper)."""

    def op(images, seed):
        batch, single = _as_batch(images)
        factor = tf.random.stateless_uniform(_per_image(batch), seed, lower, upper)
        mean = tf.reduce_mean(batch, axis=[1, 2], keepdims=True)
        return _unbatch(tf.clip_by_value((batch - mean) * factor + mean, 0.0, 255.0), single)

    return op


def hue(max_delta: float = 0.05) -> ImageOp:
    """Rotate each image's hue by a fraction of the circle uniform in [-max_delta, max_delta)."""

    def op(images, seed):
        batch, single = _as_batch(images)
        delta = tf.random.stateless_uniform(_per_image(batch), seed, -max_delta, max_delta)
        hsv = tf.image.rgb_to_hsv(batch / 255.0)
        h = tf.math.floormod(hsv[..., :1] + delta, 1.0)
        rgb = tf.image.hsv_to_rgb(tf.concat([h, hsv[..., 1:]], axis=-1)) * 255.0
        return _unbatch(rgb, single)

    return op


def color_jitter(brightness_delta=0.2, contrast_range=(0.8, 1.2), hue_delta=0.05) -> ImageOp:
    """Brightness, contrast and hue, each with its own draw."""
    ops = [brightness(brightness_delta), contrast(*contrast_range)]
    if hue_delta:
        ops.append(hue(hue_delta))
    return compose(*ops)


def random_resized_crop(
    scale: tuple[float, float] = (0.35, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
    size: tuple[int, int] | None = None,
) -> ImageOp:
    """Crop a random box (area fraction in ``scale``, aspect in ``ratio``) and resize it back.

    One ``crop_and_resize`` call for the whole batch, each image with its own box.
    ``size`` defaults to the input size, so shapes stay static.
    """

    def op(images, seed):
        batch, single = _as_batch(images)
        n = tf.shape(batch)[0]
        s_area, s_ratio, s_x, s_y = tf.unstack(_seeds(seed, 4))
        area = tf.random.stateless_uniform([n], s_area, scale[0], scale[1])
        log_r = tf.random.stateless_uniform([n], s_ratio, math.log(ratio[0]), math.log(ratio[1]))
        aspect = tf.exp(log_r)
        # Box sides as fractions of the image; clipped so the box fits.
        h = tf.minimum(tf.sqrt(area / aspect), 1.0)
        w = tf.minimum(tf.sqrt(area * aspect), 1.0)
        y0 = tf.random.stateless_uniform([n], s_y) * (1.0 - h)
        x0 = tf.random.stateless_uniform([n], s_x) * (1.0 - w)
        boxes = tf.stack([y0, x0, y0 + h, x0 + w], axis=1)
        out_size = size or (batch.shape[1], batch.shape[2])
        if out_size[0] is None:
            out_size = tf.shape(batch)[1:3]
        out = tf.image.crop_and_resize(batch, boxes, tf.range(n), out_size)
        return _unbatch(out, single)

    return op


def rotation(max_degrees: float = 15.0, fill_mode: str = "reflect") -> ImageOp:
    """Rotate each image by an angle uniform in [-max_degrees, max_degrees), bilinear."""

    def op(images, seed):
        batch, single = _as_batch(images)
        n = tf.shape(batch)[0]
        angle = tf.random.stateless_uniform([n], seed, -max_degrees, max_degrees) * (math.pi / 180)
        h = tf.cast(tf.shape(batch)[1], tf.float32)
        w = tf.cast(tf.shape(batch)[2], tf.float32)
        cos, sin = tf.cos(angle), tf.sin(angle)
        # Output pixel (x, y) samples input at the inverse rotation about the centre.
        cx, cy = (w - 1) / 2, (h - 1) / 2
        x_off = cx - cos * cx + sin * cy
        y_off = cy - sin * cx - cos * cy
        zeros = tf.zeros_like(cos)
        transforms = tf.stack([cos, -sin, x_off, sin, cos, y_off, zeros, zeros], axis=1)
        out = tf.raw_ops.ImageProjectiveTransformV3(
            images=batch,
            transforms=transforms,
            output_shape=tf.shape(batch)[1:3],
            fill_value=0.0,
            interpolation="BILINEAR",
            fill_mode=fill_mode.upper(),
        )
        return _unbatch(out, single)

    return op


def compose(*ops: ImageOp) -> ImageOp:
    """Apply image ops in order, each with its own seed split from the one given."""

    def op(images, seed):
        if not ops:
            return tf.cast(images, tf.float32)
        seeds = _seeds(seed, len(ops))
        for i, fn in enumerate(ops):
            images = fn(images, seeds[i])
        return images

    return op


def codelab() -> ImageOp:
    """The codelab's augmentation: random left-right flip, then random saturation in [0, 2)."""
    return compose(flip_left_right(), saturation(0.0, 2.0))


# --- batch ops on images and one-hot labels --------------------------------------------------


def mixup(alpha: float = 0.2) -> BatchOp:
    """Blend each image (and label) with another of the batch, weight ~ Beta(alpha, alpha)."""
    if alpha <= 0:
        raise PetalError(f"mixup alpha must be > 0. Received: alpha={alpha}")

    def op(images, labels, seed):
        images = tf.cast(images, tf.float32)
        n = tf.shape(images)[0]
        s_a, s_b, s_perm = tf.unstack(_seeds(seed, 3))
        a = tf.random.stateless_gamma([n], s_a, alpha)
        b = tf.random.stateless_gamma([n], s_b, alpha)
        lam = a / (a + b)
        perm = _permutation(n, s_perm)
        lam_img = tf.reshape(lam, [-1, 1, 1, 1])
        mixed = lam_img * images + (1 - lam_img) * tf.gather(images, perm)
        lam_lab = tf.reshape(lam, [-1, 1])
        labels = tf.cast(labels, tf.float32)
        return mixed, lam_lab * labels + (1 - lam_lab) * tf.gather(labels, perm)

    return op


def cutmix(alpha: float = 1.0) -> BatchOp:
    """Paste a random box from another image of the batch; labels mixed by pasted area."""
    if alpha <= 0:
        raise PetalError(f"cutmix alpha must be > 0. Received: alpha={alpha}")

    def op(images, labels, seed):
        images = tf.cast(images, tf.float32)
        n = tf.shape(images)[0]
        h, w = tf.shape(images)[1], tf.shape(images)[2]
        s_a, s_b, s_y, s_x, s_perm = tf.unstack(_seeds(seed, 5))
        a = tf.random.stateless_gamma([n], s_a, alpha)
        b = tf.random.stateless_gamma([n], s_b, alpha)
        lam = a / (a + b)
        side = tf.sqrt(1.0 - lam)
        hf, wf = tf.cast(h, tf.float32), tf.cast(w, tf.float32)
        cy = tf.random.stateless_uniform([n], s_y) * hf
        cx = tf.random.stateless_uniform([n], s_x) * wf
        y0 = tf.clip_by_value(cy - side * hf / 2, 0, hf)
        y1 = tf.clip_by_value(cy + side * hf / 2, 0, hf)
        x0 = tf.clip_by_value(cx - side * wf / 2, 0, wf)
        x1 = tf.clip_by_value(cx + side * wf / 2, 0, wf)
        ys = tf.cast(tf.range(h), tf.float32)[None, :, None] + 0.5
        xs = tf.cast(tf.range(w), tf.float32)[None, None, :] + 0.5
        inside = (
            (ys >= y0[:, None, None]) & (ys < y1[:, None, None])
            & (xs >= x0[:, None, None]) & (xs < x1[:, None, None])
        )
        perm = _permutation(n, s_perm)
        mixed = tf.where(inside[..., None], tf.gather(images, perm), images)
        # The label weight is the area actually pasted, after clipping at the borders.
        pasted = tf.reduce_mean(tf.cast(inside, tf.float32), axis=[1, 2])[:, None]
        labels = tf.cast(labels, tf.float32)
        return mixed, (1 - pasted) * labels + pasted * tf.gather(labels, perm)

    return op


def _permutation(n, seed) -> tf.Tensor:
    return tf.argsort(tf.random.stateless_uniform([n], seed))


# --- specs -----------------------------------------------------------------------------------

IMAGE_OPS: dict[str, Callable[[], ImageOp]] = {
    "flip": flip_left_right,
    "saturation": saturation,
    "brightness": brightness,
    "contrast": contrast,
    "hue": hue,
    "color": color_jitter,
    "crop": random_resized_crop,
    "rotate": rotation,
}
BATCH_OPS: dict[str, Callable[[], BatchOp]] = {"mixup": mixup, "cutmix": cutmix}
PRESETS: dict[str, str] = {
    "codelab": "flip+saturation",
    "light": "flip+crop",
    "strong": "flip+crop+color+rotate",
    "none": "",
}


def names() -> list[str]:
    """Every op and preset name :func:`build` accepts."""
    return sorted([*PRESETS, *IMAGE_OPS, *BATCH_OPS])


def build(spec) -> BatchOp | None:
    """One batch function ``fn(images, labels, seed) -> (images, labels)`` from a spec.

    Args:
        spec: None/False/"none" (no augmentation); a preset (``codelab``, ``light``,
            ``strong``); op names joined by ``+`` or ``,`` (``"flip+crop+mixup"``), image
            ops applied in order and mixing ops last; an image op ``fn(images, seed)``; or a
            batch op ``fn(images, labels, seed)`` (marked by ``fn.takes_labels = True``).

    Returns:
        The function, or None when there is nothing to do.
    """
    if spec is None or spec is False:
        return None
    if callable(spec):
        if getattr(spec, "takes_labels", False):
            return spec
        return lambda images, labels, seed: (spec(images, seed), labels)
    if not isinstance(spec, str):
        raise PetalError(f"augment must be a name, a '+'-joined list of names or a function. "
                         f"Received: augment={spec!r}")
    text = PRESETS.get(spec.strip().lower(), spec)
    parts = [p.strip().lower() for p in text.replace(",", "+").split("+") if p.strip()]
    image_ops, batch_ops = [], []
    for part in parts:
        if part in PRESETS:
            sub = PRESETS[part]
            image_ops.extend(IMAGE_OPS[p]() for p in sub.split("+") if p)
        elif part in IMAGE_OPS:
            image_ops.append(IMAGE_OPS[part]())
        elif part in BATCH_OPS:
            batch_ops.append(BATCH_OPS[part]())
        else:
            raise PetalError(f"Unknown augmentation {part!r} (known: {', '.join(names())}). "
                             f"Received: augment={spec!r}")
    if not image_ops and not batch_ops:
        return None
    image_fn = compose(*image_ops)

    def fn(images, labels, seed):
        s_img, s_mix = tf.unstack(_seeds(seed, 2))
        images = image_fn(images, s_img) if image_ops else tf.cast(images, tf.float32)
        for i, op in enumerate(batch_ops):
            images, labels = op(images, labels, tf.random.experimental.stateless_fold_in(s_mix, i))
        return images, labels

    fn.takes_labels = True
    fn.mixes_labels = bool(batch_ops)
    return fn
