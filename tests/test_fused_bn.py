"""The fused BatchNormalization training call: same numbers as Keras' own layer, same files."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from petal.training.fused_bn import use_fused_batch_norm


def _pair(shape, **kwargs):
    """A Keras BatchNormalization layer and an identical one switched to the fused call."""
    keras_bn = keras.layers.BatchNormalization(**kwargs)
    fused_bn = keras.layers.BatchNormalization(**kwargs)
    keras_bn.build(shape)
    fused_bn.build(shape)
    assert use_fused_batch_norm(keras.Sequential([fused_bn])) == 1
    return keras_bn, fused_bn


def _relu_input(shape, seed=0):
    rng = np.random.default_rng(seed)
    return tf.nn.relu(tf.constant(rng.normal(1.0, 3.0, shape).astype("float32")))


def _rel(a, b) -> float:
    a, b = tf.cast(a, tf.float32), tf.cast(b, tf.float32)
    return float(tf.reduce_max(tf.abs(a - b)) / (tf.reduce_max(tf.abs(a)) + 1e-12))


@pytest.mark.parametrize("compiled", [False, True])
def test_training_call_matches_keras(compiled):
    shape = (8, 12, 12, 16)
    keras_bn, fused_bn = _pair(shape, momentum=0.9)
    x = _relu_input(shape)
    r = tf.constant(np.random.default_rng(1).normal(size=shape).astype("float32"))

    def step(layer):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = layer(x, training=True)
            loss = tf.reduce_sum(y * r)
        return (y, *tape.gradient(loss, [x, layer.gamma, layer.beta]))

    results = []
    for layer in (keras_bn, fused_bn):
        fn = tf.function(step) if compiled else step
        results.append(fn(layer))
    for keras_value, fused_value in zip(*results, strict=True):
        assert _rel(keras_value, fused_value) < 1e-5
    # The moving averages move alike (biased batch variance, the layer's momentum).
    assert _rel(keras_bn.moving_mean, fused_bn.moving_mean) < 1e-6
    assert _rel(keras_bn.moving_variance, fused_bn.moving_variance) < 1e-5
    assert _rel(fused_bn.moving_mean, tf.zeros([16])) > 0  # they did move


def test_inference_and_frozen_layers_keep_keras_call():
    shape = (4, 6, 6, 8)
    keras_bn, fused_bn = _pair(shape)
    x = _relu_input(shape)
    keras_bn(x, training=True)  # give the moving statistics values
    fused_bn.set_weights(keras_bn.get_weights())
    np.testing.assert_array_equal(keras_bn(x, training=False), fused_bn(x, training=False))
    keras_bn.trainable = fused_bn.trainable = False  # frozen: inference mode even in training
    np.testing.assert_array_equal(keras_bn(x, training=True), fused_bn(x, training=True))


def test_mixed_bfloat16_keeps_the_compute_dtype():
    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        shape = (8, 10, 10, 8)
        keras_bn, fused_bn = _pair(shape)
        x = tf.cast(_relu_input(shape), tf.bfloat16)
        y_keras, y_fused = keras_bn(x, training=True), fused_bn(x, training=True)
    finally:
        keras.mixed_precision.set_global_policy(previous)
    assert y_fused.dtype == y_keras.dtype == tf.bfloat16
    assert fused_bn.moving_mean.dtype == "float32"
    assert _rel(y_keras, y_fused) < 1e-2  # bfloat16 output rounding
    assert _rel(keras_bn.moving_variance, fused_bn.moving_variance) < 1e-5


def _small_model(seed):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((16, 16, 3))
    x = inputs
    for filters in (8, 16):
        x = keras.layers.Conv2D(filters, 3, padding="same", activation="relu")(x)
        x = keras.layers.BatchNormalization(momentum=0.9)(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    outputs = keras.layers.Dense(3, activation="softmax")(x)
    return keras.Model(inputs, outputs)


def test_training_steps_match_keras_and_files_stay_plain(tmp_path):
    # No max-pooling: its ties make a network's gradients jump with 1e-6 input changes,
    # whichever BatchNormalization runs.
    rng = np.random.default_rng(0)
    x = rng.random((16, 16, 16, 3), dtype=np.float32)
    y = np.eye(3, dtype=np.float32)[rng.integers(0, 3, 16)]
    models = [_small_model(0), _small_model(0)]
    assert use_fused_batch_norm(models[1]) == 2
    assert use_fused_batch_norm(models[1]) == 0  # already switched
    for model in models:
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="categorical_crossentropy")
        for _ in range(3):
            model.train_on_batch(x, y)
    # Float32 sums in another order: a relative bound per element, and an absolute floor
    # for weights still near zero (the betas, ~1e-3 after 3 steps, differ by ~5e-7 on an
    # AVX2 CPU: 7e-4 of their size, which a bound on the relative error alone refused).
    for keras_w, fused_w in zip(models[0].get_weights(), models[1].get_weights(), strict=True):
        np.testing.assert_allclose(fused_w, keras_w, rtol=1e-4, atol=1e-5)
    # The saved model holds built-in layers only: it loads in safe mode without petal.
    path = tmp_path / "fused.keras"
    models[1].save(path)
    loaded = keras.saving.load_model(path, safe_mode=True)
    assert [type(layer) for layer in loaded.layers] == [type(layer) for layer in models[0].layers]
    np.testing.assert_allclose(loaded.predict(x, verbose=0), models[1].predict(x, verbose=0))


def test_nested_backbone_layers_are_switched():
    inner = _small_model(1)
    outer = keras.Sequential([keras.Input((16, 16, 3)), inner])
    assert use_fused_batch_norm(outer) == 2
    synced = keras.Sequential([keras.Input((4, 4, 2)), keras.layers.BatchNormalization(synchronized=True)])
    assert use_fused_batch_norm(synced) == 0  # cross-replica statistics: Keras' own call
