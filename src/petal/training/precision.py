"""Pick the mixed-precision policy per platform, in one place.

``auto`` resolves to:

- TPU: ``mixed_bfloat16`` (the matrix units compute in bfloat16 natively).
- GPU with compute capability >= 8.0 (Ampere and later): ``mixed_bfloat16``; same speed as
  float16 there, float32's range, no loss scaling.
- GPU with compute capability 7.x (Volta/Turing tensor cores): ``mixed_float16``. Keras 3's
  ``Model.compile`` wraps the optimizer in a ``LossScaleOptimizer`` (dynamic loss scaling)
  automatically when the model's dtype policy is ``mixed_float16`` (keras/src/trainers/
  trainer.py), so nothing else is needed.
- Older GPUs: ``float32``.
- CPU: ``mixed_bfloat16`` only where it was measured faster; see :data:`CPU_BF16_RULE`,
  and float32 for the models in :data:`CPU_FLOAT32_MODELS` on any CPU.

Build the model after :func:`set_policy`: layers take the global policy when created. The
classifier head stays float32 in every petal model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import keras

from petal.errors import PetalError

PRECISIONS = ("auto", "float32", "mixed_bfloat16", "mixed_float16")

# Measured with benchmarks/bench_train_speed.py on this project's CPU (AMD EPYC, avx512_bf16, no
# AMX, 2 cores shared with other jobs, TF 2.21 + oneDNN, no XLA): squeezenet at 192x192, batch
# 32, three separate runs, training images per CPU-second (float32 -> mixed_bfloat16):
# 11.2 -> 17.1, 12.9 -> 16.3, 14.1 -> 18.4, i.e. bfloat16 1.3-1.5x faster; wall-clock images/s
# agreed in direction (4.2 -> 13.3, 19.6 -> 20.9, 6.3 -> 10.2) but the shared cores make it
# noisy. benchmarks/README.md has the tables. AMX CPUs are faster still in bfloat16.
CPU_BF16_WITHOUT_AMX = True
CPU_BF16_RULE = (
    "CPU: mixed_bfloat16 with AMX (amx_bf16); with avx512_bf16 alone only if "
    "CPU_BF16_WITHOUT_AMX (set from benchmarks/bench_train_speed.py); float32 otherwise"
)

# Models that train slower in mixed_bfloat16 than in float32 on a CPU even where the rule
# above picks bfloat16. Measured with benchmarks/bench_train_speed.py (fused BatchNormalization,
# Intel Xeon with AVX512-BF16 and AMX, 2026-12-03; benchmarks/README.md, "Training speed"):
# mobilenet_v2 at 224x224, batch 32: float32 22.9 and 21.5 img/s, mixed_bfloat16 13.9 and
# 12.1 img/s in one interleaved run (14.3 vs 6.1 in the full table): oneDNN's bfloat16
# depthwise convolutions are slow on CPU.
CPU_FLOAT32_MODELS = frozenset({"mobilenet_v2"})


def cpu_flags(cpuinfo: str | Path = "/proc/cpuinfo") -> set[str]:
    """The CPU feature flags from ``/proc/cpuinfo`` (empty where that file does not exist)."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags") and ":" in line:
            return set(line.split(":", 1)[1].split())
    return set()


def cpu_prefers_bfloat16(flags: set[str] | None = None) -> bool:
    """Whether ``mixed_bfloat16`` trains faster than float32 on this CPU (see module docs)."""
    flags = cpu_flags() if flags is None else flags
    if "amx_bf16" in flags:
        return True
    return "avx512_bf16" in flags and CPU_BF16_WITHOUT_AMX


def resolve_precision(
    name: str = "auto", strategy_info: dict[str, Any] | None = None, model: str | None = None
) -> str:
    """Turn a precision name into a Keras dtype policy name.

    Args:
        name: ``"auto"``, ``"float32"``, ``"mixed_bfloat16"`` or ``"mixed_float16"``.
        strategy_info: The info dict from :func:`petal.training.strategy.get_strategy`
            (keys ``tpu``, ``gpu``, ``gpu_compute_capability``); ``None`` means CPU.
        model: the registry name of the model to train, if known: on a CPU the models in
            :data:`CPU_FLOAT32_MODELS` get float32.

    Returns:
        The policy name.

    Raises:
        PetalError: Unknown precision name.
    """
    if name not in PRECISIONS:
        raise PetalError(
            f"Unknown precision {name!r}. Choose one of: {', '.join(PRECISIONS)}. Received: precision={name!r}"
        )
    if name != "auto":
        return name
    info = strategy_info or {}
    if info.get("tpu"):
        return "mixed_bfloat16"
    if info.get("gpu"):
        cc = info.get("gpu_compute_capability")
        if cc is not None and tuple(cc) >= (8, 0):
            return "mixed_bfloat16"
        if cc is not None and tuple(cc) >= (7, 0):
            return "mixed_float16"
        return "float32"
    if model in CPU_FLOAT32_MODELS:
        return "float32"
    return "mixed_bfloat16" if cpu_prefers_bfloat16() else "float32"


def slow_precision_warning(
    name: str, strategy_info: dict[str, Any] | None = None, flags: set[str] | None = None
) -> str | None:
    """A warning for a mixed precision asked for by name on a CPU where it trains slower than
    float32 (``auto`` would not pick it there); None otherwise."""
    info = strategy_info or {}
    if name == "auto" or info.get("tpu") or info.get("gpu"):
        return None
    if name == "mixed_float16":
        why = "CPUs have no fast float16 kernels; squeezenet trained 61x slower on this project's"
    elif name == "mixed_bfloat16" and not cpu_prefers_bfloat16(flags):
        why = (
            "this CPU lacks the bfloat16 instructions (amx_bf16, avx512_bf16) that make it "
            "pay; several times slower for squeezenet on this project's"
        )
    else:
        return None
    return (
        f"precision {name} trains slower than float32 on a CPU ({why} CPU): use --precision auto "
        "or float32 unless you are checking numerics"
    )


def set_policy(policy: str) -> str:
    """Set Keras' global dtype policy (call before building the model).

    Args:
        policy: A name from :data:`PRECISIONS` other than ``auto`` (resolve it first).

    Returns:
        The policy set.
    """
    if policy not in PRECISIONS or policy == "auto":
        raise PetalError(
            f"set_policy needs a resolved policy (float32, mixed_bfloat16 or mixed_float16). "
            f"Received: policy={policy!r}"
        )
    keras.mixed_precision.set_global_policy(policy)
    return policy


def agree_on_overflow(optimizer, replicas: int) -> None:
    """Makes a ``LossScaleOptimizer``'s inf/NaN check agree across replicas.

    Keras 3 (3.15) checks the gradients of the first replica alone, on the assumption that
    they are already summed over the replicas, which they are not yet: when another
    replica's float16 gradients overflowed, it applied them (their sum is inf) and every
    weight became NaN within a few steps of the first epoch, at any learning rate. Here a
    step is skipped, and the loss scale lowered, when any replica's gradients overflowed.
    No-op for one replica or another optimizer.
    """
    import tensorflow as tf

    if replicas < 2 or not isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return
    check = optimizer.check_finite

    def check_finite(grads):
        finite = check(grads)
        context = tf.distribute.get_replica_context()
        if context is None or context.num_replicas_in_sync < 2:
            return finite
        overflowed = context.all_reduce("SUM", tf.cast(tf.logical_not(finite), tf.float32))
        return tf.equal(overflowed, 0.0)

    optimizer.check_finite = check_finite
