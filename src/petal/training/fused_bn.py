"""BatchNormalization's training step as one fused TensorFlow kernel.

Keras 3 computes a training-mode ``BatchNormalization`` from primitive ops (mean, squared
difference, mean, scale and shift) and differentiates through them: about a dozen
element-wise passes over every activation, forward and backward. TensorFlow has a fused
kernel for exactly this (``FusedBatchNormV3`` and its gradient; oneDNN on CPUs, cuDNN on
GPUs), which tf.keras 2 -- and so the codelab -- used by default. For networks whose
activations are large and whose convolutions are small, such as the codelab's squeezenet at
192x192, those passes are most of the step: on this project's CPU a training step of the
codelab's squeezenet ran 1.4-1.6x faster with the fused kernel (benchmarks/README.md).

:func:`use_fused_batch_norm` switches the layers of a built model to it, in place. The layers
stay Keras ``BatchNormalization`` layers (same weights, same saved file, loadable without
petal); only their training-mode call changes, and only where the result is the same as
Keras': channels-last 4-D inputs, no mask, no renormalisation, no cross-replica
synchronisation. Inference, frozen layers and everything else keep Keras' own call. The
statistics are those of Keras: the batch mean and biased variance normalise the batch and
update the moving averages with the layer's momentum; the float32 computation and the cast
back to the layer's compute dtype under mixed precision are Keras' too.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from petal.models.registry import walk_layers


def _eligible(layer) -> bool:
    return (
        isinstance(layer, keras.layers.BatchNormalization)
        and not layer.renorm
        and not layer.synchronized
    )


def fused_batch_norm_call(layer):
    """The fused training-mode ``call`` for one built-in ``BatchNormalization`` layer."""
    keras_call = type(layer).call.__get__(layer)

    def call(inputs, training=None, mask=None):
        if not (
            training
            and layer.trainable
            and mask is None
            and len(inputs.shape) == 4
            and layer.axis in (3, -1)
        ):
            return keras_call(inputs, training=training, mask=mask)
        x = tf.cast(inputs, tf.float32)  # as Keras: statistics in float32
        channels = x.shape[-1]
        gamma = tf.cast(layer.gamma, tf.float32) if layer.scale else tf.ones([channels])
        beta = tf.cast(layer.beta, tf.float32) if layer.center else tf.zeros([channels])
        y, mean, variance, _, _, _ = tf.raw_ops.FusedBatchNormV3(
            x=x,
            scale=gamma,
            offset=beta,
            mean=tf.zeros([0]),
            variance=tf.zeros([0]),
            epsilon=layer.epsilon,
            exponential_avg_factor=1.0,
            data_format="NHWC",
            is_training=True,
        )
        # The kernel normalises with the biased variance but returns the unbiased one;
        # Keras' moving variance averages the biased one.
        n = tf.cast(tf.reduce_prod(tf.shape(x)[:-1]), tf.float32)
        variance = variance * tf.maximum(n - 1.0, 0.0) / tf.maximum(n, 1.0)
        momentum = layer.momentum
        layer.moving_mean.assign(
            tf.cast(layer.moving_mean, tf.float32) * momentum + mean * (1.0 - momentum)
        )
        layer.moving_variance.assign(
            tf.cast(layer.moving_variance, tf.float32) * momentum + variance * (1.0 - momentum)
        )
        return tf.cast(y, layer.compute_dtype)

    return call


def use_fused_batch_norm(model: keras.Model) -> int:
    """Makes every eligible ``BatchNormalization`` layer of ``model`` train with the fused
    kernel (TensorFlow backend only). Returns how many layers were switched."""
    if keras.backend.backend() != "tensorflow":
        return 0
    count = 0
    for layer in walk_layers(model):  # nested backbones too
        if _eligible(layer) and not getattr(layer, "_petal_fused", False):
            layer.call = fused_batch_norm_call(layer)
            layer._petal_fused = True
            count += 1
    return count
