"""``petal demo``: photos -> records -> the ``quick`` preset -> evaluation -> report.html.

The README's main job, in a few minutes on a laptop CPU. The photos come from ``--data``,
else ``$PETAL_DATA``, else the tf_flowers archive (218 MB) downloaded once into
``~/.cache/petal`` (``$PETAL_CACHE`` overrides the folder).
"""

from __future__ import annotations

import json
import os
import shutil
import tarfile
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from petal.errors import PetalError, cannot_write

FLOWERS_URL = (
    "https://storage.googleapis.com/download.tensorflow.org/example_images/flower_photos.tgz"
)
DEMO_PRESET = "quick"


def cache_dir() -> Path:
    return Path(os.environ.get("PETAL_CACHE", Path.home() / ".cache" / "petal"))


def download_flowers(log: Callable[[str], None] = print, timeout: float = 30.0) -> Path:
    """The tf_flowers photos as a folder of class sub-folders, downloaded once.

    Raises:
        PetalError: the archive cannot be downloaded (offline, blocked), in one line
            saying how to pass local photos instead.
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
    with tarfile.open(archive) as tar:
        tar.extractall(tmp, filter="data")
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
    if data is None and os.environ.get("PETAL_DATA"):
        data = os.environ["PETAL_DATA"]
        log(f"petal demo: using $PETAL_DATA={data}")
    if data is None:
        return download_flowers(log)
    data = Path(data)
    if data.exists() and not data.is_dir():
        raise PetalError(f"Demo data {data} is a file; pass --data a folder of class sub-folders.")
    if not data.is_dir():
        raise PetalError(f"Demo data folder not found: {data}. Pass a folder of class sub-folders.")
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

    Records already in ``WORKDIR/records`` from the same photos are reused; a previous demo
    run in ``WORKDIR`` is replaced.

    Returns:
        ``{"metrics": ..., "evaluation": ..., "report": path}``.
    """
    from petal.data import convert, read_manifest
    from petal.evaluation.evaluate import evaluate
    from petal.evaluation.report import build_report
    from petal.models import model_info
    from petal.training.config import load_config, parse_overrides
    from petal.training.loop import train

    workdir = Path(workdir)
    records = workdir / "records"
    # Settings and the work directory first: the photos may be a download.
    if "data" in (values := parse_overrides(overrides)):
        raise PetalError(
            "petal demo trains on the records it converts from --data into WORKDIR/records; "
            "--set data=... would train on other data than it evaluates. Pass the photos as "
            f"--data, or use petal train --data for records. Received: data={values['data']!r}"
        )
    config = load_config(preset, overrides=overrides, data=str(records)).validate()
    model_info(config.model)
    _refuse_other_runs(workdir, records)
    if reason := cannot_write(workdir, folder=True):
        raise PetalError(f"Demo folder {workdir} cannot be written: {reason}; pass --workdir "
                         "a folder you can write.")
    source = resolve_data(data, log)
    size = config.image_size or 192
    manifest_path = records / "manifest.json"
    reuse = False
    if manifest_path.is_file():
        manifest = read_manifest(records)
        reuse = Path(
            str(manifest.get("source", ""))
        ).resolve() == source.resolve() and manifest.get("image_size") == [size, size]
    if reuse:
        log(f"petal demo: reusing the records in {records}")
    else:
        log(f"petal demo: converting {source} -> {records} at {size}x{size}")
        summary = convert(source, records, image_size=size, overwrite=True)
        for line in str(summary).splitlines():  # the summary, then any warnings
            log(f"petal demo: {line}")
    metrics = train(config, workdir, overwrite=True, log=log)
    evaluation = evaluate(workdir, records, log=log)
    report = build_report(workdir)
    log(f"petal demo: report written to {report}")
    return {"metrics": metrics, "evaluation": evaluation, "report": str(report)}


def _refuse_other_runs(workdir: Path, records: Path) -> None:
    """Raise when ``workdir`` holds a training run that no demo wrote: the demo replaces the
    run in its work directory, and must not delete someone's checkpoints and results."""
    config = workdir / "config.json"
    if not config.is_file():
        return
    try:
        data = json.loads(config.read_text()).get("data")
    except (ValueError, AttributeError):  # damaged or not an object: not a demo's
        data = None
    if not data or Path(data).resolve() != records.resolve():
        raise PetalError(
            f"{workdir} holds a petal train run that petal demo did not write (its data is "
            f"{data}); the demo would replace it. Pass another --workdir."
        )
