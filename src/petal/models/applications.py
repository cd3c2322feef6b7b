"""Pretrained ``keras.applications`` backbones with a new global-pooling + softmax head.

Each model is ``image -> backbone -> GlobalAveragePooling -> [Dropout] -> Dense(softmax, float32)``,
the codelab's fine-tune layout. The backbone is a nested model named ``backbone`` so the
registry's freeze helpers find it and a backbone-only weights file can be loaded into it.

``weights="imagenet"`` downloads the published weights through Keras (cached under
``~/.keras/models``); offline, a :class:`~petal.errors.PetalError` says how to pass a local file,
and a cached file Keras cannot load is named, to be deleted or replaced.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import warnings
from collections.abc import Callable

import keras
from keras import layers

from petal.errors import PetalError, first_line
from petal.models.blocks import classifier_head, image_input
from petal.models.registry import (
    BACKBONE_NAME,
    _h5_reason,
    _keras_reason,
    check_bool_options,
    freeze_batchnorm,
    h5_layout,
    register,
)


@dataclasses.dataclass(frozen=True)
class _Backbone:
    constructor: Callable[..., keras.Model]
    extra: dict  # constructor options besides the shared ones


_BACKBONES = {
    # Expects -1..1 (keras.applications.xception.preprocess_input).
    "xception": _Backbone(keras.applications.Xception, {}),
    # Expects -1..1 (keras.applications.mobilenet_v2.preprocess_input).
    "mobilenet_v2": _Backbone(keras.applications.MobileNetV2, {}),
    # The model rescales 0..255 itself (include_preprocessing), so it takes raw pixels.
    "efficientnet_v2_b0": _Backbone(
        keras.applications.EfficientNetV2B0, {"include_preprocessing": True}
    ),
    # The model normalises 0..255 with ImageNet mean/std itself (include_preprocessing).
    "convnext_tiny": _Backbone(keras.applications.ConvNeXtTiny, {"include_preprocessing": True}),
}


def build_application(
    arch: str,
    num_classes: int,
    image_size: tuple[int, int],
    weights: str | None = None,
    *,
    dropout: float = 0.0,
    bn_frozen: bool = False,
    backbone_trainable: bool = True,
) -> keras.Model:
    """A keras.applications backbone (no top) with a new classifier head.

    Args:
        arch: Key of the backbone table (``"xception"``, ``"mobilenet_v2"``, ...).
        num_classes: Output classes.
        image_size: (height, width).
        weights: ``None`` or ``"imagenet"``.
        dropout: Dropout before the head (the codelab uses none).
        bn_frozen: Keep the backbone's BatchNorm layers in inference mode (Keras' advice for
            fine-tuning pretrained weights). The codelab trains them (``False``).
        backbone_trainable: ``False`` freezes the backbone for a head-only warm-up.

    Returns:
        The uncompiled model, named ``arch``.

    Raises:
        PetalError: ImageNet weights were asked for but cannot be downloaded, or the file in
            Keras' cache does not load.
    """
    check_bool_options(arch, bn_frozen=bn_frozen, backbone_trainable=backbone_trainable)
    spec = _BACKBONES[arch]
    fetched: list[str] = []  # the cached or downloaded ImageNet file Keras loads
    cached: list[str] = []  # a file in the cache before a fetch that failed
    try:
        with warnings.catch_warnings(), _recording_fetches(fetched, cached):
            # MobileNetV2 warns at sizes other than its published ones that it loads the
            # 224-pixel ImageNet weights (even when it loads none), as a raw warning with its
            # source line: the same weights fit any size.
            warnings.filterwarnings("ignore", message=".*will be loaded as the default")
            backbone = spec.constructor(
                include_top=False,
                weights=weights,
                input_shape=(*image_size, 3),
                **spec.extra,
            )
    except Exception as err:
        # keras.utils.get_file raises a bare Exception("URL fetch failure on ...") when offline;
        # a file it found (in its cache) that Keras cannot load raises what h5py or Keras' loader
        # raise. Anything else is a real bug and propagates unchanged.
        if weights != "imagenet":
            raise
        if "URL fetch failure" in str(err) and cached:
            # Keras checks the published file's hash, removes a file that fails it and
            # downloads it again: offline, the user's copy is gone and the reason with it.
            gone = "removed it" if not os.path.exists(cached[-1]) else "kept it"
            raise PetalError(
                f"The ImageNet weights file {cached[-1]} in Keras' cache is not the published "
                f"file of {arch!r} (its hash does not match: damaged, or another file), and "
                f"Keras {gone} to download it again, which failed (offline?): "
                f"{first_line(err)}. Copy the published file there again, or pass --weights "
                "PATH (weights=PATH) to a local weights file, or --weights none (weights=None) "
                "to train from scratch. Received: weights='imagenet'"
            ) from err
        if "URL fetch failure" in str(err):
            raise PetalError(
                f"Cannot download the ImageNet weights of {arch!r} (offline?): "
                f"{first_line(err)}. Copy the published file into {_cache_folder()}/, or pass "
                f"--weights PATH (weights=PATH) to a local weights file, or --weights none "
                f"(weights=None) to train from scratch. Received: weights='imagenet'"
            ) from err
        if fetched and isinstance(err, (ValueError, KeyError, TypeError, OSError, RuntimeError)):
            raise PetalError(
                f"The cached ImageNet weights file {fetched[-1]} does not fit {arch!r} "
                f"({_cache_reason(fetched[-1], err)}); delete it (Keras downloads it again when "
                "online) or replace it with the published file. Received: weights='imagenet'"
            ) from None
        raise
    # Renamed after construction: EfficientNetV2 uses its `name` argument to pick its blocks.
    backbone.name = BACKBONE_NAME
    backbone.trainable = backbone_trainable
    if bn_frozen:
        freeze_batchnorm(backbone)

    inputs = image_input(image_size)
    x = backbone(inputs)
    x = layers.GlobalAveragePooling2D(name="gap")(x)
    return keras.Model(inputs, classifier_head(x, num_classes, dropout=dropout), name=arch)


@contextlib.contextmanager
def _recording_fetches(fetched: list[str], cached: list[str]):
    """Append the path of every file ``keras.applications`` fetches (from Keras' cache, or
    downloaded) to ``fetched``: a file Keras then fails to load is named to the user; and
    the path of a file in the cache whose fetch failed to ``cached`` (Keras found it stale
    by its hash and could not download it again).

    Keras' application modules call ``keras.src.utils.file_utils.get_file`` through the
    module, so wrapping it there for the duration sees them. Where a Keras version does
    otherwise nothing is recorded and the loader's error propagates unchanged.
    """
    from keras.src.utils import file_utils

    get_file = file_utils.get_file

    def recording(*args, **kwargs):
        name = kwargs.get("fname", args[0] if args else None)
        where = os.path.join(_cache_folder(), str(name)) if name else None
        there = where is not None and os.path.isfile(where)
        try:
            path = get_file(*args, **kwargs)
        except Exception:
            if there:
                cached.append(where)
            raise
        fetched.append(str(path))
        return path

    file_utils.get_file = recording
    try:
        yield
    finally:
        file_utils.get_file = get_file


def _cache_folder() -> str:
    """Where Keras caches the ImageNet files: ``$KERAS_HOME/models`` (``~/.keras/models``),
    or ``/tmp/.keras/models`` where that folder cannot be written."""
    from keras.src.backend import config

    home = os.path.expanduser(config.keras_home())
    if not os.access(home, os.W_OK):
        home = os.path.join("/tmp", ".keras")
    return os.path.join(home, "models")


def _cache_reason(path: str, err: Exception) -> str:
    """Why Keras could not load a cached ImageNet file, in a few words."""
    if h5_layout(path) == "keras3":
        return "it is a Keras 3 .weights.h5 file; the published files are tf.keras .h5 files"
    if isinstance(err, (OSError, RuntimeError)):  # h5py's: cut short, not HDF5, damaged
        return _h5_reason(err)
    return _keras_reason(err)


def _register(arch: str, description: str, normalization: str, default: int, minimum: int) -> None:
    @register(
        arch,
        family="applications",
        description=description,
        normalization=normalization,
        default_image_size=default,
        min_image_size=minimum,
        pretrained=True,
    )
    def builder(num_classes, image_size, weights=None, **kwargs):
        return build_application(arch, num_classes, image_size, weights, **kwargs)


_register("xception", "codelab fine-tune model: Xception + GAP + softmax", "symmetric", 331, 71)
_register("mobilenet_v2", "MobileNetV2 (alpha 1.0) + GAP + softmax", "symmetric", 224, 32)
_register("efficientnet_v2_b0", "EfficientNetV2-B0 + GAP + softmax", "raw", 224, 32)
_register("convnext_tiny", "ConvNeXt-Tiny (2022) + GAP + softmax", "raw", 224, 32)
