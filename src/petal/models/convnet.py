"""The codelab part 3 convnet: six 3x3 convolutions, a 1x1 bottleneck and global average pooling.

Architecture (all convolutions ReLU, padding same, no BatchNorm), 293,233 parameters for five
classes at any image size (global average pooling makes the count size-independent)::

    conv3x3(16) conv3x3(30) pool2
    conv3x3(60) pool2
    conv3x3(90) pool2
    conv3x3(110) pool2
    conv3x3(130) conv1x1(40) GAP Dense(N, softmax)

The count pins the kernel sizes: 448 + 4,350 + 16,260 + 48,690 + 89,210 + 128,830 (3x3
convolutions) + 5,240 (1x1) + 205 (head) = 293,233.
"""

from __future__ import annotations

import keras
from keras import layers

from petal.models.blocks import classifier_head, image_input
from petal.models.registry import register

# (filters, kernel size, max-pool after)
_LAYERS = (
    (16, 3, False),
    (30, 3, True),
    (60, 3, True),
    (90, 3, True),
    (110, 3, True),
    (130, 3, False),
    (40, 1, False),
)


def build_convnet(
    num_classes: int, image_size: tuple[int, int], weights: str | None = None
) -> keras.Model:
    """The codelab's six-conv network.

    Args:
        num_classes: Output classes.
        image_size: (height, width); at least 16 for the four 2x2 poolings.
        weights: Unused (no published weights).

    Returns:
        The uncompiled model.
    """
    del weights
    inputs = image_input(image_size)
    x = inputs
    for i, (filters, kernel, pool) in enumerate(_LAYERS):
        x = layers.Conv2D(filters, kernel, padding="same", activation="relu", name=f"conv{i}")(x)
        if pool:
            x = layers.MaxPooling2D(2, name=f"pool{i}")(x)
    x = layers.GlobalAveragePooling2D(name="gap")(x)
    return keras.Model(inputs, classifier_head(x, num_classes), name="convnet")


@register(
    "convnet",
    family="convnet",
    description="codelab part 3: six 3x3 convs 16-130, 1x1 conv 40, GAP (293,233 params)",
    normalization="unit",
    default_image_size=192,
    min_image_size=16,
)
def convnet(num_classes, image_size, weights=None, **kwargs):
    return build_convnet(num_classes, image_size, weights, **kwargs)
