"""``petal demo``: photos -> records -> the ``quick`` preset -> evaluation -> report.html.

The README's main job, in a few minutes on a laptop CPU. The photos come from ``--data``,
else ``$PETAL_DATA``, else the tf_flowers archive (218 MB) downloaded once into
``~/.cache/petal`` (``$PETAL_CACHE`` overrides the folder).
"""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import sys
import tarfile
import urllib.error
import urllib.request
import zlib
from collections.abc import Callable
from pathlib import Path

from petal.data.folders import expand_home
from petal.errors import PetalError, cannot_write, first_line
from petal.running import in_use_error, reading_elsewhere, running_elsewhere

FLOWERS_URL = (
    "https://storage.googleapis.com/download.tensorflow.org/example_images/flower_photos.tgz"
)
DEMO_PRESET = "quick"


def cache_dir() -> Path:
    return Path(expand_home(os.environ.get("PETAL_CACHE", Path.home() / ".cache" / "petal")))


def download_flowers(log: Callable[[str], None] = print, timeout: float = 30.0) -> Path:
    """The tf_flowers photos as a folder of class sub-folders, downloaded once.

    Raises:
        PetalError: the archive cannot be downloaded (offline, blocked), or the cached one
            is damaged or not the flowers archive (it is deleted, so the next call downloads
            it again), in one line saying how to pass local photos instead.
    """
    root = cache_dir()
    folder = root / "flower_photos"
    if (folder / "roses").is_dir():
        return folder
    root.mkdir(parents=True, exist_ok=True)
    archive = root / "flower_photos.tgz"
    if not archive.is_file():
        log(f"petal demo: downloading the tf_flowers photos (218 MB) from {FLOWERS_URL}")
        partial = archive.with_suffix(".tgz.part")
        try:
            with (
                urllib.request.urlopen(FLOWERS_URL, timeout=timeout) as response,
                partial.open("wb") as f,
            ):
                _copy_with_progress(response, f)
        except (urllib.error.URLError, TimeoutError, OSError) as err:
            partial.unlink(missing_ok=True)
            reason = getattr(err, "reason", err)
            raise PetalError(
                f"Cannot download the tf_flowers photos from {FLOWERS_URL} (offline? {reason}); "
                "pass --data FOLDER (a folder of class sub-folders of photos) or set PETAL_DATA."
            ) from None
        partial.replace(archive)
    log(f"petal demo: extracting {archive}")
    tmp = root / "flower_photos.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        with tarfile.open(archive) as tar:
            tar.extractall(tmp, filter="data")
    except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as err:
        # A download cut short or replaced: delete it, or every run would fail on it.
        shutil.rmtree(tmp, ignore_errors=True)
        archive.unlink(missing_ok=True)
        # tarfile.open's error lists each compression it tried: not a .tgz at all.
        reason = "not a tar archive" if "opened successfully" in str(err) else first_line(err)
        raise PetalError(
            f"The cached tf_flowers archive {archive} is damaged ({reason}); it was "
            "deleted, so the next petal demo downloads it again (or pass --data FOLDER)."
        ) from None
    except OSError as err:
        shutil.rmtree(tmp, ignore_errors=True)
        raise PetalError(
            f"Cannot extract {archive} into {root} ({err.strerror or err}); free some space "
            "there or set PETAL_CACHE to another folder, or pass --data FOLDER."
        ) from None
    if not (tmp / "flower_photos" / "roses").is_dir():
        shutil.rmtree(tmp, ignore_errors=True)
        archive.unlink(missing_ok=True)
        raise PetalError(
            f"The cached archive {archive} is not the tf_flowers archive (no "
            "flower_photos/roses/ in it); it was deleted, so the next petal demo downloads "
            "it again (or pass --data FOLDER)."
        )
    shutil.rmtree(folder, ignore_errors=True)
    (tmp / "flower_photos").replace(folder)
    shutil.rmtree(tmp, ignore_errors=True)
    return folder


def _copy_with_progress(response, f) -> None:
    from tqdm import tqdm

    total = int(response.headers.get("Content-Length") or 0) or None
    with tqdm(total=total, unit="B", unit_scale=True, desc="flower_photos.tgz") as bar:
        while chunk := response.read(1 << 20):
            f.write(chunk)
            bar.update(len(chunk))


def resolve_data(data: str | Path | None, log: Callable[[str], None] = print) -> Path:
    """``--data``, else ``$PETAL_DATA``, else the downloaded tf_flowers photos."""
    from_env = data is None and bool(os.environ.get("PETAL_DATA"))
    if from_env:
        data = os.environ["PETAL_DATA"]
        log(f"petal demo: using $PETAL_DATA={data}")
    if data is None:
        return download_flowers(log)
    data = Path(expand_home(data))
    where, fix = f"{data}", "pass --data a folder of class sub-folders"
    if from_env:
        where = f"{data} (from $PETAL_DATA)"
        fix = "set PETAL_DATA to a folder of class sub-folders, or unset it, or pass --data"
    if data.exists() and not data.is_dir():
        raise PetalError(f"Demo data {where} is a file; {fix}.")
    if not data.is_dir():
        raise PetalError(f"Demo data folder not found: {where}; {fix}.")
    return data


def run_demo(
    data: str | Path | None = None,
    workdir: str | Path = "petal-demo",
    *,
    preset: str = DEMO_PRESET,
    overrides: tuple[str, ...] = (),
    log: Callable[[str], None] = print,
) -> dict:
    """Convert ``data`` into ``WORKDIR/records``, train ``preset`` into ``WORKDIR``, evaluate
    on the validation split and write ``WORKDIR/report.html``.

    Records already in ``WORKDIR/records`` from the same photos (same classes and number of
    files) are reused; records a demo converted from other photos, and a previous demo run in
    ``WORKDIR``, are replaced. Records or a run that no demo wrote are never replaced: a demo
    knows its own by the ``demo.json`` it leaves in ``WORKDIR``.

    Returns:
        ``{"metrics": ..., "evaluation": ..., "report": path}``.
    """
    try:
        # Expanded here: convert and train expand a ~ themselves, and the checks of
        # whose run and records WORKDIR holds must look where they write.
        return _run_demo(expand_home(data), Path(expand_home(workdir)), preset, overrides, log)
    except PetalError as err:
        # Train's messages name its options, which petal demo lacks: the demo's --set instead.
        err.args = (demo_options(str(err)),)
        raise


def _run_demo(
    data: str | Path | None,
    workdir: Path,
    preset: str,
    overrides: tuple[str, ...],
    log: Callable[[str], None],
) -> dict:
    from petal.data import convert
    from petal.evaluation.evaluate import evaluate
    from petal.evaluation.report import build_report
    from petal.models import model_info
    from petal.training.config import load_config, parse_overrides
    from petal.training.loop import train

    records = workdir / "records"
    # Settings and the work directory first: the photos may be a download.
    if "data" in (values := parse_overrides(overrides)):
        raise PetalError(
            "petal demo trains on the records it converts from --data into WORKDIR/records; "
            "--set data=... would train on other data than it evaluates. Pass the photos as "
            f"--data, or use petal train --data for records. Received: data={values['data']!r}"
        )
    if values.get("classes"):
        # Train cannot choose among the classes of records it converts: refused before that.
        raise PetalError(
            "petal demo converts every class folder of --data, and trains on them all: --set "
            "classes=... cannot choose among them. Pass --data a folder holding only those "
            f"classes (links to their folders will do). Received: classes={values['classes']!r}"
        )
    if "preset" in values:
        raise PetalError(
            f"petal demo trains the {preset} preset, whose fields --set changes; it cannot "
            "choose another (petal train --preset NAME trains one). Received: "
            f"preset={values['preset']!r}"
        )
    config = load_config(preset, overrides=overrides, data=str(records)).validate()
    size = config.image_size or 192  # of the records it converts, and of evaluation
    # Too small for the model: refused by train, after the photos were converted at that size.
    model_info(config.model).image_hw(size, "image_size", config.model_options)
    _check_train_size(config, size)
    if workdir.exists() and not workdir.is_dir():
        raise PetalError(
            f"Demo folder {workdir} is a file; pass --workdir a folder (a new one, or one "
            "petal demo wrote)."
        )
    _refuse_other_runs(workdir, records)
    if workdir.is_dir() and (who := running_elsewhere(workdir, "training in it")):
        # Before its records are converted again under the run reading them.
        raise in_use_error(workdir, who, "--workdir")
    if error := _records_in_use(records, reading=False):  # records it may reuse: read on
        raise error
    if reason := cannot_write(workdir, folder=True):
        raise PetalError(f"Demo folder {workdir} cannot be written: {reason}; pass --workdir "
                         "a folder you can write.")
    source = resolve_data(data, log)
    if source.resolve() in (workdir.resolve(), *workdir.resolve().parents):
        where = "is" if source.resolve() == workdir.resolve() else "is inside"
        raise PetalError(
            f"Demo folder {workdir} {where} the photos folder {source}: its records would be "
            "read as a class. Pass a --workdir outside --data."
        )
    photos = _find_photos(source)
    manifest = _records_manifest(records)
    stale = _why_not_reuse(manifest, source, size, photos)
    if manifest is not None and stale is None:
        log(f"petal demo: reusing the records in {records}")
        _check_validation(manifest, source)
        if _read_marker(workdir) is None:
            # Someone's records of these very photos: the run is the demo's, they are not.
            _write_marker(workdir, source, None, records_too=False)
    else:
        _refuse_other_records(workdir, records, manifest, source, stale)
        if manifest is not None:
            log(f"petal demo: not reusing the records in {records}: {stale}")
        log(f"petal demo: converting {source} -> {records} at {size}x{size}")
        _write_marker(workdir, source, None)  # converting: the records are the demo's
        try:
            summary = convert(
                source, records, image_size=size, overwrite=True, progress=sys.stderr.isatty()
            )
        except PetalError:
            # Claimed since the check above: convert's refusal names its DST, not --workdir.
            if error := _records_in_use(records, reading=True):
                raise error from None
            raise
        manifest = summary.manifest
        _write_marker(workdir, source, manifest.get("created"))
        first, *warnings = str(summary).splitlines()
        for line in summary.skipped_lines(manifest=str(records / "manifest.json")):
            log(f"petal demo: {line}")
        log(f"petal demo: {first}")
        _check_validation(manifest, source)  # before warnings that name convert's options
        for line in warnings:
            log(f"petal demo: {_demo_warning(line, manifest['val_fraction'])}")
    if (workdir / "config.json").is_file():  # a demo's (_refuse_other_runs): said, not silent
        # Train may still refuse (and keep the run): it replaces it once its checks pass.
        log(
            f"petal demo: the previous demo run in {workdir} (its model, metrics, eval and "
            "report) is replaced once training's checks pass"
        )
    metrics = train(config, workdir, overwrite=True, log=lambda line: log(demo_options(line)))
    evaluation = evaluate(workdir, records, skip_corrupt=config.skip_corrupt, log=log)
    report = build_report(workdir)
    log(f"petal demo: report written to {report}")
    return {"metrics": metrics, "evaluation": evaluation, "report": str(report)}


# Train's options that petal demo lacks, and the field each sets with the demo's --set.
_TRAIN_OPTIONS = {
    "strategy": "strategy",
    "epochs": "epochs",
    "image-size": "image_size",
    "precision": "precision",
    "batch-size": "batch_size",
    "model": "model",
    "weights": "weights",
}
# A petal command a message suggests (`petal models --image-size 71`): left as it is.
_COMMAND = re.compile(r"(`petal [^`]*`|\(petal [^)]*\))")


def demo_options(text: str) -> str:
    """``text`` (a message of train's) with each of train's options it names given as the
    ``--set key=value`` that petal demo takes: ``--epochs 3`` -> ``--set epochs=3``."""
    # The demo converts its photos at image_size: no petal convert to run.
    text = re.sub(
        r"pass --image-size (\d+) or more \(image_size=\d+; smaller records are upscaled\), "
        r"or convert the photos at that size or more \(petal convert SRC DST --image-size \d+\)",
        r"pass --set image_size=\1 or more (petal demo converts its photos at that size)",
        text,
    )
    text = text.replace("`--weights none` on the command line", "`--set weights=null`")
    text = re.sub(r"--weights (none|PATH) \(weights=\w+\)", r"--weights \1", text)
    text = text.replace("--weights none", "--set weights=null")
    option = "|".join(map(re.escape, _TRAIN_OPTIONS))

    def to_set(match: re.Match) -> str:
        field, value = _TRAIN_OPTIONS[match[1]], match[2]
        return f"--set {field}={value}" if value else f"--set {field}"

    pattern = rf"--({option})\b(?: (?!or\b|out\b|and\b)([\w.]+))?"
    return "".join(
        part
        if _COMMAND.fullmatch(part)
        else re.sub(pattern, to_set, part).replace("--skip-corrupt", "--set skip_corrupt=true")
        for part in _COMMAND.split(text)
    )


def _check_train_size(config, size: int) -> None:
    """Raise when ``train_image_size`` crops the records without what it needs (the ``crop``
    augmentation, a model that takes any size): train finds out from the records' size,
    after the demo converted them at ``size``."""
    from petal.data import augment
    from petal.training.loop import _check_train_size as check

    augment.build(config.augment)  # an unknown name: its own message
    try:
        check(config, (size, size))
    except PetalError as err:
        raise PetalError(demo_options(str(err))) from None


def _find_photos(source: Path):
    """The photos' classes and files, or one line saying what the demo needs of ``--data``."""
    from petal.data import find_images

    photos = find_images(str(source), min_classes=1)
    if len(photos.classes) < 2:
        (name,) = photos.classes
        # A folder one level too high (``data/`` holding ``flower_photos/CLASS/``).
        inner = {f.relpath.split("/")[1] for f in photos.files if f.relpath.count("/") > 1}
        hint = f"; did you mean --data {source / name}?" if len(inner) > 1 else "."
        raise PetalError(
            f"Demo data {source} holds one class sub-folder ({name!r}); petal demo trains a "
            "classifier and needs at least two: pass --data a folder with a sub-folder of "
            f"photos per class{hint}"
        )
    return photos


def _records_manifest(records: Path) -> dict | None:
    """The manifest of ``records``, or None when there is none or it is damaged."""
    from petal.data import read_manifest

    if not (records / "manifest.json").is_file():
        return None
    try:
        return read_manifest(records)
    except PetalError:
        return None


def _why_not_reuse(manifest: dict | None, source: Path, size: int, photos) -> str | None:
    """Why the records of ``manifest`` are not those of the photos in ``source`` at ``size``
    (they were converted from other photos, at another size, or the photos changed since);
    None when they are."""
    if manifest is None:
        return "no finished conversion"
    converted = str(manifest.get("source", ""))
    if not converted or Path(converted).resolve() != source.resolve():
        return f"they were converted from other photos ({converted or 'unknown'})"
    if manifest.get("image_size") != [size, size]:
        shown = "x".join(map(str, manifest.get("image_size") or ["?"]))
        return f"they are {shown}, the demo needs {size}x{size}"
    classes = list(photos.classes)
    if manifest.get("classes") != classes:
        return (
            f"the photos changed: their classes are now {', '.join(classes)} (the records "
            f"have {', '.join(map(str, manifest.get('classes') or []))})"
        )
    if manifest.get("images_found") != len(photos.files):
        return (
            f"the photos changed: {len(photos.files)} image files now, "
            f"{manifest.get('images_found')} when they were converted"
        )
    return None


MARKER = "demo.json"  # in WORKDIR: the demo works there (and converted WORKDIR/records)


def _write_marker(
    workdir: Path, source: Path, created: str | None, *, records_too: bool = True
) -> None:
    """Record that the demo trains in ``workdir`` and, unless ``records_too`` is False
    (records of someone's it reuses), writes ``WORKDIR/records`` (``created``: None while
    converting, then the manifest's ``created``), so a later demo may replace them but no
    others."""
    workdir.mkdir(parents=True, exist_ok=True)
    text = json.dumps(
        {
            "records": "records" if records_too else None,
            "source": str(source.resolve()),
            "created": created,
        }
    )
    (workdir / MARKER).write_text(text + "\n")


def _read_marker(workdir: Path) -> dict | None:
    """The demo's marker in ``workdir``, or None where no demo left one (or it is damaged)."""
    try:
        marker = json.loads((workdir / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) else None


def _demo_wrote(workdir: Path, records: Path, manifest: dict | None) -> bool:
    """Whether ``records`` are the demo's to replace: its marker names this conversion (or a
    conversion it began).

    Nothing else tells: records and a run trained on them, with no marker, are what a demo
    from before the marker left, and just as much what ``petal convert`` and ``petal train``
    leave, by hand, in that folder. Such a demo folder is refused like anyone's.
    """
    marker = _read_marker(workdir)
    if marker is None or marker.get("records") != "records" or "created" not in marker:
        return False
    created = marker["created"]
    return created is None or (manifest is not None and manifest.get("created") == created)


def _refuse_other_records(
    workdir: Path, records: Path, manifest: dict | None, source: Path, stale: str | None
) -> None:
    """Raise when converting would replace records (or other files) in ``records`` that no
    demo wrote: someone's conversion of other photos, hours of work."""
    if records.exists() and not records.is_dir():
        raise PetalError(
            f"{records} is a file, where petal demo writes its records; pass another "
            f"--workdir, or delete {records}."
        )
    if not records.is_dir() or not any(records.iterdir()):
        return
    if _demo_wrote(workdir, records, manifest):
        return
    if manifest is None:
        raise PetalError(
            f"{records} holds files that petal demo did not write; the demo would convert "
            f"into that folder. Pass another --workdir, or delete {records}."
        )
    converted = manifest.get("source")
    if converted and Path(str(converted)).resolve() != source.resolve():
        stale = f"with records of {source}"
    raise PetalError(
        f"{records} holds records that petal demo did not write (converted from {converted}); "
        f"the demo would replace them ({stale}). Pass another --workdir, or delete {records}."
    )


def _demo_warning(line: str, fraction: float) -> str:
    """A warning of ``petal convert`` about the split, told as the demo's (it has no
    ``--val-fraction``: its photos are what a demo user changes)."""
    line = re.sub(
        r"raise --val-fraction to [\d.]+ \(a class of \d+ validates one\) or add images "
        r"\(at val_fraction [\d.]+ a class needs (\d+) or more to validate on one\)",
        f"add photos to it (petal demo keeps {fraction} of each class to validate on: a class "
        r"needs \1 or more to validate on one; petal convert --val-fraction sets another share)",
        line,
    )
    return re.sub(
        r"(?:raise|lower) --val-fraction or add images",
        f"add photos to it (petal demo keeps {fraction} of each class to validate on; "
        "petal convert --val-fraction sets another share)",
        line,
    )


def _check_validation(manifest: dict, source: Path) -> None:
    """Raise when the records have no validation image: the demo validates every epoch and
    evaluates on them, and its photos are all it can change."""
    if manifest["splits"]["validation"]["count"] > 0:
        return
    from petal.data.writer import photos_to_validate

    fraction = manifest["val_fraction"]
    need = photos_to_validate(fraction) if fraction > 0 else None
    enough = f" (at least {need} photos)" if need else ""
    raise PetalError(
        f"The photos in {source} are too few for petal demo: it keeps {fraction} of each "
        "class's photos (rounded) to validate on, none here. Add photos to a class "
        f"sub-folder of --data{enough} and run petal demo again."
    )


def _records_in_use(records: Path, reading: bool) -> PetalError | None:
    """The refusal of ``WORKDIR/records`` while another process converts into it (a demo in
    the same ``--workdir``) or, when ``reading``, trains from it (what a conversion into it
    is refused for), naming ``--workdir``: the demo has no DST, which convert's names."""
    if who := running_elsewhere(records, "converting into it"):
        return in_use_error(records, who, "--workdir")
    if reading and (reader := reading_elsewhere(records)):
        who, marker = reader
        return in_use_error(records, who, "--workdir", marker=marker)
    return None


def _refuse_other_runs(workdir: Path, records: Path) -> None:
    """Raise when ``workdir`` holds a training run that no demo wrote: the demo replaces the
    run in its work directory, and must not delete someone's checkpoints and results.

    A demo's run trained on ``WORKDIR/records`` in a folder holding the demo's marker; a run
    on those records in a folder without one is someone's (``petal convert`` then
    ``petal train`` there).
    """
    config = workdir / "config.json"
    if not config.is_file():
        return
    try:
        data = json.loads(config.read_text()).get("data")
    except (ValueError, AttributeError):  # damaged or not an object: not a demo's
        data = None
    ours = bool(data) and Path(data).resolve() == records.resolve()
    if not ours or _read_marker(workdir) is None:
        raise PetalError(
            f"{workdir} holds a petal train run that petal demo did not write (its data is "
            f"{data}); the demo would replace it. Pass another --workdir."
        )
