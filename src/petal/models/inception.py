"""A small inception-style network: the codelab part 4's example of a multi-branch module.

Stem convolutions, then inception modules (1x1, 1x1->3x3, 1x1->3x3->3x3 and pool->1x1
branches concatenated) separated by max-pools, GAP and a softmax head. Sized like the
squeezenet (a few hundred thousand parameters) so the two compare on a CPU.
"""

from __future__ import annotations

import keras
from keras import layers

from petal.models.blocks import classifier_head, conv_bn, image_input, inception_module
from petal.models.registry import register

# (c1, (c3 reduce, c3), (c5 reduce, c5), pool_proj) per module; a 2x2 max-pool follows each.
_MODULES = (
    (16, (16, 32), (8, 16), 16),
    (32, (32, 48), (16, 24), 24),
    (48, (32, 64), (16, 32), 32),
    (64, (48, 96), (24, 48), 48),
)


def build_inception(
    num_classes: int,
    image_size: tuple[int, int],
    weights: str | None = None,
    *,
    modules=_MODULES,
    stem_filters: int = 32,
    dropout: float = 0.0,
) -> keras.Model:
    """Inception-style classifier.

    Args:
        num_classes: Output classes.
        image_size: (height, width).
        weights: Unused (no published weights).
        modules: Branch widths per inception module.
        stem_filters: Channels of the stem convolution.
        dropout: Dropout before the head.

    Returns:
        The uncompiled model.
    """
    del weights
    inputs = image_input(image_size)
    x = conv_bn(inputs, stem_filters, 3, name="stem")
    x = layers.MaxPooling2D(2, name="stem_pool")(x)
    for i, (c1, c3, c5, pp) in enumerate(modules):
        x = inception_module(x, c1, c3, c5, pp, name=f"mixed{i}")
        if i < len(modules) - 1:
            x = layers.MaxPooling2D(2, name=f"pool{i}")(x)
    x = layers.GlobalAveragePooling2D(name="gap")(x)
    return keras.Model(inputs, classifier_head(x, num_classes, dropout=dropout), name="inception")


@register(
    "inception",
    family="inception",
    description="inception-style modules (1x1 / 3x3 / double 3x3 / pool branches) with BatchNorm",
    normalization="unit",
    default_image_size=192,
    min_image_size=16,
)
def inception(num_classes, image_size, weights=None, **kwargs):
    return build_inception(num_classes, image_size, weights, **kwargs)
