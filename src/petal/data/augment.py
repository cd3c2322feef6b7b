"""Augmentations: small factories that return functions, usable eagerly and inside tf.data.

Every image op returned by a factory is callable as ``op(images, seed) -> images``:

- ``images``: one image ``[H, W, 3]`` or a batch ``[B, H, W, 3]``, uint8 or float, in pixel
  units (0..255). Results are float32 in 0..255, except that a flip keeps the input dtype.
  Ops work on whole batches with one random draw per image: in tf.data one vectorised op
  over a batch costs far less than the same op run once per image.
- ``seed``: an int tensor of shape ``[2]``. Randomness comes only from stateless ops keyed
  by it, so the same (images, seed) gives the same output eagerly and inside tf.data, and
  a seeded pipeline is reproducible (the pipeline derives the seed from its own seed and
  the batch index, which counts across epochs).

Each op is split in two: ``draw(n, seed)`` makes the per-image random parameters (a few
numbers per image) and ``apply(images, params)`` is a pure function of them. The pipeline
compiles the ``apply`` half of a batch with XLA (fusing flip, saturation, the cast and the
normalisation into one pass over the pixels) while the draws stay outside: XLA's random
number generators differ from TensorFlow's, and this keeps both paths bit-for-bit in their
draws.

Mixing ops (mixup, cutmix) act on a batch and its one-hot labels:
``op(images, labels, seed) -> (images, labels)``.

:func:`build` turns a spec (``"codelab"``, ``"none"``, ``"flip+saturation+crop"``, ...) into
one :class:`Augment` callable as ``fn(images, labels, seed) -> (images, labels)`` on batches.
"""

from __future__ import annotations

import contextlib
import math
import numbers
from collections.abc import Callable

import tensorflow as tf

from petal.errors import PetalError


def _as_batch(images, name: str) -> tuple[tf.Tensor, bool]:
    images = tf.convert_to_tensor(images)
    if images.shape.rank is not None and images.shape.rank not in (3, 4):
        # TensorFlow's own error named an axis of ReverseV2 or a transform's input.
        raise PetalError(
            f"{name} takes a batch of images [batch, height, width, channels] or one image "
            f"[height, width, channels]. Received: images of shape {images.shape}"
        )
    if images.shape.rank is not None and images.shape[-1] not in (3, None):
        # saturation kept an empty slice of one channel (every pixel gone) and took a fourth
        # as a colour; hue raised TensorFlow's RGBToHSV error.
        raise PetalError(
            f"{name} takes RGB images: 3 channels, the last axis. Received: images of shape "
            f"{images.shape}; convert grey or RGBA images to RGB first (as petal's readers do)"
        )
    single = images.shape.rank == 3
    return (images[None] if single else images), single


def _check_seed(seed, name: str) -> tf.Tensor:
    """``seed`` as a tensor, refused unless a pair of integers (a stateless op's seed)."""
    seed = tf.convert_to_tensor(seed)
    if not seed.dtype.is_integer or (seed.shape.rank is not None and seed.shape != (2,)):
        raise PetalError(
            f"{name} takes a seed of two integers, such as tf.constant([1, 2]). Received: "
            f"a {seed.dtype.name} seed of shape {seed.shape}"
        )
    return seed


def _float(images) -> tf.Tensor:
    return tf.cast(images, tf.float32)


def _seeds(seed, n: int) -> tf.Tensor:
    """``n`` independent stateless seeds from one, one per random draw."""
    return tf.random.experimental.stateless_split(tf.cast(seed, tf.int64), n)


def _uniform(n, seed, lo=0.0, hi=1.0) -> tf.Tensor:
    return tf.random.stateless_uniform(tf.reshape(n, [1]), seed, lo, hi)


def _number(what: str, value, lo: float, hi: float = math.inf) -> float:
    """``value``, a finite real number in [lo, hi], else a PetalError naming ``what``."""
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
    # Infinity passed ``lo <= value``, and made images of NaN.
    if not (ok and math.isfinite(value) and lo <= value <= hi):
        bounds = f">= {lo:g} (and finite)" if hi == math.inf else f"in [{lo:g}, {hi:g}]"
        raise PetalError(f"{what} must be {bounds}. Received: {value!r}")
    return float(value)


def _range(what: str, pair, lo: float, hi: float = math.inf, open_lo: bool = False):
    """A (lower, upper) pair with ``lo <= lower <= upper <= hi`` (``lo < lower`` when
    ``open_lo``), else a PetalError naming ``what``."""
    try:
        lower, upper = pair
        ok = all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in pair)
    except (TypeError, ValueError):
        ok = False
    ok = ok and math.isfinite(lower) and math.isfinite(upper)  # an infinite bound: NaN images
    ok = ok and (lo < lower if open_lo else lo <= lower) and lower <= upper <= hi
    if not ok:
        first = f"{lo:g} {'<' if open_lo else '<='} lower <= upper"
        last = " (and finite)" if hi == math.inf else f" <= {hi:g}"
        raise PetalError(f"{what} needs {first}{last}. Received: {pair!r}")
    return float(lower), float(upper)


def _size(what: str, size) -> tuple[int, int] | None:
    """``size``: None, (height, width) of ints >= 1 or one int (a square), else a PetalError
    naming ``what``."""
    if size is None:
        return None
    given = size
    if isinstance(size, numbers.Integral) and not isinstance(size, bool):
        size = (size, size)  # a square, as image_size takes one int
    try:
        height, width = size
        ok = all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in size)
    except (TypeError, ValueError):
        ok = False
    # A side of 0 failed in CropAndResize at the first batch, an int in a bare TypeError.
    if not (ok and height >= 1 and width >= 1):
        raise PetalError(
            f"{what} must be (height, width), two ints >= 1, one int (a square), or None (the "
            f"input's size). Received: {given!r}"
        )
    return int(height), int(width)


def _col(v) -> tf.Tensor:
    """``[B] -> [B, 1, 1, 1]`` for per-image values broadcast over pixels."""
    return tf.reshape(v, [-1, 1, 1, 1])


class ImageOp:
    """An image augmentation: ``op(images, seed)``, or ``apply(images, draw(n, seed))``.

    Attributes:
        xla: whether ``apply`` compiles with XLA (the pipeline then fuses it).
    """

    xla = True
    takes_labels = False

    def draw(self, n, seed) -> dict[str, tf.Tensor]:
        raise NotImplementedError

    def apply(self, images: tf.Tensor, params: dict[str, tf.Tensor]) -> tf.Tensor:
        raise NotImplementedError

    def __call__(self, images, seed) -> tf.Tensor:
        batch, single = _as_batch(images, repr(self))
        seed = _check_seed(seed, repr(self))
        out = self.apply(batch, self.draw(tf.shape(batch)[0], seed))
        return out[0] if single else out


class _Fn(ImageOp):
    """An ImageOp from a draw function and an apply function."""

    def __init__(self, name, draw, apply, xla=True):
        self.name, self._draw, self._apply, self.xla = name, draw, apply, xla

    def draw(self, n, seed):
        return self._draw(n, seed)

    def apply(self, images, params):
        return self._apply(images, params)

    def __repr__(self):
        return f"ImageOp({self.name})"


# --- image ops -------------------------------------------------------------------------------


def flip_left_right(probability: float = 0.5) -> ImageOp:
    """Mirror each image left-right with ``probability`` (keeps the dtype)."""
    probability = _number("flip probability", probability, 0.0, 1.0)
    return _Fn(
        "flip",
        lambda n, seed: {"flip": _uniform(n, seed) < probability},
        lambda x, p: tf.where(_col(p["flip"]), tf.reverse(x, axis=[2]), x),
    )


def saturation(lower: float = 0.0, upper: float = 2.0) -> ImageOp:
    """Scale each image's HSV saturation by a factor uniform in [lower, upper).

    Same result as ``tf.image.random_saturation`` (what the codelab uses) up to rounding,
    computed without an HSV round trip: with hue and value fixed, every channel is
    ``v - (v - c) * k``, so scaling saturation by ``f`` (clipped at 1) scales ``v - c`` by
    ``min(f, v / (v - min))``: a few element-wise ops over the whole batch.
    """
    lower, upper = _range("saturation", (lower, upper), 0.0)

    def apply(x, p):
        x = _float(x)
        # Channel slices, not reduce_max/min over the last axis: XLA fuses them into the
        # same element-wise loop (about 1.5x faster on CPU).
        r, g, b = x[..., 0:1], x[..., 1:2], x[..., 2:3]
        v = tf.maximum(tf.maximum(r, g), b)
        spread = v - tf.minimum(tf.minimum(r, g), b)
        scale = tf.where(
            spread > 0, tf.minimum(_col(p["factor"]), v / tf.maximum(spread, 1e-6)), 1.0
        )
        return tf.maximum(v - (v - x) * scale, 0.0)

    return _Fn("saturation", lambda n, seed: {"factor": _uniform(n, seed, lower, upper)}, apply)


def brightness(max_delta: float = 0.2) -> ImageOp:
    """Add a per-image offset uniform in [-max_delta, max_delta) x 255, then clip."""
    max_delta = _number("brightness max_delta", max_delta, 0.0, 1.0)
    return _Fn(
        "brightness",
        lambda n, seed: {"delta": _uniform(n, seed, -max_delta, max_delta) * 255.0},
        lambda x, p: tf.clip_by_value(_float(x) + _col(p["delta"]), 0.0, 255.0),
    )


def contrast(lower: float = 0.8, upper: float = 1.2) -> ImageOp:
    """Scale each image's deviation from its per-channel mean by a factor in [lower, upper)."""
    lower, upper = _range("contrast", (lower, upper), 0.0)

    def apply(x, p):
        x = _float(x)
        mean = tf.reduce_mean(x, axis=[1, 2], keepdims=True)
        return tf.clip_by_value((x - mean) * _col(p["factor"]) + mean, 0.0, 255.0)

    return _Fn("contrast", lambda n, seed: {"factor": _uniform(n, seed, lower, upper)}, apply)


def hue(max_delta: float = 0.05) -> ImageOp:
    """Rotate each image's hue by a fraction of the circle uniform in [-max_delta, max_delta)."""
    max_delta = _number("hue max_delta", max_delta, 0.0, 0.5)

    def apply(x, p):
        hsv = tf.image.rgb_to_hsv(_float(x) / 255.0)
        h = tf.math.floormod(hsv[..., :1] + _col(p["delta"]), 1.0)
        return tf.image.hsv_to_rgb(tf.concat([h, hsv[..., 1:]], axis=-1)) * 255.0

    return _Fn("hue", lambda n, seed: {"delta": _uniform(n, seed, -max_delta, max_delta)}, apply)


def color_jitter(brightness_delta=0.2, contrast_range=(0.8, 1.2), hue_delta=0.05) -> ImageOp:
    """Brightness, contrast and hue, each with its own draw (``hue_delta`` 0 or None: no hue)."""
    # Checked here to name these arguments: contrast_range=1.0 failed in a bare TypeError.
    brightness_delta = _number("color_jitter brightness_delta", brightness_delta, 0.0, 1.0)
    contrast_range = _range("color_jitter contrast_range", contrast_range, 0.0)
    if hue_delta is not None:
        hue_delta = _number("color_jitter hue_delta", hue_delta, 0.0, 0.5)
    ops = [brightness(brightness_delta), contrast(*contrast_range)]
    if hue_delta:
        ops.append(hue(hue_delta))
    return compose(*ops)


CROP_TRIES = 10  # boxes each image draws for random_resized_crop, as torchvision's


def random_resized_crop(
    scale: tuple[float, float] = (0.35, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
    size: tuple[int, int] | None = None,
) -> ImageOp:
    """Crop a random box (area fraction in ``scale``, pixel aspect in ``ratio``), resize back.

    As torchvision's and timm's: each image draws up to :data:`CROP_TRIES` boxes and takes
    the first that fits in it; when none does (a wide image, a ratio range far from its
    shape), the largest centred box of an aspect in ``ratio`` (the whole image when its
    own aspect is in range). Clipping a box that did not fit to the image's sides, as
    before, gave crops outside both ranges: a fifth of those of a 96x192 image.
    One ``crop_and_resize`` call for the whole batch, each image with its own box.
    ``size`` defaults to the input size, so shapes stay static.
    """
    scale = _range("crop scale", scale, 0.0, 1.0, open_lo=True)
    ratio = _range("crop ratio", ratio, 0.0, open_lo=True)
    size = _size("crop size", size)

    def draw(n, seed):
        s_area, s_ratio, s_x, s_y = tf.unstack(_seeds(seed, 4))
        tries = tf.stack([tf.reshape(n, []), CROP_TRIES])
        return {
            "area": tf.random.stateless_uniform(tries, s_area, scale[0], scale[1]),
            "log_ratio": tf.random.stateless_uniform(
                tries, s_ratio, math.log(ratio[0]), math.log(ratio[1])
            ),
            "x": _uniform(n, s_x),
            "y": _uniform(n, s_y),
        }

    def apply(x, p):
        x = _float(x)
        aspect = tf.exp(p["log_ratio"])
        # Box sides as fractions of the image, for a box of ``aspect`` in pixels.
        hw = tf.cast(tf.shape(x)[2], tf.float32) / tf.cast(tf.shape(x)[1], tf.float32)
        h = tf.sqrt(p["area"] * hw / aspect)
        w = tf.sqrt(p["area"] * aspect / hw)
        fits = (h <= 1.0) & (w <= 1.0)
        first = tf.argmax(tf.cast(fits, tf.int32), axis=1, output_type=tf.int32)
        h, w = (tf.gather(v, first, axis=1, batch_dims=1) for v in (h, w))
        # None fits: the whole image, cut to the nearest aspect in range, centred.
        whole_h = tf.minimum(1.0, hw / ratio[0])
        whole_w = tf.minimum(1.0, ratio[1] / hw)
        some = tf.reduce_any(fits, axis=1)
        h = tf.where(some, h, whole_h)
        w = tf.where(some, w, whole_w)
        x0 = tf.where(some, p["x"], 0.5) * (1.0 - w)
        y0 = tf.where(some, p["y"], 0.5) * (1.0 - h)
        boxes = tf.stack([y0, x0, y0 + h, x0 + w], axis=1)
        out_size = size or (x.shape[1], x.shape[2])
        if out_size[0] is None or out_size[1] is None:
            out_size = tf.shape(x)[1:3]
        return tf.image.crop_and_resize(x, boxes, tf.range(tf.shape(x)[0]), out_size)

    # CropAndResize has no XLA kernel.
    return _Fn("crop", draw, apply, xla=False)


FILL_MODES = ("reflect", "wrap", "constant", "nearest")


def rotation(max_degrees: float = 15.0, fill_mode: str = "reflect") -> ImageOp:
    """Rotate each image by an angle uniform in [-max_degrees, max_degrees), bilinear;
    ``fill_mode`` (as ``keras.layers.RandomRotation``'s) fills the corners."""
    max_degrees = _number("rotation max_degrees", max_degrees, 0.0)
    given = fill_mode
    # Any case, as the other choices (augment names, normalization, resize) take it.
    fill_mode = fill_mode.strip().lower() if isinstance(fill_mode, str) else fill_mode
    if fill_mode not in FILL_MODES:
        raise PetalError(
            f"rotation fill_mode must be one of {', '.join(FILL_MODES)}. Received: {given!r}"
        )

    def apply(x, p):
        x = _float(x)
        angle = p["degrees"] * (math.pi / 180)
        h = tf.cast(tf.shape(x)[1], tf.float32)
        w = tf.cast(tf.shape(x)[2], tf.float32)
        cos, sin = tf.cos(angle), tf.sin(angle)
        # Output pixel (x, y) samples the input at the inverse rotation about the centre.
        cx, cy = (w - 1) / 2, (h - 1) / 2
        zeros = tf.zeros_like(cos)
        transforms = tf.stack(
            [cos, -sin, cx - cos * cx + sin * cy, sin, cos, cy - sin * cx - cos * cy, zeros, zeros],
            axis=1,
        )
        rotated = tf.raw_ops.ImageProjectiveTransformV3(
            images=x,
            transforms=transforms,
            output_shape=tf.shape(x)[1:3],
            fill_value=0.0,
            interpolation="BILINEAR",
            fill_mode=fill_mode.upper(),
        )
        # Bilinear weights of saturated pixels can sum a rounding over 255: clip to 0..255.
        return tf.clip_by_value(rotated, 0.0, 255.0)

    return _Fn(
        "rotate",
        lambda n, s: {"degrees": _uniform(n, s, -max_degrees, max_degrees)},
        apply,
        xla=False,
    )


class _Compose(ImageOp):
    def __init__(self, ops):
        self.ops = list(ops)
        self.xla = all(op.xla for op in self.ops)

    def draw(self, n, seed):
        if not self.ops:
            return {}
        seeds = _seeds(seed, len(self.ops))
        return {
            f"{i}/{k}": v for i, op in enumerate(self.ops) for k, v in op.draw(n, seeds[i]).items()
        }

    def apply(self, images, params):
        for i, op in enumerate(self.ops):
            prefix = f"{i}/"
            images = op.apply(
                images, {k[len(prefix) :]: v for k, v in params.items() if k.startswith(prefix)}
            )
        return images

    def __repr__(self):
        return f"compose({', '.join(map(repr, self.ops))})"


def compose(*ops: ImageOp) -> ImageOp:
    """Apply image ops in order, each with its own seed split from the one given.

    Raises:
        PetalError: an op that is no image op (mixup, cutmix: pass them to :func:`build`).
    """
    for op in ops:
        if not isinstance(op, ImageOp):
            # A MixOp failed at the first batch, in a TypeError many lines long.
            hint = (
                f"; {op.name} mixes labels too: join it after the image ops in build, e.g. "
                f"augment='flip+{op.name}'"
                if isinstance(op, MixOp)
                else ""
            )
            raise PetalError(
                f"compose takes image ops (flip_left_right, saturation, ...){hint}. "
                f"Received: {op!r}"
            )
    return _Compose(ops)


def codelab() -> ImageOp:
    """The codelab's augmentation: random left-right flip, then random saturation in [0, 2)."""
    return compose(flip_left_right(), saturation(0.0, 2.0))


# --- batch ops on images and one-hot labels --------------------------------------------------


class MixOp:
    """A batch op on images and one-hot labels: ``op(images, labels, seed)``."""

    takes_labels = True
    xla = True

    def __init__(self, name, draw, apply):
        self.name, self._draw, self._apply = name, draw, apply

    def draw(self, n, seed):
        return self._draw(n, seed)

    def apply(self, images, labels, params):
        return self._apply(images, labels, params)

    def __call__(self, images, labels, seed):
        images, labels = tf.convert_to_tensor(images), tf.convert_to_tensor(labels)
        _check_mix(self.name, images, labels)
        seed = _check_seed(seed, repr(self))
        return self.apply(images, labels, self.draw(tf.shape(images)[0], seed))

    def __repr__(self):
        return f"MixOp({self.name})"


def _check_mix(name: str, images: tf.Tensor, labels: tf.Tensor) -> None:
    """Refuse labels that are not one-hot rows, one per image: class ids ``[B]`` broadcast
    into labels of shape ``[B, B]``, and other batch sizes failed in a raw TF error."""
    if labels.shape.rank not in (None, 2):
        raise PetalError(
            f"{name} mixes labels and needs one-hot labels [batch, classes]: pass "
            f"tf.one_hot(labels, num_classes) (train_dataset: label_mode='one_hot'). "
            f"Received: labels of shape {labels.shape}"
        )
    n_images, n_labels = images.shape[0], labels.shape[0]
    if n_images is not None and n_labels is not None and n_images != n_labels:
        raise PetalError(
            f"{name} needs one label row per image: pass images and labels of the same "
            f"batch. Received: images of shape {images.shape}, labels of shape {labels.shape}"
        )


MIN_ALPHA = 1e-6  # the smallest mixup/cutmix alpha: Beta draws in log space overflow below


def _alpha(name: str, alpha) -> float:
    ok = isinstance(alpha, numbers.Real) and not isinstance(alpha, bool)
    # Infinity passed ``alpha > 0``, and made Beta draws of NaN (images and labels).
    if not (ok and math.isfinite(alpha) and alpha > 0):
        raise PetalError(
            f"{name} alpha must be a number > 0 (and finite). Received: alpha={alpha!r}"
        )
    if alpha < MIN_ALPHA:  # log(u) / alpha overflowed float32: -inf - -inf, NaN images
        raise PetalError(
            f"{name} alpha must be at least {MIN_ALPHA:g} (smaller overflows float32; at "
            f"{MIN_ALPHA:g} an image is already almost never mixed). Received: alpha={alpha!r}"
        )
    return float(alpha)


def _beta(n, seed, alpha) -> tf.Tensor:
    """``n`` draws of Beta(alpha, alpha): a / (a + b) of two Gamma(alpha) draws.

    Below alpha 1 the Gamma draws are taken in log space (G = G' * U**(1/alpha), G' ~
    Gamma(alpha + 1)): a float32 Gamma(0.01) draw stops at the smallest normal float in 42%
    of draws, and two such draws gave exactly 0.5, the opposite of a small alpha's "barely
    mix".
    """
    s_a, s_b = tf.unstack(_seeds(seed, 2))
    shape = tf.reshape(n, [1])
    if alpha >= 1:
        a = tf.random.stateless_gamma(shape, s_a, alpha)
        b = tf.random.stateless_gamma(shape, s_b, alpha)
        return a / (a + b)
    return tf.sigmoid(_log_gamma(shape, s_a, alpha) - _log_gamma(shape, s_b, alpha))


def _log_gamma(shape, seed, alpha: float) -> tf.Tensor:
    """The log of Gamma(alpha) draws for alpha < 1, without underflow."""
    s_g, s_u = tf.unstack(_seeds(seed, 2))
    g = tf.random.stateless_gamma(shape, s_g, alpha + 1.0)
    u = 1.0 - tf.random.stateless_uniform(shape, s_u)  # in (0, 1]
    return tf.math.log(g) + tf.math.log(u) / alpha


def _permutation(n, seed) -> tf.Tensor:
    return tf.argsort(_uniform(n, seed))


def mixup(alpha: float = 0.2) -> MixOp:
    """Blend each image (and label) with another of the batch, weight ~ Beta(alpha, alpha)."""
    alpha = _alpha("mixup", alpha)

    def draw(n, seed):
        s_lam, s_perm = tf.unstack(_seeds(seed, 2))
        return {"lam": _beta(n, s_lam, alpha), "perm": _permutation(n, s_perm)}

    def apply(images, labels, p):
        images, labels = _float(images), tf.cast(labels, tf.float32)
        lam, perm = p["lam"], p["perm"]
        mixed = _col(lam) * images + (1 - _col(lam)) * tf.gather(images, perm)
        # Rounding mixes two 255s to 255.00002: clip so the documented 0..255 holds.
        mixed = tf.clip_by_value(mixed, 0.0, 255.0)
        lam = lam[:, None]
        return mixed, lam * labels + (1 - lam) * tf.gather(labels, perm)

    return MixOp("mixup", draw, apply)


def cutmix(alpha: float = 1.0) -> MixOp:
    """Paste a random box from another image of the batch; labels mixed by pasted area."""
    alpha = _alpha("cutmix", alpha)

    def draw(n, seed):
        s_lam, s_y, s_x, s_perm = tf.unstack(_seeds(seed, 4))
        return {
            "lam": _beta(n, s_lam, alpha),
            "y": _uniform(n, s_y),
            "x": _uniform(n, s_x),
            "perm": _permutation(n, s_perm),
        }

    def apply(images, labels, p):
        images, labels = _float(images), tf.cast(labels, tf.float32)
        h, w = tf.shape(images)[1], tf.shape(images)[2]
        hf, wf = tf.cast(h, tf.float32), tf.cast(w, tf.float32)
        side = tf.sqrt(1.0 - p["lam"])
        cy, cx = p["y"] * hf, p["x"] * wf
        y0 = tf.clip_by_value(cy - side * hf / 2, 0, hf)[:, None, None]
        y1 = tf.clip_by_value(cy + side * hf / 2, 0, hf)[:, None, None]
        x0 = tf.clip_by_value(cx - side * wf / 2, 0, wf)[:, None, None]
        x1 = tf.clip_by_value(cx + side * wf / 2, 0, wf)[:, None, None]
        ys = tf.cast(tf.range(h), tf.float32)[None, :, None] + 0.5
        xs = tf.cast(tf.range(w), tf.float32)[None, None, :] + 0.5
        inside = (ys >= y0) & (ys < y1) & (xs >= x0) & (xs < x1)
        mixed = tf.where(inside[..., None], tf.gather(images, p["perm"]), images)
        # The label weight is the area actually pasted, after clipping at the borders.
        pasted = tf.reduce_mean(tf.cast(inside, tf.float32), axis=[1, 2])[:, None]
        return mixed, (1 - pasted) * labels + pasted * tf.gather(labels, p["perm"])

    return MixOp("cutmix", draw, apply)


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
BATCH_OPS: dict[str, Callable[[], MixOp]] = {"mixup": mixup, "cutmix": cutmix}
PRESETS: dict[str, str] = {
    "codelab": "flip+saturation",
    "light": "flip+crop",
    "strong": "flip+crop+color+rotate",
    "none": "",
}


class Augment:
    """A batch augmentation: image ops, then mixing ops. ``fn(images, labels, seed)``.

    Attributes:
        image_op: the composed image ops, or None.
        mix_ops: mixing ops applied after the image ops (they need one-hot labels).
        xla: whether :meth:`apply` compiles with XLA.
    """

    takes_labels = True

    def __init__(self, image_ops=(), mix_ops=(), spec=None):
        self.image_op = compose(*image_ops) if image_ops else None
        self.mix_ops = list(mix_ops)
        self.mixes_labels = bool(self.mix_ops)
        self.spec = spec
        self.xla = (self.image_op is None or self.image_op.xla) and all(m.xla for m in self.mix_ops)

    def draw(self, n, seed) -> dict:
        s_img, s_mix = tf.unstack(_seeds(seed, 2))
        params = {"image": self.image_op.draw(n, s_img) if self.image_op else {}}
        for i, op in enumerate(self.mix_ops):
            params[f"mix{i}"] = op.draw(n, tf.random.experimental.stateless_fold_in(s_mix, i))
        return params

    def apply_images(self, images, params):
        return self.image_op.apply(images, params["image"]) if self.image_op else images

    def apply_mix(self, images, labels, params):
        for i, op in enumerate(self.mix_ops):
            images, labels = op.apply(images, labels, params[f"mix{i}"])
        return images, labels

    def __call__(self, images, labels, seed):
        # One image [H, W, 3] (a dataset mapped before .batch()) was taken for a batch of H
        # rows: a 4-D result with flips of the colour axis, without an error.
        images, single = _as_batch(images, repr(self))
        if single and self.mix_ops:
            raise PetalError(
                f"{self!r} mixes the images of a batch ({self.mix_ops[0].name}): apply it to "
                f"batches [batch, height, width, 3], after .batch(). Received: one image of "
                f"shape {images.shape[1:]}"
            )
        if self.mix_ops:
            labels = tf.convert_to_tensor(labels)
            _check_mix(self.mix_ops[0].name, images, labels)
        params = self.draw(tf.shape(images)[0], seed)
        images = _float(self.apply_images(images, params))
        if single:
            return images[0], labels
        return self.apply_mix(images, labels, params)

    def __repr__(self):
        return f"Augment({self.spec!r})"


class _Custom(Augment):
    """A user function: ``fn(images, seed)`` or ``fn(images, labels, seed)``; never compiled."""

    def __init__(self, fn):
        super().__init__(spec=fn)
        self.fn = fn
        self.xla = False
        self.mixes_labels = bool(getattr(fn, "mixes_labels", False))

    def __call__(self, images, labels, seed):
        if getattr(self.fn, "takes_labels", False):
            out = self.fn(images, labels, seed)
            if not isinstance(out, tuple | list) or len(out) != 2:
                raise PetalError(
                    f"augment function {self._name()} takes labels (takes_labels=True), so it "
                    f"must return (images, labels). Received: {type(out).__name__}"
                )
            out_images, out_labels = out
            out_labels = self._checked(out_labels, labels, "labels")
        else:
            out_images, out_labels = self.fn(images, seed), labels
        return _float(self._checked(out_images, images, "images")), out_labels

    def _name(self) -> str:
        return getattr(self.fn, "__qualname__", None) or repr(self.fn)

    def _checked(self, out, given: tf.Tensor, what: str) -> tf.Tensor:
        """``out`` as a tensor, refused unless of real numbers and shaped as ``given``: a
        batch of another shape came out of the pipeline as it was (static shapes lost, a
        5-D "batch"), and a dtype the cast cannot take failed deep inside tf.data. A shape
        known in part (a ``py_function``'s, a slice of a random size) is checked when the
        batch comes."""
        tensor = None
        with contextlib.suppress(TypeError, ValueError):
            tensor = tf.convert_to_tensor(out)
        given_shape = given.shape.as_list()
        want = f"{what} shaped as it was given, {given_shape}"
        if what == "images":
            want += " (pixels 0..255, uint8 or float; the pipeline normalises them after)"
        if tensor is None or not (tensor.dtype.is_floating or tensor.dtype.is_integer):
            got = type(out).__name__ if tensor is None else f"dtype {tensor.dtype.name}"
            raise PetalError(
                f"augment function {self._name()} returned {what} of {got}, not numbers; it "
                f"must return {want}."
            )
        if not tensor.shape.is_compatible_with(given.shape):
            raise PetalError(
                f"augment function {self._name()} returned {what} of shape "
                f"{tensor.shape.as_list()}; it must return {want}."
            )
        if tensor.shape.rank is None or tensor.shape.as_list() != given_shape:
            return tf.ensure_shape(tensor, given.shape)
        return tensor


def _factories() -> tuple:
    """The public functions that make an op (``saturation``), which :func:`build` refuses
    uncalled."""
    return (flip_left_right, saturation, brightness, contrast, hue, color_jitter,
            random_resized_crop, rotation, compose, codelab, mixup, cutmix)


def names() -> list[str]:
    """Every op and preset name :func:`build` accepts."""
    return sorted([*PRESETS, *IMAGE_OPS, *BATCH_OPS])


def with_crop(spec) -> str:
    """``spec`` with the ``crop`` op added, as ``--set augment=`` takes it (``crop`` alone
    for no augmentation): the fix named where a training size needs crops."""
    named = isinstance(spec, str) and spec.strip().lower() not in ("", "none")
    return f"{spec.strip()}+crop" if named else "crop"


def has_crop(spec) -> bool:
    """Whether ``spec`` (as :func:`build` takes it) names the ``crop`` op, alone or in a
    preset: what a training size other than the evaluation size needs."""
    parts = spec.replace(",", "+").split("+") if isinstance(spec, str) else []
    given = [part.strip().lower() for part in parts]
    return "crop" in [op for name in given for op in PRESETS.get(name, name).split("+")]


def build(spec, size: tuple[int, int] | None = None) -> Augment | None:
    """One batch augmentation from a spec, or None when there is nothing to do.

    Args:
        spec: None/False/"none" (no augmentation); a preset (``codelab``, ``light``,
            ``strong``); op names joined by ``+`` or ``,`` (``"flip+crop+mixup"``): image ops
            applied in order, then mixing ops; an :class:`Augment`; or a function
            ``fn(images, seed)`` (or ``fn(images, labels, seed)`` with
            ``fn.takes_labels = True``, returning both): ``images`` a uint8 batch
            ``[B, H, W, 3]`` of pixels 0..255, ``seed`` as the ops take it; it returns a
            batch of that shape, uint8 or float in 0..255 (normalised after it), and
            labels of their shape.
        size: output (height, width) of the random resized crop, to train at a lower
            resolution than the records (and evaluate at theirs); needs ``crop`` in ``spec``.
    """
    if size is not None and not has_crop(spec):
        # train passes train_image_size here when it differs from image_size (the
        # records' size when that is null), the size the pipeline decodes and evaluates at.
        raise PetalError(
            "A training size (train_image_size) other than the evaluation image_size needs "
            "the 'crop' augmentation, which resizes its crops to that size: pass --set "
            f"augment={with_crop(spec)}, or drop train_image_size. Received: "
            f"augment={spec!r}, size={size}"
        )
    if spec is None or spec is False:
        return None
    if isinstance(spec, Augment):
        return spec
    if isinstance(spec, ImageOp):
        return Augment([spec], spec=spec)
    if isinstance(spec, MixOp):
        return Augment([], [spec], spec=spec)
    if callable(spec):
        if any(spec is factory for factory in _factories()):
            # augment=saturation ran saturation(images, seed) inside tf.data: a traceback, or
            # an error about arguments the user never passed.
            call = "compose(op, ...)" if spec is compose else f"{spec.__name__}()"
            raise PetalError(
                f"augment={spec.__name__} is the op's factory, not the op: call it "
                f"(augment={call}). Received: augment={spec.__module__}.{spec.__name__}"
            )
        return _Custom(spec)
    if not isinstance(spec, str):
        raise PetalError(
            f"augment must be a name, a '+'-joined list of names or a function. "
            f"Received: augment={spec!r}"
        )
    text = PRESETS.get(spec.strip().lower(), spec)
    parts = [p.strip().lower() for p in text.replace(",", "+").split("+")]
    if text.strip() and not all(parts):
        # "flip+" or "flip++crop": a name left out, most likely, not nothing meant.
        raise PetalError(
            f"augment holds an empty name between or beside its '+' (known: "
            f"{', '.join(names())}). Received: augment={spec!r}"
        )
    parts = [p for p in parts if p]
    if "none" in parts and len(parts) > 1:
        # "none+flip" trained with flip: no augmentation and some at once.
        rest = "+".join(p for p in parts if p != "none")
        raise PetalError(
            f"augment 'none' means no augmentation, which other names beside it contradict: "
            f"drop it (augment={rest!r}), or give 'none' alone. Received: augment={spec!r}"
        )
    image_ops, mix_ops = [], []
    for part in parts:
        if part in PRESETS:
            image_ops.extend(
                random_resized_crop(size=size) if p == "crop" and size else IMAGE_OPS[p]()
                for p in PRESETS[part].split("+")
                if p
            )
        elif part == "crop" and size is not None:
            image_ops.append(random_resized_crop(size=size))
        elif part in IMAGE_OPS:
            image_ops.append(IMAGE_OPS[part]())
        elif part in BATCH_OPS:
            mix_ops.append(BATCH_OPS[part]())
        else:
            raise PetalError(
                f"Unknown augmentation {part!r} (known: {', '.join(names())}). "
                f"Received: augment={spec!r}"
            )
    if not image_ops and not mix_ops:
        return None
    return Augment(image_ops, mix_ops, spec=spec)
