"""``petal predict``: top-k labels with probabilities for image files, from a trained run.

New images go through the same steps as the training images: decoded and fitted to the
records' size exactly as the converter did (EXIF orientation, RGB, the run's resize mode),
resized to the model's input size as the input pipeline resizes records of another size
(records of ``--resize none``, at the photos' own sizes, all of them), then normalized.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from petal.data import images as image_io
from petal.data.folders import (
    blurs_in_list,
    expand_home,
    is_utf8,
    missing_target_reason,
    read_bytes,
    some_names,
    utf8_name,
)
from petal.errors import (
    PetalError,
    is_int_at_least,
    need_bool,
    need_bool_or_none,
    printable,
    some_files,
)
from petal.evaluation.metrics import top_k as best_k
from petal.evaluation.workdir import RunInfo, load_model, open_run, progress_bar, top_k_for


class _Unreadable(Exception):
    """An image file that cannot be read or decoded; the message is the reason."""


def _decode(
    path: Path, run: RunInfo, max_pixels: int = image_io.DEFAULT_MAX_PIXELS
) -> np.ndarray:
    try:
        # Refuses a FIFO or a device before opening it (the read would block or never end).
        data = read_bytes(str(path))
    except FileNotFoundError:
        if why := missing_target_reason(str(path)):  # spelled right: "not found" misled
            raise _Unreadable(printable(utf8_name(why))) from None
        raise _Unreadable("not found") from None
    except OSError as err:  # a folder, no permission, an I/O error
        raise _Unreadable(err.strerror or str(err)) from None
    try:
        pixels, _, _ = image_io.decode_rgb(data, max_pixels)
    except image_io.PixelLimitError as err:
        raise _Unreadable(f"{err}: --max-pixels N reads larger images") from None
    except image_io.ImageError as err:
        raise _Unreadable(str(err)) from None
    if run.fit_mode != "none":
        pixels = image_io.resize(pixels, run.records_size or run.image_size, run.fit_mode)
    if run.fit_mode == "none" or tuple(pixels.shape[:2]) != run.image_size:
        # Records at their own sizes, or at another size than the model's: resize as the
        # input pipeline does.
        from petal.data.pipeline import resize_fill

        pixels = resize_fill(pixels, run.image_size).numpy()
    return pixels


def _error(path: Path, reason: str) -> PetalError:
    path = printable(utf8_name(str(path)))
    if reason == "not found":
        return PetalError(f"Image not found: {path}; pass an image file or a folder of them "
                          "that exists (check the path and its spelling).")  # fmt: skip
    return PetalError(f"Cannot read image {path}: {reason}")


def _listing(paths: Sequence[str], limit: int = 5) -> str:
    return some_names([str(p) for p in paths], limit)


def _warn(line: str) -> None:
    print(f"petal predict: warning: {line}", file=sys.stderr, flush=True)


def expand_images(paths: Sequence[str | Path], warn=None) -> list[Path]:
    """Image files, with each folder among ``paths`` replaced by the images under it.

    A folder contributes every file below it (sub-folders and links to folders included)
    whose extension is an image's (case-insensitive), sorted by path; its other files, its
    hidden folders and image files (``.ipynb_checkpoints/``, macOS's ``._photo.jpg``), which
    are not read, and its links back to a folder on their own path, which are not followed,
    are counted in a warning for each kind, which names the first five (other hidden files,
    such as ``.DS_Store``, are not); in the error instead when it holds no image. Files
    named directly are kept whatever their extension, in the order given.

    Args:
        paths: files and folders.
        warn: receives the warning lines (default: printed to stderr).

    Raises:
        PetalError: a folder holds no image files, or a path is a URL or empty.
    """
    return [path for path, _ in _expand(paths, warn)]


def _expand(
    paths: Sequence[str | Path], warn, workdir: str | Path | None = None
) -> list[tuple[Path, str]]:
    """:func:`expand_images`, each file with its name as given: a path given as written
    (``./a.jpg``; a leading ``~`` expanded, as a shell does), a file found in a folder as
    that folder's path as written joined to its path there; a Path would drop the ``./``
    and a doubled ``/``, and a script would not find its own paths among the results.
    ``workdir``: the run predicting, for the command that evaluates it on a folder of
    records (``WORKDIR`` when not known)."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]  # one path, not a sequence of its characters
    if bad := [p for p in paths if not isinstance(p, (str, os.PathLike))]:
        raise PetalError(
            f"images must be image files or folders of them (str or Path). Received: {bad[0]!r} "
            f"among images={paths!r}"
        )
    if any(str(p) == "" for p in paths):
        # A Path would make it the current folder, and every image under it would be read.
        raise PetalError("An image path is empty (an unset shell variable?); pass image files "
                         "or folders of them.")
    paths = [expand_home(p) for p in paths]
    if urls := [str(p) for p in paths if "://" in str(p)]:
        # A Path would have mangled it ("http:/host/..."), then called it not found.
        raise PetalError(
            f"petal predict reads local files; {urls[0]} is a URL: download the images and "
            "pass their paths."
        )
    from petal.data.folders import (
        IMAGE_EXTENSIONS,
        hidden_entries,
        holds_run_config,
        is_hidden_entry,
        walk_tree,
    )

    warn = warn or _warn
    files: list[tuple[Path, str]] = []
    for given in paths:
        path, written = Path(given), os.fspath(given)
        if not path.is_dir():
            if (written.endswith(("/", os.sep)) or written.endswith("/.")) and path.exists():
                # A Path drops the "/" and would read the file; a shell's `cat x.jpg/` fails.
                raise PetalError(
                    f"{printable(utf8_name(written))} ends with '/' but is a file, not a "
                    "folder: drop the '/' to predict the file."
                )
            files.append((path, written))
            continue
        if holds_run_config(str(path)):
            # Its plots (eval/, plots/) were predicted, with a warning naming its other files.
            folder = printable(utf8_name(written))
            raise PetalError(
                f"Folder {folder} is a training run, not a folder of images: the run comes "
                f"first, then the images (`petal predict {shlex.quote(folder)} IMAGE...`)."
            )
        # Links to folders are followed, as petal convert does; a link back to a folder on
        # its own path is not (listed among the other files, with a trailing /).
        image_names, other_names = walk_tree(str(path))
        found = sorted((path / rel, os.path.join(written, rel)) for rel in image_names)
        hidden = [f"{path}/{rel}" for rel in hidden_entries(other_names)]
        # Other hidden files (.DS_Store, .gitkeep) are in every folder: not worth a word.
        shown = [rel for rel in other_names if not is_hidden_entry(rel)]
        loops = [f"{path}/{rel}" for rel in shown if rel.endswith("/")]
        other = [f"{path}/{rel}" for rel in shown if not rel.endswith("/")]
        notes = []
        if hidden:
            notes.append(
                f"{len(hidden)} hidden folder(s) or image file(s) under {path} are not read "
                f"(names starting with '.', or __MACOSX): {_listing(hidden)}; pass them by name "
                "to predict them"
            )
        if other:
            notes.append(
                f"{len(other)} file(s) under {path} are not image files (by extension: "
                f"{', '.join(IMAGE_EXTENSIONS)}) and are not predicted: {_listing(other)}"
                + ("; pass them by name to predict them" if not found and _photos(other) else "")
            )
        if loops:
            notes.append(
                f"{len(loops)} folder link(s) under {path} lead back to a folder that holds "
                f"them and are not followed: {_listing(loops)}"
                + (f" (images in {path} are predicted once, where they lie; none above it)"
                   if found else "")
            )
        if not found:
            raise _no_images(path, other, notes, workdir)
        for note in notes:
            warn(note)
        files += found
    return files


def _no_images(path: Path, other: list[str], notes: list[str], workdir) -> PetalError:
    """Why the folder ``path`` (its non-image files ``other``) gives predict nothing: it holds
    records (evaluate the run on them), an export, or no image files (what is there but
    not read is the fix: said in the one line of the error)."""
    from petal.data.folders import IMAGE_EXTENSIONS

    folder = printable(utf8_name(str(path)))
    if _records(path, other):
        run = "WORKDIR" if workdir is None else shlex.quote(str(workdir))
        return PetalError(
            f"Folder {folder} holds records, not image files: evaluate the run on them "
            f"with `petal evaluate {run} --data {shlex.quote(folder)}`, or pass image files "
            "or a folder of them."
        )
    if _export(path, other):
        return PetalError(
            f"Folder {folder} holds a model export (SavedModel), not image files: pass "
            "image files or a folder of them."
        )
    said = "".join(f"; {note}" for note in notes)
    return PetalError(
        f"Folder {folder} holds no image files "
        f"({', '.join(IMAGE_EXTENSIONS)}){said}; pass image files or a folder of them."
    )


# Extensions of the files petal writes (records, runs, evaluations, exports, a SavedModel's
# variables.index): never photos under another extension, so never worth passing by name to
# predict. A SavedModel's variables.data-00000-of-00001 is told by its prefix.
_NOT_PHOTOS = frozenset(
    (".tfrec", ".tfrecord", ".json", ".csv", ".txt", ".h5", ".keras", ".html", ".pb", ".tflite")
    + (".npz", ".log", ".index")
)


def _photos(files: list[str]) -> bool:
    """Whether some of ``files`` (not image files by extension) may be photos all the same."""
    return any(
        (ext := os.path.splitext(f)[1].lower()) not in _NOT_PHOTOS
        and not ext.startswith(".data-")
        and ".tfevents." not in os.path.basename(f)  # TensorBoard's events.out.tfevents.*
        for f in files
    )


def _export(path: Path, files: list[str]) -> bool:
    """Whether the folder ``path`` (its non-image ``files``) holds a model export: petal
    export's folder (its ``export.json``) or a SavedModel (its ``saved_model.pb``)."""
    return (path / "export.json").is_file() or any(
        os.path.basename(f) == "saved_model.pb" for f in files
    )


def _records(path: Path, files: list[str]) -> bool:
    """Whether the folder ``path`` (its non-image ``files``) holds petal's or codelab records."""
    return (path / "manifest.json").is_file() or any(
        os.path.splitext(f)[1].lower() in (".tfrec", ".tfrecord") for f in files
    )


def predict(
    workdir: str | Path,
    images: Sequence[str | Path],
    top_k: int | None = None,
    batch_size: int = 32,
    skip_corrupt: bool = False,
    warn=None,
    progress: bool | None = None,
    max_pixels: int = image_io.DEFAULT_MAX_PIXELS,
) -> list[dict]:
    """Classify image files with the run's final model.

    Args:
        workdir: a finished ``petal train`` work directory.
        images: image file paths (JPEG, PNG, GIF, BMP, WebP), or folders of them (every
            image below a folder, sorted; see :func:`expand_images`); one path alone may be
            given as a str or Path.
        top_k: how many labels to return per image, best first (default 3); at most
            the class count (more is reduced to it, with a warning).
        batch_size: images per forward pass.
        skip_corrupt: skip files that cannot be read or decoded, instead of stopping
            (without it, the first one ends the predictions, and every file is still
            decoded to name them all); each is in the results, marked, and counted in one
            warning.
        warn: receives the warning lines (default: printed to stderr).
        progress: a progress bar on stderr; default: for more than 256 images, on a
            terminal.
        max_pixels: images with more pixels are not decoded (a guard against decompression
            bombs; the default, PIL's, refuses some 108-megapixel phone photos).

    Returns:
        One dict per image, in input order:
        ``{"file": str, "predictions": [{"label", "index", "probability"}, ...]}`` (a file
        name that is not valid UTF-8 with each byte that is not as ``\\xNN``); an
        image skipped under ``skip_corrupt`` has no predictions and says why:
        ``{"file": str, "predictions": [], "skipped": reason}``.

    Raises:
        PetalError: no images, missing or unreadable images (all of them named; without
            ``skip_corrupt``), or a run without a model.
    """
    skip_corrupt = need_bool(skip_corrupt, "skip_corrupt")
    progress = need_bool_or_none(progress, "progress")
    if not images:
        raise PetalError("No images given; pass one or more image files.")
    if not is_int_at_least(batch_size, 1):
        raise PetalError(f"batch_size must be an integer >= 1. Received: {batch_size!r}")
    if top_k is not None and not is_int_at_least(top_k, 1):
        raise PetalError(f"top_k (--top-k) must be an integer >= 1. Received: {top_k!r}")
    if not is_int_at_least(max_pixels, 1):
        raise PetalError(
            f"max_pixels (--max-pixels) must be an integer >= 1. Received: {max_pixels!r}"
        )
    from petal.data.pipeline import normalize

    warn = warn or _warn
    run = open_run(workdir, warn=warn)
    top_k = top_k_for(run, top_k, warn)
    given = _expand(images, warn, run.workdir)
    images = [path for path, _ in given]
    names = [utf8_name(name) for _, name in given]  # as given: the results' "file"
    if not_utf8 := [path for path in images if not is_utf8(str(path))]:
        # Kept as Python holds them (lone surrogates) they are no text JSON or a terminal
        # can hold: written as petal convert writes such names in its manifest.
        warn(
            f"{len(not_utf8)} file name(s) are not valid UTF-8: the results write each byte "
            f"that is not as \\xNN: {_listing(not_utf8)}"
        )
    model = None
    found: dict[int, dict] = {}  # by the file's place in images
    bad: list[tuple[int, str]] = []
    # A batch at a time, so a folder of any size fits in memory. After the first unreadable
    # file (without skip_corrupt) the rest are only decoded, to name every one of them.
    with progress_bar("predict", len(images), progress) as bar:
        for start in range(0, len(images), batch_size):
            chunk = range(start, min(start + batch_size, len(images)))
            pixels, kept = [], []
            for at in chunk:
                try:
                    pixels.append(_decode(images[at], run, max_pixels))
                    kept.append(at)
                except _Unreadable as err:
                    bad.append((at, str(err)))
            if pixels and (skip_corrupt or not bad):
                model = model or load_model(run)
                batch = normalize(np.stack(pixels), run.normalization)
                probs = np.asarray(model.predict_on_batch(batch), dtype=np.float64)
                idx, p = best_k(probs, top_k)
                for n, at in enumerate(kept):
                    found[at] = {
                        "file": names[at],
                        "predictions": [
                            {"label": run.classes[int(i)], "index": int(i), "probability": float(q)}
                            for i, q in zip(idx[n], p[n], strict=True)
                        ],
                    }
            bar.update(len(chunk))
    if len(images) == 1 and bad:
        raise _error(given[0][1], bad[0][1])  # one file: its own message
    if bad:
        named = [(names[at], reason) for at, reason in bad]
        shown = some_files(named, "--skip-corrupt marks each skipped")
        if len(bad) == len(images):
            raise PetalError(
                f"None of the {len(images)} images can be read: {shown}; pass image files."
            )
        if not skip_corrupt:
            raise PetalError(
                f"{len(bad)} of {len(images)} images cannot be read: {shown}; replace or "
                "remove them, or pass --skip-corrupt to predict the others."
            )
        warn(
            f"skipped {len(bad)} of {len(images)} images that cannot be read (each marked "
            f"skipped in the results): {shown}"
        )
    for at, reason in bad:
        found[at] = {"file": names[at], "predictions": [], "skipped": reason}
    return [found[at] for at in range(len(images))]


def _shown_label(label: str) -> str:
    """A class name in a line of predictions: on that line (a newline written ``\\n``), and
    quoted where a comma or an edge space would blur where it ends in the list."""
    shown = printable(label)
    if blurs_in_list(shown):
        return f'"{shown}"'
    return shown


def format_predictions(results: list[dict]) -> str:
    """Human-readable lines: ``file: label 0.912, label 0.051, ...`` (or ``file: skipped:
    reason``)."""
    lines = []
    for r in results:
        best = ", ".join(
            f"{_shown_label(q['label'])} {q['probability']:.3f}" for q in r["predictions"]
        )
        shown = printable(r["file"])
        lines.append(f"{shown}: " + (f"skipped: {r['skipped']}" if "skipped" in r else best))
    return "\n".join(lines)
