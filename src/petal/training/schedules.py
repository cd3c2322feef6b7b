"""Learning-rate schedules as pure functions of the optimizer step.

Durations are given in epochs and become steps in one place (:func:`epochs_to_steps`, via the
``steps_per_epoch`` every schedule takes). Each factory returns a callable ``step -> lr`` built
from ``keras.ops``, so it works on Python ints (tests pin golden values) and on the optimizer's
step counter inside a compiled train step. :class:`StepSchedule` wraps them as a serialisable
``keras.optimizers.schedules.LearningRateSchedule`` so the optimizer updates the rate every step
(not once per epoch as the codelab's ``LearningRateScheduler`` callback did).

Typical use::

    lr = build_schedule("codelab_ramp", steps_per_epoch=23, replicas=8)
    optimizer = keras.optimizers.Adam(learning_rate=lr)
"""

from __future__ import annotations

import inspect
import math
import numbers
from collections.abc import Callable

import keras
from keras import ops

from petal.errors import PetalError

StepFn = Callable[[object], object]

# codelab_ramp's ramp-up in epochs (the codelab's) when none is given.
RAMPUP_EPOCHS = 5
# More replicas than this is a TPU pod, for which the codelab has its own recipe: batch 8 x
# replicas, peak 2e-5 x replicas, a 7-epoch ramp-up. (The notebook's `else:` gives that recipe
# to 2-7 replicas too; petal keeps the 8-core recipe's shape there: codelab_max_lr.)
POD_REPLICAS = 8
POD_RAMPUP_EPOCHS = 7


def _is_number(value) -> bool:
    """Whether ``value`` is a finite real number: a NumPy scalar is one, a bool or a string
    is not."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def _check_number(name: str, value) -> None:
    """One line for an argument of a public helper that is no number (a string gave
    Python's "'<' not supported")."""
    if not _is_number(value):
        raise PetalError(f"{name} must be a finite number. Received: {name}={value!r}")


def epochs_to_steps(epochs: float, steps_per_epoch: int, name: str = "epochs") -> int:
    """Convert a duration in (possibly fractional) epochs to whole optimizer steps (``name``:
    the argument the duration came from, for the messages).

    Raises:
        PetalError: ``steps_per_epoch`` is not a positive int or ``epochs`` is not a number
            of at least 0.
    """
    if (
        isinstance(steps_per_epoch, bool)
        or not isinstance(steps_per_epoch, numbers.Integral)  # np.int64 too
        or steps_per_epoch < 1
    ):
        raise PetalError(
            f"steps_per_epoch must be a positive int. Received: steps_per_epoch={steps_per_epoch!r}"
        )
    _check_number(name, epochs)
    if epochs < 0:
        raise PetalError(f"A duration in epochs cannot be negative. Received: {name}={epochs!r}")
    return int(round(epochs * int(steps_per_epoch)))


def scale_lr(
    base_lr: float, batch_size: int, reference_batch: int = 256, rule: str = "linear"
) -> float:
    """Scale a peak learning rate to the global batch size.

    The linear scaling rule (Goyal et al., 2017): a rate tuned for ``reference_batch`` is
    multiplied by ``batch_size / reference_batch``; ``"sqrt"`` uses the square root of the ratio
    (gentler, often better for Adam).

    Args:
        base_lr: Rate that works at ``reference_batch``.
        batch_size: Global batch size (per-replica batch x replicas).
        reference_batch: Batch size ``base_lr`` was tuned for.
        rule: ``"linear"``, ``"sqrt"`` or ``"none"``.

    Returns:
        The scaled rate.
    """
    for name, value in (("base_lr", base_lr), ("batch_size", batch_size),
                        ("reference_batch", reference_batch)):  # fmt: skip
        _check_number(name, value)
    if batch_size < 1 or reference_batch < 1:
        raise PetalError(
            "Batch sizes must be positive. "
            f"Received: batch_size={batch_size}, reference_batch={reference_batch}"
        )
    ratio = batch_size / reference_batch
    if rule == "linear":
        return base_lr * ratio
    if rule == "sqrt":
        return base_lr * math.sqrt(ratio)
    if rule == "none":
        return base_lr
    raise PetalError(f"rule must be 'linear', 'sqrt' or 'none'. Received: rule={rule!r}")


def codelab_max_lr(replicas: int) -> float:
    """The codelab Xception notebook's peak rate for a number of replicas.

    5e-5 x replicas (4e-4 on 8 TPU cores) and 2e-4 on one device; in between we keep at least
    2e-4 so that more replicas never lower the rate (our interpolation: the notebook gives 2-7
    replicas its pod recipe, 2e-5 x replicas, which is below its own one-device 2e-4). On
    more than :data:`POD_REPLICAS` (a TPU pod) the codelab's pod rule, 2e-5 x replicas, for
    its pod batch of 8 x replicas.
    """
    _check_replicas(replicas)
    if replicas > POD_REPLICAS:
        return 2e-5 * replicas
    return max(2e-4, 5e-5 * replicas)


def codelab_rampup_epochs(replicas: int) -> int:
    """The codelab Xception notebook's ramp-up in epochs: 5, or 7 on a TPU pod (more than
    :data:`POD_REPLICAS` replicas)."""
    _check_replicas(replicas)
    return POD_RAMPUP_EPOCHS if replicas > POD_REPLICAS else RAMPUP_EPOCHS


def _check_replicas(replicas: int) -> None:
    _check_number("replicas", replicas)
    if replicas < 1:
        raise PetalError(f"replicas must be at least 1. Received: replicas={replicas}")


def _as_float_step(step):
    return ops.cast(step, "float32")


def codelab_ramp(
    steps_per_epoch: int,
    *,
    start_lr: float = 1e-5,
    max_lr: float | None = None,
    min_lr: float = 1e-5,
    rampup_epochs: float | None = None,
    sustain_epochs: float = 0,
    decay: float = 0.8,
    replicas: int = 1,
    interpolate: bool = False,
) -> StepFn:
    """The codelab's ramp-up, sustain, exponential-decay schedule, evaluated per step.

    Per epoch ``e``: ``start + (max - start) * e / rampup`` while ``e < rampup``, then ``max``
    for ``sustain`` epochs, then ``(max - min) * decay ** (e - rampup - sustain) + min``. With
    ``replicas=8`` this gives the golden values 1e-5, 8.8e-5, 1.66e-4, 2.44e-4, 3.22e-4, 4e-4,
    3.22e-4, 2.596e-4, ... at epochs 0, 1, 2, ...

    Args:
        steps_per_epoch: Optimizer steps per epoch.
        start_lr: Rate at step 0.
        max_lr: Peak rate; ``None`` uses :func:`codelab_max_lr` of ``replicas``.
        min_lr: Rate the decay tends to.
        rampup_epochs: Epochs of linear ramp-up; ``None`` uses :func:`codelab_rampup_epochs`
            of ``replicas``.
        sustain_epochs: Epochs held at the peak.
        decay: Per-epoch decay factor of ``max - min``, from 0 (down to ``min_lr`` the epoch
            after the peak) to 1 (held at the peak).
        replicas: Replicas in sync (only used when ``max_lr`` or ``rampup_epochs`` is None).
        interpolate: ``False`` keeps each epoch's codelab value for all its steps (identical to
            the codelab's per-epoch callback); ``True`` evaluates the same curve at fractional
            epochs, so the rate changes smoothly and still equals the codelab values at epoch
            boundaries.

    Returns:
        ``step -> lr``.
    """
    epochs_to_steps(0, steps_per_epoch)  # validates steps_per_epoch
    if not (_is_number(decay) and 0 <= decay <= 1):
        # Above 1 the "decay" grew the rate past the peak, epoch after epoch.
        raise PetalError(
            "Schedule option decay must be from 0 (down to min_lr after the peak) to 1 (held "
            f"at the peak), a factor per epoch. Received: decay={decay!r}"
        )
    peak = codelab_max_lr(replicas) if max_lr is None else max_lr
    _check_below_peak("max_lr", peak, start_lr=start_lr, min_lr=min_lr)
    if rampup_epochs is None:
        rampup_epochs = codelab_rampup_epochs(replicas)
    spe = float(steps_per_epoch)

    def fn(step):
        epoch = _as_float_step(step) / spe
        if not interpolate:
            epoch = ops.floor(epoch)
        ramp = start_lr + (peak - start_lr) * epoch / max(rampup_epochs, 1e-12)
        decayed = (peak - min_lr) * ops.power(
            decay, ops.maximum(epoch - rampup_epochs - sustain_epochs, 0.0)
        ) + min_lr
        lr = ops.where(epoch < rampup_epochs + sustain_epochs, peak, decayed)
        return ops.where(epoch < rampup_epochs, ramp, lr)

    return fn


def warmup_cosine(
    steps_per_epoch: int,
    *,
    peak_lr: float,
    total_epochs: float,
    warmup_epochs: float = 0,
    start_lr: float = 0.0,
    end_lr: float = 0.0,
) -> StepFn:
    """Linear warm-up from ``start_lr`` to ``peak_lr``, then cosine decay to ``end_lr``.

    Args:
        steps_per_epoch: Optimizer steps per epoch.
        peak_lr: Rate at the end of warm-up.
        total_epochs: Length of the whole schedule (warm-up included); after it the rate stays
            at ``end_lr``.
        warmup_epochs: Epochs of linear warm-up.
        start_lr: Rate at step 0.
        end_lr: Final rate.

    Returns:
        ``step -> lr``.
    """
    total = epochs_to_steps(total_epochs, steps_per_epoch, "total_epochs")
    warmup = epochs_to_steps(warmup_epochs, steps_per_epoch, "warmup_epochs")
    # A warm-up as long as the schedule never decays; compared in epochs, as they were
    # given (rounded to steps, 0.9 of an epoch of 1 step was "as long as" 1 epoch).
    if warmup > total or total < 1 or warmup_epochs >= total_epochs:
        raise PetalError(
            f"warmup_epochs must be shorter than total_epochs (the cosine decay follows it), "
            f"which must be positive. "
            f"Received: warmup_epochs={warmup_epochs}, total_epochs={total_epochs}"
        )
    _check_below_peak("peak_lr", peak_lr, start_lr=start_lr, end_lr=end_lr)

    def fn(step):
        s = _as_float_step(step)
        warm = start_lr + (peak_lr - start_lr) * s / max(warmup, 1)
        progress = ops.clip((s - warmup) / max(total - warmup, 1), 0.0, 1.0)
        cosine = end_lr + 0.5 * (peak_lr - end_lr) * (1.0 + ops.cos(math.pi * progress))
        return ops.where(s < warmup, warm, cosine)

    return fn


def _check_below_peak(peak_name: str, peak: float, **rates: float) -> None:
    """One line for a start or end rate above the peak: a warm-up that lowered the rate, or a
    decay that raised it (a 1e-5 start_lr and min_lr with a 2e-6 peak)."""
    for key, value in rates.items():
        if _is_number(value) and _is_number(peak) and value > peak:
            where = " when that is set" if peak_name == "max_lr" else ""
            raise PetalError(
                f"Schedule option {key} must not exceed the peak rate {peak_name} (petal train "
                f"sets it from learning_rate{where}): lower {key} (--set schedule_options."
                f"{key}=...) or raise the peak. Received: {key}={value!r}, {peak_name}={peak!r}"
            )


def scaled_rates(name: str, options: dict, factor: float) -> dict:
    """``options`` of schedule ``name`` with its rates besides the peak (``start_lr``,
    ``min_lr``, ``end_lr``: given, else their defaults) times ``factor``, for a schedule whose
    peak is scaled by it. A rate that is no number is left for the schedule to refuse."""
    params = inspect.signature(SCHEDULES[name]).parameters
    scaled = dict(options)
    for key in ("start_lr", "min_lr", "end_lr"):
        if key not in params:
            continue
        value = scaled.get(key, params[key].default)
        if _is_number(value):
            scaled[key] = _plain_number(value) * factor
    return scaled


def constant(steps_per_epoch: int = 1, *, lr: float = 1e-3) -> StepFn:
    """A constant rate (the codelab squeezenet's Adam default is 1e-3).

    Args:
        steps_per_epoch: Accepted for a uniform signature; unused.
        lr: The rate.

    Returns:
        ``step -> lr``.
    """
    del steps_per_epoch

    def fn(step):
        return ops.cast(lr, "float32") + 0.0 * _as_float_step(step)

    return fn


SCHEDULES: dict[str, Callable[..., StepFn]] = {
    "codelab_ramp": codelab_ramp,
    "warmup_cosine": warmup_cosine,
    "constant": constant,
}

# Each schedule's peak (or only) rate: training sets it from ``learning_rate``.
RATE_OPTIONS = {"codelab_ramp": "max_lr", "warmup_cosine": "peak_lr", "constant": "lr"}


@keras.saving.register_keras_serializable(package="petal")
class StepSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """A named schedule from :data:`SCHEDULES` as a Keras ``LearningRateSchedule``.

    Serialises as its name and keyword arguments, so a compiled model saved to ``.keras``
    reloads (safe mode included) once this module is imported.
    """

    def __init__(self, name: str, **kwargs):
        if name not in SCHEDULES:
            raise PetalError(
                f"Unknown learning-rate schedule {name!r}. Choose one of: "
                f"{', '.join(SCHEDULES)}. Received: schedule={name!r}"
            )
        _check_options(name, kwargs)
        # NumPy scalars as Python numbers: the config is saved as JSON with the model.
        kwargs = {key: _plain_number(value) for key, value in kwargs.items()}
        self.schedule_name = name
        self.kwargs = dict(kwargs)
        try:
            self._fn = SCHEDULES[name](**kwargs)
        except TypeError as err:
            raise PetalError(
                f"Bad arguments for schedule {name!r}: {err}. Received: {kwargs}"
            ) from err

    def __call__(self, step):
        return self._fn(step)

    def get_config(self) -> dict:
        return {"name": self.schedule_name, **self.kwargs}

    @classmethod
    def from_config(cls, config: dict) -> StepSchedule:
        config = dict(config)
        return cls(config.pop("name"), **config)


def _check_options(name: str, kwargs: dict) -> None:
    """One line for an option the schedule does not take, or a value of the wrong kind (a
    string where a rate goes would otherwise fail as Python's comparison error)."""
    params = inspect.signature(SCHEDULES[name]).parameters
    for key, value in kwargs.items():
        if key not in params:
            raise PetalError(
                f"Schedule {name!r} takes no option {key!r}; {_options_line(name)}. "
                f"Received: {key}={value!r}"
            )
        if params[key].annotation in ("bool", bool):
            if not isinstance(value, bool):
                raise PetalError(
                    f"Schedule option {key} must be true or false. Received: {key}={value!r}"
                )
            continue
        if value is None and params[key].default is None:
            continue
        if not _is_number(value):
            raise PetalError(
                f"Schedule option {key} must be a finite number. Received: {key}={value!r}"
            )
        if value < 0:
            raise PetalError(f"Schedule option {key} must be >= 0. Received: {key}={value!r}")


def _plain_number(value):
    """A NumPy integer or float as a Python ``int`` or ``float``; anything else as it is."""
    if not _is_number(value) or isinstance(value, int | float):
        return value
    return int(value) if isinstance(value, numbers.Integral) else float(value)


def _options_line(name: str) -> str:
    """The options of schedule ``name`` one may choose, apart from the length of an epoch and
    the rate, which training sets (from the data and ``learning_rate``)."""
    rate = RATE_OPTIONS[name]
    parameters = inspect.signature(SCHEDULES[name]).parameters
    chosen = [p for p in parameters if p not in ("steps_per_epoch", rate, "replicas")]
    where = " when that is set" if name == "codelab_ramp" else ""
    besides = f"its rate {rate} (petal train sets it from learning_rate{where})"
    if "replicas" in parameters:
        besides += " and replicas (petal train sets them from its strategy)"
    if not chosen:
        return f"it has no options besides {besides}"
    return f"its options are: {', '.join(chosen)}, besides {besides}"


def build_schedule(name: str, **kwargs) -> StepSchedule:
    """A :class:`StepSchedule` by name, e.g. ``build_schedule("constant", lr=1e-3)``."""
    return StepSchedule(name, **kwargs)


def per_epoch_values(schedule: StepFn, epochs: int, steps_per_epoch: int) -> list[float]:
    """The rate at the first step of each epoch (for logs, plots and tests)."""
    return [float(schedule(e * steps_per_epoch)) for e in range(epochs)]
