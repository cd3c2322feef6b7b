"""Read a finished training run back from its work directory: facts, model, preprocessing.

Everything inference needs is in ``WORKDIR/config.json`` under ``"resolved"`` (classes,
image size, pixel normalization, the records' resize mode), written by the training loop,
so evaluate, predict, export and report never need the training data or its config.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from petal.data.folders import expand_home, nfc, refuse_url
from petal.errors import (
    PetalError,
    cannot_write,
    damage_reason,
    dangling_link,
    first_line,
    is_int_at_least,
    need_folder,
)

MODEL_FILE = "model.keras"
CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.json"
STATE_FILE = "state.json"

# The input pipeline's "imagenet" scaling, in 0..1 units (inverted for image grids).
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class RunInfo:
    """What inference needs to know about a trained run.

    Attributes:
        workdir: the work directory.
        config: the saved ``config.json`` (TrainConfig fields plus ``resolved``).
        classes: class names in output order.
        image_size: (height, width) the model takes.
        normalization: pixel scaling (``unit``, ``symmetric``, ``imagenet``, ``raw``).
        resize: how source images were fitted to the records' size (``fill``, ``pad``,
            ``stretch``, or ``none``: kept at their own sizes); reused for new images at
            predict and export time.
        records_size: (height, width) of the training records, or None when they varied.
    """

    workdir: Path
    config: dict
    classes: tuple[str, ...]
    image_size: tuple[int, int]
    normalization: str
    resize: str
    records_size: tuple[int, int] | None

    @property
    def model_path(self) -> Path:
        return self.workdir / MODEL_FILE

    @property
    def fit_mode(self) -> str:
        """How new images are fitted as the records were: the records' own mode; "none"
        (records at the photos' own sizes) means the input pipeline's
        :func:`~petal.data.pipeline.resize_fill` to the model's size, as it resizes those."""
        return self.resize


def check_not_in_the_way(target: Path, folder: bool, writes: str, fix: str) -> None:
    """Refuses a file where a command writes a folder, or a folder where it writes a file.

    Raises:
        PetalError: ``{target} is a file, where {writes}; {fix}`` (or "a folder").
    """
    if target.exists() and target.is_dir() != folder:
        raise PetalError(f"{target} is a {'file' if folder else 'folder'}, where {writes}; {fix}")


DEFAULT_TOP_K = 3


def top_k_for(run: RunInfo, k: int | None, warn) -> int:
    """The k of a top-k for ``run``: ``k``, or :data:`DEFAULT_TOP_K`, at most the class
    count; a ``k`` asked for above it is said (``warn``) to be reduced."""
    count = len(run.classes)
    if k is None:
        return min(DEFAULT_TOP_K, count)
    if k > count:
        warn(f"--top-k {k} is more than the model's {count} classes; using {count}")
        return count
    return k


def check_output_folder(out: str | Path, what: str, name: str = "out") -> Path:
    """Checks that the output folder ``out`` of a command (``--out``) can be created or
    written, creating nothing: a command checks before its work and creates the folder only
    to write into it, so a failure leaves no empty folder behind.

    Args:
        out: the folder.
        what: what it holds, for the message ("export", "evaluation").
        name: the caller's argument, for the message when ``out`` is not a path.

    Raises:
        PetalError: ``out`` is not a path, is empty, a file, or cannot be created (a file
            where a parent folder should be, no permission), naming it and the fix.
    """
    need_folder(out, name, "new or not")
    refuse_url(out, "--out", f"{what}s")  # Path() made gs://b/x the local folder gs:/b/x
    if str(out) == "":  # Path() made it the current folder
        raise PetalError(f"--out is empty; pass a folder path for the {what} (new or not).")
    out = Path(expand_home(out))
    if out.exists() and not out.is_dir():
        raise PetalError(
            f"{what.capitalize()} folder {out} is a file; pass --out a folder path (new or not)."
        )
    if reason := dangling_link(out):
        raise PetalError(
            f"Cannot create {what} folder {out}: {reason}; create the folder it links to, or "
            "pass --out another folder."
        )
    if reason := cannot_write(out, folder=True):
        raise PetalError(
            f"Cannot create {what} folder {out}: {reason}; pass --out a folder path whose "
            "parents are folders you can write."
        )
    return out


def make_output_folder(out: str | Path, what: str) -> Path:
    """Creates the output folder ``out`` of a command (``--out``), parents included, after
    :func:`check_output_folder`'s checks (same errors)."""
    out = check_output_folder(out, what)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise PetalError(
            f"Cannot create {what} folder {out}: {err.strerror or err}; pass --out a folder "
            f"path whose parents are folders you can write."
        ) from None
    return out


def unfinished_resume(workdir: Path, completed, trained: int, held: str) -> str | None:
    """The line saying that a run was resumed and stopped before its end: its
    ``metrics.json`` (and ``model.keras``) are of the run after epoch ``completed``, and the
    resume trained on to epoch ``trained``; ``held`` says, in parentheses, what holds what.
    None when ``completed`` is no epoch count below ``trained``."""
    if not is_int_at_least(completed, 0) or trained <= completed:
        return None
    return (
        f"{workdir / METRICS_FILE} describes the run after epoch {completed}; it was resumed "
        f"and trained {trained - completed} more epoch(s) without finishing ({held}): finish "
        f"it with `petal train --resume --workdir {shlex.quote(str(workdir))}`."
    )


def _json_object(path: Path) -> dict:
    """The JSON object in ``path``; {} when it is missing, unreadable or not one."""
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def still_training(workdir: Path) -> str | None:
    """``{workdir} is still training (process PID on HOST is training in it)`` while a
    ``petal train`` runs in the folder (its ``--resume`` would be refused), else None."""
    from petal.running import running_elsewhere

    if who := running_elsewhere(workdir, "training in it"):
        return f"{workdir} is still training ({who})"
    return None


def file_sha256(path: Path) -> str:
    """The SHA-256 of a file's bytes, in hex: a model file's identity, which a copy keeps
    (its modification time it does not)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def non_finite_stop(workdir: Path, config: dict) -> str | None:
    """What to do about a run a NaN/inf loss stopped (``stopped`` in its ``metrics.json``,
    as ``petal report`` says it), with train's fixes for it: go on from the last checkpoint
    with ``--resume`` and the new settings, or start again when none was saved. None when
    the run did not stop so, or was resumed since (it saved later epochs)."""
    metrics = _json_object(workdir / METRICS_FILE)
    stopped, completed = metrics.get("stopped"), metrics.get("epochs_completed")
    if not isinstance(stopped, str) or not stopped.startswith("non-finite"):
        return None
    saved = _json_object(workdir / STATE_FILE).get("epoch")
    if is_int_at_least(saved, 1) and (not is_int_at_least(completed, 0) or saved > completed):
        return None
    from petal.training.loop import non_finite_fixes

    resolved = config.get("resolved") or {}
    fix = non_finite_fixes(
        resolved.get("peak_lr"), config.get("clipnorm"), resolved.get("precision")
    )
    last = workdir / "last.keras"
    run_dir = shlex.quote(str(workdir))
    if is_int_at_least(saved, 1) and last.is_file():
        return (
            f"the run stopped at a {stopped}. {fix}, and go on from {last} (epoch {saved}, "
            f"the last good one) with `petal train --resume --workdir {run_dir}` and the new "
            "settings."
        )
    return (
        f"the run stopped at a {stopped}, with no checkpoint saved to go on from. {fix}, "
        f"and start it again with the new settings (`petal train --workdir {run_dir} "
        "--overwrite ...`)."
    )


def stale_model_note(workdir: Path, config: dict | None = None) -> str | None:
    """What to know before using ``workdir``'s ``model.keras``, or None: a ``petal train``
    still training in the folder, a resume that stopped before its end, or one a NaN/inf
    loss stopped (``config``: the run's, for the fixes). Either way the model is the one of
    the run's last finish, not of its latest epochs."""
    completed = _json_object(workdir / METRICS_FILE).get("epochs_completed")
    if not is_int_at_least(completed, 1):
        completed = None
    if training := still_training(workdir):
        of = f"of epoch {completed}, " if completed else ""
        return (
            f"{training}: {workdir / MODEL_FILE} is the model "
            f"{of}its last finish, not of the epochs training now; run this again when it "
            "finishes to use the new one."
        )
    if config is not None and (stopped := non_finite_stop(workdir, config)):
        # Only a resume stops with a model.keras: a start it stopped saved none.
        return (
            f"{workdir / MODEL_FILE} is the model of the run's last finish, before a resume: "
            f"{stopped}"
        )
    saved = _json_object(workdir / STATE_FILE).get("epoch")
    if completed is None or not is_int_at_least(saved, 1):
        return None
    held = f"{MODEL_FILE} is the model of epoch {completed}, its last finish"
    return unfinished_resume(workdir, completed, saved, held)


def _pixels(size, key: str) -> tuple[int, int]:
    """``(height, width)`` of the size entry ``key`` of a run's ``resolved`` config.

    Raises:
        ValueError: ``size`` is not two positive ints ("32" was read as (3, 2)).
    """
    if not (
        isinstance(size, (list, tuple))
        and len(size) == 2
        and all(is_int_at_least(side, 1) for side in size)
    ):
        raise ValueError(f"{key} is not [height, width] in pixels: {json.dumps(size)}")
    return size[0], size[1]


def run_folder(workdir: str | Path) -> Path:
    """``workdir`` as the local folder of a run to read.

    Raises:
        PetalError: ``workdir`` is not a path, a URL, or empty (``Path("")`` is the current
            folder).
    """
    need_folder(workdir, "workdir", "the work directory of a `petal train` run")
    refuse_url(workdir, "workdir", "run folders", reads=True)
    if str(workdir) == "":
        raise PetalError("workdir is empty; pass the work directory of a `petal train` run.")
    return Path(expand_home(workdir))


def no_model(workdir: Path, config: dict) -> str:
    """Why the run in ``workdir`` (its ``config``) has no ``model.keras``, and what to do:
    it is still training (run this again when it finishes), a NaN/inf loss stopped it (what
    to change, and how to go on), or it has not finished (resume it)."""
    from petal.running import running_elsewhere

    if who := running_elsewhere(workdir, "training in it"):  # --resume would be refused
        return (
            f"{workdir} has no {MODEL_FILE} yet: the run is still training ({who}); "
            "run this again when it finishes."
        )
    if stopped := non_finite_stop(workdir, config):  # --resume alone stops again
        return f"{workdir} has no {MODEL_FILE}: {stopped}"
    if replaced := replaced_run(workdir):
        return f"{workdir} has no {MODEL_FILE}: {replaced}"
    return (
        f"{workdir} has no {MODEL_FILE}: the run has not finished. Resume it with "
        f"`petal train --resume --workdir {shlex.quote(str(workdir))}`."
    )


def replaced_run(workdir: Path) -> str | None:
    """What to do with the run an ``--overwrite`` killed before it saved an epoch left in
    ``.petal-replaced`` (see ``petal.training.loop.recover_replaced``), or None."""
    from petal.running import running_elsewhere
    from petal.training.loop import REPLACED_DIR, REPLACING_DIR
    from petal.training.saved import saved_epoch

    kept = next(
        (workdir / d for d in (REPLACED_DIR, REPLACING_DIR) if (workdir / d).is_dir()), None
    )
    if kept is None or saved_epoch(workdir) or running_elsewhere(workdir, "training in it"):
        return None  # (a run still starting: its --overwrite is under way)
    return (
        f"an --overwrite was stopped before it saved an epoch, and left the run it replaced in "
        f"{kept}; `petal train --resume --workdir {shlex.quote(str(workdir))}` puts that run "
        "back."
    )


def retrain_command(workdir: Path) -> str:
    """The command that trains the run in ``workdir`` again, from its own ``config.json``
    (its preset, data, classes and settings): ``--workdir`` alone asks for ``--data``, and
    with it trains the default preset, not this run's."""
    saved = shlex.quote(str(workdir / CONFIG_FILE))
    return f"petal train --config {saved} --workdir {shlex.quote(str(workdir))} --overwrite"


def open_run(workdir: str | Path, need_model: bool = True, warn=None) -> RunInfo:
    """Read ``config.json`` of a training run.

    Args:
        workdir: the work directory.
        need_model: refuse a run without ``model.keras``.
        warn: with ``need_model``, receives a line when the model is not the run's latest
            (:func:`stale_model_note`): a training still running in the folder, or a resume
            stopped before its end or by a NaN/inf loss. The model is used all the same.

    Raises:
        PetalError: ``workdir`` is empty or holds no run, or (with ``need_model``) no
            finished model (for a run a NaN/inf loss stopped: what to change, and how to go
            on).
    """
    workdir = run_folder(workdir)
    cfg_path = workdir / CONFIG_FILE
    if not cfg_path.is_file():
        if replaced := replaced_run(workdir):
            raise PetalError(f"{workdir} holds no run ({CONFIG_FILE}): {replaced}")
        raise PetalError(
            f"{workdir} is not a petal work directory (no {CONFIG_FILE}); "
            "pass the folder a `petal train --workdir` run wrote."
        )
    try:
        config = json.loads(cfg_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise PetalError(
            f"{cfg_path} is not valid JSON ({err}); the work directory is damaged, retrain it."
        ) from None
    if not isinstance(config, dict):
        raise PetalError(
            f"{cfg_path} holds no JSON object; the work directory is damaged (petal train "
            "writes one), retrain it."
        )
    resolved = config.get("resolved") or {}
    if not isinstance(resolved, dict) or "classes" not in resolved:
        raise PetalError(f"{cfg_path} has no resolved classes; it was not written by petal train.")
    if need_model and (workdir / MODEL_FILE).is_dir():
        raise PetalError(
            f"{workdir / MODEL_FILE} is a folder, not the model file petal train writes; move "
            "it away and resume or retrain the run."
        )
    if need_model and not (workdir / MODEL_FILE).is_file():
        raise PetalError(no_model(workdir, config))
    try:
        records = resolved.get("records_size")
        run = RunInfo(
            workdir=workdir,
            config=config,
            classes=tuple(resolved["classes"]),
            image_size=_pixels(resolved["image_size"], "image_size"),
            normalization=resolved["normalization"],
            resize=resolved.get("resize") or "fill",
            records_size=_pixels(records, "records_size") if records else None,
        )
    except (KeyError, TypeError, ValueError, IndexError) as err:
        # A hand-edited or partly written config.json: name the entry, not a traceback.
        what = damage_reason(err)
        raise PetalError(
            f"{cfg_path} is damaged (resolved: {what}); the work directory cannot be used, "
            "retrain it."
        ) from None
    if need_model and warn is not None and (note := stale_model_note(workdir, config)):
        warn(note)
    return run


def load_model(run: RunInfo, float32: bool = False):
    """The run's final model, loaded with Keras' safe mode (no arbitrary code), uncompiled.

    Args:
        run: from :func:`open_run`.
        float32: rebuild the model with a float32 dtype policy everywhere (for export:
            serving runtimes and TFLite expect float32), with the trained weights.

    Raises:
        PetalError: Keras runs on another backend than TensorFlow; the model's outputs do
            not match the run's classes, or its input the run's image size.
    """
    import keras

    import petal.models  # noqa: F401 (registers any custom objects the models use)
    from petal.training.strategy import check_tensorflow_backend

    # Evaluate, predict and export feed tf.data and TensorFlow tensors to the model.
    check_tensorflow_backend("Loading a run's model (petal evaluate, predict, export)")
    whole = zipfile.is_zipfile(run.model_path)
    try:
        if not whole:  # Keras would call it "File not found"
            raise ValueError("not a .keras zip archive: truncated or overwritten")
        model = keras.saving.load_model(run.model_path, compile=False, safe_mode=True)
    except Exception as err:  # Keras raises ValueError, TypeError, KeyError, zip errors...
        retrain = f"retrain with `{retrain_command(run.workdir)}`"
        saved = _json_object(run.workdir / STATE_FILE).get("epoch")
        last = run.workdir / "last.keras"
        if not whole and is_int_at_least(saved, 1) and last.is_file():
            # A run killed while writing it (before petal wrote it through a temporary
            # file): its last checkpoint holds the final epoch, and --resume writes it again.
            retrain = (
                f"`petal train --resume --workdir {shlex.quote(str(run.workdir))}` writes it "
                f"again from the run's last checkpoint ({last}, epoch {saved}), or {retrain}"
            )
        raise PetalError(
            f"Cannot load {run.model_path} ({first_line(err)}); the model file is damaged: "
            f"{retrain}."
        ) from None
    outputs = model.outputs[0].shape[-1]
    if outputs != len(run.classes):
        raise PetalError(
            f"{run.model_path} has {outputs} outputs but {run.workdir / CONFIG_FILE} lists "
            f"{len(run.classes)} classes; the work directory is inconsistent, retrain it."
        )
    takes = tuple(model.inputs[0].shape[1:3])  # (None, None): a model of any input size
    sides = zip(takes, run.image_size, strict=True)
    if any(side is not None and side != want for side, want in sides):
        raise PetalError(
            f"{run.model_path} takes {takes[0]}x{takes[1]} images but "
            f"{run.workdir / CONFIG_FILE} gives image_size {run.image_size[0]}x"
            f"{run.image_size[1]}; the work directory is inconsistent, retrain it."
        )
    if float32:
        model = _as_float32(model)
    return model


def _as_float32(model):
    """A copy of a (mixed-precision) model with every layer in float32, same weights."""
    import keras

    config = keras.saving.serialize_keras_object(model)
    config = _replace_policies(config)
    clone = keras.saving.deserialize_keras_object(config, safe_mode=True)
    clone.set_weights(model.get_weights())
    return clone


def _replace_policies(node):
    if isinstance(node, dict):
        if node.get("class_name") == "DTypePolicy" and isinstance(node.get("config"), dict):
            return {**node, "config": {**node["config"], "name": "float32"}}
        return {k: _replace_policies(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_replace_policies(v) for v in node]
    if isinstance(node, str) and node.startswith("mixed_"):
        return "float32"
    return node


def class_index(
    data_classes, run: RunInfo, data: str, kind: str | None = None
) -> np.ndarray | None:
    """The model's index of each of the data's classes, by name; None when they are the
    model's classes in its order. New photos may hold only some of the classes.

    Args:
        data_classes: the data's class names, in its label order.
        run: from :func:`open_run`.
        data: the data's path, for the message.
        kind: the data's kind (``"folder"``, ``"records"``, ``"codelab"``), for the fix.

    Raises:
        PetalError: the data holds a class the model does not know; for an image folder or
            records holding some of its classes too, with the ``--classes`` that keeps those.
    """
    data_classes = tuple(data_classes)
    if data_classes == run.classes:
        return None
    # A name matches the model's in another Unicode form too: a folder unzipped on macOS
    # is named in NFD ("rose\u0301"), the same name typed elsewhere in NFC ("ros\xe9").
    by_form: dict[str, int] = {}
    for i, name in enumerate(run.classes):
        by_form.setdefault(nfc(name), i)
    index = [
        run.classes.index(c) if c in run.classes else by_form.get(nfc(c)) for c in data_classes
    ]
    unknown = [c for c, i in zip(data_classes, index, strict=True) if i is None]
    if unknown:
        known = [c for c, i in zip(data_classes, index, strict=True) if i is not None]
        keep = shlex.quote(",".join(known))
        named = "class folders (or records) named after those"
        fix = f"Evaluate on {named}"
        if known and kind == "folder":
            fix = f"Pass --classes {keep} to read only those of its folders, or evaluate on {named}"
        elif len(known) == 1 and kind == "records":
            # Records need two classes, so converting again with --classes cannot keep one;
            # evaluating an image folder reads one class.
            run_dir = shlex.quote(str(run.workdir))
            fix = (
                f"Evaluate the photos instead: `petal evaluate {run_dir} --data PHOTO_FOLDER "
                f"--classes {keep}` (an image folder may hold one class), or evaluate on {named}"
            )
        elif known and kind == "records":
            fix = f"Convert the photos again with --classes {keep}, or evaluate on {named}"
        raise PetalError(
            f"{data} holds classes the model in {run.workdir} does not know: "
            f"{', '.join(unknown)}; its classes are {', '.join(run.classes)}. {fix}."
        )
    return np.array(index, dtype=np.int64)


def denormalize_np(x: np.ndarray, mode: str) -> np.ndarray:
    """The inverse of the input pipeline's normalization, as uint8 pixels (for image grids)."""
    x = np.asarray(x, dtype=np.float32)
    if mode == "unit":
        x = x * 255.0
    elif mode == "symmetric":
        x = (x + 1.0) * 127.5
    elif mode == "imagenet":
        x = (x * np.array(IMAGENET_STD, np.float32) + np.array(IMAGENET_MEAN, np.float32)) * 255.0
    return np.clip(np.rint(x), 0, 255).astype(np.uint8)


def progress_bar(desc: str, total: int, enabled: bool | None = None):
    """A bar on stderr over ``total`` images (None: for more than a few batches, and only
    on a terminal)."""
    from tqdm.auto import tqdm

    if enabled is None:
        enabled = total > 256 and sys.stderr.isatty()
    return tqdm(total=total, desc=desc, unit="img", disable=not enabled, dynamic_ncols=True)
