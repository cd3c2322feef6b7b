"""``petal evaluate``: score a trained run on records or an image folder.

Writes into ``WORKDIR/eval/`` (or ``out_dir``): ``eval.json`` (accuracy, top-k, per-class
precision/recall/F1, confusion matrix), ``confusion_matrix.png``, ``misclassified.png`` and
the image samples the plots are drawn from (``samples.npz``, ``misclassified.npz``), so the
report can redraw them later without the data. ``eval.json`` is written last: it marks the
other files as those of one finished evaluation.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import urllib.parse
from pathlib import Path

import numpy as np

from petal.data.folders import (
    absolute_data,
    expand_home,
    find_images,
    held_output,
    holds_run_config,
    is_http,
    is_remote,
    is_within,
    same_place,
)
from petal.data.reader import FOLDER_SPLIT
from petal.errors import (
    MAX_COUNT,
    PetalError,
    is_int_at_least,
    need_bool,
    need_bool_or_none,
    write_failed,
)
from petal.evaluation import plots
from petal.evaluation.metrics import classification_report
from petal.evaluation.workdir import (
    check_not_in_the_way,
    check_output_folder,
    class_index,
    denormalize_np,
    file_sha256,
    load_model,
    make_output_folder,
    open_run,
    progress_bar,
    top_k_for,
)
from petal.jsonfile import temporary_name, write_json
from petal.running import in_use_error, mark_reading, running_elsewhere, signals_held

EVAL_DIR = "eval"
# The run's training records are read for their file names (to tell which photos of a copy
# of its image folder it trained on) up to this many bytes; beyond, any copy is named.
MAX_NAME_READ = 1 << 30


def evaluate(
    workdir: str | Path,
    data: str | Path,
    *,
    split: str | None = None,
    batch_size: int = 64,
    top_k: int | None = None,
    max_misclassified: int = 24,
    num_samples: int = 12,
    out_dir: str | Path | None = None,
    skip_corrupt: bool = False,
    classes: list[str] | str | None = None,
    log=None,
    warn=None,
    progress: bool | None = None,
) -> dict:
    """Evaluate the run's final model on ``data``.

    Args:
        workdir: a finished ``petal train`` work directory.
        data: a records folder, codelab shards or a folder of class sub-folders of images,
            holding all of the model's classes or some of them (matched by name).
        split: ``validation``, ``train`` or ``all``; default ``validation`` for records and
            for the image folder the run trained on, ``all`` for any other image folder (a
            folder of new images is all test data).
        batch_size: images per forward pass.
        top_k: the k of the top-k accuracy reported besides top-1 (default 3); at most the
            class count (more is reduced to it, with a warning).
        max_misclassified: at most this many misclassified images in the grid.
        num_samples: images in the sample-predictions grid.
        out_dir: output folder; default ``WORKDIR/eval``.
        skip_corrupt: skip corrupt records and undecodable images with a warning (counted
            in ``eval.json`` as ``skipped_corrupt_records``) instead of stopping.
        classes: class names in index order of codelab shards that name none (a list or a
            comma-separated string; matched to the model's by name), or the class folders
            of an image folder to read; default: the run's own (``classes`` of its config)
            for the run's own data, else the data's.
        log: receives one summary line (default: print).
        warn: receives warning lines (default: printed to stderr); they are also kept in
            ``eval.json`` under ``warnings``.
        progress: a progress bar on stderr; default: for more than 256 images, on a
            terminal.

    Returns:
        The contents of ``eval.json``.

    Raises:
        PetalError: no finished run, unreadable data, a corrupt record (without
            ``skip_corrupt``), a class the model does not know, the image folder the
            run's records came from without ``split="all"``, records a conversion is
            writing, an output folder another evaluation is writing into, or files that
            cannot be written in the output folder (a full disk).
    """
    from tensorflow import errors as tf_errors

    from petal.data.pipeline import (
        decode_skips,
        eval_dataset,
        open_source,
        skip_list_key,
        upscale_warning,
    )
    from petal.data.reader import SKIPPED, input_error
    from petal.data.remote import STORE_ERRORS, store_error

    log = log or (lambda line: print(line, flush=True))
    warn = warn or (lambda line: print(f"petal evaluate: warning: {line}", file=sys.stderr))
    # Arguments first: a bad value is reported even when the data cannot be found.
    for name, value in (("top_k", top_k), ("batch_size", batch_size)):
        if name == "top_k" and value is None:
            continue
        flag = name.replace("_", "-")
        if not is_int_at_least(value, 1):
            raise PetalError(f"{name} (--{flag}) must be an integer >= 1. Received: {value!r}")
        if name == "batch_size" and value > MAX_COUNT:  # a traceback from tf.data
            raise PetalError(f"{name} (--{flag}) must be at most {MAX_COUNT}. Received: {value}")
    for name, value in (("num_samples", num_samples), ("max_misclassified", max_misclassified)):
        if not is_int_at_least(value, 0):
            raise PetalError(f"{name} must be an integer >= 0. Received: {name}={value!r}")
    skip_corrupt = need_bool(skip_corrupt, "skip_corrupt")
    progress = need_bool_or_none(progress, "progress")
    if isinstance(split, str) and split.lower() in ("train", "validation", "all"):
        split = split.lower()  # in any case, as the data library takes it
    elif split is not None:
        raise PetalError(
            f"split (--split) must be 'train', 'validation' or 'all'. Received: {split!r}"
        )
    warnings: list[str] = []
    data = expand_home(data)
    run = open_run(workdir, warn=warnings.append)  # a stale model: said, and in eval.json
    if not isinstance(data, (str, os.PathLike)) or not str(data):
        # A Path of None or of a list failed deep in pathlib; '' was the current folder.
        raise PetalError(
            "evaluate needs data as one records folder, codelab shards or image folder (the "
            f"run trained on {run.config.get('data')}). Received: data={data!r}"
        )
    top_k = top_k_for(run, top_k, warnings.append)
    # Before the evaluation, which may take minutes: a URL or a file in the way stops it
    # now (the folder is created once there is something to write).
    out = check_output_folder(
        out_dir if out_dir is not None else run.workdir / EVAL_DIR, "evaluation", "out_dir"
    )
    for name in WRITTEN:
        check_not_in_the_way(out / name, False, f"the evaluation writes its {name}",
                             "move it away or pass --out another folder.")
    if not is_remote(str(data)) and holds_run_config(str(data)):
        # Before the check below, which said the run's own eval/ is "inside the data".
        raise PetalError(
            f"--data {data} is the work directory of a `petal train` run, not data; pass "
            "--data a records folder, codelab shards or a folder of class sub-folders of images."
        )
    if is_within(out, data):
        # In an image folder, a folder of plots would be read as a class of its own.
        raise PetalError(
            f"The evaluation folder {out} is inside the data {data}; pass --out a folder "
            "outside it."
        )
    from petal.training.loop import refuse_out_holding_data

    refuse_out_holding_data(out, WRITTEN, "evaluation")  # a later convert listed its PNGs
    if not is_remote(str(data)) and (who := running_elsewhere(Path(data), "converting into it")):
        # A conversion into the records: their shards are replaced as they are read. Worded
        # as train's refusal, with the marker to delete if its process is gone.
        raise in_use_error(data, who, "--data")
    # Held from here to the end: a second evaluation into the folder is refused instead
    # of removing this one's files as it writes its own.
    with held_output(
        out, lambda: make_output_folder(out, "evaluation"), "--out", "evaluating into it"
    ), contextlib.ExitStack() as reading:
        # The run's own data (the default) needs no comparison with itself: its manifest, if
        # any, is not read a second time; its classes are those the run was given.
        own_data = same_place(data, run.config.get("data") or "")
        picked = classes is not None  # the user's choice of class folders, for a folder
        if classes is None and own_data:
            classes = run.config.get("classes")
        # New photos may be of one of the model's classes.
        # The files its split kept in training stay there (photos added since would move
        # them into validation).
        from petal.training.loop import kept_in_train

        source = open_source(
            str(data), classes=classes, min_classes=1,
            train_names=kept_in_train(run.config, str(data)),
        )  # fmt: skip
        if source.kind == "records" and not is_remote(source.path):
            # A conversion into these records is refused while this evaluation reads them.
            reading.callback(mark_reading(Path(source.path), "evaluating it"))
        if (
            source.kind == "codelab"
            and not source.classes_named
            and not set(source.classes) <= set(run.classes)
        ):
            # Shards that name no classes are called class_0, ...: the model's names are
            # not theirs unless it was trained on such shards too.
            known = f"the model in {run.workdir} knows them by name ({', '.join(run.classes)})"
            if picked:  # named by --classes, with a name the model does not know
                unknown = [c for c in source.classes if c not in run.classes]
                raise PetalError(
                    f"--classes names {', '.join(unknown)}, not a class of the model: the "
                    f"shards at {source.path} name no classes (no label in their records), and "
                    f"{known}; pass --classes naming the shards' classes in index order with "
                    f"those names. Received: --classes {','.join(source.classes)}"
                )
            raise PetalError(
                f"The shards at {source.path} name no classes (no label in their records) and "
                f"{known}: pass --classes NAME,NAME,... naming the shards' classes in index "
                "order."
            )
        to_model = class_index(source.classes, run, str(data), source.kind)  # labels by name
        trained_on = None if own_data else _run_records(run)
        split = _split_for(source, data, run, split, trained_on, own_data)
        warnings += [
            w
            for w in (
                _old_split_warning(run, split) if own_data and source.kind == "folder" else None,
                _own_split_warning(source, run, split) if own_data else None,
                _own_resplit_warning(source, run, split) if own_data else None,
                _resplit_warning(source, run, split, trained_on),
                None if own_data else _copy_warning(source, run, trained_on, split),
                _trained_shards_warning(source, run, split),
            )
            if w
        ]
        # An image folder's files that are not read; shards' class names assumed.
        warnings += source.notes
        if upscaled := upscale_warning(source, run.image_size):
            warnings.append(f"{upscaled}: the model may score lower on them")
        if refitted := _fit_warning(source, run):
            warnings.append(refitted)
        # Said once the images are scored (below): the macro averages are over those of the
        # data's classes with an image scored, which may be fewer.
        subset = None
        if to_model is not None and len(source.classes) < len(run.classes):
            some = f"{len(source.classes)} of the model's {len(run.classes)} classes"
            names = ", ".join(source.classes)
            subset = (
                f"--classes picks {some} ({names}) from {data}"
                if picked and source.kind == "folder"
                else f"{data} holds {some} ({names})"
            )
        undecodable, line = (
            decode_skips(source, split, "eval.json", counted=True) if skip_corrupt else (None, "")
        )
        if line:
            warnings.append(f"--skip-corrupt: {line}")
        for line in warnings:
            warn(line)
        ds = eval_dataset(
            source,
            batch_size=batch_size,
            image_size=run.image_size,
            label_mode="sparse",
            normalization=run.normalization,
            split=split,
            skip_corrupt=skip_corrupt,
            # New photos in a folder are fitted as the run's records were (at their size,
            # then resized to the model's as records are; records at the photos' own sizes
            # are only resized), as predict does.
            resize=run.fit_mode,
            fit_size=run.records_size if run.fit_mode != "none" else None,
        )
        model_sha256 = file_sha256(run.model_path)  # before it loads: the bytes it loads
        model = load_model(run)
        skipped_before, events_before = SKIPPED.skipped, len(SKIPPED.events)
        miscount_mark = len(SKIPPED.miscounted)
        reading.enter_context(SKIPPED.stopping_on_miscounts())  # stopped on after reading
        store_mark = STORE_ERRORS.mark()

        start = time.perf_counter()
        labels, probs = [], []
        samples: dict[str, list] = {"images": [], "true": [], "pred": [], "prob": []}
        wrong: dict[str, list] = {"images": [], "true": [], "pred": [], "prob": []}
        try:
            # Over the images scored: those found undecodable up front are not.
            total = source.count(split) - len(undecodable or ())
            with progress_bar("evaluate", total, progress) as bar:
                for images, y in ds:
                    p = np.asarray(model.predict_on_batch(images), dtype=np.float64)
                    y = np.asarray(y, dtype=np.int64)
                    if to_model is not None:
                        y = to_model[y]
                    labels.append(y)
                    probs.append(p)
                    _keep_examples(np.asarray(images), y, p, samples, wrong, run.normalization,
                                   num_samples, max_misclassified)
                    bar.update(len(y))
        except tf_errors.OpError as err:
            if (error := input_error(err, data, "evaluate", store_mark, split)) is None:
                raise
            raise error from err
        if (error := store_error(store_mark, "evaluate")) is not None:
            raise error  # a failed request ended the stream, and skip_corrupt took it quietly
        if (error := SKIPPED.miscount_since(miscount_mark)) is not None:
            raise error  # a sound shard of another count: skip_corrupt only logged it
        seconds = time.perf_counter() - start
        if not labels:
            # Images listed and none scored: skipped as corrupt, found up front or as read.
            if skip_corrupt and source.count(split) > 0:
                raise PetalError(
                    f"Split {split!r} of {data}: every image was skipped as corrupt (the lines "
                    "above name them); replace those files, or evaluate other data."
                )
            raise PetalError(f"Split {split!r} of {data} holds no images to evaluate.")
        y_true = np.concatenate(labels)
        y_prob = np.concatenate(probs)
        lost = 0  # images skipped as corrupt
        if skip_corrupt:
            if source.kind == "folder":
                # Undecodable files are dropped one by one; every other file is counted once.
                lost = source.count(split) - len(y_true)
            else:
                # Records lost to a CRC failure (the rest of their shard) and records whose
                # image does not decode (dropped one by one, uncounted by the reader).
                lost = max(SKIPPED.skipped - skipped_before, source.count(split) - len(y_true))

        ks = sorted({1, top_k})
        report = classification_report(y_true, y_prob, run.classes, ks=ks)
        # The data's classes with no image in the split score 0.000 and are left out of the
        # macro averages, as the model's classes the data lacks are (said below).
        # Records skipped as corrupt (CRC failures: the reader's lines, logged as they came) go
        # with the rest of what this evaluation left out.
        warnings += [f"--skip-corrupt: {line}"
                     for line in dict.fromkeys(SKIPPED.events[events_before:])]  # fmt: skip
        given = set(source.classes) if to_model is not None else set(run.classes)
        scores = report["per_class"]
        empty = [c for c in run.classes if c in given and not scores[c]["support"]]
        if subset is not None:
            # "Over those" only where each of them has an image scored: the line below says
            # which are left out, and why.
            warnings.append(subset if empty else f"{subset}; the macro averages are over those")
            warn(warnings[-1])
        if empty:
            present = sum(1 for c in run.classes if scores[c]["support"])
            why = _why_unscored(source, split, empty, lost > 0)
            if len(set(why.values())) == 1:
                which = f"{', '.join(empty)} was scored ({why[empty[0]]})"
            else:
                which = f"{', '.join(f'{c} ({why[c]})' for c in empty)} was scored"
            warnings.append(
                f"Split {split!r} of {data}: no image of {which}; the macro averages are over "
                f"the other {present} class{'es' * (present != 1)}"
            )
            warn(warnings[-1])
        if unpredicted := _unpredicted_warning(report, split, data):
            warnings.append(unpredicted)
            warn(warnings[-1])
        report.update(
            {
                # Absolute, as train's config.json: eval.json is read from elsewhere (report).
                "data": absolute_data(str(data)),
                "split": split,
                "workdir": str(run.workdir.absolute()),
                "model": str(run.model_path.absolute()),
                # Which model this scored, as report checks it (a copy of the run keeps it).
                "model_sha256": model_sha256,
                "seconds": round(seconds, 2),
                "images_per_sec": round(len(y_true) / max(seconds, 1e-9), 1),
            }
        )
        if warnings:
            report["warnings"] = warnings
        if skip_corrupt:
            report["skipped_corrupt_records"] = lost
            if undecodable is not None:
                report[skip_list_key(source)] = [f"{p}: {reason}" for p, reason in undecodable]
        wrong_count = int((y_true != y_prob.argmax(1)).sum())
        title = plots.misclassified_title(wrong_count, len(y_true), len(wrong["images"]))
        _write_outputs(out, report, samples, wrong, run, title)
        top = ", ".join(f"{k} {v:.4f}" for k, v in report["top_k_accuracy"].items())
        log(
            f"petal evaluate: {len(y_true)} image{'' if len(y_true) == 1 else 's'} of {data} "
            f"({split}): accuracy "
            f"{report['accuracy']:.4f} ({top}), macro F1 {report['macro']['f1']:.4f}"
            + (f", {lost} corrupt {'file' if source.kind == 'folder' else 'record'}"
               f"{'s' * (lost != 1)} skipped" if lost else "")
            + f" -> {out}"
        )
        return report


def _unpredicted_warning(report: dict, split: str, data) -> str | None:
    """The line for the classes with images scored that the model never predicted, or None.

    Their precision has no predictions to count (0/0); it is reported as 0.000, as
    scikit-learn's default does, and pulls the macro averages down: said, not left silent.
    """
    classes = report["classes"]
    predicted = np.asarray(report["confusion_matrix"]).sum(axis=0)  # per predicted class
    never = [c for i, c in enumerate(classes)
             if report["per_class"][c]["support"] and not predicted[i]]  # fmt: skip
    if not never:
        return None
    one = len(never) == 1
    return (
        f"Split {split!r} of {data}: the model predicted no image as {', '.join(never)}; "
        f"{'its' if one else 'their'} precision (no predictions to count) is reported as "
        f"0.000 and counted so in the macro averages"
    )


def _why_unscored(source, split: str, empty: list[str], skipped: bool) -> dict[str, str]:
    """Why each class of ``empty`` (the data's classes with no image scored) has none: none
    in the ``split``, or all of them skipped as corrupt. An image folder's files are known
    by class; records' classes are not (those skipped from a shard's first CRC failure on):
    "none in the split", with "or skipped as corrupt" when ``skipped``."""
    unsure = "none in the split, or skipped as corrupt" if skipped else "none in the split"
    labels = source.labels(split) if source.kind == "folder" else []
    if not labels:
        return {c: unsure for c in empty}
    why = {}
    for name in empty:
        if name not in source.classes:
            why[name] = unsure
            continue
        index = source.classes.index(name)
        of_class = sum(1 for label in labels if label == index)
        # A class with files in the split and none scored: each was skipped (a file that
        # does not decode stops an evaluation without --skip-corrupt), whether found up front
        # or, in a folder too large to check first or read over http, as it was read.
        why[name] = f"all {of_class} skipped as corrupt" if of_class else "none in the split"
    return why


def _split_for(
    source, data, run, split: str | None, trained_on: dict | None, own_data: bool
) -> str:
    """The split to score: the one asked for, else the one the run held out.

    Records and codelab shards: validation. The image folder the run trained on: its
    validation split too (the same stable split training held out). Any other image
    folder: all of it, as new images. The image folder the run's records were converted
    from holds the training images under a split of its own, not the records': refused
    unless all of it is asked for.
    """
    origin = run.config.get("resolved", {}).get("records_source")
    origin = origin or (trained_on or {}).get("source")  # runs trained before it was kept
    if source.kind == "folder" and split != "all" and origin and same_place(data, origin):
        raise PetalError(
            f"{data} is the image folder the run's records were converted from: it holds the "
            "images the model trained on, and its split is not the records' one. Evaluate on "
            "the records (omit --data: their validation split) or on new images, or pass "
            "--split all to score all of it, training images included."
        )
    if split is not None:
        return split
    if source.kind == "folder" and not own_data:
        return "all"
    return "validation"


def _run_records(run) -> dict | None:
    """The manifest of the records the run trained on, or None (other data, or gone)."""
    from petal.data.writer import read_manifest

    try:
        return read_manifest(run.config["data"])
    except (KeyError, TypeError, PetalError):
        return None


def _split_since(run, manifest: dict | None) -> dict | None:
    """How the run's records were split when it trained (``records_split`` of its config),
    if their ``manifest`` read now says they were converted again in place since, split
    otherwise (their splits are no longer the run's); else None, as for a run saved before
    its config kept ``records_split``."""
    from petal.training.loop import records_split

    saved = run.config.get("resolved", {}).get("records_split")
    if not saved or not manifest or records_split(manifest) == saved:
        return None
    return saved


def _held_out_advice(run, manifest: dict | None) -> str:
    """Where the run's validation photos are: its records, or, converted again in place
    since (``manifest``, theirs now) and split otherwise, a conversion split as they were."""
    ours = run.config.get("data")
    if (saved := _split_since(run, manifest)) is None:
        return f"evaluate on {ours}"
    origin = run.config.get("resolved", {}).get("records_source") or manifest.get("source")
    return (
        f"convert {origin} again with --seed {saved['seed']} --val-fraction "
        f"{saved['val_fraction']} (as {ours} were split when the run trained) and evaluate on "
        "those"
    )


def _resplit_warning(source, run, split: str, trained_on: dict | None) -> str | None:
    """A warning when ``source`` holds records converted from the same images as the run's:
    their validation split may hold images the run trained on when split differently, and
    their train (or whole) split holds them however split. ``trained_on`` (the manifest of
    the run's records) is None for the run's own data."""
    ours = run.config.get("data") or ""
    if source.kind != "records" or trained_on is None:
        return None
    theirs = source.manifest
    origin = trained_on.get("source")
    if not origin or not theirs.get("source") or not same_place(theirs["source"], origin):
        return None
    if split != "validation":
        if (how_many := _trained_share(source, run, origin, split)) is None:
            return None
        return (
            f"{source.path} was converted from {origin} like the run's records {ours}: the "
            f"{split} split scored holds {how_many} the model trained on, so the score "
            "overstates how it does on new photos. For a held-out score evaluate on the "
            "validation split (omit --split)."
        )
    from petal.training.loop import records_split

    # As the run's records were split when it trained: they may have been converted again.
    saved = run.config.get("resolved", {}).get("records_split") or records_split(trained_on)
    if not (differ := _split_differs(records_split(theirs), saved)):
        return None
    return (
        f"{source.path} was converted from {origin} like the run's records {ours}, but split "
        f"differently ({differ}): its validation split may hold images the model trained on. "
        f"For a held-out score {_held_out_advice(run, trained_on)}."
    )


def _split_differs(theirs: dict, saved: dict) -> str:
    """What differs between two ``records_split`` of one image folder ("" when nothing does).

    Each class is split on its own (by the seed, the fraction and its own photos), so only the
    classes both hold are compared: records of some of the run's classes split as it was hold
    none of the photos it trained on in their validation split."""
    differ = [
        f"{what} {theirs[key]} vs {saved[key]}"
        for key, what in (("seed", "seed"), ("val_fraction", "validation fraction"))
        if theirs[key] != saved[key]
    ]
    if differ:
        return ", ".join(differ)

    def counts(split: dict) -> dict:
        by_class: dict = {}
        for side, per_class in (split.get("per_class") or {}).items():
            for name, count in (per_class or {}).items():
                by_class.setdefault(name, {})[side] = count
        return by_class

    ours, now = counts(saved), counts(theirs)
    other = [name for name in sorted(ours.keys() & now.keys()) if ours[name] != now[name]]
    return f"other images of {', '.join(other)}" if other else ""


def _own_resplit_warning(source, run, split: str) -> str | None:
    """A warning when the run's own records were converted again in place since it trained,
    from the same photos but split otherwise: their validation split holds images it trained
    on. A run saved before its config kept ``records_split`` cannot tell."""
    from petal.training.loop import records_split

    origin = run.config.get("resolved", {}).get("records_source")
    if split != "validation" or source.kind != "records" or not origin:
        return None
    saved = _split_since(run, source.manifest)
    if saved is None or not same_place(source.manifest.get("source") or "", origin):
        return None  # split as it was, or other photos
    now = records_split(source.manifest)
    differ = [
        f"{what} {now[key]} vs {saved[key]}"
        for key, what in (("seed", "seed"), ("val_fraction", "validation fraction"))
        if now[key] != saved[key]
    ] or ["other images: added, removed or skipped since"]
    return (
        f"{source.path}, the records the run trained on, were converted again from {origin} "
        f"since and split differently ({', '.join(differ)}): its validation split holds images "
        "the model trained on, so the score overstates how it does on new photos. For a "
        f"held-out score {_held_out_advice(run, source.manifest)}, or evaluate on new photos."
    )


def _own_split_warning(source, run, split: str) -> str | None:
    """A warning when the ``split`` scored of the run's own data holds the images it trained
    on: its train split, or all of it. Records, and an image folder split as petal splits it
    now (one split otherwise is :func:`_old_split_warning`'s); codelab shards are left out
    (their split depends on a validation fraction evaluate is not given)."""
    if split == "validation" or source.kind not in ("records", "folder"):
        return None
    if source.kind == "folder" and run.config.get("resolved", {}).get("folder_split") != (
        FOLDER_SPLIT
    ):
        return None
    trained, scored = source.count("train"), source.count(split)
    if not trained:
        return None
    return (
        f"{source.path} is the data the run trained on: the {split} split scored holds "
        f"{trained} of its {scored} images the model trained on, so the score overstates how "
        "it does on new photos. For a held-out score evaluate on the validation split (omit "
        "--split)."
    )


def _fit_warning(source, run) -> str | None:
    """A warning when records were fitted to their size with another --resize than the
    run's: ``none`` (kept at their own sizes) counts as ``fill``, as the pipeline fills them
    to the model's size."""
    fitted = (source.manifest or {}).get("resize")
    same = {"none": "fill"}
    if not isinstance(fitted, str) or same.get(fitted, fitted) == same.get(run.resize, run.resize):
        return None

    def how(mode: str) -> str:
        if mode == "none":
            return "kept at their own sizes (--resize none)"
        return f"fitted to their size with --resize {mode}"

    return (
        f"the records were {how(fitted)}, and the run's {how(run.resize)}: the model sees the "
        "photos framed otherwise than in training (and than predict and the exported model "
        f"frame them); convert with --resize {run.resize} to score it as it is used"
    )


def _trained_shards_warning(source, run, split: str) -> str | None:
    """A warning when the ``split`` scored of codelab shards holds shards the run trained on:
    the train split (or all) of its own shards, or another listing of them (a glob of some
    of them, the folder with shards added since) whose validation shards are not its."""
    from petal.data.reader import shard_identity
    from petal.training.loop import trained_on, trained_shards

    if source.kind != "codelab":
        return None
    entries = trained_on(run.config.get("resolved") or {}, run.config.get("data"))
    trained = set().union(*(trained_shards(entry) for entry in entries))
    files = source.files(split)
    hit = [(f, n) for f, n in zip(files, source.counts(split), strict=True)
           if shard_identity(f) in trained]  # fmt: skip
    if not hit:
        return None
    first = f"{os.path.basename(hit[0][0])}{', ...' if len(hit) > 1 else ''}"
    ours = run.config.get("data") or ""
    fix = (
        # The run's own data, listed otherwise since (shards added or removed): its
        # validation split moved onto shards it trained on.
        f"put back the shards {ours} listed when the run trained (shards added or removed "
        "since move its validation split)"
        if split == "validation" and same_place(str(source.path), ours)
        else f"evaluate on the validation split of the shards it trained on ({ours})"
    )
    return (
        f"{len(hit)} of the {len(files)} shards of the {split} split scored ({first}; "
        f"{sum(n for _, n in hit)} of its {source.count(split)} images) are shards the run "
        f"trained on, so the score overstates how it does on new photos. For a held-out score "
        f"{fix}."
    )


def _old_split_warning(run, split: str) -> str | None:
    """A run trained on an image folder split another way than petal splits it now: the
    validation split read now may hold images it trained on."""
    if split == "all" or run.config.get("resolved", {}).get("folder_split") == FOLDER_SPLIT:
        return None
    return (
        f"{run.workdir} was trained when petal split image folders another way: the "
        f"{split} split read now may hold images it trained on. Train it again for a "
        "held-out score."
    )


def _photos(root: str) -> set[tuple[str, int]] | None:
    """(relative path, bytes) of each image in a local or http image folder, or None if it
    cannot be listed (gone; gs://: a request per file is not worth it)."""
    if is_http(root):
        from petal.data.reader import http_images

        try:
            return {(key, size) for key, size in http_images(root).items() if "/" in key}
        except (PetalError, OSError, ValueError, KeyError):
            return None
    if is_remote(root) or not os.path.isdir(root):
        return None
    try:
        found = find_images(root, min_classes=1)
        return {(f.relpath, os.stat(f.path).st_size) for f in found.files}
    except (PetalError, OSError):
        return None


def _copy_warning(source, run, trained_on: dict | None, split: str) -> str | None:
    """A warning when the ``split`` of ``source`` scored holds photos the run trained on:
    a copy of the image folder its records were converted from (or of the one it trained
    on), records converted from such a copy (same names and sizes: most likely the same
    photos), or records converted from the very image folder it trained on (split by
    ``petal convert``, not as training split it). Photos of its validation split are held
    out still and not counted. The folder itself is :func:`_origin_warning`'s (its splits
    are refused by :func:`_split_for`); other records of its records' folder are
    :func:`_resplit_warning`'s."""
    resolved = run.config.get("resolved", {})
    trained_on_folder = resolved.get("data_kind") == "folder"
    origin = resolved.get("records_source") or (trained_on or {}).get("source")
    if not origin and trained_on_folder:
        origin = run.config.get("data")
    if source.kind == "folder":
        copy = source.path
    elif source.kind == "records":
        copy = (source.manifest or {}).get("source")
    else:
        return None
    if not origin or not copy:
        return None
    same = same_place(copy, origin)
    if same and source.kind == "folder" and not trained_on_folder:
        return _origin_warning(source, run, origin, trained_on, split)
    if same and (source.kind == "folder" or not trained_on_folder):
        return None
    theirs = _photos(copy)
    scored = _scored_names(source, split) if theirs else None
    if theirs and scored is not None:
        theirs = {photo for photo in theirs if photo[0] in scored}
    ours = theirs if same else _photos(origin) if theirs else None
    shared = theirs & ours if theirs and ours else set()
    # Only the photos it trained on: a copy of its validation photos is held out still.
    trained = _trained_names(run, origin) if shared else None
    if trained is not None:
        shared = {photo for photo in shared if photo[0] in trained}
    if not shared:
        return None
    notes = [f"{split} split"] if split != "all" and scored is not None else []
    if source.kind == "records":
        notes.append(f"converted from {copy}")
    what = f"{source.path}" + (f" ({', '.join(notes)})" if notes else "")
    if trained_on_folder:
        whence, own = "the image folder the run trained on", "its validation split"
    else:
        whence, own = "the folder the run's records were converted from", "the run's records"
    advice = (
        "so the score overstates how it does on new photos. For a held-out score evaluate on "
        f"{own} (omit --data) or on new photos."
    )
    if same:
        return (
            f"{len(shared)} of the {len(theirs)} images of {what} are photos the model trained "
            f"on: petal convert split {copy}, {whence}, otherwise than training did; {advice}"
        )
    return (
        f"{len(shared)} of the {len(theirs)} images of {what} have the names and sizes of "
        f"{'' if trained is None else 'training '}photos in {origin}, {whence}: most likely "
        f"copies of the images the model trained on, {advice}"
    )


def _trained_share(source, run, origin: str, split: str) -> str | None:
    """How many of the ``split`` images scored the model trained on (photos of ``origin``):
    ``"N of its M images"``, ``"images"`` where the names cannot be read, None for none."""
    scored, trained = _scored_names(source, split), _trained_names(run, origin)
    shared = scored & trained if scored is not None and trained is not None else None
    if shared == set():
        return None
    return f"{len(shared)} of its {len(scored)} images" if shared else "images"


def _origin_warning(source, run, origin: str, trained_on: dict | None, split: str) -> str | None:
    """A warning when ``source`` is the image folder the run's records were converted from
    (all of it: :func:`_split_for` refuses its splits): it holds the photos the model trained
    on, counted by the ``filename`` of the records' training split where they can be read."""
    if (how_many := _trained_share(source, run, origin, split)) is None:
        return None
    return (
        f"{source.path} is the image folder the run's records {run.config.get('data')} were "
        f"converted from: the {split} split scored holds {how_many} the model trained on, so "
        f"the score overstates how it does on new photos. For a held-out score "
        f"{_held_out_advice(run, trained_on)}, or evaluate on new photos."
    )


def _record_names(shards: list[str]) -> set[str] | None:
    """The ``filename`` of every record of ``shards`` (paths relative to the folder they
    were converted from; local, gs:// or http), or None when not worth it (over
    MAX_NAME_READ bytes) or unreadable. (Over http it returned None: the warnings that use
    it counted every image of the folder, not the split scored, nor only training photos.)"""
    import tensorflow as tf

    from petal.data import remote, schema, tfdata

    http = [f for f in shards if is_http(f)]
    try:
        if http:
            size = sum(remote.object_size(f) for f in shards)
        else:
            size = sum(tf.io.gfile.stat(f).length for f in shards)
        if size > MAX_NAME_READ:
            return None  # not worth reading every record for a warning
        spec = {schema.FILENAME: tf.io.FixedLenFeature([], tf.string)}
        records = remote.records_dataset(shards) if http else tf.data.TFRecordDataset(shards)
        records = tfdata.untuned(records)
        names = (
            records.batch(1024)
            .map(lambda batch: tf.io.parse_example(batch, spec)[schema.FILENAME])
        )
        return {name.decode("utf-8") for batch in names.as_numpy_iterator() for name in batch}
    except (OSError, ValueError, PetalError, tf.errors.OpError):
        return None


def _scored_names(source, split: str) -> set[str] | None:
    """Paths relative to the folder they came from of the images a split of ``source``
    holds (an image folder's, or its records' ``filename``), or None if not known."""
    if source.kind == "folder":
        # An http folder's file URLs are percent-encoded; the names they stand for are not.
        name = urllib.parse.unquote if source.remote else str
        return {
            name(os.path.relpath(path, source.path).replace(os.sep, "/"))
            for path in source.files(split)
        }
    return _record_names(source.files(split))


def _trained_names(run, origin: str) -> set[str] | None:
    """Paths relative to ``origin`` of the photos the run trained on: its image folder's
    training split, or the ``filename`` of each record of its records' training split. None
    when that cannot be known (records gone or unreadable, a folder split another way)."""
    from petal.data.reader import open_source

    resolved = run.config.get("resolved", {})
    kind = resolved.get("data_kind")
    if kind not in ("folder", "records") or (
        kind == "folder" and resolved.get("folder_split") != FOLDER_SPLIT
    ):
        return None
    try:
        from petal.training.loop import kept_in_train

        trained_on = open_source(
            origin if kind == "folder" else run.config["data"],
            classes=run.config.get("classes") if kind == "folder" else None,
            train_names=kept_in_train(run.config, origin) if kind == "folder" else (),
        )
    except (PetalError, KeyError, OSError):
        return None
    if kind == "records" and _split_since(run, trained_on.manifest) is not None:
        return None  # converted again since, split otherwise: not the photos it trained on
    try:
        return _scored_names(trained_on, "train")
    except (PetalError, KeyError, OSError):
        return None


# What an evaluation writes in its folder besides eval.json, which is written last; the
# report is drawn from the JSON written as PENDING_JSON and renamed at the end.
_OUTPUTS = ("samples.npz", "misclassified.npz", "confusion_matrix.png", "misclassified.png")
EVAL_JSON = "eval.json"
PENDING_JSON = ".pending-eval.json"
# Every file an evaluation writes in its folder (a folder in the way of one is refused
# before the evaluation), eval.json first: it is removed first. The temporary names too: a
# plot or the pending JSON cut short by a kill (SIGKILL, a power cut) stayed for good.
WRITTEN = (
    EVAL_JSON,
    *_OUTPUTS,
    PENDING_JSON,
    *(
        temporary_name(Path(name)).name
        for name in (PENDING_JSON, *_OUTPUTS)
        if name.endswith((".json", ".png"))  # written through save_atomically
    ),
)


def _write_outputs(out: Path, report: dict, samples: dict, wrong: dict, run, title: str) -> None:
    """Writes an evaluation's files into ``out``, ``eval.json`` last, so that the folder never
    mixes two evaluations: an earlier evaluation's files are removed first (its eval.json
    before the rest), and what was written is removed again when the writing fails (Ctrl-C
    waits for its end), leaving no eval.json beside files of another evaluation or with
    some of its own missing. ``title`` is the misclassified grid's.

    Raises:
        PetalError: the files cannot be written (a full disk), naming ``out`` and the fix.
    """
    def remove() -> None:
        # eval.json first: an interruption part-way leaves no eval.json that looks complete.
        for name in WRITTEN:
            (out / name).unlink(missing_ok=True)

    # Ctrl-C waits until the files are written: the folder holds the earlier evaluation or
    # this one, never a part of either.
    with signals_held():
        try:
            remove()
            for name, bucket in (("samples", samples), ("misclassified", wrong)):
                _save_samples(out / f"{name}.npz", bucket, run.classes, run.image_size)
            write_json(out / PENDING_JSON, report)
            plots.plot_confusion_from_json(out / PENDING_JSON, out / "confusion_matrix.png")
            # Nothing misclassified: no grid (the earlier evaluation's is gone).
            plots.plot_image_grid(out / "misclassified.npz", out / "misclassified.png", title=title)
            os.replace(out / PENDING_JSON, out / EVAL_JSON)
        except BaseException as err:
            with contextlib.suppress(OSError):
                remove()
            if isinstance(err, OSError):  # the disk is full, most likely
                raise write_failed(out, "evaluation", err) from None
            raise


def _save_samples(path: Path, bucket: dict, classes, image_size) -> None:
    h, w = image_size
    images = np.stack(bucket["images"]) if bucket["images"] else np.zeros((0, h, w, 3), np.uint8)
    np.savez_compressed(
        path,
        images=images,
        true=np.asarray(bucket["true"], np.int64),
        pred=np.asarray(bucket["pred"], np.int64),
        prob=np.asarray(bucket["prob"], np.float64),
        classes=np.asarray(list(classes)),
    )


def _keep_examples(images, y, p, samples, wrong, normalization, num_samples, max_wrong):
    """Append the batch's first images to ``samples`` and its mistakes to ``wrong``."""
    pred = p.argmax(axis=1)
    for i in range(len(y)):
        keep_sample = len(samples["images"]) < num_samples
        keep_wrong = pred[i] != y[i] and len(wrong["images"]) < max_wrong
        for keep, bucket in ((keep_sample, samples), (keep_wrong, wrong)):
            if keep:
                bucket["images"].append(denormalize_np(images[i], normalization))
                bucket["true"].append(int(y[i]))
                bucket["pred"].append(int(pred[i]))
                bucket["prob"].append(float(p[i, pred[i]]))
