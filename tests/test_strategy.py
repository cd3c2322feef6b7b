"""Strategy and precision selection; a 2-replica MirroredStrategy trains like one replica."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import keras
import pytest

from petal.errors import PetalError
from petal.training.precision import cpu_flags, cpu_prefers_bfloat16, resolve_precision, set_policy
from petal.training.strategy import STRATEGIES, check_global_batch, describe, get_strategy

REPO = Path(__file__).resolve().parents[1]


def test_auto_on_cpu():
    import tensorflow as tf

    if tf.config.list_physical_devices("GPU"):
        pytest.skip("this host has a GPU; auto picks MirroredStrategy there")
    strategy, info = get_strategy("auto")
    assert info["name"] == "default" and info["replicas"] == 1 == strategy.num_replicas_in_sync
    assert info["tpu"] is False and info["gpu"] is False
    assert info["devices"] and "CPU" in info["devices"][0]
    line = describe(info, "float32", 32)
    assert "replicas=1" in line and "devices=CPU:0" in line and "global_batch=32" in line


def test_named_strategies_and_errors(monkeypatch):
    _, info = get_strategy("cpu")
    assert info["replicas"] == 1 and info["name"] == "cpu"
    with pytest.raises(PetalError, match="Unknown strategy 'gpu'.*mirrored.*one-device"):
        get_strategy("gpu")
    assert set(STRATEGIES) >= {
        "auto",
        "tpu",
        "mirrored",
        "multi-worker",
        "one-device",
        "cpu",
        "default",
    }
    with pytest.raises(PetalError, match="No TPU found"):
        get_strategy("tpu")
    monkeypatch.delenv("TF_CONFIG", raising=False)
    with pytest.raises(PetalError, match="TF_CONFIG"):
        get_strategy("multi-worker")


@pytest.mark.parametrize(
    "tf_config, match",
    [
        ("{", r"^TF_CONFIG is not valid JSON: "),
        # A JSON list trained as one worker without a word.
        ("[1, 2]", r'^TF_CONFIG must be a JSON object with "cluster" \(task type -> addresses\) '
                   r'and "task" .* Received: TF_CONFIG=\'\[1, 2\]\'$'),
        # TensorFlow's ValueError traceback, exit 1.
        ('{"cluster": {"worker": ["localhost:12345"]}, "task": {"type": "chief", "index": 0}}',
         r"^TF_CONFIG's task \('chief', index 0\) is not in its cluster \(worker: 1\): name a "
         r"task type of the cluster and an index below its count\. Received: "),
        ('{"cluster": {"worker": ["localhost:12345"]}, "task": {"type": "worker", "index": 1}}',
         r"task \('worker', index 1\) is not in its cluster"),
    ],
)
def test_a_tf_config_that_names_no_task_of_its_cluster_is_one_line(monkeypatch, tf_config,
                                                                   match):
    monkeypatch.setenv("TF_CONFIG", tf_config)
    with pytest.raises(PetalError, match=match):
        get_strategy("multi-worker")


def test_check_global_batch():
    assert check_global_batch(128, 8) == 16
    assert check_global_batch(32, 1) == 32
    with pytest.raises(PetalError, match="nearest valid sizes: 24 or 32 .*batch_size=30"):
        check_global_batch(30, 8)
    with pytest.raises(PetalError, match="nearest valid sizes: 8 .*batch_size=5"):
        check_global_batch(5, 8)
    with pytest.raises(PetalError, match="batch_size=0"):
        check_global_batch(0, 1)


def test_train_names_the_batch_setting_that_does_not_divide(small_records, tmp_path,
                                                            monkeypatch):
    # The evaluation batch (global) is checked too, under its own name.
    from conftest import tiny_config
    from petal.training import loop, strategy

    monkeypatch.setattr(strategy, "get_strategy", lambda name: (None, {"replicas": 2}))
    cfg = tiny_config(small_records, batch_size=8, eval_batch_size=15)
    with pytest.raises(PetalError, match=r"Global batch size 15 does not divide across 2 "
                       r"replicas; nearest valid sizes: 14 or 16 \(multiples of 2\). "
                       r"Received: eval_batch_size=15"):
        loop.train(cfg, tmp_path / "run", log=lambda line: None)


def test_resolve_precision_per_platform(monkeypatch):
    assert resolve_precision("auto", {"tpu": True}) == "mixed_bfloat16"
    assert (
        resolve_precision("auto", {"gpu": True, "gpu_compute_capability": (8, 6)})
        == "mixed_bfloat16"
    )
    assert (
        resolve_precision("auto", {"gpu": True, "gpu_compute_capability": (7, 0)})
        == "mixed_float16"
    )
    assert resolve_precision("auto", {"gpu": True, "gpu_compute_capability": (6, 1)}) == "float32"
    assert resolve_precision("float32", {"tpu": True}) == "float32"
    with pytest.raises(PetalError, match="Unknown precision 'fp8'"):
        resolve_precision("fp8", None)
    # CPU: follows the flags (and the measured rule for avx512_bf16 without AMX).
    monkeypatch.setattr("petal.training.precision.cpu_flags", lambda: {"avx2", "amx_bf16"})
    assert resolve_precision("auto", {"tpu": False, "gpu": False}) == "mixed_bfloat16"
    assert resolve_precision("auto", None, "squeezenet") == "mixed_bfloat16"
    # ...except models measured slower in bfloat16 on a CPU; accelerators keep bfloat16.
    assert resolve_precision("auto", None, "mobilenet_v2") == "float32"
    assert resolve_precision("auto", {"tpu": True}, "mobilenet_v2") == "mixed_bfloat16"
    assert resolve_precision("mixed_bfloat16", None, "mobilenet_v2") == "mixed_bfloat16"
    monkeypatch.setattr("petal.training.precision.cpu_flags", lambda: {"avx2", "fma"})
    assert resolve_precision("auto", None) == "float32"


def test_a_mixed_precision_slower_than_float32_on_this_cpu_is_said():
    """Named on a CPU without bfloat16 instructions it trained about 5x slower, silently."""
    from petal.training.precision import slow_precision_warning

    cpu = {"tpu": False, "gpu": False}
    plain, bf16 = {"avx2", "fma"}, {"avx2", "amx_bf16"}
    said = slow_precision_warning("mixed_bfloat16", cpu, plain)
    assert said.startswith("precision mixed_bfloat16 trains slower than float32 on a CPU (this "
                           "CPU lacks the bfloat16 instructions (amx_bf16, avx512_bf16)")
    assert said.endswith(": use --precision auto or float32 unless you are checking numerics")
    assert "no fast float16 kernels; squeezenet trained 61x slower on this project's CPU): " \
        "use" in slow_precision_warning("mixed_float16", cpu, bf16)
    assert "several times slower for squeezenet on this project's CPU): use" in said
    assert slow_precision_warning("mixed_bfloat16", cpu, bf16) is None  # auto's pick there
    for name in ("auto", "float32"):
        assert slow_precision_warning(name, cpu, plain) is None
    assert slow_precision_warning("mixed_float16", {"gpu": True}, plain) is None
    assert slow_precision_warning("mixed_bfloat16", {"tpu": True}, plain) is None


def test_cpu_flags_parsing(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16\n\nprocessor\t: 1\n")
    assert cpu_flags(info) == {"fpu", "avx2", "avx512f", "avx512_bf16"}
    assert cpu_flags(tmp_path / "missing") == set()
    assert cpu_prefers_bfloat16({"amx_bf16"}) is True
    assert cpu_prefers_bfloat16({"avx2"}) is False


def test_mixed_float16_gets_loss_scaling():
    try:
        assert set_policy("mixed_float16") == "mixed_float16"
        model = keras.Sequential(
            [keras.Input((4,)), keras.layers.Dense(2, activation="softmax", dtype="float32")]
        )
        model.compile("adam", "categorical_crossentropy")
        # Keras 3 wraps the optimizer itself when the model's policy is mixed_float16.
        assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    with pytest.raises(PetalError, match="resolved policy"):
        set_policy("auto")


# Runs in a fresh interpreter: logical CPU devices must be configured before TF initialises.
_MIRRORED_SCRIPT = textwrap.dedent(
    """
    import json
    import numpy as np
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration(), tf.config.LogicalDeviceConfiguration()]
    )
    import keras
    from petal.training.strategy import check_global_batch, get_strategy

    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 8)).astype("float32")
    y = np.eye(3, dtype="float32")[rng.integers(0, 3, 64)]
    keras.utils.set_random_seed(0)
    initial = keras.Sequential(
        [keras.Input((8,)), keras.layers.Dense(16, activation="tanh"), keras.layers.Dense(3, activation="softmax")]
    ).get_weights()

    def train(strategy):
        with strategy.scope():
            model = keras.Sequential(
                [keras.Input((8,)), keras.layers.Dense(16, activation="tanh"),
                 keras.layers.Dense(3, activation="softmax")]
            )
            model.set_weights(initial)
            model.compile(keras.optimizers.SGD(0.5), "categorical_crossentropy")
        check_global_batch(16, strategy.num_replicas_in_sync)
        data = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)  # global batch 16
        history = model.fit(data, epochs=3, verbose=0, shuffle=False)
        return model.get_weights(), history.history["loss"]

    mirrored, info = get_strategy("mirrored")
    one, _ = get_strategy("cpu")
    w2, loss2 = train(mirrored)
    w1, loss1 = train(one)
    print(json.dumps({
        "replicas": info["replicas"],
        "max_weight_diff": max(float(np.max(np.abs(a - b))) for a, b in zip(w1, w2)),
        "max_change": max(float(np.max(np.abs(a - b))) for a, b in zip(w1, initial)),
        "loss1": loss1, "loss2": loss2,
    }))
    """
)


def _run_script(tmp_path, text: str, *args: str) -> dict:
    """Runs ``text`` as a script in a fresh process (its own logical devices, this
    repository's petal) and returns the JSON object its last line prints."""
    script = tmp_path / "script.py"
    script.write_text(text)
    env = dict(
        os.environ, TF_CPP_MIN_LOG_LEVEL="3", KERAS_BACKEND="tensorflow", CUDA_VISIBLE_DEVICES=""
    )
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, str(script), *args], capture_output=True, text=True, env=env, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # 9-10 s in CI on a Zen 3 host (session 39: 775 s): `pytest -m slow` runs it
def test_two_replica_mirrored_trains_like_one_replica(tmp_path):
    result = _run_script(tmp_path, _MIRRORED_SCRIPT)
    assert result["replicas"] == 2
    assert result["max_change"] > 1e-2  # it did train
    assert result["max_weight_diff"] < 1e-5
    assert result["loss1"] == pytest.approx(result["loss2"], rel=1e-5)


_BN_SCRIPT = textwrap.dedent(
    """
    import csv, json, sys
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    import keras
    sys.path.insert(0, sys.argv[3])
    from conftest import tiny_config
    from petal.data.pipeline import eval_dataset
    from petal.training.loop import train

    workdir = sys.argv[2]
    cfg = tiny_config(sys.argv[1], strategy="mirrored", epochs=1, steps_per_epoch=4)
    metrics = train(cfg, workdir, log=lambda line: None)
    (last,) = list(csv.DictReader(open(workdir + "/history.csv")))
    model = keras.models.load_model(workdir + "/model.keras", compile=False)
    ds = eval_dataset(sys.argv[1], batch_size=10, image_size=32)
    losses = [keras.losses.categorical_crossentropy(y, model(x, training=False)) for x, y in ds]
    print(json.dumps({
        "replicas": metrics["replicas"],
        "recorded": float(last["val_loss"]),
        "saved": float(tf.reduce_mean(tf.concat(losses, 0))),
        "eval_batch": json.load(open(workdir + "/config.json"))["resolved"]["eval_batch"],
    }))
    """
)


@pytest.mark.slow  # 7-52 s in the full suite (session 27): `pytest -m slow` runs it
def test_two_replicas_validate_with_the_batch_norm_statistics_they_save(small_records, tmp_path):
    """Keras 3 lets each replica keep its own BatchNormalization statistics: validation
    during training used them, the saved model the first replica's, and the two scores
    differed. The replicas' mean is used and saved."""
    args = [str(small_records), str(tmp_path / "run"), str(REPO / "tests")]
    result = _run_script(tmp_path, _BN_SCRIPT, *args)
    assert result["replicas"] == 2
    # 10 validation images, fewer than the global batch of 20: a replica got none, and
    # Keras stopped ("Inputs to operation AddN ... must have the same size and shape"), which
    # petal named a corrupt input. Batches of 10 (5 per replica) instead.
    assert result["eval_batch"] == 10
    assert result["recorded"] == pytest.approx(result["saved"], rel=1e-5), result


_OVERFLOW_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    import keras
    from petal.training.precision import agree_on_overflow

    keras.mixed_precision.set_global_policy("mixed_float16")
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
        model.compile(keras.optimizers.SGD(0.1), "mse")
        if sys.argv[1] == "agree":
            agree_on_overflow(model.optimizer, strategy.num_replicas_in_sync)
    # The second replica's half of the batch overflows float16 once the loss is scaled.
    x = np.ones((4, 4), np.float32)
    x[2:] = 6e4
    y = np.zeros((4, 2), np.float32)
    model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(4), epochs=1, verbose=0)
    print(json.dumps({
        "finite": bool(all(np.isfinite(w).all() for w in model.get_weights())),
        "scale": float(model.optimizer.dynamic_scale.numpy()),
    }))
    """
)


@pytest.mark.parametrize("mode", ["agree", pytest.param("keras", marks=pytest.mark.slow)])
def test_float16_loss_scaling_skips_a_step_any_replica_overflowed(tmp_path, mode):
    """Keras 3 looked at the first replica's gradients alone and applied the others' inf:
    mixed_float16 on two GPUs turned every weight NaN in the first epoch. With petal's
    check (``agree``) the step is skipped and the scale halved, as on one device."""
    result = _run_script(tmp_path, _OVERFLOW_SCRIPT, mode)
    if mode == "agree":
        assert result == {"finite": True, "scale": 32768.0 / 2}
    else:  # The data does overflow: Keras 3.15 applied it (NaN weights), a fixed one skips
        assert result["finite"] is False or result["scale"] == 32768.0 / 2


def _one_worker_tf_config() -> str:
    """TF_CONFIG of a one-worker cluster on a free localhost port."""
    import socket

    with socket.socket() as sock:
        sock.bind(("localhost", 0))
        port = sock.getsockname()[1]
    cluster = {"cluster": {"worker": [f"localhost:{port}"]}, "task": {"type": "worker", "index": 0}}
    return json.dumps(cluster)


@pytest.mark.slow  # 10-12 s in CI on a Zen 3 host (session 39: 775 s): `pytest -m slow` runs it
def test_multi_worker_trains(small_records, tmp_path):
    """get_strategy listed the logical GPUs first, which starts TensorFlow's runtime, and
    MultiWorkerMirroredStrategy can only configure its collective ops before that: every
    `--strategy multi-worker` ended in "RuntimeError: Collective ops must be configured at
    program startup"."""
    env = dict(os.environ, TF_CONFIG=_one_worker_tf_config(), CUDA_VISIBLE_DEVICES="")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), env.get("PYTHONPATH", "")])
    argv = ["--data", str(small_records), "--workdir", str(tmp_path / "run"), "--model", "dense",
            "--epochs", "1", "--image-size", "32", "--strategy", "multi-worker",
            "--set", "steps_per_epoch=1", "--set", "tensorboard=false"]
    proc = subprocess.run([sys.executable, "-m", "petal", "train", *argv], capture_output=True,
                          text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "strategy=multi-worker replicas=1" in proc.stdout + proc.stderr
    assert (tmp_path / "run" / "model.keras").is_file()


def test_train_refuses_a_cluster_of_several_workers_in_one_line(small_records, tmp_path,
                                                                monkeypatch, capsys):
    """Keras 3's fit fails on input distributed over several workers: each worker printed a
    traceback of 230 lines holding the batch's pixels (keras-team/keras#20585)."""
    from petal.cli import main

    cluster = {"cluster": {"chief": ["localhost:1"], "worker": ["localhost:2", "localhost:3"]},
               "task": {"type": "worker", "index": 0}}  # fmt: skip
    monkeypatch.setenv("TF_CONFIG", json.dumps(cluster))
    argv = ["train", "--data", str(small_records), "--workdir", str(tmp_path / "run"),
            "--model", "dense", "--epochs", "1", "--image-size", "32",
            "--strategy", "multi-worker"]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (
        "petal train: error: petal train cannot train on a cluster of 3 workers: Keras 3's fit "
        "fails on input distributed over several workers (keras-team/keras#20585). Train on "
        "one host (--strategy auto: its TPU or GPUs), or give TF_CONFIG a cluster of one "
        "worker. Received: strategy='multi-worker', 3 workers in TF_CONFIG"), err
    assert not (tmp_path / "run").exists()


@pytest.mark.slow  # 24 s in a loaded suite run (session 40): `pytest -m slow` runs it
def test_multi_worker_after_the_runtime_started_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("TF_CONFIG", _one_worker_tf_config())
    script = textwrap.dedent(
        """
        import json
        import tensorflow as tf
        from petal.errors import PetalError
        from petal.training.strategy import get_strategy

        tf.constant(1.0)  # starts the runtime
        try:
            get_strategy("multi-worker")
        except PetalError as err:
            print(json.dumps({"error": str(err)}))
        """
    )
    error = _run_script(tmp_path, script)["error"]
    assert error.startswith("strategy 'multi-worker' must be created before TensorFlow's runtime")
    assert "\n" not in error


_JAX_SCRIPT = textwrap.dedent(
    """
    import json
    import os

    os.environ["KERAS_BACKEND"] = "jax"  # before keras is imported
    from pathlib import Path

    import keras
    from petal.errors import PetalError
    from petal.evaluation.workdir import RunInfo, load_model
    from petal.models import create_model
    from petal.training.config import TrainConfig
    from petal.training.loop import train

    out = {"backend": keras.backend.backend()}
    out["params"] = create_model("dense", 5, 32).count_params()  # building still works
    try:
        train(TrainConfig(), "run")
    except PetalError as err:
        out["train"] = str(err)
    run = RunInfo(Path("run"), {}, ("a", "b"), (32, 32), "unit", "fill", None)
    try:
        load_model(run)  # what evaluate, predict and export load the model with
    except PetalError as err:
        out["load"] = str(err)
    print(json.dumps(out))
    """
)


@pytest.mark.slow  # 9-11 s in CI on a Zen 3 host (session 39: 775 s): `pytest -m slow` runs it
def test_training_and_loading_a_run_refuse_another_keras_backend(tmp_path):
    # On JAX, train() trained without a word (slower, no fused BN) and evaluate, predict and
    # export crashed with JAX tracebacks on TensorFlow tensors.
    pytest.importorskip("jax")
    result = _run_script(tmp_path, _JAX_SCRIPT)
    assert result["backend"] == "jax" and result["params"] > 0
    fix = (
        "needs Keras' TensorFlow backend, but Keras runs on 'jax' here (from "
        "KERAS_BACKEND=jax): set KERAS_BACKEND=tensorflow before Python imports keras"
    )
    assert result["train"].startswith(f"petal train {fix}")
    loading = "Loading a run's model (petal evaluate, predict, export)"
    assert result["load"].startswith(f"{loading} {fix}")


def test_another_backend_from_keras_json_names_the_file(monkeypatch):
    import re

    from keras.src.backend import config

    from petal.training.strategy import check_tensorflow_backend

    check_tensorflow_backend("petal train")  # the tests' backend
    monkeypatch.delenv("KERAS_BACKEND", raising=False)
    monkeypatch.setattr(keras.backend, "backend", lambda: "torch")
    keras_json = re.escape(os.path.join(config.keras_home(), "keras.json"))
    with pytest.raises(PetalError, match=(
        rf"^petal train needs Keras' TensorFlow backend, but Keras runs on 'torch' here \(from "
        rf"the \"backend\" of {keras_json}\): set KERAS_BACKEND=tensorflow before"
    )):  # fmt: skip
        check_tensorflow_backend("petal train")


@pytest.mark.parametrize("name", ["auto", "tpu"])
def test_a_tpu_name_that_cannot_be_reached_says_so(monkeypatch, name):
    # TPU_NAME=foo off Google Cloud: "petal train: error: <urlopen error [Errno -2] Name or
    # service not known>" from the resolver's metadata lookup.
    import socket
    import urllib.error

    import tensorflow as tf

    def unreachable(*args, **kwargs):
        raise urllib.error.URLError(socket.gaierror(-2, "Name or service not known"))

    monkeypatch.setenv("TPU_NAME", "foo")
    monkeypatch.setattr(tf.distribute.cluster_resolver, "TPUClusterResolver", unreachable)
    with pytest.raises(PetalError, match=(
        r"^Cannot reach the TPU named by TPU_NAME='foo' \(\[Errno -2\] Name or service not "
        r"known\): unset TPU_NAME \(or name a reachable TPU\), or pass --strategy cpu or "
        rf"--strategy default to train without a TPU\. Received: strategy='{name}'$"
    )):  # fmt: skip
        get_strategy(name)


_UNEVEN_VALIDATION_SCRIPT = textwrap.dedent(
    """
    import csv, json, sys
    import tensorflow as tf

    replicas, batch = int(sys.argv[4]), int(sys.argv[5])
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * replicas
    )
    import keras
    sys.path.insert(0, sys.argv[3])
    from conftest import tiny_config
    from petal.data.pipeline import eval_dataset
    from petal.training.loop import train

    workdir = sys.argv[2]
    # One fire module: BatchNormalization all the same, in half the time.
    cfg = tiny_config(
        sys.argv[1], strategy="mirrored", epochs=1, steps_per_epoch=1, batch_size=batch,
        model_options={"fires": [[8, 16]]},
    )
    lines = []
    metrics = train(cfg, workdir, log=lines.append)
    (last,) = list(csv.DictReader(open(workdir + "/history.csv")))
    model = keras.models.load_model(workdir + "/model.keras", compile=False)
    losses, hits, count = [], 0, 0
    for x, y in eval_dataset(sys.argv[1], batch_size=7, image_size=32):
        p = model(x, training=False)
        losses.append(keras.losses.categorical_crossentropy(y, p))
        hits += int(tf.reduce_sum(tf.cast(tf.argmax(p, -1) == tf.argmax(y, -1), tf.int32)))
        count += int(x.shape[0])
    print(json.dumps({
        "replicas": metrics["replicas"],
        "recorded_loss": float(last["val_loss"]),
        "recorded_accuracy": float(last["val_accuracy"]),
        "saved_loss": float(tf.reduce_mean(tf.concat(losses, 0))),
        "saved_accuracy": hits / count,
        "count": count,
        "eval_batch": json.load(open(workdir + "/config.json"))["resolved"]["eval_batch"],
        "heads": [line.split(":")[1].split()[0] for line in lines[:3]],
    }))
    """
)


@pytest.mark.slow  # 12 s in CI; test_pipeline's two logical CPUs check the sharding there
def test_replicas_validate_a_split_that_does_not_divide_evenly(make_records, tmp_path):
    """21 validation images on 2 replicas in batches of 5: batches dealt in turn from one
    pipeline ([5, 5, 1] and [5, 5]), or shares of whole shards (15 and 6), left a replica an
    empty last batch, on which BatchNormalization failed ("Incompatible shapes: [32] vs.
    [0,32,32,3]"), blamed on the records. Each replica reads every other image, in batches
    of 4: [4, 4, 3] and [4, 4, 2], every image once."""
    shards = [15, 6]
    records = make_records(counts={"train": [20], "validation": shards}, size=(32, 32))
    args = [str(records), str(tmp_path / "run"), str(REPO / "tests"), "2", "5"]
    result = _run_script(tmp_path, _UNEVEN_VALIDATION_SCRIPT, *args)
    assert result["replicas"] == 2
    assert result["eval_batch"] == 8
    assert result["count"] == sum(shards)
    assert result["recorded_accuracy"] == pytest.approx(result["saved_accuracy"], abs=1e-6)
    assert result["recorded_loss"] == pytest.approx(result["saved_loss"], rel=1e-5), result
    # The batch's note came before the run's header and strategy lines, which it follows.
    assert result["heads"] == ["squeezenet", "strategy=mirrored", "validation"], result


def test_the_validation_batch_gives_every_replica_as_many_batches():
    from petal.training.loop import _replicated_eval_batch

    lines = []
    # Per-replica pipelines (MirroredStrategy): shares of 11 and 10 in batches of 4, not
    # 5 ([5, 5, 1] and [5, 5]); 21 in one pipeline dealt to 2 replicas: 6 batches of 4.
    assert _replicated_eval_batch(10, 21, 2, lines.append, pipelines=2) == 8
    assert _replicated_eval_batch(10, 21, 2, lines.append, pipelines=1) == 8
    assert lines[0].startswith("petal train: validation in batches of 8 (4 per replica), not 10")
    assert _replicated_eval_batch(32, 21, 2, lines.append, pipelines=2) == 18  # [9, 2], [9, 1]
    assert _replicated_eval_batch(64, 10, 2, lines.append, pipelines=2) == 10  # [5], [5]
    assert _replicated_eval_batch(64, 1000, 2, lines.append, pipelines=2) == 64
    assert _replicated_eval_batch(64, 21, 1, lines.append) == 64
    with pytest.raises(PetalError, match="validation split's 5 images cannot be batched"):
        _replicated_eval_batch(4, 5, 2, lines.append, pipelines=2)  # [2, 1] and [2]
    # None fits up to the batch asked for: the smallest above it that does (25 images on
    # two replicas were refused at 6 and 4, though 14 fits: 4 batches of 7 in turn).
    assert _replicated_eval_batch(6, 25, 2, lines.append, pipelines=1) == 14
    assert _replicated_eval_batch(4, 21, 2, lines.append, pipelines=1) == 8  # [6 of 4]


def test_validation_pipelines_share_by_record_whatever_the_shards(make_records):
    """Shares of whole shards (15 and 6 images) left one replica batches after the other's
    ran out; every other record gives 11 and 10."""
    import tensorflow as tf

    from petal.data.pipeline import eval_dataset

    records = make_records(counts={"train": [4], "validation": [15, 6]})
    shares = [
        sum(
            int(x.shape[0])
            for x, _ in eval_dataset(
                str(records), batch_size=8, input_context=tf.distribute.InputContext(2, i, 2)
            )
        )
        for i in range(2)
    ]
    assert shares == [11, 10]


# Two logical CPU devices, then petal's train (argv: records, run folder, tests folder).
_ON_TWO_CPUS = textwrap.dedent(
    """
    import json, sys
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    sys.path.insert(0, sys.argv[3])
    from conftest import tiny_config
    from petal.training.loop import train
    """
)

_STEPS_PER_EXECUTION_SCRIPT = _ON_TWO_CPUS + textwrap.dedent(
    """

    cfg = tiny_config(
        sys.argv[1], strategy="mirrored", model="dense", epochs=1, steps_per_epoch=2,
        steps_per_execution=2,
    )
    lines = []
    metrics = train(cfg, sys.argv[2], log=lines.append)
    config = json.load(open(sys.argv[2] + "/config.json"))
    print(json.dumps({
        "replicas": metrics["replicas"],
        "epochs": metrics["epochs_completed"],
        "steps_per_execution": config["resolved"]["steps_per_execution"],
        "lines": [line for line in lines if "steps_per_execution" in line],
    }))
    """
)


@pytest.mark.slow  # 7-23 s in full suites (session 34): `pytest -m slow` runs it
def test_several_replicas_run_one_step_per_execution(make_records, tmp_path):
    """Keras' loop of several steps per execution fails under MirroredStrategy ("You must
    feed a value for placeholder tensor ... multi_step_on_iterator"), which petal blamed on
    the records: squeezenet-plus (3) failed on every multi-device machine. 1, and said."""
    records = make_records(counts={"train": [20], "validation": [10]}, size=(32, 32))
    args = [str(records), str(tmp_path / "run"), str(REPO / "tests")]
    result = _run_script(tmp_path, _STEPS_PER_EXECUTION_SCRIPT, *args)
    assert result["replicas"] == 2
    assert result["epochs"] == 1
    assert result["steps_per_execution"] == 1
    assert result["lines"] == [
        "petal train: steps_per_execution 2 -> 1: Keras' loop of several steps per execution "
        'fails on 2 replicas ("You must feed a value for placeholder tensor")'
    ]


_SKIPPED_VALIDATION_SCRIPT = _ON_TWO_CPUS + textwrap.dedent(
    """

    cfg = tiny_config(
        sys.argv[1], strategy="mirrored", model="dense", epochs=1, steps_per_epoch=1,
        skip_corrupt=True,
    )
    metrics = train(cfg, sys.argv[2], log=lambda line: None)
    config = json.load(open(sys.argv[2] + "/config.json"))
    print(json.dumps({
        "replicas": metrics["replicas"],
        "skipped": metrics["skipped_corrupt_records"],
        "val_count": metrics["val_count"],
        "eval_batch": config["resolved"]["eval_batch"],
    }))
    """
)


@pytest.mark.slow  # 7-23 s in full suites (session 34): `pytest -m slow` runs it
def test_several_replicas_validate_with_corrupt_records_skipped(make_records, tmp_path):
    """A CRC failure at record 7 of 10 leaves 7 to validate; the batches were sized for 10
    (5 per replica: [4] and [3]) and Keras stopped ("Inputs to operation AddN ... must have
    the same size and shape"), blamed on the records. Sized for the 7 read: [2, 2], [2, 1]."""
    from conftest import corrupt_record

    records = make_records(counts={"train": [20], "validation": [10]}, size=(32, 32))
    corrupt_record(next(records.glob("validation-*")), 7)
    args = [str(records), str(tmp_path / "run"), str(REPO / "tests")]
    result = _run_script(tmp_path, _SKIPPED_VALIDATION_SCRIPT, *args)
    assert result == {"replicas": 2, "skipped": 3, "val_count": 7, "eval_batch": 4}


def test_a_validation_split_too_small_after_corrupt_records_names_them():
    from petal.training.loop import _replicated_eval_batch

    with pytest.raises(PetalError, match=(
        r"validation split's 3 images cannot be batched .*: 10 more are corrupt and skipped "
        r"\(--skip-corrupt\): restore their shards or convert again, or add images"
    )):
        _replicated_eval_batch(8, 3, 2, print, pipelines=2, skipped=10)
