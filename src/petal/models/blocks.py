"""Building blocks shared by the model families: conv+BN, fire modules, the float32 head.

Functional-API helpers over built-in Keras layers only, so every model saves to ``.keras`` and
loads back in safe mode without custom objects.
"""

from __future__ import annotations

import keras
from keras import layers

#: The codelab's BatchNormalization momentum (Keras' default is 0.99).
BN_MOMENTUM = 0.9


def conv_bn(
    x,
    filters: int,
    kernel_size: int,
    *,
    strides: int = 1,
    separable: bool = False,
    name: str | None = None,
):
    """Conv (ReLU, padding same, bias on) followed by BatchNorm, the codelab's order.

    Args:
        x: Input tensor.
        filters: Output channels.
        kernel_size: Square kernel side.
        strides: Convolution stride.
        separable: Use a depthwise-separable convolution instead of a full one.
        name: Prefix for the two layers' names.

    Returns:
        The normalised feature map.
    """
    conv = layers.SeparableConv2D if separable else layers.Conv2D
    x = conv(
        filters,
        kernel_size,
        strides=strides,
        padding="same",
        activation="relu",
        name=f"{name}_conv" if name else None,
    )(x)
    return layers.BatchNormalization(momentum=BN_MOMENTUM, name=f"{name}_bn" if name else None)(x)


def fire(x, squeeze: int, expand: int, *, separable: bool = False, name: str | None = None):
    """A squeezenet fire module: a 1x1 squeeze, then 1x1 and 3x3 expand branches concatenated.

    Args:
        x: Input tensor.
        squeeze: Channels of the 1x1 squeeze convolution.
        expand: Output channels; each expand branch has ``expand // 2``.
        separable: Make the 3x3 branch depthwise-separable (far fewer weights and FLOPs).
        name: Prefix for the module's layer names.

    Returns:
        A feature map with ``expand`` channels.
    """
    p = name or "fire"
    s = conv_bn(x, squeeze, 1, name=f"{p}_squeeze")
    left = conv_bn(s, expand // 2, 1, name=f"{p}_e1x1")
    right = conv_bn(s, expand // 2, 3, separable=separable, name=f"{p}_e3x3")
    return layers.Concatenate(name=f"{p}_concat")([left, right])


def inception_module(
    x, c1: int, c3: tuple[int, int], c5: tuple[int, int], pool_proj: int, *, name: str
):
    """An inception-style (GoogLeNet) module: four parallel branches concatenated.

    The 5x5 branch is two stacked 3x3 convolutions (same receptive field, fewer weights), as in
    Inception v2.

    Args:
        x: Input tensor.
        c1: Channels of the 1x1 branch.
        c3: (reduce, out) channels of the 1x1 -> 3x3 branch.
        c5: (reduce, out) channels of the 1x1 -> 3x3 -> 3x3 branch.
        pool_proj: Channels of the 3x3 max-pool -> 1x1 branch.
        name: Prefix for the module's layer names.

    Returns:
        A feature map with ``c1 + c3[1] + c5[1] + pool_proj`` channels.
    """
    b1 = conv_bn(x, c1, 1, name=f"{name}_b1")
    b3 = conv_bn(x, c3[0], 1, name=f"{name}_b3r")
    b3 = conv_bn(b3, c3[1], 3, name=f"{name}_b3")
    b5 = conv_bn(x, c5[0], 1, name=f"{name}_b5r")
    b5 = conv_bn(b5, c5[1], 3, name=f"{name}_b5a")
    b5 = conv_bn(b5, c5[1], 3, name=f"{name}_b5b")
    bp = layers.MaxPooling2D(3, strides=1, padding="same", name=f"{name}_pool")(x)
    bp = conv_bn(bp, pool_proj, 1, name=f"{name}_bp")
    return layers.Concatenate(name=f"{name}_concat")([b1, b3, b5, bp])


def classifier_head(x, num_classes: int, *, dropout: float = 0.0, name: str = "predictions"):
    """Softmax classifier whose output stays float32 under a mixed-precision policy.

    A bfloat16/float16 softmax loses probability resolution and can overflow the loss; the
    codelab sets ``dtype='float32'`` on the last layer for this reason.

    Args:
        x: Pooled features [batch, channels].
        num_classes: Output classes.
        dropout: Dropout rate before the classifier (0 disables it).
        name: Name of the Dense layer.

    Returns:
        Float32 class probabilities [batch, num_classes].
    """
    if dropout:
        x = layers.Dropout(dropout, name="head_dropout")(x)
    return layers.Dense(num_classes, activation="softmax", dtype="float32", name=name)(x)


def image_input(image_size: tuple[int, int]) -> keras.KerasTensor:
    """The model input: float images [batch, height, width, 3] named ``image``."""
    return keras.Input(shape=(*image_size, 3), name="image")
