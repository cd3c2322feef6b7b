"""Pretrained ``keras.applications`` backbones with a new global-pooling + softmax head.

Each model is ``image -> backbone -> GlobalAveragePooling -> [Dropout] -> Dense(softmax, float32)``,
the codelab's fine-tune layout. The backbone is a nested model named ``backbone`` so the
registry's freeze helpers find it and a backbone-only weights file can be loaded into it.

``weights="imagenet"`` downloads the published weights through Keras (cached under
``~/.keras/models``); offline, a :class:`~petal.errors.PetalError` says how to pass a local file.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable

import keras
from keras import layers

from petal.errors import PetalError, first_line
from petal.models.blocks import classifier_head, image_input
from petal.models.registry import BACKBONE_NAME, check_bool_options, freeze_batchnorm, register


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
        PetalError: ImageNet weights were asked for but cannot be downloaded.
    """
    check_bool_options(arch, bn_frozen=bn_frozen, backbone_trainable=backbone_trainable)
    spec = _BACKBONES[arch]
    try:
        with warnings.catch_warnings():
            if weights is None:
                # MobileNetV2 warns about which ImageNet weights it would load at odd sizes,
                # even when it loads none.
                warnings.filterwarnings("ignore", message=".*will be loaded as the default")
            backbone = spec.constructor(
                include_top=False,
                weights=weights,
                input_shape=(*image_size, 3),
                **spec.extra,
            )
    except Exception as err:
        # keras.utils.get_file raises a bare Exception("URL fetch failure on ...") when offline;
        # anything else is a real bug and propagates unchanged.
        if weights != "imagenet" or "URL fetch failure" not in str(err):
            raise
        raise PetalError(
            f"Cannot download the ImageNet weights of {arch!r} (offline?): {first_line(err)}. "
            f"Copy the weights file into ~/.keras/models/ or pass weights=PATH to a local "
            f".weights.h5 file (or weights=None to train from scratch). Received: weights='imagenet'"
        ) from err
    # Renamed after construction: EfficientNetV2 uses its `name` argument to pick its blocks.
    backbone.name = BACKBONE_NAME
    backbone.trainable = backbone_trainable
    if bn_frozen:
        freeze_batchnorm(backbone)

    inputs = image_input(image_size)
    x = backbone(inputs)
    x = layers.GlobalAveragePooling2D(name="gap")(x)
    return keras.Model(inputs, classifier_head(x, num_classes, dropout=dropout), name=arch)


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
