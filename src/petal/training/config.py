"""Typed training configuration and the named presets derived from its default.

A run is described by one :class:`TrainConfig`. It is resolved in a fixed order,
later steps winning:

1. a named preset (``default`` when none is given),
2. a JSON config file (any subset of the fields, optionally naming a ``preset``),
3. explicit command-line flags (``--epochs``, ``--model``, ...),
4. ``--set key=value`` overrides (``value`` is parsed as JSON when it parses, else as a
   Python number (``.001``, ``+1``), else taken as a string;
   ``schedule_options.warmup_epochs=2`` sets one dict key).

The resolved config is saved next to the results as ``config.json`` and can be
fed back with ``--config``. Every preset is a function registered with
:func:`register_preset`; its docstring says what it reproduces and how long it takes.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import json
import math
import os
import re
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from petal.data.folders import expand_home, parse_classes, refuse_url
from petal.errors import MAX_COUNT, PetalError, first_line, is_int_at_least
from petal.jsonfile import write_json

OPTIMIZERS = ("adam", "adamw", "sgd", "rmsprop")
SCHEDULES = ("constant", "codelab_ramp", "warmup_cosine")
FINE_TUNE_MODES = ("all", "head_then_all")
CLASS_WEIGHTS = (None, "balanced")
NORMALIZATIONS = (None, "unit", "symmetric", "imagenet", "raw")


@dataclass
class TrainConfig:
    """Every knob of a training run. Sizes are in pixels, durations in epochs.

    Attributes:
        preset: name of the preset this config was derived from (informational).
        data: a petal records folder (or any source the input pipeline accepts).
        classes: class names in index order, comma-separated (``"daisy,roses"``; a JSON
            list too), for codelab shards (every class index their records hold; needed
            when the shards name no classes) or an image folder (the class folders to
            train on, in this order); ``None``: a records folder's manifest's, or found.
        model: registered model name (``petal models`` lists them).
        model_options: extra keyword arguments for ``create_model``. A preset's are for
            the preset's model: :func:`load_config` with another ``model`` drops them (as
            :meth:`replace` drops any config's), keeping any ``model_options.KEY`` given,
            unless ``model_options`` is given.
        weights: ``None`` (random init), ``"imagenet"`` or a local weights file.
        image_size: square size the model sees at evaluation (and training, unless
            ``train_image_size`` is set); ``None`` uses the records' size, else the
            model's default size.
        train_image_size: train on random resized crops of this size (needs the ``crop``
            augmentation and a model built with ``any_size``) while evaluating at
            ``image_size``: cheaper epochs, and objects in crops appear at about the scale
            they have in full validation images. ``None``: same as ``image_size``.
        normalization: pixel scaling; ``None`` uses the model's own (``model_info``). A
            preset's value is for the preset's model: :func:`load_config` with another
            ``model`` uses that model's own (as :meth:`replace` does for any config's),
            unless ``normalization`` is given too.
        epochs: total epochs, head-only warm-up epochs included.
        steps_per_epoch: ``None`` means train images // global batch.
        batch_size: batch per replica; the global batch is this times the replicas.
        single_device_batch_size: global batch used instead when there is only one
            replica (the codelab trains with 32 on one GPU but 16 x 8 on a TPU).
        pod_batch_size: batch per replica used instead on more than 8 replicas (a TPU
            pod: the codelab's Xception trains with 8 x replicas there); ``None``:
            ``batch_size``. Setting ``batch_size`` drops a preset's.
        eval_batch_size: global validation batch; ``None`` uses the training batch.
        optimizer: one of ``adam``, ``adamw``, ``sgd``, ``rmsprop``.
        learning_rate: peak learning rate (at ``lr_reference_batch`` when that is set);
            ``None`` only with ``codelab_ramp``: the codelab's rule, 5e-5 x replicas
            (2e-4 on one replica, 2e-5 x replicas on more than 8).
        lr_reference_batch: when set, ``learning_rate`` is scaled linearly by
            global batch / this (``None``: no scaling); refused with a null
            ``learning_rate`` (the codelab's rule follows the replicas by itself).
        weight_decay: decoupled weight decay (adamw, sgd), of every variable (BatchNorm scales
            and biases too, where timm leaves them out).
        momentum: sgd (Nesterov) and rmsprop momentum (a resumed run keeps it zero or non-zero).
        clipnorm: per-variable gradient-norm clipping (``None``: off).
        schedule: learning-rate schedule (``constant``, ``codelab_ramp``, ``warmup_cosine``),
            applied per step.
        schedule_options: keyword arguments of the schedule, durations in epochs.
        label_smoothing: categorical cross-entropy label smoothing.
        augment: training augmentation recipe understood by the input pipeline.
        cache: where to cache the decoded training images: ``"auto"`` (RAM when they fit,
            else local disk: the temporary folder, not cached where that folder is in memory
            too, as a tmpfs ``/tmp`` is), ``"ram"`` (true), ``"disk"`` (a temporary file,
            removed when the run ends, or by the next run's once its run was killed; a
            warning where the temporary folder is in memory) or
            ``"off"`` (false).
        shuffle_buffer: training shuffle buffer, in images.
        class_weight: ``None`` or ``"balanced"`` (weights inversely proportional to
            the training counts, mean 1).
        fine_tune: ``all`` (every layer trainable from the start, the codelab's way) or
            ``head_then_all`` (train the new head on a frozen backbone for
            ``head_epochs``, then unfreeze and recompile at the schedule's peak rate times
            ``fine_tune_lr_factor``; BatchNorm stays in inference mode unless
            ``model_options.bn_frozen`` is false). Needs a model with a pretrained backbone.
        head_epochs: head-only warm-up epochs for ``head_then_all``.
        fine_tune_lr_factor: ``head_then_all`` only (refused with ``all``): multiplier of
            the peak rate once the backbone is unfrozen
            (``learning_rate``'s, or with ``codelab_ramp`` and no ``learning_rate`` the
            codelab's rule's).
        strategy: ``auto``, ``tpu``, ``mirrored``, ``multi-worker``, ``one-device`` or ``cpu``.
        precision: ``auto``, ``float32``, ``mixed_float16`` or ``mixed_bfloat16``.
        jit_compile: XLA compilation for the train step (``"auto"`` lets Keras decide).
        steps_per_execution: train steps per compiled call (higher helps TPUs).
        fused_batch_norm: train BatchNormalization layers with TensorFlow's fused kernel
            (same statistics and weights as Keras' own; 1.4-1.6x faster steps for the codelab's
            squeezenet on CPU). Off: Keras' composite ops.
        seed: seeds weights init, shuffling and augmentation.
        deterministic: fixed input order and augmentation draws (reproducible runs, and a
            resumed run trains on the batches the uninterrupted one would have, except for
            records ``skip_corrupt`` drops and data read over http; the input pipeline
            is slower). Off by default: order-altering optimisations on.
        skip_corrupt: skip corrupt records with a warning and a count instead of stopping
            (a CRC failure loses the rest of that shard: TFRecord readers cannot resync).
        tensorboard: write TensorBoard logs under ``WORKDIR/tensorboard``.
    """

    preset: str = "default"
    data: str | None = None
    classes: str | None = None
    model: str = "squeezenet"
    model_options: dict = field(default_factory=dict)
    weights: str | None = None
    image_size: int | None = None
    train_image_size: int | None = None
    normalization: str | None = None
    epochs: int = 35
    steps_per_epoch: int | None = None
    batch_size: int = 16
    single_device_batch_size: int | None = None
    pod_batch_size: int | None = None
    eval_batch_size: int | None = None
    optimizer: str = "adam"
    learning_rate: float | None = 1e-3
    lr_reference_batch: int | None = None
    weight_decay: float = 0.0
    momentum: float = 0.9
    clipnorm: float | None = None
    schedule: str = "constant"
    schedule_options: dict = field(default_factory=dict)
    label_smoothing: float = 0.0
    augment: str = "codelab"
    cache: str | bool = "auto"
    shuffle_buffer: int = 2048
    class_weight: str | None = None
    fine_tune: str = "all"
    head_epochs: int = 0
    fine_tune_lr_factor: float = 0.1
    strategy: str = "auto"
    precision: str = "auto"
    jit_compile: str | bool = "auto"
    steps_per_execution: int = 1
    fused_batch_norm: bool = True
    seed: int = 42
    deterministic: bool = False
    skip_corrupt: bool = False
    tensorboard: bool = True

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def replace(self, **changes: Any) -> TrainConfig:
        """A copy with ``changes`` (field names, or ``"model_options.KEY"`` through
        ``**{...}``) applied. Another ``model`` drops this config's ``normalization`` and
        ``model_options`` (chosen for its model) unless given too, as ``--model`` does to a
        preset's (:func:`load_config`, which keeps those of a ``base`` config)."""
        return _for_model(self, apply_overrides(self, changes), changes)

    def validate(self) -> TrainConfig:
        """Check values that need no TensorFlow; raises PetalError naming the field.

        Converts in place what :func:`apply_overrides` converts (``"false"`` to false,
        ``3.0`` to 3, a list of class names to one string) and returns the config.
        """
        # Types first (a config built in Python skips apply_overrides' checks): a string
        # where a number goes would otherwise fail below as Python's comparison TypeError.
        # The converted value is kept: the string "false" is true to an `if`.
        hints = typing.get_type_hints(TrainConfig)
        for item in dataclasses.fields(self):
            value = _coerce(item.name, getattr(self, item.name), hints[item.name], "")
            setattr(self, item.name, value)
        _check_positive(self, "epochs", "batch_size", "shuffle_buffer", "steps_per_execution")
        _check_positive(
            self,
            "steps_per_epoch",
            "single_device_batch_size",
            "pod_batch_size",
            "eval_batch_size",
            "image_size",
            "train_image_size",
            "lr_reference_batch",
            allow_none=True,
        )
        if isinstance(self.augment, str) and not self.augment.strip():
            # (--set augment= with its value left out trained with none, without a word.)
            raise PetalError(
                "augment is empty; pass a recipe (e.g. 'codelab' or 'flip+saturation'), or "
                f"'none' for no augmentation. Received: augment={self.augment!r}"
            )
        for key, wanted in _FINITE.items():
            value = getattr(self, key)
            if isinstance(value, float) and not math.isfinite(value):
                # 1e400 parses as inf, which read as meeting "must be > 0".
                raise PetalError(f"{key} must be a finite number {wanted}. Received: {key}={value}")
        if self.learning_rate is None:
            preset = _PRESETS.get(self.preset)
            leaves = preset is not None and preset().learning_rate is None
            by = f" (preset {self.preset!r} leaves it so)" if leaves else ""
            if self.schedule != "codelab_ramp":
                raise PetalError(
                    f"learning_rate is null{by}: the peak follows the codelab's rule for the "
                    "replicas, which only schedule='codelab_ramp' has; set a rate for "
                    f"schedule={self.schedule!r} (--set learning_rate=2e-4, the rule's on one "
                    "device) or keep schedule='codelab_ramp'. "
                    f"Received: learning_rate=None, schedule={self.schedule!r}"
                )
            if self.lr_reference_batch is not None:
                # _peak_lr scales learning_rate only; the codelab's rule follows the replicas.
                raise PetalError(
                    f"lr_reference_batch scales learning_rate, which is null{by}: the codelab's "
                    "rule follows the replicas by itself: drop it (--set lr_reference_batch=null; "
                    "the rule's rate stays), or set the rate at that batch (--set "
                    "learning_rate=R, then scaled by global batch / lr_reference_batch). Received: "
                    f"learning_rate=None, lr_reference_batch={self.lr_reference_batch}"
                )
        elif not 0 < self.learning_rate < math.inf:
            raise PetalError(
                f"learning_rate must be > 0. Received: learning_rate={self.learning_rate}"
            )
        if not 0 <= self.seed < 2**32:  # Keras' and NumPy's seeds are 32-bit
            raise PetalError(
                f"seed must be a whole number from 0 to {2**32 - 1}. Received: seed={self.seed}"
            )
        reserved = {"name": "model", "num_classes": "the data's classes",
                    "image_size": "image_size", "weights": "weights", "log": None}  # fmt: skip
        for key in sorted(set(self.model_options or {}) & set(reserved)):
            where = reserved[key]
            raise PetalError(
                f"model_options.{key} is not a model option"
                + (f": it comes from {where} (set that instead)" if where else "")
                + f". Received: model_options={self.model_options!r}"
            )
        if not 0.0 <= self.momentum <= 1.0:
            raise PetalError(f"momentum must be in [0, 1]. Received: momentum={self.momentum}")
        if not 0.0 <= self.weight_decay < math.inf:
            raise PetalError(
                f"weight_decay must be >= 0 (0: none). Received: weight_decay={self.weight_decay}"
            )
        if self.weight_decay and self.optimizer in ("adam", "rmsprop"):
            raise PetalError(
                f"optimizer {self.optimizer!r} takes no weight decay (it would be ignored): use "
                "optimizer='adamw' (or 'sgd'), or weight_decay=0. Received: "
                f"optimizer={self.optimizer!r}, weight_decay={self.weight_decay}"
            )
        if self.clipnorm is not None and not 0.0 < self.clipnorm < math.inf:
            raise PetalError(
                f"clipnorm must be > 0, or null for no clipping. Received: clipnorm={self.clipnorm}"
            )
        if not 0.0 <= self.label_smoothing < 1.0:
            raise PetalError(
                f"label_smoothing must be in [0, 1). Received: label_smoothing={self.label_smoothing}"
            )
        _check_choice("optimizer", self.optimizer, OPTIMIZERS)
        _check_choice("schedule", self.schedule, SCHEDULES)
        _check_choice("fine_tune", self.fine_tune, FINE_TUNE_MODES)
        _check_choice("class_weight", self.class_weight, CLASS_WEIGHTS)
        _check_choice("normalization", self.normalization, NORMALIZATIONS)
        if self.fine_tune == "head_then_all":
            factor = self.fine_tune_lr_factor
            if not (isinstance(factor, (int, float)) and 0 < factor < float("inf")):
                raise PetalError(
                    "fine_tune_lr_factor (the learning rate's multiplier once the backbone is "
                    f"unfrozen) must be a positive number. Received: fine_tune_lr_factor={factor!r}"
                )
            if not 0 < self.head_epochs < self.epochs:
                raise PetalError(
                    "fine_tune='head_then_all' needs 0 < head_epochs < epochs. "
                    f"Received: head_epochs={self.head_epochs}, epochs={self.epochs}"
                )
            if not self.weights:
                raise PetalError(
                    "fine_tune='head_then_all' warms up a new head on pretrained weights; "
                    "set weights ('imagenet' or a file) or use fine_tune='all'. Received: weights=None"
                )
            if (self.model_options or {}).get("backbone_trainable", True) is False:
                # The full phase unfreezes the backbone: the option would be overridden.
                raise PetalError(
                    "fine_tune='head_then_all' unfreezes the backbone after head_epochs, which "
                    "model_options.backbone_trainable=false forbids: drop that option, or use "
                    "fine_tune='all' to train the head alone on a frozen backbone. Received: "
                    "model_options.backbone_trainable=False"
                )
        elif self.head_epochs:
            raise PetalError(
                "head_epochs is only used with fine_tune='head_then_all'. "
                f"Received: head_epochs={self.head_epochs}, fine_tune={self.fine_tune!r}"
            )
        elif self.fine_tune_lr_factor != TrainConfig.fine_tune_lr_factor:
            # Only the full phase of head_then_all recompiles at a factor of the peak.
            raise PetalError(
                "fine_tune_lr_factor is only used with fine_tune='head_then_all' (the rate once "
                "the backbone is unfrozen): drop it (--set fine_tune_lr_factor="
                f"{TrainConfig.fine_tune_lr_factor}, the default), or set "
                "fine_tune=head_then_all and head_epochs. Received: "
                f"fine_tune_lr_factor={self.fine_tune_lr_factor}, fine_tune={self.fine_tune!r}"
            )
        if self.classes is not None:
            parse_classes(self.classes)  # names, none twice
        refuse_url(self.weights, "weights", "weights files", reads=True, folder=False)
        for name, expected in _EXPECTED.items():
            value = getattr(self, name)
            word = value.lower() if isinstance(value, str) else value
            if word not in (True, False, *_MODES.get(name, ("auto",))):
                raise PetalError(f"{name} must be {expected}. Received: {name}={value!r}")
        return self


def _check_positive(cfg: TrainConfig, *names: str, allow_none: bool = False) -> None:
    for name in names:
        value = getattr(cfg, name)
        if value is None and allow_none:
            continue
        if not is_int_at_least(value, 1) or value > MAX_COUNT:
            # A count past int64 was a traceback from TensorFlow's tensor conversion.
            raise PetalError(
                f"{name} must be a positive integer (at most {MAX_COUNT}). "
                f"Received: {name}={value!r}"
            )


def _check_choice(name: str, value: Any, choices: Iterable[Any]) -> None:
    choices = tuple(choices)
    if value not in choices:
        shown = ", ".join("null" if c is None else str(c) for c in choices)
        words = [c for c in choices if isinstance(c, str)]
        close = difflib.get_close_matches(str(value).lower(), words, n=1, cutoff=0.6)
        meant = f" (did you mean {close[0]!r}?)" if close else ""
        raise PetalError(
            f"Unknown {name} {value!r}{meant}; valid: {shown}. Received: {name}={value!r}"
        )


# --- presets ---------------------------------------------------------------------------------

PresetFn = Callable[[], TrainConfig]
_PRESETS: dict[str, PresetFn] = {}


def register_preset(name: str) -> Callable[[PresetFn], PresetFn]:
    """Register a function returning a :class:`TrainConfig` under ``name``."""

    def wrap(fn: PresetFn) -> PresetFn:
        _PRESETS[name] = fn
        return fn

    return wrap


def list_presets() -> list[str]:
    return list(_PRESETS)


def preset_doc(name: str) -> str:
    """First paragraph of a preset's docstring (what it reproduces, how long it takes)."""
    doc = (_get_preset_fn(name).__doc__ or "").strip()
    return " ".join(doc.split("\n\n")[0].split())


def get_preset(name: str) -> TrainConfig:
    """A fresh copy of the named preset.

    Raises:
        PetalError: for an unknown name, listing the valid ones.
    """
    cfg = _get_preset_fn(name)()
    cfg.preset = name
    return cfg


def _get_preset_fn(name: str, where: str = "") -> PresetFn:
    if not isinstance(name, str) or name not in _PRESETS:  # (a JSON list: no dict key)
        raise PetalError(
            f"Unknown preset {name!r}{where}; valid presets: {', '.join(_PRESETS)}. "
            f"Received: preset={name!r}"
        )
    return _PRESETS[name]


@register_preset("default")
def default() -> TrainConfig:
    """The defaults every preset starts from: squeezenet, Adam 1e-3, 35 epochs, flip+saturation.

    The recipe of ``codelab-squeezenet`` but with a plain 16-per-replica batch (no 32 on one
    device), the records' own image size, the cache chosen by size (``auto``) and a shuffle
    buffer of 2048 (the codelab's squeezenet: 2000).
    """
    return TrainConfig()


@register_preset("codelab-squeezenet")
def codelab_squeezenet() -> TrainConfig:
    """Codelab part 4's squeezenet from scratch: 192px, Adam 1e-3 constant, 35 epochs.

    Reproduces ``07_Keras_Flowers_TPU_squeezenet.ipynb`` (final val accuracy 0.80-0.81 on
    TPU). Batch 16 x replicas (128 on a TPU v3-8), 32 on one device; random flip and
    saturation(0, 2); decoded images cached in RAM. About 72 minutes for 35 epochs on the
    project's 2-core CPU in bfloat16 (the issue's faithful re-run: 0.789 mean-of-last-5);
    a few seconds per epoch on a TPU v3-8.
    """
    return dataclasses.replace(
        default(),
        model="squeezenet",
        image_size=192,
        epochs=35,
        batch_size=16,
        single_device_batch_size=32,
        optimizer="adam",
        learning_rate=1e-3,
        schedule="constant",
        augment="codelab",
        cache=True,
        shuffle_buffer=2000,
    )


@register_preset("codelab-xception")
def codelab_xception() -> TrainConfig:
    """Codelab part 4's fine-tuned Xception: ImageNet weights, 331px, 12 epochs, ramp schedule.

    Reproduces ``07_Keras_Flowers_TPU_xception_fine_tuned_best.ipynb`` (mean-of-last-5 val
    accuracy 0.96-0.97). All layers trainable from epoch 1 (BatchNorm too, as the codelab);
    Adam with the codelab's ramp 1e-5 -> 5e-5 x replicas over 5 epochs (2e-4 on one
    replica) then x0.8 per epoch (constant within an epoch, as its per-epoch callback); batch
    16 x replicas. On a TPU pod (more than 8 replicas) the codelab's pod recipe: batch 8 x
    replicas, peak 2e-5 x replicas, a 7-epoch ramp (unless batch_size, learning_rate or
    schedule_options.rampup_epochs / max_lr are set); the notebook also gives it to 2-7
    replicas, where petal keeps 16 per replica, a peak of max(2e-4, 5e-5 x replicas) and 5
    epochs of ramp (see :func:`petal.training.schedules.codelab_max_lr`); flip+saturation; no
    cache; pixels in [0, 1] as the codelab feeds them, although Keras' Xception weights were
    trained on [-1, 1] (``--set normalization=symmetric`` matches them; another ``--model``
    gets its own normalization unless ``--set normalization=...`` is given). Needs the
    ImageNet weights (downloaded once) and records at 331px. About 2-3 minutes on a TPU
    v3-8 (109-165 s in the codelab); hours on a 2-core CPU.
    """
    return dataclasses.replace(
        default(),
        model="xception",
        weights="imagenet",
        image_size=331,
        normalization="unit",  # the codelab's /255, not the weights' [-1, 1]
        epochs=12,
        batch_size=16,
        pod_batch_size=8,
        optimizer="adam",
        learning_rate=None,
        schedule="codelab_ramp",
        schedule_options={  # rampup_epochs: the codelab's for the replicas (5, 7 on a pod)
            "start_lr": 1e-5,
            "min_lr": 1e-5,
            "sustain_epochs": 0,
            "decay": 0.8,
        },
        fine_tune="all",
        augment="codelab",
        cache=False,
        shuffle_buffer=2048,
    )


@register_preset("codelab-convnet")
def codelab_convnet() -> TrainConfig:
    """Codelab part 3's plain six-conv convnet: 192px, batch 16 x replicas (32 on one
    device), Adam 1e-3, 20 epochs.

    Reproduces ``07_Keras_Flowers_TPU_solution.ipynb`` (final val accuracy 0.704, 293,233
    parameters). No augmentation, no BatchNorm. Batch 16 x replicas (128 on an 8-core TPU,
    where the codelab ran it), 32 on one device, as the notebook's ``if tpu: ... else:
    BATCH_SIZE = 32`` picks it (``--batch-size N`` replaces both). 2-3 s per epoch on a
    TPU.
    """
    return dataclasses.replace(
        default(),
        model="convnet",
        image_size=192,
        epochs=20,
        batch_size=16,
        single_device_batch_size=32,
        optimizer="adam",
        learning_rate=1e-3,
        schedule="constant",
        augment="none",
        cache=True,
    )


@register_preset("codelab-dense")
def codelab_dense() -> TrainConfig:
    """Codelab part 3's dense baseline (Flatten-500-50-N): 192px, batch 16 x replicas (32 on
    one device), 20 epochs.

    The "no convolutions" starting point of the codelab: it overfits and stays near 0.4-0.5
    validation accuracy. No augmentation.
    """
    return dataclasses.replace(codelab_convnet(), model="dense")


@register_preset("quick")
def quick() -> TrainConfig:
    """CPU demo: squeezenet at 96px for 5 epochs, Adam 3e-3 with half an epoch of warm-up, cosine.

    For ``petal demo``. On the flowers set (2,526 training images, 192px records) it reached
    0.69 validation accuracy (5 classes: chance is 0.20) in 253 s wall on this project's
    shared 2-core CPU under load (59 img/s in bfloat16), 0.71 in another run. Flip +
    saturation; decoded images cached in RAM.
    """
    return dataclasses.replace(
        default(),
        model="squeezenet",
        image_size=96,
        epochs=5,
        batch_size=32,
        optimizer="adam",
        learning_rate=3e-3,
        schedule="warmup_cosine",
        schedule_options={"warmup_epochs": 0.5},
        augment="codelab",
        cache=True,
    )


@register_preset("squeezenet-plus")
def squeezenet_plus() -> TrainConfig:
    """petal's own from-scratch recipe: the codelab's squeezenet, trained better and cheaper.

    The same 120,613 parameters as ``codelab-squeezenet`` (fire modules, BatchNorm), but a
    stride-2 stem so every fire module runs on a quarter of the pixels: the codelab's network
    spends most of its time on memory-bound 24-48 channel layers at full 192px resolution,
    and this is about 2.6x faster per image on a CPU. Trained on 160px random resized crops of
    the 192px records and evaluated on the full 192px images (FixRes: objects in a crop,
    resized to 160px, appear at about the scale they have in the full image), for 60 epochs
    with AdamW, a 3-epoch warm-up and cosine decay (the late epochs settle instead of jumping
    around, which is what a mean-of-last-5 measures), label smoothing 0.1, flip + saturation
    as the codelab. Target: mean-of-last-5 val accuracy >= 0.82 in no more wall time than
    ``codelab-squeezenet`` (measured in benchmarks/README.md).
    """
    return dataclasses.replace(
        codelab_squeezenet(),
        model="squeezenet",
        model_options={"any_size": True, "stem_stride": 2},
        train_image_size=160,
        epochs=60,
        optimizer="adamw",
        learning_rate=2e-3,
        weight_decay=0.05,
        schedule="warmup_cosine",
        schedule_options={"warmup_epochs": 3},
        label_smoothing=0.1,
        augment="crop+flip+saturation",
    )


# --- loading: preset < config file < flags < --set ---------------------------------------


def load_config(
    preset: str | None = None,
    config_file: str | Path | None = None,
    overrides: Iterable[str] = (),
    base: TrainConfig | None = None,
    **flags: Any,
) -> TrainConfig:
    """Resolve a config from a preset, a JSON file, flags and ``key=value`` overrides.

    Args:
        preset: preset name; ``None`` uses ``base``, else the file's ``preset`` key, else
            ``default``. Refused when the file names another.
        config_file: JSON object of TrainConfig fields (unknown keys are refused).
        overrides: ``key=value`` strings, applied last.
        base: the starting config when no preset is named (``--resume`` passes the saved one).
        **flags: explicit field values; ``None`` values are ignored (flag not given).

    Returns:
        The validated config.
    """
    file_values: dict = {}
    if config_file is not None:
        file_values = read_config_file(config_file)
        # A run's own config.json: its resolved facts (classes, counts) are not fields.
        file_values.pop("resolved", None)
    file_preset = file_values.pop("preset", None)
    if base is not None and not preset and file_preset not in (None, base.preset):
        raise PetalError(
            f"Config file {config_file} names preset {file_preset!r}, but the run being "
            f"resumed is {base.preset!r}: a preset starts a new run (drop --resume and pass "
            "--overwrite or another --workdir), or drop the file's preset key to change fields "
            "only."
        )
    if preset and file_preset not in (None, preset):
        # The file's fields are its preset's changes: on another preset, the run trained
        # the file's values under the other's name.
        raise PetalError(
            f"Config file {config_file} names preset {file_preset!r}, but --preset is "
            f"{preset!r}: drop --preset to run the file's, or edit the file's preset key "
            "(drop it to change fields of --preset's only)."
        )
    if not preset and file_preset is not None:
        _get_preset_fn(file_preset, f" (from {config_file})")  # the file to fix
    name = preset or file_preset
    from_preset = base is None or bool(preset)
    cfg = get_preset(name or "default") if from_preset else base
    chosen = cfg  # the preset, whose normalization (if pinned) suits its own model
    flag_values = {k: v for k, v in flags.items() if v is not None}
    cfg = apply_overrides(cfg, file_values, source=str(config_file))
    cfg = apply_overrides(cfg, flag_values, source="flag")
    values = parse_overrides(overrides)
    if "preset" in values:
        raise PetalError(
            "preset is chosen with --preset NAME, which sets every field; --set preset=... "
            f"would only rename the run. Received: preset={values['preset']!r}"
        )
    cfg = apply_overrides(cfg, values, source="--set")
    keys = [*file_values, *flag_values, *values]
    if from_preset:
        cfg = _for_model(chosen, cfg, keys)
    return cfg.validate()


def _for_model(before: TrainConfig, after: TrainConfig, keys: Iterable[str]) -> TrainConfig:
    """``after``, where its model is not ``before``'s, without what ``before`` chose for its
    own model and ``keys`` (the fields given) did not set again."""
    if after.model == before.model:
        return after
    given = {key.partition(".")[0] for key in keys}
    # A preset's pixel scaling is chosen for its model (codelab-xception's [0, 1]): another
    # backbone's weights learned their own, and would see inputs out of their range.
    if before.normalization is not None and "normalization" not in given:
        after = dataclasses.replace(after, normalization=None)
    # Its model options too (squeezenet-plus's stem_stride): another model may not take
    # them. Those given one by one (model_options.KEY) are kept.
    if "model_options" not in keys:
        mine = {key.partition(".")[2] for key in keys if key.startswith("model_options.")}
        options = {k: v for k, v in after.model_options.items() if k in mine}
        after = dataclasses.replace(after, model_options=options)
    return after


def read_config_file(
    path: str | Path, fix: str = "Pass a JSON file of TrainConfig fields (UTF-8 text)."
) -> dict:
    """The JSON object of a config file; ``fix`` ends the error for a file that is no JSON."""
    refuse_url(path, "Config file", "config files", reads=True, folder=False)
    path = Path(expand_home(path))
    if path.is_dir():
        raise PetalError(f"Config file {path} is a directory, not a file. {fix}")
    if not path.is_file():
        raise PetalError(f"Config file not found: {path}. Pass a JSON file of TrainConfig fields.")
    try:
        values = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise PetalError(
            f"Config file {path} is not valid JSON: {first_line(err)[:200]}. {fix}"
        ) from None
    except OSError as err:
        raise PetalError(f"Config file {path} cannot be read: {first_line(err)}.") from None
    if not isinstance(values, dict):
        kinds = {list: "a list", str: "a string", bool: "true or false", type(None): "null"}
        kind = kinds.get(type(values), "a number")
        raise PetalError(
            f"Config file {path} holds {kind}, not a JSON object of TrainConfig fields. {fix}"
        )
    return values


def parse_overrides(items: Iterable[str]) -> dict:
    """``["epochs=3", "schedule_options.warmup_epochs=1"]`` -> ``{"epochs": 3, ...}``.

    Values are parsed as JSON when they parse (numbers, true/false, null, lists,
    objects), then as Python's numbers (``.001``, ``5.``, ``+1``, ``1_000``, which JSON
    refuses), otherwise taken as plain strings. A number given to a field that names a path
    or classes (``data=2024``) is taken as the text it is written as.
    """
    if isinstance(items, str):
        items = [items]  # one override, not a sequence of its characters
    out: dict = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise PetalError(f"--set expects key=value. Received: {item!r}")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = _python_number(raw)
        if key in _TEXT_KEYS and isinstance(value, int | float) and not isinstance(value, bool):
            value = raw.strip()  # data=2024: a folder named 2024, not the number
        out[key] = value
    return out


# Fields that name a path or classes: a value that parses as a number is the name it spells.
_TEXT_KEYS = ("data", "weights", "classes")  # (cache=1 stays refused: no mode)


# A number as Python writes it (int() or float() reads it), without float()'s words (nan, inf).
_PYTHON_NUMBER = re.compile(r"\s*[+-]?(\d[\d_]*\.?[\d_]*|\.\d[\d_]*)([eE][+-]?\d[\d_]*)?\s*")


def _python_number(raw: str) -> int | float | str:
    """``raw`` as an int or float when it is one in Python's syntax, else ``raw``."""
    if not _PYTHON_NUMBER.fullmatch(raw):
        return raw
    for number in (int, float):
        try:
            return number(raw)
        except ValueError:  # "5." is no int; "1__0" neither number
            continue
    return raw


def apply_overrides(cfg: TrainConfig, values: Mapping[str, Any], source: str = "") -> TrainConfig:
    """A copy of ``cfg`` with ``values`` applied; dotted keys set one key of a dict field.

    Setting ``batch_size`` drops a preset's ``single_device_batch_size`` and
    ``pod_batch_size``, and another
    ``schedule`` starts from empty ``schedule_options``, unless ``values`` sets those too.
    ``source`` names where ``values`` come from in errors: ``"--set"``, ``"flag"`` or a
    config file's path.
    """
    hints = typing.get_type_hints(TrainConfig)
    data = cfg.to_dict()
    where = f" (from {source})" if source else ""
    given = {key.partition(".")[0] for key in values}
    # A batch size chosen replaces a preset's one-device batch; another schedule does not
    # inherit the old one's options (the preset's warm-up is no option of "constant").
    for other in ("single_device_batch_size", "pod_batch_size"):
        if "batch_size" in given and other not in given:
            data[other] = None
    if values.get("schedule", cfg.schedule) != cfg.schedule and "schedule_options" not in values:
        data["schedule_options"] = {}  # (its keys given one by one apply to the new one)
    for key, value in values.items():
        name, _, sub = key.partition(".")
        if name not in hints:
            meant = _field_of_option(name.lower())
            close = [meant] if meant else difflib.get_close_matches(
                name.lower(), hints, n=1, cutoff=0.6
            )
            guess = f"; did you mean {close[0]!r}?" if close else "."
            if source not in ("", "flag", "--set"):  # a config file: fixed in it
                guess += (" Rename it in that file, or remove it." if close
                          else " Remove it from that file, or rename it to a valid key.")
            raise PetalError(
                f"Unknown config key {name!r}{where}{guess} Valid keys: {', '.join(hints)}. "
                f"Received: {key}={value!r}"
            )
        if sub:
            if hints[name] is not dict:
                raise PetalError(
                    f"{name} is not a dict; use {name}=VALUE. Received: {key}={value!r}"
                )
            data[name] = {**data[name], sub: value}
        else:
            data[name] = _coerce(name, value, hints[name], where)
    return TrainConfig(**data)


def _field_of_option(key: str) -> str | None:
    """The key meant by ``key``, a schedule's or a model's option given as a field:
    ``schedule_options.KEY`` or ``model_options.KEY`` (``warmup_epochs`` pointed to
    ``head_epochs``), or ``learning_rate`` for a schedule's rate, which training sets from it."""
    # Imported on this error only: they import Keras, which the rest of this module does not.
    from petal.models import list_models
    from petal.models.registry import model_options
    from petal.training.schedules import RATE_OPTIONS, SCHEDULES

    if key in RATE_OPTIONS.values():
        return "learning_rate"
    for schedule in SCHEDULES.values():
        if key != "steps_per_epoch" and key in inspect.signature(schedule).parameters:
            return f"schedule_options.{key}"
    if any(key in model_options(model) for model in list_models()):
        return f"model_options.{key}"
    return None


# The fields of a few named choices, which _coerce reads in any case.
_CHOICES = {
    "optimizer": OPTIMIZERS,
    "schedule": SCHEDULES,
    "fine_tune": FINE_TUNE_MODES,
    "class_weight": CLASS_WEIGHTS,
    "normalization": NORMALIZATIONS,
}


def _coerce(name: str, value: Any, hint: Any, where: str) -> Any:
    """Check ``value`` against the field's type, converting the lossless cases."""
    value = _plain(value)
    options = typing.get_args(hint) if _is_union(hint) else (hint,)
    if bool in options and isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"  # Python's True, or TRUE: true meant, not a string
    for option in options:
        if option is type(None) and value is None:
            return None
        if option is bool and isinstance(value, bool):
            return value
        if option is int and isinstance(value, int) and not isinstance(value, bool):
            return value
        if option is int and isinstance(value, float) and value.is_integer():
            return int(value)
        if option is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if option is str and isinstance(value, str):
            if name == "weights" and value.strip().lower() in ("none", "imagenet"):
                # as `--weights` takes them: no file named none or IMAGENET is meant
                return None if value.strip().lower() == "none" else "imagenet"
            if name in _CHOICES:
                # In any case, as cache=RAM and weights=NONE are taken: optimizer=Adam
                # (Keras' own spelling) and class_weight=none were refused.
                word = value.strip().lower()
                if word == "none" and None in _CHOICES[name]:
                    return None
                if word in _CHOICES[name]:
                    return word
            return value
        if option is str and name in ("data", "weights") and isinstance(value, os.PathLike):
            refuse_url(value, name, "records", urls=True)  # a Path made gs:/b of gs://b
            return os.fspath(value)  # a path given as a Path
        if option is dict and isinstance(value, dict):
            return dict(value)
        if option is str and name == "classes" and _names(value):
            return ",".join(value)  # a JSON config's list of names
    if name == "classes" and isinstance(value, (list, tuple)) and (
        commas := [n for n in value if isinstance(n, str) and "," in n]
    ):  # kept as one comma-separated string (as --classes gives it): it would be split
        raise PetalError(
            f"classes name {commas[0]!r}{where} holds a comma, which separates the names "
            "(as in --classes): rename the class folder, or leave classes out to read "
            f"every class. Received: classes={value!r}"
        )
    expected = {**_EXPECTED, **_KINDS}.get(name) or " or ".join(_WORDS[o] for o in options)
    raise PetalError(f"{name} must be {expected}{where}. Received: {name}={value!r}")


def _plain(value: Any) -> Any:
    """``value`` with NumPy scalars (a notebook's ``np.float32(1e-3)``, ``np.int64(3)``) as
    the Python numbers they hold, also inside a dict or list: as they are, an int field
    refused them and ``config.json`` could not be written."""
    if type(value) not in (bool, int, float) and getattr(value, "shape", None) == ():
        item = getattr(value, "item", None)  # a NumPy scalar (np.bool_ too) or 0-d array
        return item() if callable(item) else value
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(map(_plain, value))
    return value


# What a field takes, in the words of --set and a JSON config (not Python's type names).
_WORDS = {
    type(None): "null",
    bool: "true or false",
    int: "a whole number",
    float: "a number",
    str: "a string",
    dict: "a JSON object",
}
# The float fields, with the values they take: inf or nan is named as no finite number.
_FINITE = {
    "learning_rate": "> 0 (e.g. 1e-3)",
    "weight_decay": ">= 0 (e.g. 0.05; 0: none)",
    "momentum": "in [0, 1] (e.g. 0.9)",
    "clipnorm": "> 0 (e.g. 1.0), or null for no clipping",
    "label_smoothing": "in [0, 1) (e.g. 0.1)",
    "fine_tune_lr_factor": "> 0 (e.g. 0.1)",
}
# Fields whose string takes a few values only: those values (checked by validate()).
_EXPECTED = {
    "cache": "'auto', 'ram', 'disk', 'off', true (ram) or false (off)",
    "jit_compile": "'auto', true or false",
}
# Their string values, in any case ('auto' where not given).
_MODES = {"cache": ("auto", "ram", "disk", "off")}
# Fields whose type's word alone says too little: what to give (null is no augment's "none").
_KINDS = {"augment": "a recipe (e.g. 'none', 'codelab' or 'flip+saturation')"}


def _names(value: Any) -> bool:
    """A non-empty list of names without commas (``classes`` from a JSON config)."""
    return isinstance(value, (list, tuple)) and bool(value) and all(
        isinstance(n, str) and "," not in n for n in value
    )


def _is_union(hint: Any) -> bool:
    return typing.get_origin(hint) in (typing.Union, types.UnionType)


def save_config(cfg: TrainConfig, path: str | Path, **extra: Any) -> None:
    """Write the config as JSON; ``extra`` adds resolved run facts under ``"resolved"``."""
    data = cfg.to_dict()
    if extra:
        data["resolved"] = extra
    write_json(path, data)


def config_from_json(path: str | Path) -> TrainConfig:
    """Read a ``config.json`` written by :func:`save_config` (ignores ``resolved``)."""
    values = read_config_file(
        path, "The run's config.json is damaged: restore it, or start again with --overwrite."
    )
    values.pop("resolved", None)
    return apply_overrides(TrainConfig(), values, source=str(path))
