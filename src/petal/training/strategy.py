"""Pick the distribution strategy in one function: TPU, else all local GPUs, else the default.

``get_strategy("auto")`` follows the codelab's detection but fixes its 2021 bug (``tpu`` is set
to ``None`` before the attempt, so the GPU/CPU fallback cannot hit a NameError) and catches only
the error ``TPUClusterResolver`` raises when there is no TPU: a ``ValueError`` ("Please provide
a TPU Name to connect to.", checked on TensorFlow 2.21). A TPU that is named (``TPU_NAME``)
but cannot be reached (the resolver's ``URLError``) is an error that says so, not a fallback.

This module uses ``tf.distribute`` (TensorFlow backend); the models themselves are Keras-only.
"""

from __future__ import annotations

import json
import os
from typing import Any

import tensorflow as tf

from petal.errors import PetalError, first_line

STRATEGIES = ("auto", "tpu", "mirrored", "multi-worker", "one-device", "cpu", "default")


def check_tensorflow_backend(what: str) -> None:
    """Refuses to go on when Keras runs on another backend than TensorFlow: petal's training,
    evaluation, prediction and export feed ``tf.data`` into Keras and use ``tf.distribute``.
    Building models (:func:`~petal.models.create_model`) works on any backend.

    Args:
        what: what needs TensorFlow, to start the message (``"petal train"``).

    Raises:
        PetalError: ``keras.backend.backend()`` is not ``"tensorflow"``; the message names the
            backend, where it was set (``KERAS_BACKEND`` or ``keras.json``) and the fix.
    """
    import keras
    from keras.src.backend import config

    backend = keras.backend.backend()
    if backend == "tensorflow":
        return
    if os.environ.get("KERAS_BACKEND") == backend:
        where = f"from KERAS_BACKEND={backend}"
    elif "KERAS_BACKEND" not in os.environ:
        where = f"from the \"backend\" of {os.path.join(config.keras_home(), 'keras.json')}"
    else:
        where = "chosen before KERAS_BACKEND changed, or by keras.config.set_backend"
    raise PetalError(
        f"{what} needs Keras' TensorFlow backend, but Keras runs on {backend!r} here "
        f"({where}): set KERAS_BACKEND=tensorflow before Python imports keras (petal's "
        f"models themselves build on any backend). Received: backend={backend!r}"
    )


def _connect_tpu(tpu_address: str | None = None):
    """Connect to a TPU and return its resolver; raises ValueError when there is none."""
    # No argument, as in the codelab: the resolver then reads TPU_NAME / Colab / Kaggle / TPU VM
    # settings from the environment.
    cls = tf.distribute.cluster_resolver.TPUClusterResolver
    resolver = cls(tpu=tpu_address) if tpu_address else cls()
    tf.config.experimental_connect_to_cluster(resolver)
    tf.tpu.experimental.initialize_tpu_system(resolver)
    return resolver


def _unreachable_tpu(name: str, tpu_address: str | None, err: OSError) -> PetalError:
    """The error of a TPU that was named (``tpu_address``, else ``TPU_NAME``) but could not be
    reached, with the cause and how to train without it."""
    reason = first_line(getattr(err, "reason", err))  # URLError's: the socket error
    if tpu_address:
        what, fix = f"the TPU {tpu_address!r}", "pass the address of a reachable TPU"
    elif os.environ.get("TPU_NAME"):
        what = f"the TPU named by TPU_NAME={os.environ['TPU_NAME']!r}"
        fix = "unset TPU_NAME (or name a reachable TPU)"
    else:
        what, fix = "the TPU this environment names", "run on a TPU host"
    return PetalError(
        f"Cannot reach {what} ({reason}): {fix}, or pass --strategy cpu or --strategy default "
        f"to train without a TPU. Received: strategy={name!r}"
    )


def _gpu_compute_capability(gpus) -> tuple[int, int] | None:
    """The lowest compute capability among ``gpus`` (the slowest card sets the precision)."""
    caps = []
    for gpu in gpus:
        details = tf.config.experimental.get_device_details(gpu)
        if "compute_capability" in details:
            caps.append(tuple(details["compute_capability"]))
    return min(caps) if caps else None


def _info(strategy, name: str, *, tpu: bool) -> dict[str, Any]:
    gpus = tf.config.list_physical_devices("GPU")
    try:
        devices = list(strategy.extended.worker_devices)
    except RuntimeError:
        # The default strategy has no device list; it places ops on the first GPU, else the CPU.
        first = tf.config.list_logical_devices("GPU" if gpus else "CPU")[:1]
        devices = [d.name for d in first]
    uses_gpu = any("GPU" in d.upper() for d in devices)
    return {
        "name": name,
        "replicas": int(strategy.num_replicas_in_sync),
        "devices": devices,
        "tpu": tpu,
        "gpu": uses_gpu,
        "gpu_compute_capability": _gpu_compute_capability(gpus) if uses_gpu else None,
    }


def _check_tf_config(text: str) -> None:
    """TF_CONFIG as MultiWorkerMirroredStrategy reads it: a JSON object whose ``cluster``
    maps task types to address lists and whose ``task`` names one of them (``type``,
    ``index``). TensorFlow raised a traceback for a task missing from the cluster, and took
    a JSON list as one worker without a word."""
    received = f"Received: TF_CONFIG={text[:80]!r}"
    try:
        config = json.loads(text)
    except json.JSONDecodeError as err:
        raise PetalError(f"TF_CONFIG is not valid JSON: {err}. {received}") from err
    cluster = config.get("cluster") if isinstance(config, dict) else None
    task = config.get("task") if isinstance(config, dict) else None
    if not (isinstance(cluster, dict) and cluster and isinstance(task, dict)):
        raise PetalError(
            'TF_CONFIG must be a JSON object with "cluster" (task type -> addresses) and '
            f'"task" ({{"type": ..., "index": ...}}) of this worker. {received}'
        )
    kind, index = task.get("type"), task.get("index", 0)
    addresses = cluster.get(kind)
    if not isinstance(addresses, list) or not (
        isinstance(index, int) and 0 <= index < len(addresses)
    ):
        raise PetalError(
            f"TF_CONFIG's task ({kind!r}, index {index!r}) is not in its cluster "
            f"({', '.join(f'{k}: {len(v)}' for k, v in cluster.items() if isinstance(v, list))}"
            f"): name a task type of the cluster and an index below its count. {received}"
        )


def check_fit_cluster() -> None:
    """Refuses a ``TF_CONFIG`` cluster of several workers for Keras' ``fit``: Keras 3 cannot
    take input distributed over them (every step failed, with a traceback printing the
    batch: keras-team/keras#20585). A cluster of one worker trains; a custom loop may use
    :func:`get_strategy`'s multi-worker strategy on more. A TF_CONFIG that does not parse
    is left to :func:`get_strategy` to name."""
    try:
        cluster = json.loads(os.environ.get("TF_CONFIG") or "{}").get("cluster")
    except (json.JSONDecodeError, AttributeError):
        return
    if not isinstance(cluster, dict):
        return
    workers = sum(len(v) for k, v in cluster.items() if k in ("chief", "worker")
                  and isinstance(v, list))  # fmt: skip
    if workers > 1:
        raise PetalError(
            f"petal train cannot train on a cluster of {workers} workers: Keras 3's fit "
            "fails on input distributed over several workers (keras-team/keras#20585). "
            "Train on one host (--strategy auto: its TPU or GPUs), or give TF_CONFIG a "
            f"cluster of one worker. Received: strategy='multi-worker', {workers} workers "
            "in TF_CONFIG"
        )


def get_strategy(name: str = "auto", tpu_address: str | None = None):
    """Create a ``tf.distribute`` strategy from a name.

    Args:
        name: ``"auto"`` (TPU, else MirroredStrategy over all local GPUs, else the default
            strategy), ``"tpu"``, ``"mirrored"`` (all GPUs, else all logical CPU devices),
            ``"multi-worker"`` (MultiWorkerMirroredStrategy configured by ``TF_CONFIG``),
            ``"one-device"`` (first GPU, else the CPU), ``"cpu"`` or ``"default"``.
        tpu_address: TPU name or ``grpc://`` address; empty uses the environment (Colab,
            Kaggle, TPU VMs).

    Returns:
        ``(strategy, info)``; ``info`` holds ``name`` (the strategy chosen), ``replicas``,
        ``devices``, ``tpu`` and ``gpu`` (bools) and ``gpu_compute_capability`` (or None).

    Raises:
        PetalError: Unknown name; ``tpu`` without a TPU; a TPU named (``tpu_address``,
            ``TPU_NAME``) that cannot be reached; ``multi-worker`` without ``TF_CONFIG``,
            or after TensorFlow's runtime started (it must be created first in a process).
    """
    if name not in STRATEGIES:
        raise PetalError(
            f"Unknown strategy {name!r}. Choose one of: {', '.join(STRATEGIES)}. Received: strategy={name!r}"
        )

    # First: MultiWorkerMirroredStrategy configures collective ops, which TensorFlow only
    # allows before its runtime starts, and listing logical devices below starts it.
    if name == "multi-worker":
        if not os.environ.get("TF_CONFIG"):
            raise PetalError(
                "strategy 'multi-worker' needs the TF_CONFIG environment variable (cluster and "
                "task of this worker); see tf.distribute.MultiWorkerMirroredStrategy. "
                "Received: TF_CONFIG unset"
            )
        _check_tf_config(os.environ["TF_CONFIG"])
        try:
            strategy = tf.distribute.MultiWorkerMirroredStrategy()
        except ValueError as err:  # what TensorFlow finds wrong with the cluster
            raise PetalError(
                f"TF_CONFIG does not describe this worker's cluster: {first_line(err)}. "
                f"Received: TF_CONFIG={os.environ['TF_CONFIG'][:80]!r}"
            ) from err
        except RuntimeError as err:
            if "startup" not in str(err):
                raise
            # "Collective ops must be configured at program startup": a tensor, a model or a
            # device query earlier in this process started the runtime.
            raise PetalError(
                "strategy 'multi-worker' must be created before TensorFlow's runtime starts, "
                "which it already has in this process: call get_strategy('multi-worker') "
                "before anything creates a tensor or a model or lists logical devices."
            ) from err
        return strategy, _info(strategy, "multi-worker", tpu=False)
    if name in ("auto", "tpu"):
        tpu = None  # Set first: the codelab's 2021 notebooks crashed on `if tpu:` without it.
        try:
            tpu = _connect_tpu(tpu_address)
        except ValueError as err:
            if name == "tpu":
                raise PetalError(
                    f"No TPU found ({err}). Run on a TPU host or pass --strategy auto. Received: strategy='tpu'"
                ) from err
        except OSError as err:
            # urllib's URLError: the resolver looks a named TPU up through the GCE metadata
            # server, which does not answer off Google Cloud.
            raise _unreachable_tpu(name, tpu_address, err) from err
        if tpu is not None:
            strategy = tf.distribute.TPUStrategy(tpu)
            return strategy, _info(strategy, "tpu", tpu=True)

    gpus = tf.config.list_logical_devices("GPU")
    if name == "auto":
        if gpus:
            strategy = tf.distribute.MirroredStrategy([d.name for d in gpus])
            return strategy, _info(strategy, "mirrored", tpu=False)
        strategy = tf.distribute.get_strategy()
        return strategy, _info(strategy, "default", tpu=False)
    if name == "mirrored":
        devices = [d.name for d in (gpus or tf.config.list_logical_devices("CPU"))]
        strategy = tf.distribute.MirroredStrategy(devices)
        return strategy, _info(strategy, "mirrored", tpu=False)
    if name == "one-device":
        device = gpus[0].name if gpus else "/cpu:0"
        strategy = tf.distribute.OneDeviceStrategy(device)
        return strategy, _info(strategy, "one-device", tpu=False)
    if name == "cpu":
        strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
        return strategy, _info(strategy, "cpu", tpu=False)
    strategy = tf.distribute.get_strategy()
    return strategy, _info(strategy, "default", tpu=False)


def check_global_batch(batch_size: int, replicas: int, name: str = "batch_size") -> int:
    """Check that the global batch splits evenly across replicas.

    Args:
        batch_size: Global batch size (per-replica batch x replicas).
        replicas: Replicas in sync.
        name: the setting the batch size came from, named in the error.

    Returns:
        The per-replica batch size.

    Raises:
        PetalError: ``batch_size`` is not a positive multiple of ``replicas``; the message names
            the nearest valid sizes.
    """
    from petal.data.pipeline import per_replica_batch

    return per_replica_batch(batch_size, replicas, name)


def describe(
    info: dict[str, Any], precision: str | None = None, global_batch: int | None = None
) -> str:
    """One log line: strategy, replicas, devices, precision and global batch."""
    # "/job:localhost/replica:0/task:0/device:CPU:0" -> "CPU:0": the prefix is noise in logs.
    devices = ",".join(d.rsplit("device:", 1)[-1] for d in info["devices"])
    parts = [f"strategy={info['name']}", f"replicas={info['replicas']}", f"devices={devices}"]
    if precision:
        parts.append(f"precision={precision}")
    if global_batch:
        parts.append(
            f"global_batch={global_batch} ({global_batch // max(info['replicas'], 1)} per replica)"
        )
    return " ".join(parts)


def replica_stats(model) -> list:
    """The moving mean and variance of each BatchNormalization layer of ``model`` (petal's
    fused kernel keeps them there too): what each replica updates on its own."""
    import keras

    from petal.models.registry import walk_layers

    return [
        var
        for layer in walk_layers(model)
        if isinstance(layer, keras.layers.BatchNormalization)
        for var in (layer.moving_mean, layer.moving_variance)
    ]


def average_replica_stats(variables) -> None:
    """Sets every replica's copy of each variable to the mean of the copies.

    Under a multi-replica strategy Keras 3 creates BatchNormalization's moving statistics
    as mirrored variables that each replica updates with its own share of the batch, and
    nothing brings them together again: validation used each replica's statistics and the
    saved model only the first's (tf.keras 2 averaged them when read, for a checkpoint). Called
    before every validation, the replicas validate with, and checkpoints keep, the mean.
    """
    for var in variables:
        copies = getattr(getattr(var, "value", var), "values", ())
        if len(copies) < 2:
            continue
        with tf.device("/cpu:0"):
            mean = tf.add_n([tf.convert_to_tensor(c) for c in copies]) / len(copies)
        for copy in copies:
            copy.assign(mean)


def replica_stats_sync(model, replicas: int):
    """A Keras callback that averages the replicas' BatchNormalization statistics
    (:func:`average_replica_stats`) before each validation and at each epoch's end, or
    None when there is nothing to average (one replica, no BatchNormalization)."""
    import keras

    stats = replica_stats(model) if replicas > 1 else []
    if not stats:
        return None

    class ReplicaStatsSync(keras.callbacks.Callback):
        def on_test_begin(self, logs=None):
            average_replica_stats(stats)

        def on_epoch_end(self, epoch, logs=None):
            average_replica_stats(stats)

    return ReplicaStatsSync()
