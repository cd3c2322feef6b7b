"""The training loop: config -> strategy, precision, datasets, model -> a work directory.

:func:`train` runs one :class:`~petal.training.config.TrainConfig` and leaves everything in
``WORKDIR``:

| file                 | what                                                              |
|----------------------|-------------------------------------------------------------------|
| ``config.json``      | the resolved config, plus facts under ``resolved`` (classes, size) |
| ``history.csv``      | one row per epoch: loss, accuracy, val_*, lr*, images/s...        |
| ``tensorboard/``     | TensorBoard logs                                                  |
| ``best.weights.h5``  | weights of the epoch with the best validation accuracy            |
| ``last.keras``       | model + optimizer after the last completed epoch (for ``--resume``)|
| ``state.json``       | the last completed epoch, best epoch, wall time so far            |
| ``model.keras``      | the final model                                                   |
| ``metrics.json``     | final, mean-of-last-5 and best validation accuracy, wall time...  |

Fine-tuning runs in phases: ``fine_tune="all"`` is one phase with every layer trainable (the
codelab's way); ``"head_then_all"`` trains the new head on a frozen backbone for
``head_epochs``, then unfreezes the backbone with its BatchNorm layers kept in inference mode
(Keras' advice; ``model_options.bn_frozen=false`` trains them) and recompiles with its schedule's
peak rate times ``fine_tune_lr_factor`` (``learning_rate``'s, or with ``codelab_ramp`` and no
``learning_rate`` the codelab's rule's). Each phase runs the schedule from its start.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import posixpath
import shlex
import shutil
import statistics
import sys
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from petal.data import schema
from petal.data.folders import (
    absolute_data,
    expand_home,
    holds_run_config,
    is_hidden,
    is_image_name,
    is_remote,
    is_run_config,
    refuse_url,
    same_place,
)
from petal.data.reader import (
    CODELAB_VAL_FRACTION,
    FOLDER_SPLIT,
    FOLDER_VAL_FRACTION,
    codelab_split_files,
    shard_identity,
)
from petal.errors import (
    PetalError,
    cannot_write,
    dangling_link,
    first_line,
    is_int_at_least,
    need_bool,
    need_folder,
)
from petal.jsonfile import save_atomically, temporary_name
from petal.running import (
    RUNNING_FILE,
    in_use_error,
    mark_reading,
    mark_running,
    running_elsewhere,
    signals_held,
)
from petal.training.callbacks import (
    Checkpointer,
    ErrorGuard,
    MetricsWriter,
    NanGuard,
    ScalarLogger,
    StepProgress,
    per_second,
    read_history,
    truncate_history,
    write_json,
)
from petal.training.config import TrainConfig, config_from_json, read_config_file, save_config
from petal.training.saved import saved_epoch

# Files and folders a run writes into its work directory (what --overwrite deletes).
RUN_FILES = (
    "config.json",
    "history.csv",
    "state.json",
    "metrics.json",
    "best.weights.h5",
    "last.keras",
    "model.keras",
    "report.html",
)
RUN_DIRS = ("tensorboard", "eval", "plots", "export")
# What a run and its report write inside tensorboard/ and plots/: other files there are the
# user's, and are kept (as in eval/ and export/: see _petals_files_in).
RUN_DIR_FILES = {
    "tensorboard": ("train", "validation"),
    "plots": ("curves.png", "lr.png", "confusion_matrix.png", "samples.png", "misclassified.png"),
}


@dataclass
class _Phase:
    name: str  # "all", "head" or "full"
    start: int  # first epoch (0-based)
    end: int  # one past the last epoch
    lr: float | None
    backbone_trainable: bool | None  # None: leave the model as built


def _log_default(line: str) -> None:
    # Warnings on stderr, as every petal command prints them; progress on stdout.
    warning = line.startswith("petal train: warning: ")
    print(line, flush=True, file=sys.stderr if warning else sys.stdout)


# Files a run holds before its first checkpoint: a work directory with only these (and no
# completed epoch) is a failed start, which a new run may replace.
# A run that stopped before its first checkpoint, and the report of it.
_START_FILES = {"config.json", "history.csv", "state.json", "metrics.json", "report.html"}


def _not_a_run(workdir: Path) -> PetalError:
    if held := [n for n in RUN_FILES if n != "config.json" and (workdir / n).exists()]:
        return _no_config(workdir, held)
    return PetalError(
        f"{workdir} is not a petal training run (no config.json); drop --resume to start one."
    )


def _no_config(workdir: Path, held: list[str]) -> PetalError:
    # Not "drop --resume" nor "pass --resume": each refuses the folder for the other's reason.
    return PetalError(
        f"{workdir / 'config.json'} is missing from {workdir}, which holds a training run "
        f"({', '.join(held[:3])}); restore the file to continue it with --resume, or start "
        "again with --overwrite (deletes its checkpoints and results)."
    )


def _not_petals(workdir: Path) -> PetalError:
    return PetalError(
        f"{workdir} holds files that are not a petal run ({workdir / 'config.json'} was not "
        "written by petal train); pass another --workdir, or --overwrite to replace it."
    )


_TRAINING = "training in it"  # what a run's marker says it does in its work directory


def _running_elsewhere(workdir: Path) -> str | None:
    return running_elsewhere(workdir, _TRAINING)


def _mark_running(workdir: Path) -> Callable[[], None]:
    """Writes :data:`~petal.running.RUNNING_FILE` while ``train`` runs in ``workdir``; returns
    its remover."""
    return mark_running(workdir, lambda who: in_use_error(workdir, who, "--workdir"), _TRAINING)


def _config_kind(workdir: Path) -> str:
    """Who wrote ``workdir``'s ``config.json``: ``"petal"`` (petal train's always holds the
    run's classes under ``resolved``), ``"other"`` (JSON without them: another program's
    settings), ``"damaged"`` (not JSON) or ``"none"``."""
    if not (workdir / "config.json").is_file():
        return "none"
    try:
        saved = json.loads((workdir / "config.json").read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return "damaged"
    return "petal" if is_run_config(saved) else "other"


def _failed_start(workdir: Path, found: list[str]) -> bool:
    """Whether the run in ``workdir`` stopped before checkpointing any epoch.

    Such a run holds nothing to resume (no ``last.keras``, no ``best.weights.h5``, no
    model), so starting again loses nothing. A run still in its first epoch in another
    process is not one.
    """
    if not found or not set(found) <= _START_FILES:
        return False
    if "config.json" in found and _config_kind(workdir) != "petal":
        return False  # another program's folder, or a damaged run
    if _running_elsewhere(workdir):
        return False
    if any((workdir / name).exists() for name in RUN_DIRS if name in ("eval", "export")):
        return False
    try:  # a run whose checkpoints were deleted keeps its results
        if json.loads((workdir / "metrics.json").read_text()).get("epochs_completed"):
            return False
    except FileNotFoundError:
        pass
    except (ValueError, OSError, AttributeError):
        return False
    try:
        state = json.loads((workdir / "state.json").read_text())
    except FileNotFoundError:
        return True
    except (ValueError, OSError):
        return False
    return isinstance(state, dict) and not state.get("epoch")


def _epoch_files(workdir: Path) -> list[str]:
    """The files in ``workdir`` that only an epoch's checkpoint (or a finish) writes.

    History rows count from epoch 2 on: a NaN/inf loss in epoch 1, or a kill between its row
    and its checkpoint, leaves a row of epoch 1 and no ``state.json``.
    """
    held = [n for n in ("last.keras", "best.weights.h5", "model.keras") if (workdir / n).exists()]
    try:
        if json.loads((workdir / "metrics.json").read_text()).get("epochs_completed"):
            held.append("metrics.json")
    except FileNotFoundError:
        pass
    except (ValueError, OSError, AttributeError):
        held.append("metrics.json")
    try:
        if any(row["epoch"] > 1 for row in read_history(workdir / "history.csv", "drop")):
            held.append("history.csv")
    except (ValueError, UnicodeDecodeError, OSError):
        held.append("history.csv")
    return held


def _run_entries(workdir: Path) -> list[Path]:
    """The files a run writes in ``workdir`` (:data:`RUN_FILES`), and what it, its report,
    evaluation and export wrote in its sub-folders (:func:`_petals_files_in`), that are there;
    the user's files beside them are not among them."""
    found = [workdir / name for name in RUN_FILES]
    for name in RUN_DIRS:
        found += [workdir / name / entry for entry in _petals_files_in(workdir / name)]
    return [path for path in found if path.exists() or path.is_symlink()]


def _leave_run_dirs(workdir: Path) -> None:
    """Delete the run files' temporaries (a write cut short by a kill), and the run's
    sub-folders (:data:`RUN_DIRS`) that are now empty."""
    for name in RUN_FILES:
        temporary_name(workdir / name).unlink(missing_ok=True)
    for name in RUN_DIRS:
        with contextlib.suppress(OSError):  # left in place while it holds the user's files
            (workdir / name).rmdir()


def _remove_run(workdir: Path) -> None:
    """Delete the files and folders a run writes (and their temporary files), nothing else."""
    for path in _run_entries(workdir):
        if path.parent != workdir and path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)  # an export's saved_model/
        else:
            path.unlink(missing_ok=True)
    _leave_run_dirs(workdir)


# Where --overwrite keeps the run it replaces until the new one saves its first epoch: one
# stopped before then (a corrupt record, Ctrl-C, a NaN loss) puts it back.
REPLACED_DIR = ".petal-replaced"
# Where the files go one by one first: renamed REPLACED_DIR once all are in it, so that a
# kill part-way leaves the run split between the two, to put back whole (recover_replaced).
REPLACING_DIR = ".petal-replacing"


def _set_aside_run(workdir: Path) -> None:
    """Move what :func:`_remove_run` deletes into ``workdir/.petal-replaced``, each in its
    place there; the user's files stay."""
    aside, staging = workdir / REPLACED_DIR, workdir / REPLACING_DIR
    for earlier in (aside, staging):  # an earlier --overwrite's, which a kill left
        if earlier.exists():
            shutil.rmtree(earlier)
    for path in _run_entries(workdir):
        kept = staging / path.relative_to(workdir)
        kept.parent.mkdir(parents=True, exist_ok=True)
        os.replace(path, kept)
    # (a folder without a run, or none yet: nothing set aside, all the same)
    staging.mkdir(parents=True, exist_ok=True)
    os.replace(staging, aside)
    _leave_run_dirs(workdir)


def _put_back(aside: Path, workdir: Path) -> None:
    """Move the run's files kept in ``aside`` back to their places in ``workdir``, then
    delete ``aside``."""
    for name in RUN_FILES:
        if (aside / name).exists() or (aside / name).is_symlink():
            os.replace(aside / name, workdir / name)
    for name in RUN_DIRS:
        if (aside / name).is_dir():
            (workdir / name).mkdir(exist_ok=True)
            for entry in os.listdir(aside / name):
                os.replace(aside / name / entry, workdir / name / entry)
    shutil.rmtree(aside, ignore_errors=True)


def _restore_run(
    workdir: Path,
    log: Callable[[str], None],
    said: str = "no epoch was saved: the run --overwrite replaced is back in {workdir}",
    stopped: BaseException | None = None,
) -> None:
    """Put back the run an --overwrite set aside (:func:`_set_aside_run`), in place of the
    new run's files, when the new run saved no epoch; nothing when none is set aside.
    ``stopped``: what stopped the new run, marked for
    :func:`~petal.training.saved.run_restored` once the run is back."""
    aside = workdir / REPLACED_DIR
    if not aside.is_dir():
        return
    _remove_run(workdir)
    _put_back(aside, workdir)
    log("petal train: " + said.format(workdir=workdir))
    if stopped is not None:
        with contextlib.suppress(AttributeError, TypeError):  # (an exception without a dict)
            stopped.petal_run_restored = True


def recover_replaced(workdir: str | Path, log: Callable[[str], None]) -> None:
    """Settle what an --overwrite killed outright (SIGKILL, the kernel's out-of-memory
    killer, a power cut) left in ``workdir/.petal-replaced``: the run it replaced is put back
    when the new run saved no epoch (as a Ctrl-C would have), and deleted when it saved one.

    Nothing happens when none is there, ``workdir`` is not a local folder, or a ``petal
    train`` is running in it (whose own ``--overwrite`` that is).
    """
    if is_remote(str(workdir)):
        return
    workdir = Path(expand_home(workdir))
    staging = workdir / REPLACING_DIR
    if not (staging.is_dir() or (workdir / REPLACED_DIR).is_dir()) or _running_elsewhere(workdir):
        return
    if staging.is_dir():  # killed while setting it aside: what is left of it is in place
        _put_back(staging, workdir)
        log(
            f"petal train: an --overwrite was stopped while it set aside the run it replaced "
            f"(in {staging}): that run is back in {workdir}"
        )
        return
    if saved_epoch(workdir):
        _drop_replaced(workdir)
        log(
            f"petal train: deleted {workdir / REPLACED_DIR}, the run an --overwrite replaced: "
            "the new run had saved an epoch"
        )
    else:
        _restore_run(
            workdir,
            log,
            f"an --overwrite was stopped before it saved an epoch, and left the run it replaced "
            f"in {workdir / REPLACED_DIR}: that run is back in {{workdir}}",
        )


def _drop_replaced(workdir: Path) -> None:
    """Delete the run an --overwrite set aside, once the new run saved an epoch."""
    if (workdir / REPLACED_DIR).is_dir():
        shutil.rmtree(workdir / REPLACED_DIR, ignore_errors=True)


def _petals_files_in(folder: Path) -> list[str]:
    """The names petal wrote in the run's sub-folder ``folder`` (:data:`RUN_DIRS`): a run's
    and its report's (:data:`RUN_DIR_FILES`), an evaluation's, or what the export's
    ``export.json`` lists (and a staging folder an interrupted export left); not the user's
    notes beside them."""
    if folder.name == "eval":
        from petal.evaluation.evaluate import WRITTEN

        return [*WRITTEN, RUNNING_FILE]
    if folder.name == "export":
        from petal.evaluation.export import EXPORT_OUTPUTS, exported_names

        staging = [p.name for p in folder.glob(".export-*")] if folder.is_dir() else []
        # Without export.json: an export by a petal before the marker, whose names are these.
        return [*sorted(exported_names(folder) or EXPORT_OUTPUTS), *staging]
    names = RUN_DIR_FILES[folder.name]
    # A plot cut short by a kill stays under its temporary name (jsonfile.save_atomically).
    return [*names, *(temporary_name(Path(name)).name for name in names if "." in name)]


def _written_inside(workdir: Path) -> tuple[Path, str] | None:
    """(the folder, who writes it) when another live process evaluates or exports into the
    run's ``eval/`` or ``export/`` (their markers, :func:`petal.running.mark_running`)."""
    folders = [workdir / "eval"]
    with contextlib.suppress(OSError):
        folders += sorted((workdir / "export").glob(".export-*"))
    for folder in folders:
        if who := running_elsewhere(folder):
            return folder, who
    return None


def holds_data(workdir: Path, own: Iterable[str] = ()) -> str | None:
    """What data ``workdir`` holds ("records (manifest.json)", "photos (a.jpg)", "class
    folders of photos (daisy/)"), or None: a run's folder (petal's config.json: its
    evaluations with ``--out`` hold PNGs) is none of these. ``own``: names the caller writes
    there itself (an evaluation's PNGs), which are no data, in ``workdir`` or a folder of it
    (an earlier ``--out workdir/a``)."""
    try:
        entries = sorted(os.scandir(workdir), key=lambda e: e.name)
    except OSError:  # missing (created later) or unreadable (said later)
        return None
    own = set(own)
    entries = [entry for entry in entries if entry.name not in own]
    if holds_run_config(str(workdir)):  # not a data set's own config.json
        return None
    for entry in entries:
        if entry.name == schema.MANIFEST_NAME or entry.name.endswith(schema.SHARD_SUFFIX):
            return f"records ({entry.name})"
    for entry in entries:
        if is_image_name(entry.name):
            return f"photos ({entry.name})"
    for entry in entries:
        if entry.name in RUN_DIRS or is_hidden(entry.name) or not entry.is_dir():
            continue
        try:
            names = os.listdir(entry.path)
        except OSError:
            continue
        if any(is_image_name(n) and n not in own for n in names):  # not earlier outputs
            return f"class folders of photos ({entry.name}/)"
    return None


def refuse_out_holding_data(out: Path, own: Iterable[str], what: str) -> None:
    """Refuse ``--out`` that :func:`holds_data` (``own``: the names ``what`` writes there):
    evaluate's and export's files went in among photos or shards, as train's --workdir is
    refused."""
    if kind := holds_data(out, own):
        raise PetalError(
            f"--out {out} holds {kind}; pass --out a folder of its own (a new or empty "
            f"folder) so that the {what}'s files do not mix with the data."
        )


def prepare_workdir(
    workdir: Path,
    resume: bool,
    overwrite: bool,
    clear: bool = True,
    log: Callable[[str], None] | None = None,
    set_aside: bool = False,
) -> None:
    """Refuse to mix runs: a work directory holding a run needs ``resume`` or ``overwrite``.

    A run that stopped before its first checkpoint (a corrupt record, a NaN loss in epoch 1)
    does not count: a fresh start deletes its files and begins again.

    Args:
        workdir: the work directory (created when missing).
        resume: continue the run it holds.
        overwrite: delete the files of the run it holds (other files are kept).
        clear: ``False`` only checks, changing nothing (so later errors leave it intact).
        log: told when the files of a failed start, or of the run ``overwrite`` replaces,
            are deleted (set aside).
        set_aside: ``overwrite`` moves the run into ``.petal-replaced`` instead of deleting
            it (:func:`train` puts it back when the new run saves no epoch).
    """
    if resume and overwrite:
        raise PetalError(
            "Pass either --resume or --overwrite (resume=True or overwrite=True), not both."
        )
    if workdir.exists() and not workdir.is_dir():
        raise PetalError(f"Work directory {workdir} is a file; pass a folder.")
    if reason := dangling_link(workdir):
        raise PetalError(
            f"Work directory {workdir} cannot be created: {reason}; create the folder it links "
            "to, or pass another --workdir."
        )
    if reason := cannot_write(workdir, folder=True):
        raise PetalError(
            f"Work directory {workdir} cannot be written: {reason}; pass a --workdir whose "
            "parents are folders you can write."
        )
    found = [n for n in RUN_FILES if (workdir / n).exists()]
    if who := _running_elsewhere(workdir):
        # Two processes in one run: each rewrites the other's history and checkpoints.
        raise in_use_error(workdir, who, "--workdir")
    if resume:
        if not (workdir / "config.json").is_file():
            raise _not_a_run(workdir)
        if _config_kind(workdir) == "other":  # resumed, it would be replaced as a run's
            raise _not_petals(workdir)
        return
    failed_start = bool(found) and not overwrite and _failed_start(workdir, found)
    if not overwrite and _config_kind(workdir) == "other":
        raise _not_petals(workdir)
    if found and not overwrite and not failed_start:
        if "config.json" not in found:
            raise _no_config(workdir, found)
        raise PetalError(
            f"{workdir} already holds a training run ({', '.join(found[:3])}); pass --resume "
            "(resume=True) to continue it or --overwrite (overwrite=True) to start again "
            "(deletes its checkpoints and results)."
        )
    if overwrite and (busy := _written_inside(workdir)):
        # --overwrite deletes eval/ and export/: another process's files as it writes them.
        raise in_use_error(*busy, "--workdir")
    if not clear:
        return
    if overwrite or failed_start:
        if failed_start and log is not None:
            log(f"petal train: {workdir} held a run that completed no epoch; starting it again")
        elif found and log is not None:
            done = "replacing" if set_aside else "deleting"
            log(f"petal train: --overwrite: {done} the run in {workdir} ({', '.join(found)})")
        if overwrite and set_aside:
            _set_aside_run(workdir)
        else:
            _remove_run(workdir)
    workdir.mkdir(parents=True, exist_ok=True)


def _check_tensorboard_folder(workdir: Path) -> None:
    """Refuses a file where the run writes its TensorBoard logs (they failed after the first
    epoch's work, and ``--overwrite`` keeps the user's files)."""
    for name in ("tensorboard", *(f"tensorboard/{run}" for run in RUN_DIR_FILES["tensorboard"])):
        if (workdir / name).exists() and not (workdir / name).is_dir():
            raise PetalError(
                f"{workdir / name} is a file, where petal train writes its TensorBoard logs; "
                "move it away, or pass --set tensorboard=false or another --workdir."
            )


def resume_config(workdir: str | Path) -> TrainConfig:
    """The config saved in a work directory (what ``--resume`` continues with).

    Raises:
        PetalError: ``workdir`` is a URL or holds no run (no ``config.json``), or a
            ``config.json`` petal train did not write.
    """
    refuse_url(workdir, "workdir", "run folders", reads=True)
    workdir = Path(expand_home(workdir))
    if not (workdir / "config.json").is_file():
        raise _not_a_run(workdir)
    if _config_kind(workdir) == "other":
        raise _not_petals(workdir)
    return config_from_json(workdir / "config.json")


def _drop_unsaved_rows(history_path: Path, workdir: Path) -> None:
    """A run stopped between an epoch's row in history.csv and its checkpoint: drop the rows
    of epochs not saved. An extension of a finished run so stopped kept a row that its report
    left out and that ``--resume`` (nothing to do: the run is finished) never dropped."""
    epoch = saved_epoch(workdir)
    try:
        if epoch and any(row["epoch"] > epoch for row in read_history(history_path, "drop")):
            truncate_history(history_path, epoch)
    except (OSError, ValueError, KeyError):
        pass  # the stop's own error is the one to see; a resume truncates it anyway


def _whole_model(path: Path) -> bool:
    """Whether ``path`` is a .keras archive that is not cut short (a zip's index is at its
    end)."""
    import zipfile

    return path.is_file() and zipfile.is_zipfile(path)


def _check_workdir_outside_data(workdir: Path, data: str) -> None:
    """A work directory in the training data folder mixes the run's files with the data; in
    an image folder its plots would be read as a class of their own by the next run."""
    from petal.data.folders import is_within

    if is_within(workdir, data):
        raise PetalError(
            f"The work directory {workdir} is inside the training data {data}, where the run's "
            "checkpoints and plots would mix with the data (in an image folder, become a "
            "class); choose a --workdir outside it."
        )


def _check_resumed_data(cfg: TrainConfig, workdir: Path) -> None:
    """A resumed run whose saved local data path is gone: say to pass ``--data``.

    Runs written before data paths were stored absolute hold paths relative to the folder
    they were started from.
    """
    data = cfg.data
    if not data or "://" in data or any(ch in data for ch in "*?[") or os.path.exists(data):
        return
    if data != resume_config(workdir).data:
        return  # given with --data: the input pipeline's own message applies
    where = "" if os.path.isabs(data) else " (relative to the folder the run was started from)"
    raise PetalError(
        f"The training data of {workdir}, {data}{where}, is not found; pass --data PATH "
        "to the records it was trained on."
    )


def _check_nothing_changed(workdir: Path, cfg: TrainConfig, epochs_done: int) -> None:
    """A finished run resumed without more epochs trains nothing: settings that differ from
    its own would be ignored, so they are refused instead (with what would apply them)."""
    saved = resume_config(workdir).to_dict()
    now = cfg.to_dict()
    if now["epochs"] == epochs_done:
        now["epochs"] = saved["epochs"]  # ending a run stopped early where it stopped
    if now["data"] and saved["data"] and same_place(now["data"], saved["data"]):
        now["data"] = saved["data"]
    changed = [f"{key} {_show(saved[key])} -> {_show(now[key])}" for key in now
               if key in saved and now[key] != saved[key]]
    # Fields the checkpoint holds are refused by a resume that trains too (the image sizes
    # only when they resolve to another size, which the data decides).
    fixed = [key for key in CHECKPOINT_FIELDS if key not in ("image_size", "train_image_size")
             and key in saved and now[key] != saved[key]]
    if "weights" in saved and _weights_place(saved["weights"]) != _weights_place(now["weights"]):
        fixed.append("weights")
    further = (
        f"Pass --epochs {epochs_done + 1} or more to train it further (its model, image size "
        "and optimizer stay), or start a new run in another --workdir."
    )
    if fixed:
        further = (
            f"Its checkpoint holds the {', '.join(fixed)}, which --resume cannot change: "
            f"leave {'that' if len(fixed) == 1 else 'those'} out, or start a new run without "
            "--resume (another --workdir, or --overwrite)."
        )
    if changed:
        raise PetalError(
            f"{workdir} already completed its {epochs_done} epochs, so nothing would train and "
            f"these changes would be ignored: {'; '.join(changed)}. {further}"
        )


def _other_classes(weights: str | None, classes: list[str], log) -> list[str] | None:
    """The classes of the run a weights file comes from (its folder's ``config.json``), when
    they are not ``classes`` in this order: its head must not load even if its size fits."""
    if not weights or weights == "imagenet" or "://" in weights:
        return None
    try:
        saved = json.loads((Path(weights).parent / "config.json").read_text())
        theirs = saved["resolved"]["classes"]
    except (OSError, ValueError, KeyError, TypeError):
        return None  # not in a run folder: the head loads when its size fits
    if not isinstance(theirs, list) or theirs == list(classes):
        return None
    log(
        f"petal train: {weights} comes from a run on other classes ({', '.join(theirs)}): "
        "its classifier head is not loaded"
    )
    return theirs


def _epochs(n: int) -> str:
    return f"{n} epoch{'s' * (n != 1)}"


def _read_state(path: Path) -> dict:
    """A run's ``state.json``, checked: a damaged one is named in one line."""
    def count(value) -> bool:
        return is_int_at_least(value, 0)

    def number(value) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool)

    checks = {
        "epoch": (count, "a whole number >= 0"),
        "best_epoch": (count, "a whole number >= 0"),
        "best_val_accuracy": (number, "a number"),
        "wall_seconds": (lambda v: number(v) and v >= 0, "a number >= 0"),
        "phase": (lambda v: v is None or isinstance(v, str), "a name or null"),
        "compile_epochs": (
            lambda v: isinstance(v, list) and all(count(e) for e in v),
            "a list of epochs",
        ),
        "batches": (
            lambda v: isinstance(v, list) and all(
                isinstance(b, dict) and is_int_at_least(b.get("from_epoch"), 1)
                and is_int_at_least(b.get("global_batch"), 1)
                and is_int_at_least(b.get("steps_per_epoch"), 1) for b in v
            ),
            "a list of {from_epoch, global_batch, steps_per_epoch}",
        ),
    }
    try:
        state = json.loads(path.read_text())
        if not isinstance(state, dict):
            raise ValueError(f"a JSON {type(state).__name__}, not an object")
        for key, (ok, what) in checks.items():
            if key in state and not ok(state[key]):
                raise ValueError(f"{key} is {state[key]!r}, not {what}")
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise PetalError(
            f"{path} is damaged ({first_line(err)[:200]}); the run cannot be resumed: restore "
            "the file, or start again with --overwrite."
        ) from None
    return state


def _check_resumed_classes(workdir: Path, data: str, classes: list[str]) -> None:
    """The model's outputs are the run's classes in its order: resuming on data whose classes
    differ (another set, or the same names in another order) would train the wrong outputs."""
    try:
        saved = json.loads((workdir / "config.json").read_text()).get("resolved", {})
    except (OSError, ValueError, AttributeError):
        return  # the config itself is checked where it is read
    run_classes = saved.get("classes") if isinstance(saved, dict) else None
    if run_classes and list(run_classes) != classes:
        raise PetalError(
            f"Classes of {data} ({', '.join(classes)}) differ from those of the run in "
            f"{workdir} ({', '.join(run_classes)}); resume on data with the same classes in the "
            "same order, or start a new run in another --workdir."
        )


def records_split(manifest: dict | None) -> dict | None:
    """What decides which photo a conversion put in which split: its seed, validation
    fraction and per-class counts (other photos in the folder since). None without a
    manifest."""
    if not manifest:
        return None
    splits = manifest.get("splits") or {}
    return {
        "seed": manifest.get("seed"),
        "val_fraction": manifest.get("val_fraction"),
        "per_class": {s: (splits.get(s) or {}).get("per_class") for s in ("train", "validation")},
    }


# What says how the data of a training session split its photos (``trained_on``).
# (Each entry of codelab shards also lists its train_shards: trained_shards.)
_SPLIT_KEYS = (
    "data_kind", "folder_split", "folder_kept_in_train", "records_source", "records_split"
)


def trained_on(saved_resolved: dict, data: str | None) -> list[dict]:
    """Every data a run trained on, with how each split its photos: its ``config.json``'s
    ``trained_on`` list (``saved_resolved``: its ``resolved``), or (a run saved before it
    was kept) its ``data``."""
    history = saved_resolved.get("trained_on")
    if isinstance(history, list) and all(isinstance(h, dict) for h in history):
        return history
    return [{"data": data, **{k: saved_resolved.get(k) for k in _SPLIT_KEYS}}] if data else []


def kept_in_train(config: dict, data: str) -> list[str]:
    """The files of the image folder ``data`` that a run's split kept in training against
    the rule by name (see :func:`petal.data.reader.open_source`'s ``train_names``), from
    its ``config.json`` (``config``): reading the folder again keeps them there."""
    entries = trained_on(config.get("resolved") or {}, config.get("data"))
    return sorted({
        name
        for entry in entries
        if same_place(entry.get("data") or "", data)
        and isinstance(entry.get("folder_kept_in_train"), list)
        for name in entry["folder_kept_in_train"]
        if isinstance(name, str)
    })


def _check_resumed_split(workdir: Path, source, saved_resolved: dict) -> list[dict]:
    """Refuse to resume on other data holding photos the run trained on split another way
    (records converted again with another seed or fraction, the image folder its records
    came from, records of the folder it trained on), checked against every data it trained
    on, not only the last: some photos it trained on would validate, and ``config.json``
    would name data whose validation split ``petal evaluate`` takes for held out. A
    conversion split the same way (another image size) may go on.

    Returns:
        The data it trained on before (``trained_on`` of ``config.json``).
    """
    history = trained_on(saved_resolved, resume_config(workdir).data)
    for entry in history:
        _check_split_against(workdir, source, entry["data"], entry)
    return history


def _check_split_against(workdir: Path, source, was: str, saved_resolved: dict) -> None:
    """:func:`_check_resumed_split` for one data ``was`` the run trained on, whose split is
    described by ``saved_resolved`` (its ``_SPLIT_KEYS``)."""
    from petal.data.writer import read_manifest

    if not was:
        return
    new_weights = f"--weights {workdir / 'best.weights.h5'} --workdir NEW"
    fix = f"start a new run from this one's weights ({new_weights})"
    harm = (
        "resuming on it would validate on photos the run trained on (and petal evaluate "
        "would score them as held out)"
    )
    origin = saved_resolved.get("records_source")
    if source.kind == "codelab":
        _check_codelab_split(workdir, source, was, saved_resolved, harm, fix)
        return
    if same_place(was, source.path):
        _check_split_in_place(workdir, source, saved_resolved, harm, fix)
        return
    if saved_resolved.get("data_kind") == "records" and origin:
        ours = saved_resolved.get("records_split")
        if ours is None:  # a run saved before it was recorded: its records' manifest
            try:
                ours = records_split(read_manifest(was))
            except PetalError:
                return  # gone: what split it is not known
        seed = f"--seed {ours['seed']}" if ours else "--seed"
        if source.kind == "folder" and same_place(source.path, origin):
            raise PetalError(
                f"{source.path} is the image folder that {was}, the records {workdir} trained "
                f"on, were converted from, and read as a folder it is split another way (by "
                f"each file's name, not by petal convert's {seed}): {harm}. Resume on {was}, "
                f"or {fix}."
            )
        if (resplit := _resplit(source, origin, ours)) is None:
            return
        differ, split_as_ours = resplit
        again = f", convert {origin} again with {split_as_ours}" if split_as_ours else ""
        raise PetalError(
            f"{source.path} and {was}, the records {workdir} trained on, were both converted "
            f"from {origin} but split otherwise ({differ}): {harm}. Resume on {was}{again}, or "
            f"{fix}."
        )
    if saved_resolved.get("data_kind") == "folder" and source.kind == "records":
        converted_from = (source.manifest or {}).get("source")
        if converted_from and same_place(converted_from, was):
            raise PetalError(
                f"{source.path} was converted from {was}, the image folder {workdir} trained "
                f"on, and petal convert split it another way (by --seed "
                f"{source.manifest.get('seed')}, not by each file's name): {harm}. Resume on "
                f"{was}, or {fix}."
            )


def trained_shards(entry: dict) -> set[str]:
    """The codelab shards (:func:`~petal.data.reader.shard_identity`) a run trained on from
    one entry of its ``trained_on``: as it saved them, or (a run saved before it kept
    them) as its data's listing splits them now; empty for other data."""
    if entry.get("data_kind") not in ("codelab", None) or not entry.get("data"):
        return set()
    if isinstance(saved := entry.get("train_shards"), list):
        return set(saved)
    return set(codelab_split_files(entry["data"], "train") or ())


def _check_codelab_split(
    workdir: Path, source, was: str, saved_resolved: dict, harm: str, fix: str
) -> None:
    """:func:`_check_split_against` for codelab shards, split by file: a listing of them
    (another glob, the folder with shards added or removed since) whose validation shards
    include some the run trained on."""
    trained = trained_shards({"data": was, **saved_resolved})
    taken = [f for f in source.files("validation") if shard_identity(f) in trained]
    if not taken:
        return
    shards = f"{len(taken)} of the shards {workdir} trained on ({posixpath.basename(taken[0])}"
    shards += ", ...)" if len(taken) > 1 else ")"
    rule = "codelab shards are split by file: the first 19% a folder or glob lists validate"
    if same_place(was, source.path):
        raise PetalError(
            f"{source.path} lists other shards than when {workdir} trained on it, and now takes "
            f"{shards} for validation ({rule}): {harm}. Put its shards back as they were, or "
            f"{fix}."
        )
    raise PetalError(
        f"{source.path} takes {shards} for validation ({rule}): {harm}. Resume on {was}, or "
        f"{fix}."
    )


def _check_split_in_place(
    workdir: Path, source, saved_resolved: dict, harm: str, fix: str
) -> None:
    """:func:`_check_split_against` for the very folder of records the run trained on,
    converted again since: from its photos but split otherwise, its validation split holds
    photos the run trained on. A run saved before ``records_split`` was kept goes on (how
    its records were split is not known)."""
    origin = saved_resolved.get("records_source")
    ours = saved_resolved.get("records_split")
    if saved_resolved.get("data_kind") != "records" or not origin or not ours:
        return
    if (resplit := _resplit(source, origin, ours)) is None:
        return
    differ, split_as_ours = resplit
    go_on = (
        f"Convert {origin} again into {source.path} with {split_as_ours} --overwrite, or {fix}"
        if split_as_ours
        else f"To go on, {fix}"
    )
    raise PetalError(
        f"{source.path}, the records {workdir} trained on, were converted again from {origin} "
        f"since and split otherwise ({differ}): {harm}. {go_on}."
    )


def _resplit(source, origin: str, ours: dict) -> tuple[str, str] | None:
    """:func:`_split_differences` of the records ``source`` from the run's records'
    ``ours``, where both were converted from ``origin``; None where they split alike or
    ``source`` holds other photos (the run may go on with them)."""
    theirs = records_split(source.manifest) if source.kind == "records" else None
    if theirs is None or not same_place(source.manifest.get("source") or "", origin):
        return None
    return None if theirs == ours else _split_differences(theirs, ours)


def _split_differences(theirs: dict, ours: dict) -> tuple[str, str]:
    """What differs between the ``records_split`` of the data resumed on (``theirs``) and of
    the run's records (``ours``), and the options of ``petal convert`` that split as the run's
    were ("" when the seed and fraction are the same: other photos)."""
    differ = [
        f"{key} {theirs[key]}, not {ours[key]}"
        for key in ("seed", "val_fraction")
        if theirs[key] != ours[key]
    ]
    if not differ:
        other = "the same seed and fraction, but of other photos: added, removed or skipped since"
        return other, ""
    return ", ".join(differ), f"--seed {ours['seed']} --val-fraction {ours['val_fraction']}"


# What a checkpoint fixes: its weights (model, options, input size), its optimizer's state
# and the training phase it belongs to. ``--resume`` may change anything else.
CHECKPOINT_FIELDS = (
    "model",
    "model_options",
    "image_size",
    "train_image_size",
    "optimizer",
    "fine_tune",
    "head_epochs",
)


def _check_resumed_checkpoint(workdir: Path, cfg: TrainConfig, resolved: dict) -> dict:
    """Refuse a resume whose config changes what ``last.keras`` holds (it would fail to
    load, or, for a fully convolutional model at another image size, silently go on).

    Returns:
        the saved run's resolved facts (``config.json``'s ``resolved``).
    """
    saved = read_config_file(workdir / "config.json")
    saved_resolved = saved.get("resolved") or {}
    now = cfg.to_dict()
    changed = []
    for key in CHECKPOINT_FIELDS:
        if key == "image_size" and key in saved_resolved:  # as resolved from the data
            was, new = saved_resolved[key], resolved[key]
        elif key == "train_image_size" and key in saved_resolved:
            # null trains at the image size: --set train_image_size=64 on a 64x64 run
            # changes nothing (and a changed image size is named once, as image_size).
            was, new = saved.get(key), now[key]
            if saved_resolved[key] == resolved[key]:
                continue
        elif key in saved:  # (a run saved before the field existed has no say)
            was, new = saved[key], now[key]
        else:
            continue
        if was != new:
            # Left out, a null image_size keeps the size the run trained at.
            keep = f" (leaving out --image-size and --set image_size keeps {_show(was)})"
            changed.append(f"{key} {_show(was)} -> {_show(new)}{keep * (key == 'image_size')}")
    # The starting weights were loaded once, at the start: the checkpoint holds every
    # weight since, so another file would be recorded but never loaded.
    was, new = saved.get("weights"), now["weights"]
    if "weights" in saved and _weights_place(was) != _weights_place(new):
        changed.append(f"weights {_show(was)} -> {_show(new)} (loaded once, at the start)")
    # The weights learned inputs scaled one way: another scaling feeds them other numbers.
    was = saved_resolved.get("normalization")
    if was and was != resolved["normalization"]:
        changed.append(f"normalization {_show(was)} -> {_show(resolved['normalization'])}")
    was = saved_resolved.get("precision")
    if was and (was == "mixed_float16") != (resolved["precision"] == "mixed_float16"):
        # Loss scaling wraps the optimizer: its saved state would not load (Keras only
        # warns). float32 and bfloat16 keep the same variables and may change.
        changed.append(
            f"precision {_show(was)} -> {_show(resolved['precision'])} (--precision {was} "
            "keeps it)"
        )
    # sgd and rmsprop keep a momentum slot per weight only when momentum is not 0: across
    # zero, their saved state would not load either. Another non-zero momentum may change.
    was = saved.get("momentum")
    if (
        cfg.optimizer in ("sgd", "rmsprop")
        and saved.get("optimizer") == cfg.optimizer
        and isinstance(was, (int, float))
        and (was != 0) != (now["momentum"] != 0)
    ):
        held = "momentum: any non-zero value keeps it" if was else "no momentum: 0 keeps it"
        changed.append(
            f"momentum {_show(was)} -> {_show(now['momentum'])} (the saved {cfg.optimizer} "
            f"state holds {held})"
        )
    if changed:
        raise _fixed_by_checkpoint(workdir, changed)
    return saved_resolved


def _fixed_by_checkpoint(workdir: Path | str, changed: list[str]) -> PetalError:
    return PetalError(
        f"{workdir} holds a checkpoint that --resume cannot change: {'; '.join(changed)}. "
        "Leave those settings out to continue the run, or start a new one without --resume "
        "(another --workdir, or --overwrite)."
    )


def refuse_checkpoint_changes(workdir: str | Path, base: TrainConfig, values: dict) -> None:
    """Raise :func:`_check_resumed_checkpoint`'s refusal when ``values`` (fields given to
    ``--resume`` the run ``base`` saved in ``workdir``) change a field its checkpoint fixes.
    For a config those values do not validate on: the validation's own complaint
    (``head_epochs`` is only used with head_then_all, for a changed ``fine_tune``) sent the
    user to change another field, only to be refused for this one."""
    now = base.to_dict()
    changed = [
        f"{key} {_show(now[key])} -> {_show(values[key])}"
        for key in CHECKPOINT_FIELDS
        if key in values and key not in ("image_size", "train_image_size")
        and values[key] != now[key]
    ]
    if changed:
        raise _fixed_by_checkpoint(workdir, changed)


def _trained_size(workdir: Path, cfg: TrainConfig) -> tuple[int, int] | None:
    """The size a run resumed without an ``image_size`` keeps: the one it trained at,
    resolved from its first data (``config.json``'s ``resolved``), when its own
    ``image_size`` is null too. None otherwise."""
    if cfg.image_size:
        return None
    saved = read_config_file(workdir / "config.json")
    size = (saved.get("resolved") or {}).get("image_size")
    if saved.get("image_size") is not None or not isinstance(size, list) or len(size) != 2:
        return None
    return tuple(size) if all(is_int_at_least(v, 1) for v in size) else None


def _size(size) -> str:
    return f"{size[0]}x{size[1]}"


def _larger_crops(train_size, image_size) -> str:
    """The warning for training crops larger than the evaluation size ("" when not): a
    preset's smaller training size (squeezenet-plus: 160 for 192) kept under a smaller
    --image-size trained a 64px model on 160px crops, each epoch dearer, not cheaper."""
    if train_size[0] * train_size[1] <= image_size[0] * image_size[1]:
        return ""
    return (
        f"training on {_size(train_size)} crops, larger than the {_size(image_size)} images "
        "it is evaluated on: each epoch costs more, not less (train_image_size is for "
        "training smaller, as FixRes does); pass --set "
        f"train_image_size={max(1, round(image_size[0] * 5 / 6))}, or "
        "--set train_image_size=null to train at the image size"
    )


def _weights_place(weights):
    """A weights file's absolute path ("imagenet" and None as they are)."""
    if weights in (None, "imagenet"):
        return weights
    return str(Path(weights).expanduser().resolve())


def weighted_by_label(weights: list[float]):
    """``(images, one-hot labels) -> (images, labels, sample weights)``: each label's weight
    is its class's, or its classes' mixed as the label is (mixup and cutmix; the class of
    the larger share weighed it all)."""
    import tensorflow as tf

    table = tf.constant(weights, tf.float32)
    return lambda x, y: (x, y, tf.linalg.matvec(tf.cast(y, tf.float32), table))


def _finished_wall(workdir: Path) -> float:
    """The wall time a finished session wrote in ``metrics.json`` (0 without one)."""
    try:
        wall = json.loads((workdir / "metrics.json").read_text()).get("wall_seconds")
    except (OSError, ValueError, AttributeError):
        return 0.0
    return float(wall) if isinstance(wall, int | float) and math.isfinite(wall) else 0.0


def _show(value) -> str:
    if isinstance(value, list) and len(value) == 2 and all(is_int_at_least(v, 1) for v in value):
        return _size(value)  # an image size
    return json.dumps(value)


def _model_out_of_memory(model: str, image_size) -> PetalError:
    """Building the model ran out of memory: its weights grow with the input size (a dense
    head on a large image)."""
    return PetalError(
        f"Out of memory building the model {model!r} for {_size(image_size)} images; pass a "
        f"smaller --image-size or a smaller --model (`petal models --image-size "
        f"{max(image_size)}` lists their parameters). Received: model={model!r}, "
        f"image_size={_size(image_size)}"
    )


def _training_out_of_memory(
    cfg: TrainConfig, global_batch: int, replicas: int, size
) -> PetalError:
    """A training step ran out of (accelerator) memory: its activations grow with the batch
    and the image size."""
    per_replica = global_batch // replicas
    return PetalError(
        f"Out of memory training {cfg.model!r} on batches of {per_replica} images of "
        f"{_size(size)} per replica; pass a smaller --batch-size (per replica), or a smaller "
        f"--image-size or --model. Received: batch_size={per_replica}, "
        f"image_size={_size(size)}, replicas={replicas}"
    )


def _no_room_to_cache(err, cache) -> PetalError:
    """The pipeline's error for a disk cache without room, with the fixes train takes: its
    config's ``cache`` (the training images'; None: the validation images', cached in RAM or
    else on disk whatever it says) is true or false, not a folder, and the disk cache is
    made in the temporary folder."""
    room = "set TMPDIR to a folder on a disk with room"
    if cache is None:
        return PetalError(f"{err.space} for the validation images; {room}.")
    return PetalError(
        f"{err.space}; pass --set cache=false (decode the images again each epoch) or {room}. "
        f"Received: cache={cache!r}"
    )


def _eval_input(strategy, replicas: int):
    """``(options, pipelines)`` of the validation input under ``strategy``: MirroredStrategy
    gives each replica a pipeline of its own (every n-th image: the shares differ by one
    image at most); the others, one pipeline per host, dealing its batches to the host's
    replicas in turn."""
    import tensorflow as tf

    if replicas == 1:
        return None, 1
    if isinstance(strategy, tf.distribute.MirroredStrategy):
        mode = tf.distribute.InputReplicationMode.PER_REPLICA
        return tf.distribute.InputOptions(experimental_replication_mode=mode), replicas
    try:  # (TensorFlow's default strategy raises for it)
        local = len(strategy.extended.worker_devices) or replicas
    except (AttributeError, RuntimeError):
        local = replicas
    return None, replicas // local if replicas % local == 0 else 1


def _replicated_eval_batch(
    eval_batch: int, val_count: int, replicas: int, log, pipelines: int = 1, skipped: int = 0
) -> int:
    """The validation batch: under several replicas Keras builds the model from the mean of
    the replicas' first batches (which must all be full) and gives a replica that has run
    out an empty batch, on which BatchNormalization fails.

    Each of the ``pipelines`` input pipelines reads every ``pipelines``-th image, ``s`` or
    ``s + 1`` of them, and deals its batches of ``b`` in turn to its ``replicas /
    pipelines`` replicas. So its first round of batches must be full (``b`` times its
    replicas is ``s`` at most), and ``ceil(s / b)`` must equal ``ceil((s + 1) / b)`` (``b``
    does not divide ``s``; not needed when every share is ``s``) and be a multiple of its
    replicas. ``b`` is the largest such up to the per-replica batch asked for, else the
    smallest above it. ``skipped``:
    the corrupt records left out of ``val_count``, named in a refusal.
    """
    if replicas == 1:
        return eval_batch
    fix = "add images to it (convert with a larger --val-fraction)"
    if skipped:
        fix = (
            f"{skipped} more are corrupt and skipped (--skip-corrupt): restore their shards "
            f"or convert again, or {fix}"
        )
    if val_count < replicas:
        raise PetalError(
            f"The validation split has {val_count} image(s), fewer than the {replicas} "
            f"replicas, each of which validates on a share of it: {fix}, or train on fewer "
            "devices (--strategy one-device)."
        )
    local = replicas // pipelines
    share = val_count // pipelines

    def fits(b: int) -> bool:
        uneven = val_count % pipelines and share % b == 0
        return not uneven and -(-share // b) % local == 0

    asked = min(eval_batch // replicas, share // local)
    # The largest that fits up to the batch asked for, else the smallest above it (a split
    # of 25 on two replicas was refused at 6, though 14 fits).
    sizes = [*range(asked, 0, -1), *range(asked + 1, share // local + 1)]
    per_replica = next((b for b in sizes if fits(b)), None)
    if per_replica is None:
        raise PetalError(
            f"The validation split's {val_count} images cannot be batched so that each of the "
            f"{replicas} replicas validates as many batches as the others: {fix}, or train on "
            "fewer devices (--strategy one-device)."
        )
    if per_replica * replicas == eval_batch:
        return eval_batch
    log(
        f"petal train: validation in batches of {per_replica * replicas} ({per_replica} per "
        f"replica), not {eval_batch}: its {val_count} images then give each of the "
        f"{replicas} replicas as many batches as the others, none of them empty"
    )
    return per_replica * replicas


def _multi_step_fails(strategy, replicas: int) -> bool:
    """Whether Keras' loop of several steps per execution fails under ``strategy``: on
    several replicas of a MirroredStrategy ("You must feed a value for placeholder tensor
    ... multi_step_on_iterator"), as plain Keras does. (A TPU keeps it: the codelab's speed
    depends on it.)"""
    import tensorflow as tf

    return replicas > 1 and isinstance(strategy, tf.distribute.MirroredStrategy)


def _steps_per_execution(asked: int, steps: int, replicas: int, strategy=None) -> int:
    """The training steps per Keras execution: the largest divisor of the epoch's ``steps``
    up to the one ``asked`` (Keras runs whole executions: one that does not divide the epoch
    ran extra steps, and the schedule ended early); 1 where :func:`_multi_step_fails`."""
    if _multi_step_fails(strategy, replicas):
        return 1
    return max(d for d in range(1, min(asked, steps) + 1) if steps % d == 0)


def _check_splits(source, data: str, train_count: int, val_count: int) -> None:
    """An empty split can neither train nor validate: name the split and how to fill it."""
    if source.kind == "records":
        fraction = (source.manifest or {}).get("val_fraction")
        made = f" (converted with --val-fraction {fraction})" if fraction is not None else ""
        fix_val = _fill_records_validation(source, fraction)
        below = f"than {fraction}" if fraction is not None else "(default 0.19)"
        fix_train = f"reconvert the images with a smaller --val-fraction {below} or add images"
    else:
        made = ""
        fix_val = fix_train = (
            "convert the images with `petal convert SRC DST --val-fraction 0.19` and train on "
            "those records"
        )
        if source.kind == "folder":
            # Converting them splits no better: fill the folder (reader._validation_files
            # keeps a photo on each side of a class of 2 or more).
            most = max(Counter(source.labels("train")).values(), default=0)
            fix_val = (
                f"add photos: an image folder validates {FOLDER_VAL_FRACTION:.0%} of each "
                f"class's photos, and one of a class of 2 or more (the largest class here "
                f"holds {most})"
            )
        elif source.kind == "codelab":
            # As the codelab: the first int(n x fraction) of the n shard files validate.
            need = math.ceil(1 / CODELAB_VAL_FRACTION)
            while int(need * CODELAB_VAL_FRACTION) < 1:
                need += 1
            # Shards may come without their images: rewriting the records is a fix too.
            fix_val = (
                f"codelab shards validate the first int(n x {CODELAB_VAL_FRACTION}) of their "
                f"n files, one of {need} or more ({len(source.files('all'))} here): write "
                f"their records into {need} or more shard files, each named with its record "
                f"count (NAME-<count>.tfrec), or {fix_val}"
            )
    if train_count == 0:
        raise PetalError(f"The training split of {data} holds no images{made}; {fix_train}.")
    if val_count == 0:
        raise PetalError(
            f"The validation split of {data} holds no images{made}; training validates every "
            f"epoch: {fix_val}."
        )


def _check_validation_readable(source, data: str, readable: int, crc_skipped: int) -> None:
    """With ``skip_corrupt``: records that all fail their CRC (or do not decode) leave nothing
    to validate on, which :func:`_check_splits` would blame on the split's size."""
    stored = source.count("validation")
    if readable > 0 or not stored:
        return
    files, counts = source.files("validation"), source.counts("validation")
    shards = [f for f, n in zip(files, counts, strict=True) if n]
    lost = [f"{crc_skipped} lost to CRC failures"] if crc_skipped else []
    if stored > crc_skipped:
        lost.append(f"{stored - crc_skipped} whose image does not decode")
    its = "its shard" if len(shards) == 1 else "its shards"
    raise PetalError(
        f"The validation split of {data} cannot be read: its {stored} record(s) are all "
        f"corrupt ({' and '.join(lost)}) and skipped (--skip-corrupt), and training validates "
        f"every epoch: restore {its} {', '.join(shards)} or convert the photos again."
    )


def _fill_records_validation(source, fraction) -> str:
    """How to convert again so that a class validates an image, by the converter's rule
    (``writer.validation_count``): a class of n photos validates ``round(fraction x n)``, halves
    rounded up, so one from ``0.5 / fraction`` photos on."""
    from petal.data.writer import DEFAULT_VAL_FRACTION, fraction_to_validate, photos_to_validate

    default = (
        f"reconvert the images with `petal convert SRC DST --val-fraction {DEFAULT_VAL_FRACTION}`"
    )
    splits = (source.manifest or {}).get("splits") or {}
    per_class = [(splits.get(s) or {}).get("per_class") for s in ("train", "validation")]
    if fraction is None or not all(isinstance(c, dict) for c in per_class):
        return f"{default} (the default)"  # counts unknown
    most = max((int(n) + int(per_class[1].get(c) or 0) for c, n in per_class[0].items()),
               default=0)
    asked = float(fraction) or DEFAULT_VAL_FRACTION  # 0 asked for none: the default's rule
    need = photos_to_validate(asked)
    if not fraction and most >= need:
        return f"{default} (the default)"
    rule = f"--val-fraction {asked}" if fraction else f"the default --val-fraction, {asked},"
    fix = (
        f"add photos and convert them again: {rule} validates round({asked} x n) of a "
        f"class's n photos, one of {need} or more (these records hold at most {most} per class)"
    )
    if most < 2:
        return fix  # a larger fraction would validate every photo of a class, train none
    # The smallest two-decimal fraction that validates one of the largest class's photos;
    # at most 0.25, so every class keeps a training image.
    larger = fraction_to_validate(most)
    return (
        f"reconvert the images with `petal convert SRC DST --val-fraction {larger}` (one of a "
        f"class's {most} photos validates), or {fix}"
    )


def class_weights(source, classes) -> dict[int, float]:
    """``balanced`` weights: N / (C * n_c) per class, from the training split's counts.

    Raises:
        PetalError: the counts are unknown (codelab shards) or a class has no images.
    """
    counts: dict[int, int]
    if source.manifest is not None:
        per_class = source.manifest["splits"]["train"].get("per_class") or {}
        counts = {i: int(per_class.get(name, 0)) for i, name in enumerate(classes)}
    elif source.kind == "folder":
        c = Counter(source.labels("train"))
        counts = {i: c.get(i, 0) for i in range(len(classes))}
    else:
        raise PetalError(
            f"class_weight='balanced' needs per-class counts, which {source.path} does not "
            "record; convert the images with `petal convert` first."
        )
    missing = [classes[i] for i, n in counts.items() if n == 0]
    if missing:
        raise PetalError(
            f"class_weight='balanced': no training images for {', '.join(missing)} in "
            f"{source.path}."
        )
    total = sum(counts.values())
    return {i: total / (len(classes) * n) for i, n in counts.items()}


def _global_batch(cfg: TrainConfig, replicas: int) -> int:
    return _batch_setting(cfg, replicas)[0]


def _batch_setting(cfg: TrainConfig, replicas: int) -> tuple[int, str]:
    """The global batch on ``replicas`` and the setting that made it, for messages: a
    preset's one-device batch on one, its pod batch on a pod, else ``batch_size``."""
    from petal.training.schedules import POD_REPLICAS

    if replicas == 1 and cfg.single_device_batch_size:
        made = cfg.single_device_batch_size
        return made, f"single_device_batch_size={made}"
    per_replica, name = cfg.batch_size, "batch_size"
    if replicas > POD_REPLICAS and cfg.pod_batch_size:
        per_replica, name = cfg.pod_batch_size, "pod_batch_size"
    return per_replica * replicas, f"{name}={per_replica} per replica x {replicas} replica(s)"


def _peak_lr(cfg: TrainConfig, global_batch: int) -> float | None:
    if cfg.learning_rate is None:
        return None
    if cfg.lr_reference_batch:
        from petal.training.schedules import scale_lr

        return scale_lr(cfg.learning_rate, global_batch, cfg.lr_reference_batch, "linear")
    return cfg.learning_rate


def _schedule(
    cfg: TrainConfig,
    peak: float | None,
    epochs: int,
    steps: int,
    replicas: int,
    phase: str = "all",
):
    """A per-step LearningRateSchedule for a phase of ``epochs`` epochs (``phase`` names it
    in errors)."""
    from petal.training.schedules import build_schedule, codelab_rampup_epochs, scaled_rates

    opts = dict(cfg.schedule_options)
    given = {"constant": "lr", "warmup_cosine": "peak_lr"}.get(cfg.schedule)
    if cfg.schedule == "codelab_ramp" and cfg.learning_rate is not None:
        given = "max_lr"  # else the codelab's rule for the replicas, or max_lr given here
    set_by = [("steps_per_epoch", "the data and batch size"), (given, "learning_rate")]
    if cfg.schedule == "codelab_ramp":  # the log and config.json stated one replica's peak
        set_by.append(("replicas", "the strategy's replicas"))
    for key, source in set_by:
        if key in opts:
            raise PetalError(
                f"schedule_options.{key} is set by training from {source}; remove it from "
                f"schedule_options. Received: schedule_options.{key}={opts[key]!r}"
            )
    if cfg.schedule == "constant":
        return build_schedule("constant", steps_per_epoch=steps, lr=peak, **opts)
    if phase == "full":
        # The full phase runs the head phase's schedule times fine_tune_lr_factor, its start
        # and end rates too: a peak scaled below codelab_ramp's 1e-5 ran its ramp backwards.
        opts = scaled_rates(cfg.schedule, opts, cfg.fine_tune_lr_factor)
    if cfg.schedule == "warmup_cosine":
        warmup = opts.get("warmup_epochs")
        # A warm-up as long as the phase ends at the peak: the cosine decay never starts.
        if (
            "total_epochs" not in opts
            and isinstance(warmup, (int, float))
            and math.isfinite(warmup)  # (else refused by the schedule, by name)
            and warmup >= epochs
        ):
            raise _long_warmup(cfg, warmup, epochs, phase, need=math.floor(warmup) + 1)
        total = opts.get("total_epochs")
        if (
            isinstance(total, (int, float))
            and not isinstance(total, bool)
            and 0 < total < epochs
            and not opts.get("end_lr")
        ):
            # After total_epochs the rate stays at end_lr: whole epochs trained at 0.
            where = "" if phase == "all" else f" ({phase} phase)"
            raise PetalError(
                f"schedule_options.total_epochs={total} is shorter than the {epochs} epochs it "
                f"schedules{where}: the cosine reaches end_lr=0 there, and the epochs after it "
                f"would train at a rate of 0. Drop total_epochs (the run's epochs), set it to "
                f"{epochs} or more, or set schedule_options.end_lr above 0. "
                f"Received: schedule_options.total_epochs={total}"
            )
        opts.setdefault("total_epochs", epochs)
        return build_schedule("warmup_cosine", steps_per_epoch=steps, peak_lr=peak, **opts)
    # codelab_ramp. Each phase of head_then_all ramps up anew: a ramp that does not fit in one
    # never reaches the peak the log states. (A whole run shorter than its ramp is the
    # codelab's schedule cut short, as a quick run of codelab-xception's 5-epoch ramp is.)
    ramp = opts.get("rampup_epochs")
    if ramp is None:
        ramp = codelab_rampup_epochs(replicas)  # the codelab's: 7 on a pod, else 5
    if phase != "all" and isinstance(ramp, (int, float)) and math.isfinite(ramp):
        # Per epoch (the codelab's callback) the peak is the rate of the epoch after the ramp,
        # so a phase needs one epoch more than it; interpolated, it comes at the ramp's end.
        need = math.ceil(ramp) + (opts.get("interpolate") is not True)
        if epochs < need:
            raise _long_warmup(cfg, ramp, epochs, phase, "rampup_epochs", need)
    # max_lr from learning_rate, else the codelab's rule for this many replicas
    # (schedule_options.max_lr, else codelab_max_lr) -- times fine_tune_lr_factor in the full
    # phase of head_then_all, which passes that rate as its peak.
    if peak is not None:
        opts["max_lr"] = peak
    opts.setdefault("replicas", replicas)
    return build_schedule("codelab_ramp", steps_per_epoch=steps, **opts)


def _long_warmup(
    cfg: TrainConfig,
    warmup: float,
    epochs: int,
    phase: str,
    key: str = "warmup_epochs",
    need: int | None = None,
) -> PetalError:
    """A warm-up (schedule option ``key``) longer than the phase it warms up: the settings
    that make the phase long enough (each phase of head_then_all runs the schedule from its
    start). ``need``: the epochs a phase needs to reach the peak, when more than the
    warm-up's (codelab_ramp per epoch peaks the epoch after its ramp; warmup_cosine decays
    after its warm-up)."""
    what = f"The learning-rate warm-up (schedule_options.{key}={warmup}) is longer than"
    if need is not None and need > math.ceil(warmup):
        after = (
            "codelab_ramp reaches its peak the epoch after it"
            if key == "rampup_epochs"
            else "warmup_cosine decays after it"
        )
        what = (
            f"The learning-rate warm-up (schedule_options.{key}={warmup}; {after}) does not "
            "fit in"
        )
    shorter = f"or a shorter warm-up (--set schedule_options.{key}=N)."
    need = math.ceil(warmup) if need is None else need
    if phase == "head":
        more = f"--set head_epochs={need}"
        if cfg.epochs < 2 * need:  # the full phase warms up too
            more += f" and --epochs {2 * need}"
        return PetalError(
            f"{what} the head-only phase's {_epochs(epochs)} (head_epochs={epochs}; each phase "
            f"of fine_tune='head_then_all' warms up anew): pass {more} or more, {shorter}"
        )
    if phase == "full":
        return PetalError(
            f"{what} the {_epochs(epochs)} after the head-only phase (epochs {cfg.epochs} - "
            f"head_epochs {cfg.head_epochs}; each phase of fine_tune='head_then_all' warms up "
            f"anew): pass --epochs {cfg.head_epochs + need} or more, {shorter}"
        )
    return PetalError(
        f"{what} the {epochs} epoch(s) to train: pass --epochs {need} or more, {shorter}"
    )


def _ramp_peak(cfg: TrainConfig, replicas: int) -> float:
    """codelab_ramp's peak without a learning_rate: schedule_options.max_lr, else the
    codelab's rule for the replicas (a bad max_lr is refused where the schedule is built)."""
    from petal.training.schedules import codelab_max_lr

    given = cfg.schedule_options.get("max_lr")
    if isinstance(given, (int, float)) and not isinstance(given, bool):
        return given
    return codelab_max_lr(replicas)


def _rebuilt_schedule(
    cfg: TrainConfig, workdir: Path, start_epoch: int, peak, steps: int, replicas: int
) -> str | None:
    """What a resume for another number of epochs does to a schedule whose length follows
    them (warmup_cosine): rebuilt, it moves the rate at the next epoch (up, after a decay
    that was nearly over). None when the rate goes on as it would have."""
    import keras

    old = resume_config(workdir)
    saved = old.epochs
    if saved == cfg.epochs or cfg.schedule != "warmup_cosine" or old.schedule != cfg.schedule:
        return None
    if "total_epochs" in cfg.schedule_options:
        return None
    phase = _phases(cfg, peak)[-1]  # the one phase whose length follows --epochs
    if not phase.start < start_epoch < phase.end:
        return None  # (a head phase is head_epochs long, whatever the epochs)
    was_epochs = phase.end - phase.start - (cfg.epochs - saved)
    if was_epochs < 1:
        return None

    def rate(epochs: int, step: int, built=cfg) -> float:
        schedule = _schedule(built, phase.lr, epochs, steps, replicas, phase.name)
        return float(keras.ops.convert_to_numpy(schedule(step)))

    step = (start_epoch - phase.start) * steps
    try:
        # The schedule as saved (its warm-up too, which the resume may change), against the
        # new one; a new one that cannot be built is refused when the run builds it.
        now, before = rate(phase.end - phase.start, step), rate(was_epochs, step, old)
    except PetalError:
        return None
    if abs(now - before) <= 0.01 * max(abs(now), abs(before)):
        return None
    ended = next((r["lr_end"] for r in read_history(workdir / "history.csv", "drop")
                  if r["epoch"] == start_epoch and not math.isnan(r["lr_end"])), None)
    if ended is None:
        ended = rate(was_epochs, step - 1, old)
    whose, over = ("", "all its epochs") if phase.name == "all" else (
        f"{phase.name} phase's ", "each phase's epochs"
    )
    return (
        f"the {whose}warmup_cosine schedule is rebuilt for {_epochs(phase.end - phase.start)} "
        f"(it was built for {was_epochs}): the learning rate goes from {ended:.3g} at the end "
        f"of epoch {start_epoch} to {now:.3g} at epoch {start_epoch + 1} (a new run follows "
        f"one schedule over {over})"
    )


def _optimizer(cfg: TrainConfig, schedule):
    import keras

    common = {"learning_rate": schedule}
    if cfg.clipnorm:
        common["clipnorm"] = cfg.clipnorm
    if cfg.optimizer == "adam":
        return keras.optimizers.Adam(**common)
    if cfg.optimizer == "adamw":
        return keras.optimizers.AdamW(weight_decay=cfg.weight_decay, **common)
    if cfg.optimizer == "sgd":
        return keras.optimizers.SGD(
            momentum=cfg.momentum, nesterov=True, weight_decay=cfg.weight_decay or None, **common
        )
    return keras.optimizers.RMSprop(momentum=cfg.momentum, **common)


def _phases(cfg: TrainConfig, peak: float | None, replicas: int = 1) -> list[_Phase]:
    if cfg.fine_tune == "head_then_all":
        # The full phase peaks at the head phase's rate (the codelab's rule when there is no
        # learning_rate) times the factor.
        rate = peak if peak is not None else _ramp_peak(cfg, replicas)
        low = rate * cfg.fine_tune_lr_factor
        return [
            _Phase("head", 0, cfg.head_epochs, peak, backbone_trainable=False),
            _Phase("full", cfg.head_epochs, cfg.epochs, low, backbone_trainable=True),
        ]
    return [_Phase("all", 0, cfg.epochs, peak, backbone_trainable=None)]


def _no_backbone(cfg: TrainConfig) -> PetalError:
    from petal.models import list_models, model_info

    with_one = [name for name in list_models() if model_info(name).pretrained]
    return PetalError(
        f"fine_tune='head_then_all' trains a new head on a frozen pretrained backbone, which "
        f"{cfg.model!r} does not have (models with one: {', '.join(with_one)}); use "
        f"fine_tune='all' to fine-tune every layer from --weights. Received: model={cfg.model!r}"
    )


def _training_batch_norms(model) -> int:
    """How many BatchNormalization layers switched to the fused kernel train now."""
    from petal.models.registry import walk_layers

    fused = [layer for layer in walk_layers(model) if getattr(layer, "_petal_fused", False)]
    return sum(layer.trainable for layer in fused)


# Families whose models take one input size, there being no any_size option to change it.
_ONE_SIZE_FAMILIES = ("dense", "convnet", "inception", "applications")


def _check_train_size(cfg: TrainConfig, image_size) -> None:
    """A training size other than the evaluation size needs the ``crop`` augmentation and a
    model that takes any input size: every change it needs, named at once before anything is
    built (each was refused on its own, and the first fix led to the second refusal)."""
    from petal.data import augment as augment_lib
    from petal.models import model_info
    from petal.models.registry import model_options

    size = cfg.train_image_size
    if not size or (size, size) == tuple(image_size):
        return
    height, width = image_size
    needs, fixes = [], []
    if not augment_lib.has_crop(cfg.augment):
        needs.append("the 'crop' augmentation, which resizes its crops to that size")
        fixes.append(f"--set augment={augment_lib.with_crop(cfg.augment)}")
    received = f"Received: model={cfg.model!r}, augment={cfg.augment!r}, train_image_size={size}"
    model_needs = f"a model that takes {size}x{size} crops as well as its {height}x{width} input"
    if "any_size" not in model_options(cfg.model):
        if model_info(cfg.model).family in _ONE_SIZE_FAMILIES:
            raise PetalError(
                f"train_image_size {size} needs {model_needs}, and {cfg.model!r} has no any_size "
                "option (squeezenet and squeezenet_separable do), so it cannot train at another "
                "size: drop train_image_size, or pass --model squeezenet --set "
                f"model_options.any_size=true{''.join(' ' + fix for fix in fixes)}. {received}"
            )
        # A model registered elsewhere: its input is checked once built.
    elif cfg.model_options.get("any_size", False) is False:  # other values: refused as built
        needs.append(model_needs)
        fixes.append("--set model_options.any_size=true")
    if needs:
        raise PetalError(
            f"train_image_size {size} needs {', and '.join(needs)}: pass {' '.join(fixes)}, or "
            f"drop train_image_size. {received}"
        )


def _check_takes_train_size(model, cfg: TrainConfig, image_size) -> None:
    """Crops smaller than the evaluation size need a model that takes any input size: the
    built model's input, for models :func:`_check_train_size` cannot judge before."""
    from petal.models import model_info

    crop = (cfg.train_image_size,) * 2 if cfg.train_image_size else tuple(image_size)
    fixed = tuple(model.input_shape[1:3])
    if crop == tuple(image_size) or None in fixed:
        return
    how = (
        "pass --set model_options.any_size=true"
        if model_info(cfg.model).family == "squeezenet"
        else f"{cfg.model!r} has no any_size option (squeezenet and squeezenet_separable do)"
    )
    raise PetalError(
        f"train_image_size {cfg.train_image_size} needs a model that takes {crop[0]}x{crop[1]} "
        f"crops as well as its {fixed[0]}x{fixed[1]} input: {how}, or drop train_image_size. "
        f"Received: model={cfg.model!r}, train_image_size={cfg.train_image_size}"
    )


def train(
    config: TrainConfig,
    workdir: str | Path,
    *,
    resume: bool = False,
    overwrite: bool = False,
    log: Callable[[str], None] | None = None,
) -> dict:
    """Train ``config`` into ``workdir``.

    Seeds Python's, NumPy's and TensorFlow's global random generators with ``config.seed``
    (``keras.utils.set_random_seed``) and does not restore them afterwards.

    Args:
        config: the run's configuration (``config.data`` must name the training data; a
            local path is saved absolute in ``config.json``).
        workdir: output folder; refused when it holds another run, unless ``resume``
            (continue from the last completed epoch, optimizer state included) or
            ``overwrite`` (delete the old run's files first). A run that stopped before
            its first checkpoint does not count: its files are replaced.
        resume: continue the run saved in ``workdir``; one that already completed
            ``config.epochs`` is left as it is (its ``metrics.json`` is returned), and fewer
            epochs than it completed are refused. What its checkpoint holds
            (:data:`CHECKPOINT_FIELDS`: model, input size, optimizer, phases; a null
            ``image_size`` keeps the size it trained at, on data of another size), the input
            normalization its weights learned and float16 loss scaling cannot change; the
            rest may (epochs, data with the same classes but not the run's photos split
            another way, batch size, strategy): the schedule continues from the saved epoch
            at the new steps per epoch (a warmup_cosine one is rebuilt for new epochs, with a
            warning of the jump).
        overwrite: replace the run saved in ``workdir``.
        log: receives the progress lines (default: print).

    Returns:
        The contents of ``metrics.json``.

    Raises:
        PetalError: bad config or data, a refused work directory, or a non-finite loss
            (the message names the epoch).
    """
    from petal.training.strategy import check_tensorflow_backend

    check_tensorflow_backend("petal train")
    with contextlib.ExitStack() as releases:
        return _train(
            config, workdir, resume=resume, overwrite=overwrite, log=log, releases=releases
        )


def _train(
    config: TrainConfig,
    workdir: str | Path,
    *,
    resume: bool,
    overwrite: bool,
    log: Callable[[str], None] | None,
    releases: contextlib.ExitStack,
) -> dict:
    """:func:`train`; ``releases`` gets what to release however it ends (the records'
    reading marker)."""
    import keras
    from tensorflow import errors as tf_errors

    from petal.data import augment as augment_lib
    from petal.data.pipeline import (
        NoRoomToCache,
        auto_cache_choice,
        distributed_dataset,
        eval_dataset,
        open_source,
        skip_list_key,
        train_dataset,
        upscale_warning,
    )
    from petal.models import (
        count_params,
        create_model,
        get_backbone,
        model_info,
        set_backbone_trainable,
    )
    from petal.models.registry import check_weights_file, h5_layout
    from petal.training.fused_bn import use_fused_batch_norm
    from petal.training.precision import (
        agree_on_overflow,
        resolve_precision,
        set_policy,
        slow_precision_warning,
    )
    from petal.training.strategy import (
        check_fit_cluster,
        check_global_batch,
        describe,
        get_strategy,
        replica_stats_sync,
    )

    log = log or _log_default
    if not isinstance(config, TrainConfig):
        raise PetalError(
            "train needs a TrainConfig (from get_preset(...), load_config(...) or "
            f"TrainConfig(...)). Received: config of type {type(config).__name__}"
        )
    workdir = expand_home(workdir)
    need_folder(workdir, "workdir", "the run folder to write or resume", empty=False)
    refuse_url(workdir, "workdir", "run folders")
    resume, overwrite = need_bool(resume, "resume"), need_bool(overwrite, "overwrite")
    cfg = config.validate()
    cfg = cfg.replace(
        data=expand_home(cfg.data), cache=expand_home(cfg.cache), weights=expand_home(cfg.weights)
    )
    workdir = Path(workdir)
    recover_replaced(workdir, log)
    prepare_workdir(workdir, resume, overwrite, clear=False)  # checks only
    if cfg.tensorboard:
        _check_tensorboard_folder(workdir)
    if not cfg.data:
        raise PetalError("No training data: pass --data RECORDS (a folder from `petal convert`).")
    _check_workdir_outside_data(workdir, cfg.data)
    if data_kind := holds_data(workdir):
        # The run's files went in among records or photos (a later convert of the photos
        # read its tensorboard/ and plots/ as classes).
        raise PetalError(
            f"Work directory {workdir} holds {data_kind}; pass a --workdir of its own (a new "
            "or empty folder) so that the run's files do not mix with the data."
        )
    if not is_remote(cfg.data) and (who := running_elsewhere(Path(cfg.data), "converting into it")):
        # A conversion replacing its shards: they vanish under the run, or the run trains on
        # the new split while its config.json records the old one.
        raise in_use_error(cfg.data, who, "--data")
    info_model = model_info(cfg.model)  # unknown model: fails before anything is written
    if cfg.fine_tune == "head_then_all" and not info_model.pretrained:
        raise _no_backbone(cfg)
    # Bad schedule options (a warm-up longer than its phase), augmentation names or sizes:
    # also before the data is opened. The schedule at the steps per epoch given, else at
    # many (the data sets them): at one, a schedule shorter than half an epoch rounded to no
    # step. Checked again at the real count once it is known.
    for phase in _phases(cfg, cfg.learning_rate):
        _schedule(cfg, phase.lr, phase.end - phase.start, cfg.steps_per_epoch or 10**6, 1,
                  phase.name)
    augment_lib.build(cfg.augment)
    for key in ("image_size", "train_image_size"):
        if getattr(cfg, key):
            info_model.image_hw(getattr(cfg, key), key, cfg.model_options)

    state: dict = {
        "epoch": 0,
        "best_epoch": 0,
        "best_val_accuracy": -1.0,
        "wall_seconds": 0.0,
        "phase": None,
        "compile_epochs": [],
    }
    if resume and (workdir / "state.json").is_file():
        state.update(_read_state(workdir / "state.json"))
    elif resume and (held := _epoch_files(workdir)):
        # Started over, the run's checkpoints and results would be replaced.
        raise PetalError(
            f"{workdir / 'state.json'} is missing, but {workdir} holds completed epochs "
            f"({', '.join(held)}); the run cannot be resumed: restore the file, or start "
            "again with --overwrite."
        )
    start_epoch = int(state["epoch"])
    # A finished run is never retrained or re-described: its config.json keeps the epochs
    # its history.csv and checkpoints hold.
    finished = resume and start_epoch >= cfg.epochs
    if resume and start_epoch > cfg.epochs:
        raise PetalError(
            f"{workdir} already completed {start_epoch} epochs, more than the {cfg.epochs} "
            f"asked for; pass --epochs {start_epoch + 1} or more to train it further, or leave "
            f"--epochs out. Received: epochs={cfg.epochs}"
        )
    if finished:
        # Also a run stopped early and ended now (--epochs as many as it completed).
        _check_nothing_changed(workdir, cfg, start_epoch)
    # A run stopped early and ended now: its config.json is rewritten with the epochs it ended
    # at, as metrics.json says (with the saved ones, a later --resume trained on).
    ended_early = finished and resume_config(workdir).epochs != cfg.epochs
    # A model.keras cut short (by a petal before it was written through a temporary file)
    # is written again from last.keras, and a missing or damaged metrics.json from
    # history.csv and state.json.
    if finished and _whole_model(workdir / "model.keras") and (workdir / "metrics.json").is_file():
        try:
            done = json.loads((workdir / "metrics.json").read_text())
            if not isinstance(done, dict):
                raise ValueError(f"a JSON {type(done).__name__}, not an object")
        except (OSError, UnicodeDecodeError, ValueError) as err:
            log(
                f"petal train: warning: {workdir / 'metrics.json'} is damaged "
                f"({first_line(err)[:200]}); writing it again from history.csv and state.json"
            )
        else:
            # The marker a killed run left is taken over and removed (refused while another
            # process trains here): a later process given its pid would pass for it.
            _mark_running(workdir)()
            log(
                f"petal train: {workdir} already completed {_epochs(start_epoch)}; nothing to "
                f"do (to train it further, pass --epochs {start_epoch + 1} or more)"
            )
            return done
    # Only training on (or writing model.keras again) needs the checkpoint.
    if resume and start_epoch and not (workdir / "last.keras").is_file():
        raise PetalError(
            f"{workdir}/state.json says epoch {start_epoch} but last.keras is missing; "
            "start again with --overwrite."
        )
    if resume:
        _check_resumed_data(cfg, workdir)
        try:  # damaged before its last row (a cut-short last row is the interruption's)
            rows = read_history(workdir / "history.csv", "drop")
        except (ValueError, UnicodeDecodeError) as err:
            raise PetalError(
                f"{workdir / 'history.csv'} is damaged ({err}); it cannot be resumed: start "
                "again with --overwrite."
            ) from None
        # Resumed, metrics.json would score the new epochs alone, against a state.json (and
        # best.weights.h5) of the epochs whose rows were lost.
        kept = len({row["epoch"] for row in rows} & set(range(1, start_epoch + 1)))
        if kept < start_epoch:
            lacks = ("is missing" if not (workdir / "history.csv").is_file()
                     else f"holds the rows of {kept} of them")
            raise PetalError(
                f"{workdir / 'state.json'} says {_epochs(start_epoch)} completed but "
                f"{workdir / 'history.csv'} {lacks}; the run cannot be resumed: restore the "
                "file, or start again with --overwrite."
            )
    # Stored absolute in config.json, so evaluate and --resume work from any directory (a
    # relative weights file was looked for in the resume's directory).
    weights = cfg.weights if cfg.weights in (None, "imagenet") else absolute_data(cfg.weights)
    cfg = cfg.replace(data=absolute_data(cfg.data), weights=weights)

    if cfg.strategy == "multi-worker":
        check_fit_cluster()
    strategy, sinfo = get_strategy(cfg.strategy)
    replicas = int(sinfo["replicas"])
    global_batch = _global_batch(cfg, replicas)
    check_global_batch(global_batch, replicas)
    eval_batch = cfg.eval_batch_size or global_batch
    check_global_batch(eval_batch, replicas, "eval_batch_size")
    policy = resolve_precision(cfg.precision, sinfo, cfg.model)
    previous_policy = keras.mixed_precision.global_policy().name

    saved_config = workdir / "config.json"
    kept = kept_in_train(read_config_file(saved_config), cfg.data) if resume and (
        saved_config.is_file()) else []  # fmt: skip
    source = open_source(cfg.data, classes=cfg.classes, train_names=kept)
    if source.kind == "records" and not is_remote(source.path):
        # A conversion into these records is refused from here (the model's build took
        # long enough for one to replace the shards) to the end of this run.
        releases.callback(mark_reading(Path(source.path), "training from it"))
    classes = list(source.classes)
    if resume:
        _check_resumed_classes(workdir, cfg.data, classes)
    if cfg.weights not in (None, "imagenet") and not (resume and start_epoch):
        # Before the start-up lines (the model's build looked for it, after them); a resumed
        # run loaded its weights when it started.
        check_weights_file(
            cfg.weights, ", 'imagenet', or None: `--weights none` on the command line"
        )
    # A run that took its size from its records keeps it (its model's input) on records of
    # another size, which are resized to it as for an explicit image_size.
    trained_size = _trained_size(workdir, cfg) if resume and start_epoch else None
    if cfg.image_size:
        image_size = (cfg.image_size, cfg.image_size)
    elif trained_size:
        image_size = trained_size
    elif source.image_size:
        image_size = tuple(source.image_size)
    else:
        image_size = (info_model.default_image_size,) * 2
    _check_train_size(cfg, image_size)
    normalization = cfg.normalization or info_model.normalization
    undecodable = _undecodable(source, cfg, log)
    train_count, val_count = source.count("train"), source.count("validation")
    if undecodable:
        # The pipeline drops these files or records: leave them out of the counts (the
        # validation length Keras is told, the steps per epoch).
        val_count -= _in_split(undecodable, source, "validation")
        train_count -= _in_split(undecodable, source, "train")
    crc_skipped = 0
    if cfg.skip_corrupt and source.kind != "folder" and not source.remote:
        # After a CRC failure the reader skips the rest of its shard: a split left with no
        # record to read is refused now (it trained, then had no accuracy to report), and
        # each replica's validation batches are sized from the records it will read (Keras
        # stopped on replicas' first batches of different sizes).
        from petal.data.reader import unread_records

        crc_skipped = unread_records(source, "validation")
        _check_validation_readable(source, cfg.data, val_count - crc_skipped, crc_skipped)
        if replicas > 1:
            val_count -= crc_skipped
    _check_splits(source, cfg.data, train_count, val_count)
    eval_options, pipelines = _eval_input(strategy, replicas)
    skipped = crc_skipped + _in_split(undecodable or [], source, "validation")
    eval_notes: list[str] = []  # said after the run's header and strategy lines
    eval_batch = _replicated_eval_batch(eval_batch, val_count, replicas, eval_notes.append,
                                        pipelines, skipped)  # fmt: skip
    steps = cfg.steps_per_epoch or train_count // global_batch
    if steps < 1:
        given = _batch_setting(cfg, replicas)[1]  # (a preset's one-device batch on one)
        raise PetalError(
            f"The training split of {cfg.data} has {train_count} images, fewer than one global "
            f"batch of {global_batch}; lower batch_size (--set batch_size=N). Received: {given}"
        )
    weights_by_class = class_weights(source, classes) if cfg.class_weight == "balanced" else None
    peak = _peak_lr(cfg, global_batch)
    for phase in _phases(cfg, peak, replicas):  # at this count, some length may round to none
        _schedule(cfg, phase.lr, phase.end - phase.start, steps, replicas, phase.name)
    resize = (source.manifest or {}).get("resize") or "fill"

    resolved = {
        "classes": classes,
        "image_size": list(image_size),
        "train_image_size": [cfg.train_image_size] * 2
        if cfg.train_image_size
        else list(image_size),
        "records_size": list(source.image_size) if source.image_size else None,
        "resize": resize,
        "normalization": normalization,
        "data_kind": source.kind,
        # How an image folder was split (evaluate checks that it splits the same way).
        "folder_split": FOLDER_SPLIT if source.kind == "folder" else None,
        # Its files that train against the rule by name: photos added since would move them
        # into validation (evaluate and a resume keep them in training).
        # (with those an earlier session kept: one out of the folder then stays recorded)
        "folder_kept_in_train": sorted({*kept, *source.kept_in_train})
        if source.kind == "folder"
        else None,
        # The image folder the records were converted from (evaluate refuses to score it
        # as held-out data: it holds the training images), and how they were split (a
        # resume on records split otherwise is refused).
        "records_source": (source.manifest or {}).get("source"),
        "records_split": records_split(source.manifest),
        "train_count": train_count,
        "val_count": val_count,
        "strategy": sinfo["name"],
        "devices": list(sinfo["devices"]),
        "replicas": replicas,
        "precision": policy,
        "global_batch": global_batch,
        "eval_batch": eval_batch,
        "steps_per_epoch": steps,
        "steps_per_execution": _steps_per_execution(
            cfg.steps_per_execution, steps, replicas, strategy
        ),
        "peak_lr": peak if peak is not None else _ramp_peak(cfg, replicas),
        "class_weights": weights_by_class,
    }
    was_steps = steps
    saved_resolved: dict = {}
    history: list[dict] = []
    if resume and start_epoch:
        saved_resolved = _check_resumed_checkpoint(workdir, cfg, resolved)
        was_steps = saved_resolved.get("steps_per_epoch", steps)
        history = _check_resumed_split(workdir, source, saved_resolved)
    # Every data the run trained on, how each split its photos: a later --resume on any of
    # their photos split another way is refused (not only on the last one's).
    entry = {"data": cfg.data, **{k: resolved[k] for k in _SPLIT_KEYS}}
    if source.kind == "codelab":
        # Codelab shards are split by file: the ones it trained on, in every session (a
        # resume on another listing of them that validates on some is refused; evaluate
        # warns of them).
        earlier = [h.get("train_shards") or [] for h in history
                   if same_place(h.get("data") or "", cfg.data)]  # fmt: skip
        now = [shard_identity(f) for f in source.files("train")]
        entry["train_shards"] = list(dict.fromkeys([*sum(earlier, []), *now]))
    resolved["trained_on"] = [
        *(h for h in history if not same_place(h.get("data") or "", cfg.data)),
        entry,
    ]
    train_size = tuple(resolved["train_image_size"])
    crops = ""
    if train_size != image_size:
        crops = f" (training on {train_size[0]}x{train_size[1]} crops)"
    log(
        f"petal train: {cfg.model} {image_size[0]}x{image_size[1]}{crops}, {len(classes)} "
        f"classes, {train_count} train / {val_count} validation images ({source.kind} "
        f"{cfg.data})"
    )
    if trained_size and source.image_size and tuple(source.image_size) != trained_size:
        log(
            f"petal train: the {_size(source.image_size)} records are resized to "
            f"{_size(trained_size)}, the size the run trained at (its image_size is null: the "
            "size of the records it began on)"
        )
    if larger := _larger_crops(train_size, image_size):
        log(f"petal train: warning: {larger}")
    if upscaled := upscale_warning(source, image_size):  # crops: _larger_crops above
        # Upscaling adds no detail: the recipe's accuracy needs records at its size.
        log(f"petal train: warning: {upscaled}")
    for note in source.notes:  # an image folder's files not read; class names assumed
        log(f"petal train: warning: {note}")
    if (
        resume
        and start_epoch
        and source.kind == "folder"
        and saved_resolved.get("data_kind") == "folder"
        and saved_resolved.get("folder_split") != FOLDER_SPLIT
    ):
        log(
            f"petal train: warning: {workdir} began when petal split image folders another "
            "way: from here on some of its validation images train, and some training "
            "images validate (start a new run for a clean held-out split)"
        )
    best = workdir / "best.weights.h5"
    if resume and start_epoch and state.get("best_epoch") and h5_layout(best) != "keras3":
        # The Checkpointer writes it only for an epoch that beats state.json's best.
        log(
            f"petal train: warning: {best} is {'damaged' if best.exists() else 'missing'}: "
            f"the weights of the run's best epoch ({state['best_epoch']}, val_acc "
            f"{state.get('best_val_accuracy', -1.0):.4f}) are lost; it is written again when a "
            "later epoch does better"
        )
    log(f"petal train: {describe(sinfo, policy, global_batch)}")
    for note in eval_notes:
        log(note)
    if (was := saved_resolved.get("precision")) and was != policy:
        # Allowed (float32 and bfloat16 keep the same variables), but metrics.json names the
        # last session's only: --precision auto resolves again on another host.
        log(
            f"petal train: precision {was} -> {policy} from epoch {start_epoch + 1} "
            f"(--precision {cfg.precision}; the last session, to epoch {start_epoch}, trained "
            f"in {was})"
        )
    if isinstance(cfg.cache, str) and cfg.cache.lower() == "auto":
        # What auto chose, and why: RAM, or local disk when the decoded images do not fit.
        where = auto_cache_choice(source, "train", image_size)
        log(f"petal train: cache=auto: the decoded training images are cached {where}")
    if slow := slow_precision_warning(cfg.precision, sinfo):
        log(f"petal train: warning: {slow}")
    if cfg.optimizer in ("adam", "adamw") and cfg.momentum != TrainConfig.momentum:
        # Said, not refused: a run saved with it (ignored, as ever) still resumes.
        log(
            f"petal train: warning: momentum={cfg.momentum} is not used by optimizer "
            f"{cfg.optimizer!r} (its own momentum is fixed, beta_1 0.9): set optimizer='sgd' or "
            "'rmsprop' to use it, or leave momentum out"
        )
    if cfg.steps_per_execution > 1 and _multi_step_fails(strategy, replicas):
        log(
            f"petal train: steps_per_execution {cfg.steps_per_execution} -> 1: Keras' loop of "
            f"several steps per execution fails on {replicas} replicas (\"You must feed a value "
            "for placeholder tensor\")"
        )
    elif resolved["steps_per_execution"] != cfg.steps_per_execution:
        log(
            f"petal train: steps_per_execution {cfg.steps_per_execution} -> "
            f"{resolved['steps_per_execution']}, the largest that divides the {steps} steps "
            "per epoch (Keras runs whole executions: the epochs would run extra steps)"
        )
    log(
        f"petal train: {steps} steps/epoch x {cfg.epochs} epoch{'s' * (cfg.epochs != 1)}, "
        f"{cfg.optimizer} "
        f"{cfg.schedule} peak lr {resolved['peak_lr']:.3g}"
        + (f", resuming after epoch {start_epoch}" if resume and start_epoch else "")
        + (", resuming a run that completed no epoch: from the start" if resume and not start_epoch
           else "")
        + (f" (it ran {was_steps} steps/epoch)" if was_steps != steps else "")
    )

    rebuilt = resume and start_epoch and _rebuilt_schedule(
        cfg, workdir, start_epoch, peak, steps, replicas
    )
    if rebuilt:
        log(f"petal train: warning: {rebuilt}")

    augment = cfg.augment
    if cfg.train_image_size and (cfg.train_image_size,) * 2 != tuple(image_size):
        # Decode (and cache) at the evaluation size; the random resized crop outputs the
        # smaller training size.
        augment = augment_lib.build(cfg.augment, size=(cfg.train_image_size,) * 2)

    def train_fn(ctx=None, epoch=start_epoch):
        try:
            ds = train_dataset(
                source,
                batch_size=global_batch,
                image_size=image_size,
                augment=augment,
                cache=cfg.cache,
                shuffle_buffer=cfg.shuffle_buffer,
                seed=cfg.seed,
                # A resumed run (a later phase) reads on where the interrupted run (the phase
                # before) stopped: the same batches.
                start_step=epoch * steps,
                deterministic=cfg.deterministic,
                normalization=normalization,
                input_context=ctx,
                skip_corrupt=cfg.skip_corrupt,
            )
        except NoRoomToCache as err:
            raise _no_room_to_cache(err, cfg.cache) from None
        if weights_by_class is not None:
            ds = ds.map(weighted_by_label([weights_by_class[i] for i in range(len(classes))]))
        return ds

    def eval_fn(ctx=None):
        try:
            ds = eval_dataset(
                source,
                batch_size=eval_batch,
                image_size=image_size,
                normalization=normalization,
                input_context=ctx,
                cache="auto",
                skip_corrupt=cfg.skip_corrupt,
            )
        except NoRoomToCache as err:
            raise _no_room_to_cache(err, None) from None
        if ctx is None and not cfg.skip_corrupt:
            import tensorflow as tf

            # Record reads have unknown length; telling Keras spares it a first pass that
            # ends in a misleading "input ran out of data" warning. Not when corrupt records
            # are skipped: their batches may be fewer (the assertion failed the run).
            ds = ds.apply(tf.data.experimental.assert_cardinality(-(-val_count // eval_batch)))
        return ds

    def train_from(epoch):
        """The training input from ``epoch`` on: each model.fit starts its input over."""
        if replicas > 1:
            return distributed_dataset(strategy, lambda ctx: train_fn(ctx, epoch))
        return train_fn(epoch=epoch)

    # Each session's global batch and steps per epoch, from the first epoch it trains (a
    # resume may change them): metrics.json's global_batch is the last session's alone.
    batches = state.get("batches") or []
    if not batches and start_epoch and saved_resolved.get("global_batch"):
        # A run saved before they were kept: its config.json's, its last session's.
        batches = [{"from_epoch": 1, "global_batch": saved_resolved["global_batch"],
                    "steps_per_epoch": saved_resolved.get("steps_per_epoch", was_steps)}]
    batches = [b for b in batches if b["from_epoch"] <= start_epoch]
    now = {"global_batch": global_batch, "steps_per_epoch": steps}
    if not batches or {key: batches[-1][key] for key in now} != now:
        batches.append({"from_epoch": start_epoch + 1, **now})
    state["batches"] = batches

    train_ds = train_from(start_epoch)
    if replicas > 1:
        val_ds = distributed_dataset(strategy, eval_fn, options=eval_options)
    else:
        val_ds = eval_fn()

    from petal.data.reader import SKIPPED, input_error
    from petal.data.remote import STORE_ERRORS, store_error

    skip_mark = len(SKIPPED.shards)
    miscount_mark = len(SKIPPED.miscounted)
    releases.enter_context(SKIPPED.stopping_on_miscounts())  # ErrorGuard below stops on it
    store_mark = STORE_ERRORS.mark()
    t0 = time.perf_counter()
    prior_wall = float(state.get("wall_seconds", 0.0))
    if resume:  # state.json's is its last checkpoint's: what the session did after it counts
        prior_wall = max(prior_wall, _finished_wall(workdir))
    clock = lambda: prior_wall + time.perf_counter() - t0  # noqa: E731
    nan_guard = NanGuard()
    history_path = workdir / "history.csv"
    phases = _phases(cfg, peak, replicas)
    # Unfreezing the backbone keeps its BatchNorm layers in inference mode unless asked not to.
    bn_frozen = cfg.model_options.get("bn_frozen", True) is not False
    set_policy(policy)
    unmark = None
    try:
        keras.utils.set_random_seed(cfg.seed)
        try:
            with strategy.scope():
                model = create_model(
                    cfg.model,
                    len(classes),
                    image_size,
                    # A resumed run's checkpoint holds every weight: the file it started
                    # from may have moved since.
                    weights=None if resume and start_epoch else cfg.weights,
                    log=lambda line: log(f"petal train: {line}"),
                    fresh_head=not (resume and start_epoch)
                    and _other_classes(cfg.weights, classes, log) is not None,
                    **cfg.model_options,
                )
        except tf_errors.ResourceExhaustedError:  # e.g. dense's weights at 4000 px
            keras.backend.clear_session()  # as petal models does: free what was built
            raise _model_out_of_memory(cfg.model, image_size) from None
        with strategy.scope():
            fused = use_fused_batch_norm(model) if cfg.fused_batch_norm else 0
        _check_takes_train_size(model, cfg, image_size)
        if cfg.fine_tune == "head_then_all" and get_backbone(model) is None:
            raise _no_backbone(cfg)
        total_params, _ = count_params(model)
        # Everything checked and built: only now touch the work directory.
        prepare_workdir(workdir, resume, overwrite, log=log, set_aside=True)
        unmark = _mark_running(workdir)
        # A resumed run's config.json is rewritten once its checkpoint has loaded: a config
        # the checkpoint does not fit must not replace the one it does.
        config_saved = finished and not ended_early

        def save_config_once() -> None:
            nonlocal config_saved
            if not config_saved:
                save_config(cfg, workdir / "config.json", **resolved)
                config_saved = True

        if resume:
            truncate_history(history_path, start_epoch)
        loaded = False

        def compile_for(phase: _Phase) -> None:
            """Compile the model for ``phase``, whose schedule runs from its first epoch."""
            lr = _schedule(cfg, phase.lr, phase.end - phase.start, steps, replicas, phase.name)
            model.compile(
                optimizer=_optimizer(cfg, lr),
                loss=keras.losses.CategoricalCrossentropy(label_smoothing=cfg.label_smoothing),
                metrics=["accuracy"],
                jit_compile=cfg.jit_compile,
                steps_per_execution=resolved["steps_per_execution"],
            )
            agree_on_overflow(model.optimizer, replicas)

        for phase in phases:
            if phase.end <= start_epoch:
                continue
            with strategy.scope():
                if phase.backbone_trainable is not None:
                    set_backbone_trainable(model, phase.backbone_trainable, bn_frozen=bn_frozen)
                if resume and start_epoch and not loaded and state.get("phase") != phase.name:
                    # The checkpoint ends an earlier phase: take its weights, not its optimizer.
                    _load_checkpoint(model, workdir)
                    loaded = True
                compile_for(phase)
                if resume and start_epoch and not loaded:
                    # Same phase as the checkpoint: restore weights and optimizer state.
                    model.optimizer.build(model.trainable_variables)
                    _load_checkpoint(model, workdir)
                    loaded = True
                    # The schedule runs by step: continue it at this epoch with this run's
                    # steps per epoch (another batch size or training set changes them),
                    # less the steps float16 loss scaling skipped, which the optimizer does
                    # not count (an overflow applies no step): with the steps per epoch it
                    # ran, the checkpoint's own count, as the uninterrupted run goes on.
                    epochs_in = start_epoch - phase.start
                    skipped = 0
                    if policy == "mixed_float16":
                        counted = keras.ops.convert_to_numpy(model.optimizer.iterations)
                        skipped = max(0, epochs_in * was_steps - int(counted))
                    model.optimizer.iterations.assign(max(0, epochs_in * steps - skipped))
            if not resume:
                save_config_once()  # marks the folder as this run's before it trains
            # A resume's settings, at its first saved epoch: one stopped before then left
            # config.json with its --epochs and --set (a plain --resume took them up).
            state["phase"] = phase.name
            # This session's (or phase's) first epoch includes tracing and compilation.
            first = max(phase.start, start_epoch) + 1
            state["compile_epochs"] = sorted({*state.get("compile_epochs", []), first})
            writer = MetricsWriter(
                history_path, global_batch, steps, cfg.epochs, log=log, defer=True
            )
            callbacks = [
                # First: the step bar is cleared before any line is printed at an epoch's end.
                StepProgress(steps),
                # Then: a failed request to the store ends training before the epoch that
                # missed data is saved or reported.
                *([ErrorGuard(lambda: store_error(store_mark, "train"))] if source.remote else []),
                # A sound shard of another count, which skip_corrupt only logs: as early.
                *([ErrorGuard(lambda: SKIPPED.miscount_since(miscount_mark))]
                  if cfg.skip_corrupt else []),  # fmt: skip
                # Before validation and the checkpoint: one set of BatchNormalization
                # statistics, the replicas' mean, as the saved model keeps.
                *([sync] if (sync := replica_stats_sync(model, replicas)) else []),
                writer,
                nan_guard,
                # Before the checkpoint: an epoch saved is never trained again, so scalars
                # written after it were lost for good to a signal in between (one written
                # but not saved is replaced by the resume's: see ScalarLogger). After the
                # NaN guard: an epoch it stopped is not saved, and gets no scalars.
                *([ScalarLogger(workdir / "tensorboard", nan_guard)] if cfg.tensorboard else []),
                # The epoch's line once it is saved (before a signal held meanwhile stops
                # training): Ctrl-C just after a line seen used to lose that epoch (and name
                # none to resume from). An epoch a non-finite loss stopped is not saved, and
                # gets no line.
                Checkpointer(
                    workdir, state, clock=clock, nan_guard=nan_guard,
                    # The epoch saved: an --overwrite's old run is let go (its line first).
                    saved=lambda announce=writer.announce: (announce(), _drop_replaced(workdir)),
                    before_state=save_config_once,
                ),
            ]
            if phase.name == "full":
                bn = "BatchNorm kept in inference mode" if bn_frozen else "BatchNorm training"
                log(
                    f"petal train: unfreezing the backbone ({bn}), peak lr {phase.lr:.3g} "
                    f"(x{cfg.fine_tune_lr_factor} of the head phase's {resolved['peak_lr']:.3g})"
                )
            # Frozen layers (a frozen backbone, bn_frozen) run Keras' inference call instead.
            if fused and (training := _training_batch_norms(model)):
                log(
                    f"petal train: {training} BatchNormalization layers train with the fused "
                    "kernel"
                )
            if phase.start > start_epoch:
                # A new model.fit starts its input over: read on from this phase's first
                # epoch instead (the last phase's input, and its RAM cache, let go first).
                train_ds = None
                train_ds = train_from(phase.start)
            with warnings.catch_warnings():
                # Distributed validation sets have unknown length; Keras warns when it first
                # reaches their end, which is expected here.
                warnings.filterwarnings("ignore", message="Your input ran out of data")
                try:
                    model.fit(
                        train_ds,
                        epochs=phase.end,
                        initial_epoch=max(phase.start, start_epoch),
                        steps_per_epoch=steps,
                        validation_data=val_ds,
                        callbacks=callbacks,
                        shuffle=False,  # the input pipeline shuffles
                        verbose=0,
                    )
                except tf_errors.ResourceExhaustedError as err:  # a batch too large
                    oom = _training_out_of_memory(cfg, global_batch, replicas, train_size)
                    raise oom from err
                except tf_errors.OpError as err:
                    # A corrupt record (CRC or decode failure) surfaces here, and an image
                    # folder's file that cannot be read.
                    if (error := input_error(err, cfg.data, "train", store_mark)) is None:
                        raise
                    raise error from err
            if nan_guard.nan_epoch is not None:
                break
        if resume and start_epoch and not loaded:
            # Every epoch was already done (stopped in or after its last checkpoint): the
            # final model is the last checkpoint, compiled for its phase with the optimizer's
            # state, as the run that ended there would have saved it (uncompiled, it was not).
            log(f"petal train: {workdir} already completed {_epochs(start_epoch)}")
            last = next((p for p in phases if p.name == state.get("phase")), phases[-1])
            with strategy.scope():
                if last.backbone_trainable is not None:
                    set_backbone_trainable(model, last.backbone_trainable, bn_frozen=bn_frozen)
                compile_for(last)
                model.optimizer.build(model.trainable_variables)
                _load_checkpoint(model, workdir)
            save_config_once()  # ended early: the epochs it ended at
    except BaseException as err:
        if unmark is not None:
            if not state.get("epoch"):  # before the marker goes: no second run meanwhile
                _restore_run(workdir, log, stopped=err)
            else:
                _drop_unsaved_rows(history_path, workdir)
            unmark()
        raise
    finally:
        keras.mixed_precision.set_global_policy(previous_policy)

    # The marker stays until model.keras and metrics.json are written: a run stopped
    # before then is one a resume finishes, and is still training to evaluate meanwhile.
    try:
        rows = read_history(history_path)
        metrics = _metrics(rows, state, clock(), resolved, cfg, total_params)
        if undecodable is not None:
            metrics[skip_list_key(source)] = [f"{where}: {reason}" for where, reason in undecodable]
        if cfg.skip_corrupt and source.kind == "folder":
            # The files dropped (each epoch), as evaluate counts them; null when they were not
            # checked (too many, or not on a local disk), as the log said.
            metrics["skipped_corrupt_records"] = None if undecodable is None else len(undecodable)
        elif cfg.skip_corrupt:
            # Records lost to CRC failures, each once however many epochs skipped it, and
            # records whose image does not decode (named up front).
            lost = SKIPPED.lost_since(skip_mark)
            metrics["skipped_corrupt_records"] = sum(lost.values()) + len(undecodable or [])
            train_files = set(source.files("train"))
            lost_train = sum(n for shard, n in lost.items() if shard in train_files)
            lost_train += _in_split(undecodable or [], source, "train")
            metrics["skipped_corrupt_train_records"] = lost_train
            # False: records whose image does not decode were not looked for (too many, or not
            # on a local disk) and are not in these counts, as the log said.
            metrics["undecodable_records_counted"] = undecodable is not None
            stored = source.count("train")  # train_count leaves the undecodable ones out
            if lost_train > 0.1 * stored:
                log(
                    f"petal train: warning: --skip-corrupt left {lost_train} of the {stored} "
                    f"training records ({100 * lost_train / stored:.0f}%) out of every epoch: "
                    "after a corrupt record the reader skips the rest of its shard. Restore the "
                    "shard, or convert the photos again, to train on all of them."
                )
        if nan_guard.nan_epoch is not None:
            where = f"epoch {nan_guard.nan_epoch}/{cfg.epochs}" + (
                f" (step {nan_guard.nan_step})" if nan_guard.nan_step else ""
            )
            metrics["stopped"] = f"non-finite {nan_guard.nan_what} at {where}"
            # A resume so stopped keeps its settings (--epochs): its error says to go on with
            # them, changed. One stopped otherwise before it saved an epoch does not.
            save_config_once()
            write_json(workdir / "metrics.json", metrics)
            raise _non_finite_loss(
                workdir, where, cfg, resolved, int(state["epoch"]), nan_guard.nan_what
            )
        # Keras swallowed a signal raised while it opened the file; and a resume takes a run
        # with both files for finished, so they are written together. Through a temporary
        # file: one cut short (killed, a full disk) was taken for a damaged run.
        with signals_held():
            save_atomically(workdir / "model.keras", model.save)
            write_json(workdir / "metrics.json", metrics)
    except BaseException as err:
        if not state.get("epoch"):  # a NaN loss in the first epoch: none saved
            _restore_run(workdir, log, stopped=err)
        raise
    finally:
        unmark()
    earlier = [name for name in ("eval", "export") if resume and (workdir / name).is_dir()]
    command = {"eval": "evaluate", "export": "export"}  # what writes each folder
    if earlier:
        log(
            f"petal train: {' and '.join(f'{workdir / n}/' for n in earlier)} "
            f"{'hold' if len(earlier) > 1 else 'holds'} the results of the model before this "
            f"resume: run petal {' and '.join(command[n] for n in earlier)} again"
        )
    by_phase = metrics.get("train_images_per_sec_by_phase") or {}
    of_phase = ""
    if by_phase.get("full") is not None:
        of_phase = " (full phase"
        if by_phase.get("head") is not None:
            of_phase += f"; head-only phase {per_second(by_phase['head'])}"
        of_phase += ")"

    def shown(key: str, spec: str | Callable[[float], str]) -> str:
        """A metric for the closing line, by a format spec or a function; null (no
        validation accuracy, say) as "n/a"."""
        if metrics.get(key) is None:
            return "n/a"
        return spec(metrics[key]) if callable(spec) else format(metrics[key], spec)

    log(
        f"petal train: done in {metrics['wall_seconds']:.0f} s: final val_acc "
        f"{shown('final_val_accuracy', '.4f')}, mean of last "
        f"{min(5, metrics['epochs_completed'])} {shown('mean_last5_val_accuracy', '.4f')}, best "
        f"{shown('best_val_accuracy', '.4f')} (epoch {shown('best_epoch', '')}), "
        f"{shown('train_images_per_sec', per_second)} img/s{of_phase} -> {workdir}"
    )
    return metrics


def non_finite_fixes(
    peak_lr: float | None, clipnorm: float | None, precision: str | None
) -> str:
    """The fixes for a NaN/inf loss that apply to a run of these settings (``resolved``'s
    ``peak_lr`` and ``precision``, the config's ``clipnorm``), as one sentence: train's error
    says them, and evaluate, predict and export repeat them for the run it stopped."""
    peak = f"; its peak was {peak_lr:.3g}" if isinstance(peak_lr, (int, float)) else ""
    fixes = [f"Lower the learning rate (--set learning_rate=...{peak})"]
    if clipnorm is None:
        fixes.append("clip the gradients (--set clipnorm=1.0)")
    if precision == "mixed_float16":
        # float16 overflows past 65504; float32 (or bfloat16) has the range.
        fixes.append("train in float32 (--precision float32, a new run)")
    return f"{', '.join(fixes[:-1])} or {fixes[-1]}" if len(fixes) > 1 else fixes[0]


def _non_finite_loss(
    workdir: Path,
    where: str,
    cfg: TrainConfig,
    resolved: dict,
    epochs_done: int,
    what: str = "loss",
) -> PetalError:
    """The error of a run a NaN/inf loss stopped: the fixes that apply to this run, and the
    checkpoint it can go on from (or that it saved none)."""
    fix = non_finite_fixes(resolved["peak_lr"], cfg.clipnorm, resolved["precision"])
    last = workdir / "last.keras"
    if epochs_done and last.is_file():
        saved = (
            f"{last} holds epoch {epochs_done}, the last good one: go on from it with "
            f"`petal train --resume --workdir {shlex.quote(str(workdir))}` and the new settings"
        )
    else:
        saved = (
            "no epoch completed, so no checkpoint was saved: start it again with the new "
            "settings (the files of this start are replaced)"
        )
    return PetalError(f"Training stopped: the {what} became NaN/inf at {where}. {fix}; {saved}.")


def _load_checkpoint(model, workdir: Path) -> None:
    """Load ``last.keras`` (weights, and the optimizer's state once it is built)."""
    import zipfile

    path = workdir / "last.keras"
    try:
        # As for saving: Keras' loader of whole models opens the weight store in a bare
        # `except:` that swallows a signal's exception (load_weights does not, so far).
        with signals_held(f"the load of {path}"), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model.load_weights(str(path))
        for warning in caught:
            if "Skipping variable loading" in str(warning.message):
                # Keras only warns, and the run went on from a fresh optimizer state (an
                # option that changes its variables, which the checks above did not know).
                raise ValueError(str(warning.message).strip())
            warnings.warn_explicit(
                warning.message, warning.category, warning.filename, warning.lineno
            )
    except (zipfile.BadZipFile, EOFError, OSError) as err:
        raise PetalError(
            f"{path} cannot be read ({first_line(err)[:200]}); "
            "it is damaged (a disk filled or a copy cut short): start a new run with "
            "--overwrite, or restore the file."
        ) from None
    except ValueError as err:
        raise PetalError(
            f"{workdir / 'last.keras'} does not fit the model of this config "
            f"({str(err).splitlines()[0][:200]}); resume with the run's own settings (see "
            f"{workdir / 'config.json'}), or start a new run with --overwrite."
        ) from None


def _undecodable(source, cfg: TrainConfig, log) -> list[tuple[str, str]] | None:
    """With ``skip_corrupt``: the image-folder files or records whose image the pipeline
    will drop (inside tf.data, every epoch), named now. None when not checked and without
    ``skip_corrupt``."""
    if not cfg.skip_corrupt:
        return None
    from petal.data.pipeline import decode_skips

    bad, line = decode_skips(source, "all", "metrics.json")
    if line:
        log(f"petal train: --skip-corrupt: {line}")
    return bad


def _in_split(undecodable: list[tuple[str, str]], source, split: str) -> int:
    """How many of :func:`_undecodable`'s files (or records, ``SHARD: record I``) are in
    ``split``."""
    files = set(source.files(split))
    if source.kind == "folder":
        return sum(path in files for path, _ in undecodable)
    return sum(where.rsplit(": record ", 1)[0] in files for where, _ in undecodable)


def _metrics(rows, state, wall, resolved, cfg: TrainConfig, params: int) -> dict:
    # The completed (checkpointed) epochs: history.csv also holds the epoch a non-finite
    # loss stopped, which is neither the best nor the final one.
    rows = [r for r in rows if r["epoch"] <= state["epoch"]]
    scored = [r for r in rows if not math.isnan(r.get("val_accuracy", math.nan))]
    val = [r["val_accuracy"] for r in scored]
    # Epochs that began a session or phase include tracing and compilation: leave them out
    # when there are others.
    compiled = set(state.get("compile_epochs", []))

    def speed(first: int, last: float) -> float | None:
        """Median images/s of epochs ``first`` to ``last`` (1-based), of the last session
        (or phase) among them: an earlier one's may have run at another batch size or
        precision."""
        first = max([first, *(c for c in compiled if first <= c <= last)])
        timed = [
            r for r in rows if first <= r["epoch"] <= last and not math.isnan(r["images_per_sec"])
        ]
        steady = [r["images_per_sec"] for r in timed if r["epoch"] not in compiled]
        steady = steady or [r["images_per_sec"] for r in timed]
        return round(statistics.median(steady), 1) if steady else None

    by_phase = None
    if cfg.fine_tune == "head_then_all":
        # The head-only epochs skip the backbone's gradients: the run's speed is the full
        # phase's (the head phase's while no full epoch completed).
        by_phase = {"head": speed(1, cfg.head_epochs), "full": speed(cfg.head_epochs + 1, math.inf)}
    best = max(range(len(val)), key=lambda i: val[i]) if val else None
    return {
        "final_val_accuracy": val[-1] if val else None,
        "mean_last5_val_accuracy": statistics.fmean(val[-5:]) if val else None,
        "best_val_accuracy": val[best] if best is not None else None,
        "best_epoch": scored[best]["epoch"] if best is not None else None,
        "final_loss": rows[-1]["loss"] if rows else None,
        "final_val_loss": rows[-1]["val_loss"] if rows else None,
        "epochs_completed": int(state["epoch"]),
        "wall_seconds": round(wall, 2),
        "train_images_per_sec": (
            speed(1, math.inf) if by_phase is None else by_phase["full"] or by_phase["head"]
        ),
        **({"train_images_per_sec_by_phase": by_phase} if by_phase else {}),
        "model": cfg.model,
        "params": int(params),
        "preset": cfg.preset,
        "image_size": resolved["image_size"],
        "replicas": resolved["replicas"],
        "strategy": resolved["strategy"],
        "precision": resolved["precision"],
        "global_batch": resolved["global_batch"],
        "steps_per_epoch": resolved["steps_per_epoch"],
        # Those of each session, from the epoch it began (a resume may change them).
        "batches": [b for b in state.get("batches", []) if b["from_epoch"] <= state["epoch"]],
        "train_count": resolved["train_count"],
        "val_count": resolved["val_count"],
        "classes": resolved["classes"],
    }
