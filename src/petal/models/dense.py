"""The codelab's first model: a fully connected classifier on flattened pixels (Flatten-500-50-N).

Kept as the baseline that shows why convolutions matter: at 192x192 the first layer alone holds
55 million weights.
"""

from __future__ import annotations

import keras
from keras import layers

from petal.models.blocks import classifier_head, image_input
from petal.models.registry import register


def build_dense(
    num_classes: int, image_size: tuple[int, int], weights: str | None = None, hidden=(500, 50)
) -> keras.Model:
    """Flatten -> Dense(500, relu) -> Dense(50, relu) -> Dense(num_classes, softmax).

    Args:
        num_classes: Output classes.
        image_size: (height, width).
        weights: Unused (no published weights); local files are loaded by the registry.
        hidden: Widths of the hidden layers.

    Returns:
        The uncompiled model.
    """
    del weights
    inputs = image_input(image_size)
    x = layers.Flatten(name="flatten")(inputs)
    for i, units in enumerate(hidden):
        x = layers.Dense(units, activation="relu", name=f"dense_{i}")(x)
    return keras.Model(inputs, classifier_head(x, num_classes), name="dense")


@register(
    "dense",
    family="dense",
    description="codelab part 3 baseline: Flatten-500-50-N, no convolutions",
    normalization="unit",
    default_image_size=192,
    min_image_size=8,
)
def dense(num_classes, image_size, weights=None, **kwargs):
    return build_dense(num_classes, image_size, weights, **kwargs)
