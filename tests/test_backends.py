"""petal's models and schedules on Keras' JAX backend (no TensorFlow in the process), and on
its PyTorch backend where PyTorch is installed.

``petal.models`` and ``petal.training.schedules`` use Keras 3 APIs only, so a model trained by
``petal train`` (TensorFlow) can be rebuilt, fine-tuned or served with JAX, the recommended TPU
path today. Keras fixes its backend at import, so each check runs in a fresh interpreter.
JAX compiles every new shape, building too: a one-fire-module squeezenet is checked here;
every model, the codelab's squeezenet, the keras.applications backbones and the inception
example among them (two minutes more), with ``-m slow``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest

from petal.models import create_model, list_models, model_info

# The models CI trains a step of, with their options: squeezenet cut to one fire module (its
# BatchNorm and all), whose JAX train step compiles in half the time of the codelab's eight
# (19 s against 42 s, with dense 11 s more, on a 2-core Zen 3). The codelab's squeezenet is
# built below; it, dense and the rest train with -m slow.
SMALL = {"squeezenet": {"fires": [[8, 16]]}}

pytest.importorskip("jax")

# argv: "-", then a JSON object of the models to build at a tiny size and take a training step
# with, each with its options; then, given a .keras file saved by the TensorFlow backend and
# images: a per-step schedule drives an optimizer, and the file loads in safe mode and predicts.
SCRIPT = r"""
import json, sys
import numpy as np
import keras
from petal.models import create_model, model_info
from petal.training.schedules import build_schedule

out = {"backend": keras.backend.backend(), "models": {}}
rng = np.random.default_rng(0)
for name, options in json.loads(sys.argv[2]).items():
    size = max(model_info(name).min_image_size, 32)
    model = create_model(name, num_classes=3, image_size=size, **options)
    model.compile(keras.optimizers.SGD(0.01), "categorical_crossentropy")
    x = rng.uniform(0, 1, (2, size, size, 3)).astype("float32")
    y = np.eye(3, dtype="float32")[[0, 2]]
    before = [np.array(w) for w in model.trainable_weights[-2:]]
    loss = float(model.train_on_batch(x, y))
    moved = any(not np.allclose(b, np.array(w))
                for b, w in zip(before, model.trainable_weights[-2:]))
    out["models"][name] = {"loss": loss, "moved": moved, "params": model.count_params()}
out["tensorflow_imported"] = "tensorflow" in sys.modules
if len(sys.argv) == 3:
    print("RESULT " + json.dumps(out))
    sys.exit()
out["squeezenet_192_params"] = create_model("squeezenet", num_classes=5,
                                            image_size=192).count_params()

schedule = build_schedule("codelab_ramp", steps_per_epoch=2, replicas=8, interpolate=True)
model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, activation="softmax")])
optimizer = keras.optimizers.Adam(learning_rate=schedule)
model.compile(optimizer, "categorical_crossentropy")
model.fit(np.ones((12, 3), "float32"), np.eye(2, dtype="float32")[[0, 1] * 6],
          batch_size=4, epochs=1, verbose=0)
out["schedule"] = [int(optimizer.iterations), float(optimizer.learning_rate)]

saved = keras.saving.load_model(sys.argv[3], safe_mode=True)
out["probabilities"] = np.asarray(saved.predict(np.load(sys.argv[4]), verbose=0)).tolist()
out["tensorflow_imported"] = "tensorflow" in sys.modules
print("RESULT " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def jax_run(tmp_path_factory):
    """The script's results under KERAS_BACKEND=jax, with a squeezenet saved here (TF)."""
    return _run_with_a_saved_model(tmp_path_factory.mktemp("jax"), "jax")


def _run_with_a_saved_model(folder, backend: str) -> tuple[dict, np.ndarray]:
    """The script's results on ``backend`` given a squeezenet saved here by TensorFlow, and
    that model's probabilities here."""
    model = create_model("squeezenet", num_classes=5, image_size=48)
    images = np.random.default_rng(1).uniform(0, 1, (3, 48, 48, 3)).astype("float32")
    model.save(folder / "model.keras")
    np.save(folder / "images.npy", images)
    expected = model.predict(images, verbose=0)
    files = [str(folder / "model.keras"), str(folder / "images.npy")]
    return _run_on_backend(SMALL, *files, backend=backend), expected


def _run_on_backend(models, *files, backend: str = "jax") -> dict:
    env = {**os.environ, "KERAS_BACKEND": backend, "JAX_PLATFORMS": "cpu"}
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, "-", json.dumps(models), *files],
        capture_output=True, text=True, env=env, timeout=900,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    line = [ln for ln in result.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


def _assert_trained_like_tensorflow(out: dict, models, backend: str = "jax") -> None:
    assert out["backend"] == backend
    assert not out["tensorflow_imported"]
    assert sorted(out["models"]) == sorted(models)
    for name, row in out["models"].items():
        assert np.isfinite(row["loss"]), name
        assert row["moved"], name
        # The same architecture as on TensorFlow: the same weights.
        size = max(model_info(name).min_image_size, 32)
        model = create_model(name, num_classes=3, image_size=size, **models[name])
        assert row["params"] == model.count_params(), name
        keras.utils.clear_session()


def test_petals_models_train_a_step_on_jax_without_tensorflow(jax_run):
    out, _ = jax_run
    _assert_trained_like_tensorflow(out, SMALL)
    # The codelab's squeezenet, built by JAX: its parameter count.
    assert out["squeezenet_192_params"] == 120_613


@pytest.mark.slow
def test_every_model_trains_a_step_on_jax():
    others = {name: {} for name in list_models()}  # squeezenet with its eight fire modules
    _assert_trained_like_tensorflow(_run_on_backend(others), others)


def test_per_step_schedule_drives_a_jax_optimizer(jax_run):
    out, _ = jax_run
    steps, lr = out["schedule"]
    assert steps == 3
    # 1.5 epochs in: halfway between the epoch-1 and epoch-2 codelab rates, as on TensorFlow.
    assert lr == pytest.approx((8.8e-5 + 1.66e-4) / 2, rel=1e-5)


def test_a_model_saved_by_petal_on_tensorflow_predicts_the_same_on_jax(jax_run):
    out, expected = jax_run
    np.testing.assert_allclose(np.array(out["probabilities"]), expected, atol=1e-5)


def test_petals_models_schedule_and_saved_model_on_torch(tmp_path):
    """The same checks on Keras' PyTorch backend, where PyTorch is installed (not in CI's
    dev extras: its CPU wheel alone is larger than everything else petal installs)."""
    pytest.importorskip("torch")
    out, expected = _run_with_a_saved_model(tmp_path, "torch")
    _assert_trained_like_tensorflow(out, SMALL, backend="torch")
    assert out["squeezenet_192_params"] == 120_613
    assert out["schedule"][0] == 3
    assert out["schedule"][1] == pytest.approx((8.8e-5 + 1.66e-4) / 2, rel=1e-5)
    np.testing.assert_allclose(np.array(out["probabilities"]), expected, atol=1e-5)
