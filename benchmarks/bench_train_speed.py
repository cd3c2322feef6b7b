"""Training speed per model and precision on this machine, on synthetic data.

For each model at its preset image size and batch, builds the model under the dtype policy,
compiles it (Adam, categorical cross-entropy, as the training loop does), runs a few warm-up
steps (tracing, XLA compilation, oneDNN kernel selection) and then times a few more training
steps on one in-memory batch, so the numbers measure the model alone, not the input pipeline.
Prints a table and writes JSON to ``benchmarks/results/train_speed.json``.

    python benchmarks/bench_train_speed.py                       # all models, float32 + bf16
    python benchmarks/bench_train_speed.py --models squeezenet --jit auto,off --steps 10
    python benchmarks/bench_train_speed.py --models squeezenet --batch-norm fused,keras

BatchNormalization layers train with TensorFlow's fused kernel, as ``petal train`` does
(``fused_batch_norm``); ``--batch-norm keras`` measures Keras' own composite ops.

``--backend jax`` (or torch) times the same models on another Keras backend, with Keras' own
batch normalization and no TensorFlow in the process: what an accelerator host that has JAX but
no TensorFlow can train at (petal's models use Keras 3 APIs only). The batch is created on the
backend's default device, so on a GPU the numbers are the accelerator's, not the input's:

    KERAS_BACKEND=jax python benchmarks/bench_train_speed.py --backend jax \
        --models squeezenet,xception --precisions mixed_bfloat16 --batch 256 --steps 20

The machine is shared: numbers are noisy (other processes compete for the cores), so repeat a
measurement before trusting a difference under ~15%.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

BACKENDS = ("tensorflow", "jax", "torch")

RESULTS = Path(__file__).resolve().parent / "results"

# Image size and global batch of each model's preset on one device (training/config.py presets;
# the codelab sizes), and a batch for models without a preset that fits a small CPU's memory.
PRESET_SIZE_BATCH = {
    "dense": (192, 128),
    "convnet": (192, 128),
    "squeezenet": (192, 32),
    "squeezenet_separable": (192, 32),
    "inception": (192, 32),
    "xception": (331, 16),
    "mobilenet_v2": (224, 32),
    "efficientnet_v2_b0": (224, 32),
    "convnext_tiny": (224, 16),
}


def accelerator_description(backend: str) -> str:
    """The device the backend computes on: a GPU or TPU's name, else "cpu"."""
    if backend == "jax":
        import jax

        device = jax.devices()[0]
        return "cpu" if device.platform == "cpu" else f"{device.platform}: {device.device_kind}"
    if backend == "torch":
        import torch

        return f"cuda: {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else "cpu"
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return "cpu"
    details = tf.config.experimental.get_device_details(gpus[0])
    return f"gpu: {details.get('device_name', gpus[0].name)}"


def cpu_description() -> dict:
    """CPU model, core count and the bfloat16-relevant flags."""
    from petal.training.precision import cpu_flags

    model = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    flags = cpu_flags()
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "avx512_bf16": "avx512_bf16" in flags,
        "amx_bf16": "amx_bf16" in flags,
        "load_average_at_start": os.getloadavg() if hasattr(os, "getloadavg") else None,
    }


def measure(
    name: str,
    precision: str,
    jit: str,
    size: int,
    batch: int,
    warmup: int,
    steps: int,
    batch_norm: str = "fused",
) -> dict:
    """Time ``steps`` training steps of one model after ``warmup`` steps."""
    import keras
    import numpy as np

    from petal.models import count_flops, create_model

    keras.backend.clear_session()
    keras.mixed_precision.set_global_policy(precision)
    keras.utils.set_random_seed(0)
    model = create_model(name, num_classes=5, image_size=size)
    if batch_norm == "fused":
        from petal.training.fused_bn import use_fused_batch_norm  # TensorFlow's kernel

        use_fused_batch_norm(model)
    jit_compile = {"auto": "auto", "on": True, "off": False}[jit]
    model.compile(keras.optimizers.Adam(1e-4), "categorical_crossentropy", jit_compile=jit_compile)
    rng = np.random.default_rng(0)
    x = keras.ops.convert_to_tensor(rng.uniform(0, 1, (batch, size, size, 3)).astype("float32"))
    y = keras.ops.convert_to_tensor(np.eye(5, dtype="float32")[rng.integers(0, 5, batch)])

    start = time.perf_counter()
    for _ in range(warmup):
        model.train_on_batch(x, y)
    warmup_s = time.perf_counter() - start
    times = []
    cpu_start = time.process_time()
    for _ in range(steps):
        t = time.perf_counter()
        loss = model.train_on_batch(x, y)
        times.append(time.perf_counter() - t)
    cpu_total = time.process_time() - cpu_start
    total = sum(times)
    row = {
        "model": name,
        "precision": precision,
        "jit": jit,
        "batch_norm": batch_norm,
        "xla": bool(model.jit_compile),
        "image_size": size,
        "batch": batch,
        "steps": steps,
        "warmup_steps": warmup,
        "warmup_s": round(warmup_s, 2),
        "step_ms_median": round(1000 * statistics.median(times), 1),
        "images_per_s": round(steps * batch / total, 2),
        # CPU seconds of this process (all threads): less sensitive to other users of the
        # cores than wall time, and the fairer way to compare precisions on a shared machine.
        "images_per_cpu_s": round(steps * batch / cpu_total, 2),
        "mflops_per_image": round(count_flops(model) / 1e6, 1),
        # A training step costs about 3x the forward pass (forward, two backward products).
        "train_tflops_per_s_estimate": round(
            3 * count_flops(model) * steps * batch / total / 1e12, 2
        ),
        "loss_finite": bool(np.isfinite(loss)),
    }
    keras.mixed_precision.set_global_policy("float32")
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--models", default=",".join(PRESET_SIZE_BATCH), help="comma-separated model names"
    )
    parser.add_argument("--precisions", default="float32,mixed_bfloat16")
    parser.add_argument(
        "--jit",
        default="auto",
        help="comma-separated: auto (Keras' choice: no XLA on CPU-only hosts), on, off",
    )
    parser.add_argument(
        "--backend",
        choices=BACKENDS,
        default=os.environ.get("KERAS_BACKEND", "tensorflow"),
        help="Keras backend (default: $KERAS_BACKEND, else tensorflow, as petal train)",
    )
    parser.add_argument(
        "--batch-norm",
        default=None,
        help="comma-separated: fused (TensorFlow's fused kernel, as petal train; the default "
        "on tensorflow), keras (Keras' own ops; the default and only choice on jax and torch)",
    )
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first (compilation)")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per measurement")
    parser.add_argument("--image-size", type=int, default=None, help="override every model's size")
    parser.add_argument("--batch", type=int, default=None, help="override every model's batch")
    parser.add_argument("--out", type=Path, default=RESULTS / "train_speed.json")
    args = parser.parse_args(argv)
    for flag, value, least in (
        ("--steps", args.steps, 1),
        ("--warmup", args.warmup, 0),
        ("--image-size", args.image_size, 1),
        ("--batch", args.batch, 1),
    ):
        if value is not None and value < least:
            parser.error(f"{flag} must be at least {least}. Received: {value}")
    for flag, given, known in (
        ("--precisions", args.precisions, ("float32", "mixed_bfloat16", "mixed_float16")),
        ("--jit", args.jit, ("auto", "on", "off")),
    ):
        bad = [v for v in given.split(",") if v.strip() not in known]
        if bad:
            parser.error(f"{flag} takes {', '.join(known)} (comma-separated). Received: {given}")
    if args.batch_norm is None:
        args.batch_norm = "fused" if args.backend == "tensorflow" else "keras"
    if args.backend != "tensorflow" and "fused" in args.batch_norm.split(","):
        parser.error(f"--batch-norm fused needs TensorFlow; on {args.backend} use keras")
    if not [n for n in args.models.split(",") if n.strip()]:
        parser.error(f"--models needs one or more model names. Received: {args.models!r}")
    if importlib.util.find_spec(args.backend) is None:
        parser.error(
            f"--backend {args.backend} needs the {args.backend} package, which is not "
            "installed: install it or pick another --backend"
        )
    from petal.cli import _check_output_file
    from petal.errors import PetalError
    from petal.jsonfile import json_text

    try:  # now, not after the first model's measurement
        _check_output_file(str(args.out), "--out")
    except PetalError as err:
        parser.error(str(err))

    # Keras reads its backend once, at its first import.
    os.environ["KERAS_BACKEND"] = args.backend
    import keras
    from tqdm import tqdm

    if keras.backend.backend() != args.backend:
        parser.error(
            f"Keras was already imported with the {keras.backend.backend()} backend; "
            f"run this script in a fresh process with KERAS_BACKEND={args.backend}"
        )

    from petal.models import list_models, model_info

    names = [n.strip() for n in args.models.split(",") if n.strip()]
    unknown = [n for n in names if n not in list_models()]
    if unknown:
        parser.error(f"unknown models {unknown}; choose from {list_models()}")
    runs = [
        (n, p.strip(), j.strip(), b.strip())
        for n in names
        for p in args.precisions.split(",")
        for j in args.jit.split(",")
        for b in args.batch_norm.split(",")
    ]
    bad = {b for *_, b in runs} - {"fused", "keras"}
    if bad:
        parser.error(f"--batch-norm takes fused and/or keras. Received: {args.batch_norm}")
    host = cpu_description()
    host["accelerator"] = accelerator_description(args.backend)
    backend_version = _backend_version(args.backend)
    print(
        f"{host['cpu']} ({host['cores']} cores, avx512_bf16={host['avx512_bf16']}, "
        f"amx_bf16={host['amx_bf16']}, load {host['load_average_at_start']}); "
        f"device {host['accelerator']}; {args.backend} {backend_version}, "
        f"Keras {keras.__version__}",
        flush=True,
    )
    payload = {
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(
            [
                "python benchmarks/bench_train_speed.py",
                *(argv if argv is not None else sys.argv[1:]),
            ]
        ),
        "host": host,
        "backend": args.backend,
        "backend_version": backend_version,
        "keras_version": keras.__version__,
        "note": "synthetic data, one in-memory batch; shared machine, numbers are noisy",
        # Written after every row: false until the last one (a run cut short by Ctrl-C).
        "complete": False,
        "rows": [],
    }
    if args.backend == "tensorflow":
        payload["tensorflow_version"] = backend_version
    args.out.parent.mkdir(parents=True, exist_ok=True)

    rows = []
    for name, precision, jit, bn in tqdm(runs, desc="measurements", unit="run", file=sys.stderr):
        size, batch = PRESET_SIZE_BATCH.get(name, (model_info(name).default_image_size, 32))
        size = args.image_size if args.image_size is not None else size
        batch = args.batch if args.batch is not None else batch
        try:
            rows.append(measure(name, precision, jit, size, batch, args.warmup, args.steps, bn))
        except PetalError as err:  # a size the model refuses, say
            parser.error(str(err))
        r = rows[-1]
        payload["rows"] = rows  # written after every row: a run cut short keeps what it measured
        args.out.write_text(json_text(payload))
        tqdm.write(
            f"  {name} {precision} jit={jit} bn={bn}: {r['images_per_s']} img/s", file=sys.stderr
        )
    payload["complete"] = True
    args.out.write_text(json_text(payload))

    header = (
        f"{'model':<22}{'size':>5}{'batch':>6}  {'precision':<15}{'xla':<5}{'bn':<7}{'img/s':>8}"
        f"{'img/cpu-s':>10}{'ms/step':>9}{'warm-up s':>10}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        print(
            f"{r['model']:<22}{r['image_size']:>5}{r['batch']:>6}  {r['precision']:<15}"
            f"{'yes' if r['xla'] else 'no':<5}{r['batch_norm']:<7}{r['images_per_s']:>8.2f}{r['images_per_cpu_s']:>10.2f}"
            f"{r['step_ms_median']:>9.0f}{r['warmup_s']:>10.1f}"
        )

    print(f"wrote {args.out}")
    return 0


def _backend_version(backend: str) -> str:
    import importlib

    return importlib.import_module(backend).__version__


if __name__ == "__main__":
    sys.exit(main())
