"""Squeezenet from fire modules, as in the codelab part 4, and a depthwise-separable variant.

Codelab architecture (BatchNorm momentum 0.9 after every ReLU convolution, padding same)::

    conv3x3(32) fire(24,48) pool2 fire(48,96) pool2 fire(64,128) pool2 fire(48,96) pool2
    fire(24,48) GAP Dense(N, softmax)

120,613 parameters for five classes (119,301 trainable, 1,312 BatchNorm moving statistics),
independent of the image size.
"""

from __future__ import annotations

import keras
from keras import layers

from petal.models.blocks import classifier_head, conv_bn, fire, image_input
from petal.models.registry import check_bool_options, register

#: (squeeze, expand) per fire module; a 2x2 max-pool follows every module but the last.
CODELAB_FIRES = ((24, 48), (48, 96), (64, 128), (48, 96), (24, 48))


def build_squeezenet(
    num_classes: int,
    image_size: tuple[int, int],
    weights: str | None = None,
    *,
    fires=CODELAB_FIRES,
    stem_filters: int = 32,
    stem_stride: int = 1,
    separable: bool = False,
    dropout: float = 0.0,
    any_size: bool = False,
    name: str = "squeezenet",
) -> keras.Model:
    """Stem convolution, fire modules separated by max-pools, GAP and a softmax head.

    Args:
        num_classes: Output classes.
        image_size: (height, width).
        weights: Unused (no published weights).
        fires: (squeeze, expand) per fire module.
        stem_filters: Channels of the first 3x3 convolution.
        stem_stride: Stride of that convolution; 2 runs every fire module at a quarter of the
            pixels (about 4x fewer FLOPs; the codelab uses 1).
        separable: Depthwise-separable 3x3 expand branches.
        dropout: Dropout before the head (the codelab uses none).
        any_size: Accept any input size (fully convolutional up to the pooling), to train on
            smaller random crops than the size it is evaluated at.
        name: Model name.

    Returns:
        The uncompiled model.
    """
    del weights
    check_bool_options(name, separable=separable, any_size=any_size)
    inputs = image_input((None, None) if any_size else image_size)
    x = conv_bn(inputs, stem_filters, 3, strides=stem_stride, name="stem")
    for i, (squeeze, expand) in enumerate(fires):
        x = fire(x, squeeze, expand, separable=separable, name=f"fire{i}")
        if i < len(fires) - 1:
            x = layers.MaxPooling2D(2, name=f"pool{i}")(x)
    x = layers.GlobalAveragePooling2D(name="gap")(x)
    return keras.Model(inputs, classifier_head(x, num_classes, dropout=dropout), name=name)


def min_side(*, fires=CODELAB_FIRES, stem_stride: int = 1, **_) -> int:
    """The smallest input side: the stem's ``same`` convolution leaves ``ceil(n / stride)``,
    which every 2x2 max-pool halves (rounding down) to at least one pixel."""
    return stem_stride * (2 ** (len(fires) - 1) - 1) + 1


@register(
    "squeezenet",
    family="squeezenet",
    description="codelab part 4: fire modules with BatchNorm(0.9) (120,613 params)",
    normalization="unit",
    default_image_size=192,
    min_image_size=16,
    min_side=min_side,
)
def squeezenet(num_classes, image_size, weights=None, **kwargs):
    return build_squeezenet(num_classes, image_size, weights, **kwargs)


@register(
    "squeezenet_separable",
    family="squeezenet",
    description="squeezenet with depthwise-separable 3x3 expand branches (fewer FLOPs)",
    normalization="unit",
    default_image_size=192,
    min_image_size=16,
    min_side=min_side,
)
def squeezenet_separable(num_classes, image_size, weights=None, **kwargs):
    kwargs.setdefault("name", "squeezenet_separable")
    return build_squeezenet(num_classes, image_size, weights, separable=True, **kwargs)
