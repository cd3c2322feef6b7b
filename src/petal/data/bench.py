"""``petal bench input``: how fast each input path runs, against the decode ceiling.

Measured in one run, on the same images:

- ``ceiling``: the records' own JPEG bytes decoded in a tight loop on every core (one
  process per core) with the fastest decoder available (simplejpeg = libjpeg-turbo, with
  its accurate defaults, the same work as the pipeline's decoder; else PIL, else
  ``tf.io.decode_jpeg``). A JPEG pipeline cannot beat it on this machine.
- ``folder``: the per-file path (read each image file, decode, resize);
- ``jpeg``: TFRecords of JPEGs (``petal convert`` default);
- ``raw``: TFRecords of raw uint8 pixels (no decoding);
- ``cached``: the JPEG records decoded once into an in-RAM cache;

each without and with the default (codelab) augmentation, through the same
:func:`petal.data.pipeline.train_dataset` that training uses, timed after a warm-up.
With ``remote_latency_ms`` it also serves the folder and the records from a loopback
object server with that latency per request and measures reads per second (per-file
vs sharded) and the full pipelines over it.
"""

from __future__ import annotations

import json
import logging
import math
import numbers
import os
import shutil
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from petal.data import folders, tfdata
from petal.data.writer import usable_cpus
from petal.errors import PetalError, first_line, tf_message
from petal.jsonfile import save_atomically

log = logging.getLogger(__name__)


@dataclass
class Case:
    """One measured configuration."""

    name: str
    path: str
    augment: str
    images_per_s: float  # median over rounds
    batches_per_s: float
    cpu_ms_per_image: float
    rounds: int
    seconds: float
    note: str = ""
    runs: list[float] = field(default_factory=list)
    # Median over rounds of images/s over the ceiling's in the same round (as every ratio):
    # with several rounds not the same as images_per_s over the ceiling's median.
    x_ceiling: float | None = None


@dataclass
class BenchResult:
    records: str
    batch_size: int
    seconds: float
    cpus: int
    decoder: str
    cases: list[Case] = field(default_factory=list)
    ratios: dict[str, float] = field(default_factory=dict)
    findings: list[str] = field(default_factory=list)
    remote: dict = field(default_factory=dict)
    # Bytes per record of the shards read: "jpeg" (RECORDS) and "raw" (the raw-pixel copy,
    # which may hold the training images only), where their manifests give them.
    record_bytes: dict = field(default_factory=dict)

    def case(self, name: str) -> Case | None:
        return next((c for c in self.cases if c.name == name), None)

    def to_dict(self) -> dict:
        return asdict(self)


# --- timing ----------------------------------------------------------------------------------


def time_dataset(
    dataset, *, batch_size: int, seconds: float, warmup_batches: int = 10, min_batches: int = 5
) -> tuple[float, float, float]:
    """(images/s, batches/s, CPU ms per image) after ``warmup_batches``, for ~``seconds``.

    CPU time is the whole process's (every thread), so it counts what the pipeline costs
    even when other programs compete for the cores; on a busy machine it is the steadier
    figure of the two.
    """
    it = iter(dataset)
    try:
        for _ in range(warmup_batches):
            next(it)
        n, images = 0, 0
        cpu, start = time.process_time(), time.perf_counter()
        while True:
            x, _ = next(it)
            images += int(x.shape[0])
            n += 1
            elapsed = time.perf_counter() - start
            if elapsed >= seconds and n >= min_batches:
                break
    finally:
        # The pipeline and its threads go now: an error's traceback kept them (this frame)
        # until a later garbage collection, which, once a shard had been renamed, waited for
        # ever on a thread looping on the missing file.
        del it
    cpu = time.process_time() - cpu
    return images / elapsed, n / elapsed, cpu / images * 1e3


def time_iterator(items, *, seconds: float, count=lambda item: 1, warmup: int = 0):
    """(items/s, items, seconds) for a plain iterator (used for raw reads)."""
    it = iter(items)
    for _ in range(warmup):
        next(it)
    n, start = 0, time.perf_counter()
    for item in it:
        n += count(item)
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            break
    elapsed = time.perf_counter() - start
    return n / elapsed, n, elapsed


# --- decode ceiling --------------------------------------------------------------------------


def jpeg_bytes(source, split: str = "train", limit: int = 4000) -> list[bytes]:
    """The encoded images of a JPEG records folder, as stored, in shard and record order.

    Raises:
        PetalError: a record that cannot be read (CRC failure, short file) or parsed,
            named by shard and record.
    """
    import tensorflow as tf

    from petal.data import schema
    from petal.data.reader import open_source

    src = open_source(source)
    if src.format != schema.FORMAT_JPEG:
        raise PetalError(f"The decode ceiling needs JPEG records; {src.path} is {src.format}.")
    spec = {schema.IMAGE: tf.io.FixedLenFeature([], tf.string)}
    parse = tf.autograph.experimental.do_not_convert(
        lambda r: tf.io.parse_single_example(r, spec)[schema.IMAGE]
    )
    blobs: list[bytes] = []
    for path in src.files(split):
        if len(blobs) >= limit:
            break
        records = tf.data.TFRecordDataset(path).take(limit - len(blobs)).map(parse)
        blobs += [bytes(b) for b in _records_of(path, records, src.path)]
    return blobs


def _records_of(path: str, dataset, records: str):
    """The elements of ``dataset``, one per record of shard ``path`` in order; a record that
    cannot be read or parsed raises a :class:`PetalError` naming it."""
    import tensorflow as tf

    n = 0
    try:
        for item in tfdata.untuned(dataset).as_numpy_iterator():
            yield item
            n += 1
    except tf.errors.DataLossError:
        raise PetalError(
            f"Corrupt input in {path}: record {n} (0-based) cannot be read (CRC failure or "
            f"short file). {_fix(records)}"
        ) from None
    except tf.errors.InvalidArgumentError as err:
        raise PetalError(
            f"Corrupt input in {path}: record {n} (0-based) does not parse as an image "
            f"example ({first_line(err)}). {_fix(records)}"
        ) from None


def _fix(records: str) -> str:
    return f"Run `petal inspect --verify {records}` to list every bad record, and convert again."


def _undecodable(record: str, reason: str, records: str, more: int = 0) -> str:
    """The message for image ``record`` ("SHARD: record I") that does not decode."""
    others = f" (and {more} more)" if more else ""
    return (
        f"Corrupt input: the image of {record}{others} cannot be decoded "
        f"({reason.rstrip('.')}). {_fix(records)}"
    )


class UndecodableImage(PetalError):
    """Image ``index`` of the decode ceiling's images does not decode: ``reason``."""

    def __init__(self, index: int, reason: str) -> None:
        super().__init__(f"image {index} of the decode ceiling does not decode: {reason}")
        self.index, self.reason = index, reason


def _decoder():
    """(name, decode function bytes -> HxWx3 uint8) of the fastest decoder available; a
    blob that does not decode raises ValueError or OSError."""
    try:
        import simplejpeg

        def decode(data):
            return simplejpeg.decode_jpeg(data, colorspace="RGB")

        return f"simplejpeg {simplejpeg.__version__} (libjpeg-turbo)", decode
    except ImportError:
        pass
    try:
        import io

        import numpy as np
        from PIL import Image

        def decode(data):
            with Image.open(io.BytesIO(data)) as im:
                return np.asarray(im.convert("RGB"))

        return "PIL", decode
    except ImportError:  # pragma: no cover - pillow is a dependency
        import tensorflow as tf

        def decode(data):
            try:
                return tf.io.decode_jpeg(data, channels=3).numpy()
            except tf.errors.InvalidArgumentError as err:
                raise ValueError(first_line(err)) from None

        return "tf.io.decode_jpeg", decode


def _decode_one(decode, blobs: list[bytes], i: int) -> None:
    """``decode(blobs[i])``; a blob that does not decode raises :class:`UndecodableImage`."""
    try:
        decode(blobs[i])
    except (ValueError, OSError) as err:
        raise UndecodableImage(i, f"{type(err).__name__}: {err}") from None


_BLOBS: list[bytes] = []


def _ceiling_process(index: int, workers: int, seconds: float, start, results) -> None:
    """One decoding process: decode its share of ``_BLOBS`` (inherited) for ``seconds``.

    Puts ``("done", count, wall, cpu)`` on ``results``, or ``("undecodable", image, reason)``
    or ``("failed", reason)``: the parent waits for one message per process, so a failure
    is reported, never left for the parent to time out on.
    """
    import signal

    # The parent stops the others after one failed; not through a handler it installed.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    # Ctrl-C reaches the whole process group: the parent stops the processes itself (a
    # KeyboardInterrupt here printed a traceback). Forked with it blocked, so one sent
    # before this line is dropped, not raised.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    try:
        _, decode = _decoder()
        blobs = _BLOBS
        start.wait()
        cpu, t0 = time.process_time(), time.perf_counter()
        count, i = 0, index
        while True:
            _decode_one(decode, blobs, i % len(blobs))
            count += 1
            i += workers
            if count % 16 == 0 and time.perf_counter() - t0 >= seconds:
                break
        results.put(("done", count, time.perf_counter() - t0, time.process_time() - cpu))
    except UndecodableImage as err:
        results.put(("undecodable", err.index, err.reason))
    except Exception as err:  # noqa: BLE001 - anything else is reported to the parent too
        results.put(("failed", f"{type(err).__name__}: {err}"))


def decode_ceiling(blobs: list[bytes], *, seconds: float, workers: int | None = None):
    """(images/s, CPU ms per image, decoder, how): ``blobs`` decoded over and over on all cores.

    One process per core (no interpreter lock in the way), each decoding its share in a
    tight loop; where processes cannot be forked, threads (simplejpeg releases the GIL).

    Raises:
        UndecodableImage: a blob the decoder rejects (its index in ``blobs``), at once.
        PetalError: a decoding process that failed otherwise or died.
    """
    import multiprocessing as mp
    import signal

    name, decode = _decoder()
    workers = workers or usable_cpus()
    for i in range(min(20, len(blobs))):  # warm-up
        _decode_one(decode, blobs, i)
    global _BLOBS
    if "fork" in mp.get_all_start_methods():
        ctx = mp.get_context("fork")
        _BLOBS = blobs
        start, results = ctx.Event(), ctx.Queue()
        procs = [
            ctx.Process(
                target=_ceiling_process, args=(i, workers, seconds, start, results), daemon=True
            )
            for i in range(workers)
        ]
        stats = []
        try:
            blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
            try:
                for p in procs:
                    p.start()
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
            start.set()
            stats = _ceiling_reports(procs, results, deadline=time.monotonic() + seconds + 60)
        finally:
            for p in procs:
                if len(stats) < len(procs) and p.is_alive():  # the others, after one failed
                    p.terminate()
                p.join(timeout=10)
            _BLOBS = []
        rate = sum(count / wall for count, wall, _ in stats)
        cpu_ms = sum(cpu for *_, cpu in stats) / sum(count for count, *_ in stats) * 1e3
        return rate, cpu_ms, name, f"{workers} processes"
    return (*_ceiling_threads(blobs, decode, seconds, workers), name, f"{workers} threads")


def _ceiling_reports(procs, results, *, deadline: float) -> list[tuple[float, float, float]]:
    """``(count, wall, cpu)`` of each decoding process; the first failure raises."""
    import queue

    stats = []
    while len(stats) < len(procs):
        try:
            kind, *report = results.get(timeout=0.2)
        except queue.Empty:
            # A process killed outright (out of memory, a signal) reports nothing.
            if dead := [p.exitcode for p in procs if p.exitcode not in (None, 0)]:
                raise PetalError(
                    f"A decode-ceiling process died (exit code {dead[0]}); run with fewer "
                    "cases (--cases) or on a less loaded machine."
                ) from None
            if time.monotonic() > deadline:
                raise PetalError(
                    "The decode-ceiling processes did not report in time; rerun without "
                    "case ceiling (--cases) if this repeats."
                ) from None
            continue
        if kind == "undecodable":
            raise UndecodableImage(*report)
        if kind == "failed":
            raise PetalError(f"A decode-ceiling process failed: {report[0]}")
        stats.append(tuple(report))
    return stats


def _ceiling_threads(blobs, decode, seconds, threads):
    stop = threading.Event()
    counts = [0] * threads

    def worker(index):
        i = index
        while not stop.is_set():
            _decode_one(decode, blobs, i % len(blobs))
            counts[index] += 1
            i += threads

    with ThreadPoolExecutor(threads) as pool:
        cpu, start = time.process_time(), time.perf_counter()
        futures = [pool.submit(worker, i) for i in range(threads)]
        try:
            time.sleep(seconds)
        finally:
            stop.set()  # Ctrl-C in the sleep too: the pool waits for its threads to end
        for f in futures:
            f.result()  # raises a worker's UndecodableImage
        elapsed = time.perf_counter() - start
        cpu = time.process_time() - cpu
    total = sum(counts)
    return total / elapsed, cpu / max(total, 1) * 1e3


# --- raw records from JPEG records -----------------------------------------------------------


def make_raw_copy(records: str, folder: str, split: str = "train") -> str:
    """Write ``split`` of JPEG records (a records folder or codelab shards) again with raw
    pixels, as a records folder (for case ``raw``)."""
    import tensorflow as tf

    from petal.data import pipeline, schema
    from petal.data.reader import open_source

    src = open_source(records)
    if src.manifest is not None:
        manifest = json.loads(json.dumps(src.manifest))
    else:  # codelab shards: what a reader needs
        size = list(src.image_size) if src.image_size else None
        manifest = {"classes": list(src.classes), "image_size": size}
    os.makedirs(folder, exist_ok=True)
    shards = []
    for path, count in zip(src.files(split), src.counts(split), strict=True):
        name = os.path.basename(path)
        out = os.path.join(folder, name)
        with tf.io.TFRecordWriter(out) as writer:
            records = _records_of(path, tf.data.TFRecordDataset(path), src.path)
            for i, record in enumerate(records):
                example = tf.train.Example.FromString(record)
                feature = example.features.feature
                image = feature[schema.IMAGE].bytes_list
                try:
                    pixels = tf.io.decode_jpeg(
                        image.value[0], channels=3, dct_method=pipeline.DCT_METHOD
                    ).numpy()
                except tf.errors.InvalidArgumentError as err:
                    reason = tf_message(err).splitlines()[0]
                    message = _undecodable(f"{path}: record {i}", reason, src.path)
                    raise PetalError(message) from None
                image.value[0] = pixels.tobytes()
                # Raw pixels need their shape; shards written with only image and class
                # (Kaggle's flowers) do not record it.
                feature[schema.SIZE].int64_list.value[:] = pixels.shape[:2]
                writer.write(example.SerializeToString())
        shards.append({"file": name, "count": count, "bytes": os.path.getsize(out)})
    manifest["format"] = schema.FORMAT_RAW
    manifest["splits"] = {
        split: {"count": sum(s["count"] for s in shards), "shards": shards},
        **{s: {"count": 0, "shards": []} for s in schema.SPLITS if s != split},
    }
    with open(os.path.join(folder, schema.MANIFEST_NAME), "w") as f:
        json.dump(manifest, f, indent=1)
    return folder


# --- the benchmark ---------------------------------------------------------------------------


def _describe(source) -> str:
    size = "x".join(map(str, source.image_size)) if source.image_size else "varying sizes"
    origin = (source.manifest or {}).get("source") or "?"
    return f"{source.count('all')} images at {size} from {origin}"


def _bytes_per_record(source) -> float | None:
    """The shards' bytes per record of the records ``source`` (opened), as its manifest
    lists them (None when it does not give every shard's)."""
    splits = (source.manifest or {}).get("splits") or {}
    shards = [shard for info in splits.values() for shard in info.get("shards", [])]
    sizes = [shard.get("bytes") for shard in shards]
    if not sizes or not all(isinstance(n, int) for n in sizes):
        return None
    return sum(sizes) / max(1, sum(shard["count"] for shard in shards))


def _opened(option: str, path: str):
    """``open_source(path)``, its error prefixed with the option that named the path."""
    from petal.data.reader import open_source

    try:
        return open_source(path)
    except PetalError as err:
        raise PetalError(f"{option} {path}: {err}") from None


def _image_size(src, image_size) -> tuple[int, int]:
    """The size the pipeline cases read ``src``'s images at: the one the records hold, or
    ``image_size`` for records that record none (or hold mixed sizes)."""
    from petal.data.images import parse_image_size

    if image_size is not None:
        try:
            size = parse_image_size(image_size)
        except ValueError as err:
            raise PetalError(f"--image-size: {err}") from None
        if src.image_size is not None and size != tuple(src.image_size):
            raise PetalError(
                f"--image-size {size[0]}x{size[1]}: {src.path} holds "
                f"{src.image_size[0]}x{src.image_size[1]} images; leave the option out "
                "(it is for records that do not record their size)."
            )
        return size
    if src.image_size is None:
        raise PetalError(
            f"bench input needs the records' image size; {src.path} does not record one "
            "(codelab shards with only image and class) or holds mixed sizes: pass "
            "--image-size N or HxW."
        )
    return tuple(src.image_size)


def _record_name(src, index: int, split: str = "train") -> str:
    """``"SHARD: record I"`` of record ``index`` counted across ``split``'s shards."""
    for path, count in zip(src.files(split), src.counts(split), strict=True):
        if index < count:
            return f"{path}: record {index}"
        index -= count
    return f"record {index} past the end of {src.path}"


def _input_failure(path: str, records: str, folder: str | None) -> PetalError | None:
    """What made a case reading ``path`` (RECORDS, the raw records or ``--folder``) fail,
    as a one-line error naming the file and the fix; None when its input is sound."""
    import tensorflow as tf

    from petal.data import pipeline
    from petal.data.reader import open_source

    if folder is not None and str(path) == str(folder):
        return _folder_failure(folder)
    src = open_source(path)
    said = "file name" if src.manifest is None else "manifest"
    for shard, count in zip(src.files("train"), src.counts("train"), strict=True):
        # The first record that cannot be read raises; then a shard of sound records that
        # are fewer or more than it should hold (cut at a record's end, renamed, empty):
        # the pipeline's count check failed as a TensorFlow assertion with train's advice.
        records = _records_of(shard, tf.data.TFRecordDataset(shard), str(path))
        if (held := sum(1 for _ in records)) != count:
            return PetalError(
                f"Corrupt input in {shard}: it holds {held} records, not the {count} its "
                f"{said} says (a short or renamed shard). {_fix(str(path))}"
            )
    bad = pipeline.undecodable_records(src, "train")
    if not bad:
        return None
    if pipeline.lacks_feature(bad[0][1]):  # no image to blame: a record written without it
        more = f" (and {len(bad) - 1} more bad record(s))" if len(bad) > 1 else ""
        return PetalError(f"{bad[0][0]}: {bad[0][1]}{more}. {_fix(str(path))}")
    return PetalError(_undecodable(bad[0][0], bad[0][1], str(path), more=len(bad) - 1))


def _folder_failure(folder: str) -> PetalError | None:
    """The images of ``--folder`` that the pipeline's decoder rejects, as a one-line error
    naming the first and the fix; None when every one decodes."""
    from petal.data import pipeline

    bad = pipeline.undecodable_files(folder, "train")
    if not bad:
        return None
    return PetalError(
        f"{len(bad)} image(s) in --folder {folder} cannot be decoded, e.g. "
        f"{bad[0][0]}: {bad[0][1]}; pass a folder without them (petal convert skips "
        "them and lists them in its manifest)."
    )


def _check_folder(folder: str, opened, src, progress) -> None:
    """``--folder`` must be an image folder of RECORDS' classes (else the per-file case
    measures other images); another place than the one RECORDS were converted from is
    named in a warning (a folder moved since is the same photos)."""
    origin = (src.manifest or {}).get("source")
    came_from = f" ({origin})" if origin else ""
    if opened.kind != "folder":
        raise PetalError(
            f"--folder {folder} is not a folder of images; pass the image folder "
            f"RECORDS came from{came_from} (class sub-folders of photos)."
        )
    if missing := [c for c in src.classes if c not in opened.classes]:
        raise PetalError(
            f"--folder {folder} has no class {', '.join(missing)} of RECORDS' classes "
            f"({', '.join(opened.classes)} against {', '.join(src.classes)}): pass the image "
            f"folder RECORDS came from{came_from}."
        )
    if origin and not folders.same_place(folder, origin):
        progress(
            f"warning: --folder {folder} is not {origin}, the folder RECORDS were converted "
            "from: the per-file case reads its photos, which may be others."
        )


def _refuse_short(what: str, per_epoch: int, batch_size: int) -> None:
    """Refuse a source (RECORDS, ``--folder``) with fewer training images than a batch, before
    any case is timed (the folder's stopped the run after the ceiling was measured)."""
    if per_epoch < batch_size:
        raise PetalError(
            f"{what} has {per_epoch} training images, fewer than one batch of {batch_size}: "
            f"pass --batch-size N (at most {per_epoch}). Received: batch_size={batch_size}"
        )


def check_settings(
    *, batch_size: int, seconds: float, repeats: int = 1, cases=None
) -> tuple[str, ...] | None:
    """Raise on a setting :func:`run` cannot measure with, in one line naming it (and its
    option); for every caller, before anything slow (the CLI and the benchmark script call
    it before converting or measuring).

    Returns:
        ``cases`` as a tuple of known case names (a string is the ``--cases`` spelling,
        comma-separated); None (all cases) for None.
    """
    if not (isinstance(batch_size, numbers.Integral) and batch_size > 0):
        raise PetalError(
            f"batch_size (--batch-size) must be a positive int. Received: batch_size={batch_size}"
        )
    # NaN fails every comparison: it would never end a timed loop.
    if not (isinstance(seconds, numbers.Real) and 0 < seconds < math.inf):
        raise PetalError(
            f"seconds (--seconds) must be positive and finite. Received: seconds={seconds}"
        )
    if not (isinstance(repeats, numbers.Integral) and repeats >= 1):
        raise PetalError(f"repeats (--repeat) must be >= 1. Received: repeats={repeats}")
    if cases is None:
        return None
    given = cases
    if isinstance(cases, str):
        cases = [c.strip() for c in cases.split(",") if c.strip()]
    cases = tuple(cases)
    if not cases:
        raise PetalError(
            f"cases (--cases) needs one or more of {', '.join(CASES)} (None runs all). "
            f"Received: cases={given!r}"
        )
    unknown = sorted(set(cases) - set(CASES), key=str)
    if unknown:
        raise PetalError(
            f"Unknown bench case(s) {', '.join(map(str, unknown))}; known: {', '.join(CASES)}."
        )
    return tuple(dict.fromkeys(cases))


def run(
    records: str,
    *,
    folder: str | None = None,
    raw_records: str | None = None,
    batch_size: int = 64,
    seconds: float = 6.0,
    augment: str = "codelab",
    repeats: int = 1,
    remote_latency_ms: float | None = None,
    cases: tuple[str, ...] | None = None,
    image_size=None,
    progress=print,
) -> BenchResult:
    """Measure every input path; see the module docstring.

    Args:
        records: a JPEG records folder (``petal convert`` output).
        folder: the image folder it was converted from, for the per-file case.
        raw_records: the same images as raw records; default: written to a temporary
            folder from ``records`` (train split) and removed afterwards.
        batch_size: batch size of every pipeline.
        seconds: timed seconds per case and round (after warm-up).
        augment: the augmentation of the "+aug" cases.
        repeats: rounds over all cases (``remote`` included, its rounds after all the
            others'). Each case reports its median; each ratio, and each case's
            ``x_ceiling``, is the median of the ratios within a round (cases of one round ran under the same machine load, which matters on a
            shared machine).
        remote_latency_ms: also measure reads through a loopback object server with this
            latency per request.
        cases: only these case names (``ceiling``, ``folder``, ``jpeg``, ``jpeg-uint8``,
            ``jpeg-sj``, ``raw``, ``cached``, ``remote``), or them comma-separated in a
            string; default (None) all that apply. ``jpeg`` is
            the default pipeline (float32 batches); ``jpeg-uint8`` the same records as uint8
            batches (normalised on the accelerator; no float pass on the host);
            ``jpeg-sj`` decodes with simplejpeg (``decoder="simplejpeg"``) instead of
            ``tf.io.decode_jpeg``.
        image_size: the size of the records' images (an int or ``(height, width)``), for
            records that do not record one (codelab shards with only image and class);
            records of mixed sizes are resized to it, as training does.
        progress: called with one line per finished case.
    """
    import tensorflow as tf

    from petal.data import augment as augment_lib
    from petal.data import pipeline, schema
    from petal.data.reader import open_source

    cases = check_settings(batch_size=batch_size, seconds=seconds, repeats=repeats, cases=cases)
    src = open_source(records)
    if src.remote:
        raise PetalError(
            f"bench input measures records on a local disk or gs://; {records} is read over "
            "http: pass a local copy (--remote-latency-ms MS measures http reads on a loopback "
            "store)."
        )
    if src.kind == "folder":
        raise PetalError(
            f"{records} is a folder of images; bench input measures records: convert it first "
            f"(`petal convert {records} RECORDS`), then pass RECORDS and --folder {records}."
        )
    if src.format != schema.FORMAT_JPEG:
        raise PetalError(
            f"bench input needs JPEG records (petal convert's default); {records} holds "
            f"{src.format} records: pass them as --raw-records and the JPEG records as RECORDS."
        )
    size = _image_size(src, image_size)
    wanted = set(cases or CASES)
    # Everything a case needs is checked here, not minutes later when the case comes up.
    if cases and "folder" in wanted and not folder:
        raise PetalError("Case 'folder' needs --folder SRC, the image folder RECORDS came from.")
    if cases and "remote" in wanted and remote_latency_ms is None:
        raise PetalError("Case 'remote' needs --remote-latency-ms MS (latency per request).")
    if remote_latency_ms is not None and "remote" in wanted and not (
        0 <= remote_latency_ms < math.inf
    ):
        raise PetalError(
            f"--remote-latency-ms must be >= 0 (and finite). Received: "
            f"remote_latency_ms={remote_latency_ms}"
        )
    uses_folder = "folder" in wanted or "remote" in wanted
    for option, value, used in (
        ("--folder", folder, uses_folder),
        ("--raw-records", raw_records, "raw" in wanted),
        ("--remote-latency-ms", remote_latency_ms, "remote" in wanted),
    ):
        if value is not None and not used:
            progress(f"warning: {option} is not used by the cases chosen ({', '.join(cases)}).")
    per_epoch = src.count("train")
    _refuse_short(str(records), per_epoch, batch_size)  # before anything is read or timed
    folder_src = None
    if folder and uses_folder:
        folder_src = _opened("--folder", folder)
        _check_folder(folder, folder_src, src, progress)
        _refuse_short(f"--folder {folder}", folder_src.count("train"), batch_size)
        for note in folder_src.notes:  # files the folder cases do not read, said once
            progress(f"warning: {note}")
        # Now, not when its case comes up: the remote per-file pipeline, last of all, met
        # a bad file as a bare ValueError naming none.
        progress(f"checking that the images of --folder {folder} decode ...")
        if failure := _folder_failure(folder):
            raise failure
    if raw_records is not None and "raw" in wanted:
        raw = _opened("--raw-records", raw_records)
        if raw.format != schema.FORMAT_RAW:
            raise PetalError(
                f"--raw-records {raw_records} holds {raw.format} records, not raw ones; write "
                f"them with `petal convert SRC DIR --format raw` or leave the option out."
            )
        # The comparison holds for the same images at the same size only.
        origins = [(s.manifest or {}).get("source") for s in (raw, src)]
        same_origin = None in origins or folders.same_place(*origins)
        if (raw.image_size, raw.count("all")) != (src.image_size, src.count("all")) or not (
            same_origin
        ):
            raise PetalError(
                f"--raw-records {raw_records} are not RECORDS' images as raw pixels "
                f"({_describe(raw)} against {_describe(src)}); convert RECORDS' source "
                "with --format raw at the same --image-size, or leave the option out."
            )
    # An unknown name fails before the first case. 'none' ran the "+aug" cases as their
    # twins, and the summary called the noise between them augmentation's cost.
    if augment_lib.build(augment) is None and wanted - {"ceiling", "remote"}:
        raise PetalError(
            f"--augment {augment} leaves nothing to measure in the '+aug' cases, which would "
            "run the same pipelines again: name the augmentation to measure (the default is "
            f"codelab). Received: augment={augment!r}"
        )
    # Up to 4,000 images read for the ceiling alone.
    blobs = jpeg_bytes(src) if "ceiling" in wanted else []
    result = BenchResult(
        records=str(records),
        batch_size=batch_size,
        seconds=seconds,
        cpus=usable_cpus(),
        decoder="",
    )

    def pipeline_case(source, aug, cache="off", warmup=10, **options):
        def measure():
            ds = pipeline.train_dataset(
                source,
                batch_size=batch_size,
                image_size=size,
                augment=aug,
                cache=cache,
                seed=None,
                **options,
            )
            return time_dataset(ds, batch_size=batch_size, seconds=seconds, warmup_batches=warmup)

        return measure

    def ceiling_case():
        try:
            rate, cpu_ms, name, how = decode_ceiling(blobs, seconds=seconds)
        except UndecodableImage as err:
            record = _record_name(src, err.index)
            raise PetalError(_undecodable(record, err.reason, src.path)) from None
        result.decoder = f"{name}, {how}"
        return rate, rate / batch_size, cpu_ms

    tmp = None
    try:
        if "raw" in wanted and raw_records is None:
            tmp = tempfile.mkdtemp(prefix="petal-bench-raw-")
            progress("writing raw-pixel records for case 'raw' ...")
            raw_records = make_raw_copy(str(records), tmp)
        shard_bytes = {"jpeg": _bytes_per_record(src)}
        if raw_records is not None and "raw" in wanted:  # (--raw-records unused otherwise)
            shard_bytes["raw"] = _bytes_per_record(_opened("--raw-records", raw_records))
        result.record_bytes = {k: n for k, n in shard_bytes.items() if n is not None}
        # (name, measure, path, augment, note)
        plan = []
        if "ceiling" in wanted:
            plan.append(("ceiling", ceiling_case, "decode only", "-", "JPEG decode, all cores"))
        for aug in (None, augment):
            sfx, aug_name = ("+aug", aug) if aug else ("", "none")
            if "folder" in wanted and folder:
                plan.append(
                    (
                        f"folder{sfx}",
                        pipeline_case(folder_src, aug),
                        folder,
                        aug_name,
                        "read, decode and resize every file",
                    )
                )
            if "jpeg" in wanted:
                plan.append(
                    (f"jpeg{sfx}", pipeline_case(src, aug), src.path, aug_name, "TFRecord JPEG")
                )
            if "jpeg-uint8" in wanted:
                plan.append(
                    (
                        f"jpeg-uint8{sfx}",
                        pipeline_case(src, aug, dtype="uint8", normalization="raw"),
                        src.path,
                        aug_name,
                        "TFRecord JPEG, uint8 batches",
                    )
                )
            if "jpeg-sj" in wanted:
                plan.append(
                    (
                        f"jpeg-sj{sfx}",
                        pipeline_case(src, aug, decoder="simplejpeg"),
                        src.path,
                        aug_name,
                        "TFRecord JPEG, simplejpeg decoder",
                    )
                )
            if "raw" in wanted:
                plan.append(
                    (
                        f"raw{sfx}",
                        pipeline_case(raw_records, aug),
                        raw_records,
                        aug_name,
                        "TFRecord raw pixels",
                    )
                )
            if "cached" in wanted:
                # Warm-up covers a full epoch: timing starts once the cache is complete.
                plan.append(
                    (
                        f"cached{sfx}",
                        pipeline_case(src, aug, cache="ram", warmup=per_epoch // batch_size + 5),
                        src.path,
                        aug_name,
                        "decoded uint8 images in RAM",
                    )
                )
        runs: dict[str, list[tuple[float, float, float]]] = {name: [] for name, *_ in plan}
        remote_runs: list[dict] = []
        for round_index in range(repeats):
            step = f"[{round_index + 1}/{repeats}]"
            for name, measure, path, *_ in plan:
                try:
                    ips, bps, cpu_ms = measure()
                except tf.errors.OpError as err:
                    raise _input_failure(path, records, folder) or err from None
                runs[name].append((ips, bps, cpu_ms))
                progress(
                    f"{step} {name}: {ips:,.0f} images/s, "
                    f"{bps:,.1f} batches/s, {cpu_ms:.3f} CPU ms/image"
                )
        # The remote rounds come after every local one, so nothing they leave in the process
        # weighs on the local cases: TensorFlow's from_generator patch made the rounds after
        # a remote one ~3x slower (cached 14,557 -> 3,691 images/s, session 23) until
        # remote.restore_malloc_thresholds. The remote ratio is within its own round, so
        # --repeat still gives it a median.
        if "remote" in wanted and remote_latency_ms is not None:
            for round_index in range(repeats):
                step = f"[{round_index + 1}/{repeats}]"
                try:
                    remote_runs.append(
                        remote_bench(
                            src,
                            folder,
                            latency_ms=remote_latency_ms,
                            batch_size=batch_size,
                            image_size=size,
                            seconds=seconds,
                            progress=lambda line, step=step: progress(f"{step} {line}"),
                        )
                    )
                except tf.errors.OpError as err:
                    # A corrupt shard, named by its loopback URL and train's advice, as the
                    # local cases name it.
                    raise _input_failure(src.path, records, None) or err from None
        for name, _, path, aug_name, note in plan:
            values = runs[name]
            result.cases.append(
                Case(
                    name,
                    str(path),
                    aug_name,
                    _median([v[0] for v in values]),
                    _median([v[1] for v in values]),
                    _median([v[2] for v in values]),
                    len(values),
                    seconds,
                    result.decoder if name == "ceiling" else note,
                    runs=[round(v[0], 1) for v in values],
                    x_ceiling=_within_rounds(runs, name, "ceiling"),
                )
            )
        result.ratios = _ratios(runs)
        if remote_runs:
            result.remote = _remote_medians(remote_runs)
            if result.remote.get("sharded_over_per_file"):
                result.ratios["remote sharded/per-file"] = result.remote["sharded_over_per_file"]
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)

    _summarise(result)
    return result


def _median(values):
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


CASES = ("ceiling", "folder", "jpeg", "jpeg-uint8", "jpeg-sj", "raw", "cached", "remote")

RATIOS = {
    "jpeg/ceiling": ("jpeg", "ceiling"),
    "jpeg+aug/ceiling": ("jpeg+aug", "ceiling"),
    "jpeg-uint8/ceiling": ("jpeg-uint8", "ceiling"),
    "jpeg-uint8+aug/ceiling": ("jpeg-uint8+aug", "ceiling"),
    "jpeg-sj/jpeg": ("jpeg-sj", "jpeg"),
    # The costs of augmentation and of the float conversion, within each round: the ratio
    # of two cases' medians over the ceiling mixes rounds (and turned a 19% gain into a cost).
    "jpeg+aug/jpeg": ("jpeg+aug", "jpeg"),
    "jpeg-uint8/jpeg": ("jpeg-uint8", "jpeg"),
    "cached/jpeg": ("cached", "jpeg"),
    "cached+aug/jpeg+aug": ("cached+aug", "jpeg+aug"),
    "raw/jpeg": ("raw", "jpeg"),
    "jpeg/folder": ("jpeg", "folder"),
}


def _ratios(runs: dict[str, list[tuple[float, float, float]]]) -> dict[str, float]:
    """Each ratio within each round, then the median over rounds.

    Also ``cpu: A/B``: B's CPU time per image over A's, i.e. the speed ratio the two would
    have on an otherwise idle machine if both kept every core busy.
    """
    out = {}
    for label, (a, b) in RATIOS.items():
        if (ratio := _within_rounds(runs, a, b)) is not None:
            out[label] = ratio
    for label, (a, b) in RATIOS.items():
        if runs.get(a) and runs.get(b):
            out[f"cpu: {label}"] = _median(
                [y[2] / x[2] for x, y in zip(runs[a], runs[b], strict=True) if x[2] > 0]
            )
    return out


def _within_rounds(runs: dict[str, list[tuple[float, float, float]]], a: str, b: str):
    """The median over rounds of case ``a``'s images/s over case ``b``'s in the same round
    (None when either did not run)."""
    if not (runs.get(a) and runs.get(b)):
        return None
    return _median([x[0] / y[0] for x, y in zip(runs[a], runs[b], strict=True)])


def remote_bench(
    src,
    folder,
    *,
    latency_ms: float,
    batch_size: int,
    seconds: float,
    image_size=None,
    progress=print,
) -> dict:
    """Reads/s per file and sharded through the loopback object server, plus full pipelines."""
    from petal.data import pipeline, remote
    from petal.data.reader import open_source

    mounts = {"records": src.path}
    if folder:
        mounts["images"] = folder
    out: dict = {"latency_ms": latency_ms, "parallel_requests": remote.PARALLEL_REQUESTS}
    with remote.ObjectServer(mounts, latency_ms=latency_ms) as server:
        rsrc = open_source(server.url("records"))
        # Reads only (no decoding), counted in batches so Python's per-element cost does
        # not cap the count.
        shards = remote.records_dataset(rsrc.files("train"), rsrc.counts("train"), repeat=True)
        start_requests = server.requests
        rate, _, secs = time_iterator(
            shards.batch(256), seconds=seconds, count=lambda b: int(b.shape[0])
        )
        out["sharded_reads_per_s"] = rate
        out["sharded_requests"] = server.requests - start_requests
        progress(
            f"remote sharded read: {rate:,.0f} records/s "
            f"({out['sharded_requests']} requests in {secs:.1f} s)"
        )
        if folder:
            fsrc = open_source(server.url("images"))
            reads = remote.files_dataset(
                fsrc.files("train"), fsrc.labels("train"), shuffle_seed=0, repeat=True
            )
            start_requests = server.requests
            rate_file, _, secs = time_iterator(
                reads.batch(16), seconds=seconds, count=lambda b: int(b[0].shape[0])
            )
            out["per_file_reads_per_s"] = rate_file
            out["per_file_requests"] = server.requests - start_requests
            out["sharded_over_per_file"] = ratio = rate / rate_file if rate_file else None
            compared = f"; sharded is {_faster(ratio, 'per-file')}" if ratio else ""
            progress(
                f"remote per-file read: {rate_file:,.0f} images/s "
                f"({out['per_file_requests']} requests in {secs:.1f} s){compared}"
            )
        # The full training pipelines over the store (decoding included).
        size = image_size or rsrc.image_size
        ds = pipeline.train_dataset(
            rsrc, batch_size=batch_size, image_size=size, augment=None, cache="off"
        )
        ips = time_dataset(ds, batch_size=batch_size, seconds=seconds, warmup_batches=3)[0]
        out["sharded_pipeline_images_per_s"] = ips
        progress(f"remote sharded pipeline: {ips:,.0f} images/s")
        if folder:
            ds = pipeline.train_dataset(
                fsrc, batch_size=batch_size, image_size=size, augment=None, cache="off"
            )
            ips = time_dataset(
                ds, batch_size=batch_size, seconds=seconds, warmup_batches=1, min_batches=2
            )[0]
            out["per_file_pipeline_images_per_s"] = ips
            progress(f"remote per-file pipeline: {ips:,.0f} images/s")
    return out


def _remote_medians(rounds: list[dict]) -> dict:
    """One :func:`remote_bench` result from those of several rounds: each measurement's
    median, ``sharded_over_per_file`` the median of the within-round ratios (as every
    ratio); ``rounds`` counts them and ``runs`` keeps each round's measurements."""
    fixed = ("latency_ms", "parallel_requests")
    out: dict = dict(rounds[0])
    for key in out:
        values = [r[key] for r in rounds if r.get(key) is not None]
        if key not in fixed and values:
            out[key] = _median(values)
    out["rounds"] = len(rounds)
    out["runs"] = [{k: v for k, v in r.items() if k not in fixed} for r in rounds]
    return out


TARGETS = {
    "jpeg/ceiling": 0.85,
    "jpeg+aug/ceiling": 0.7,
    "jpeg-uint8/ceiling": 0.85,
    "jpeg-uint8+aug/ceiling": 0.7,
    "cached/jpeg": 3.0,
    "remote sharded/per-file": 50.0,
}


# The remote target compares per-file and sharded reads at this latency per request.
TARGET_LATENCY_MS = 20.0

# A difference in throughput smaller than this is within a run's noise.
NOISE = 0.05


def _faster(ratio: float, than: str) -> str:
    """``"N.Nx faster than THAN"`` for something that ran at ``ratio`` times ``than``'s
    speed; below 1 the inverse, slower (0.63 is "1.6x slower", not "0.6x faster" nor,
    rounded, "1x faster"); within noise, "about as fast as THAN"."""
    if abs(ratio - 1) < NOISE:
        return f"about as fast as {than}"
    if ratio > 1:
        return f"{ratio:,.1f}x faster than {than}"
    return f"{1 / ratio:,.1f}x slower than {than}"


def _cost(cost: float, of: str, without: str) -> str:
    """"costs ..." for a stage that loses ``cost`` (a fraction) of ``of``; a difference
    within noise says so, and so does a speed-up (``without`` the stage ran slower)."""
    if abs(cost) < NOISE:
        return f"costs {max(cost, 0):.0%} of {of} (within noise)."
    if cost < 0:
        # The stage's pipeline ran 1 / (1 - cost) times as fast as the one without it.
        slower = 1 - 1 / (1 - cost)
        return f"costs none measured: {without} ran {slower:.0%} slower in this run."
    return f"costs {cost:.0%} of {of}."


def _summarise(result: BenchResult) -> None:
    """Which stage is the bottleneck, in words, from the within-round ratios."""
    r, f = result.ratios, result.findings
    ceiling = result.case("ceiling")
    wall, cpu = r.get("jpeg/ceiling"), r.get("cpu: jpeg/ceiling")
    if wall is not None:
        basis = wall if cpu is None else min(wall, cpu)
        if basis >= 0.85:
            f.append(
                f"JPEG decoding is the bottleneck: the TFRecord JPEG pipeline runs at "
                f"{wall:.2f}x the decode ceiling ({ceiling.images_per_s:,.0f} images/s on "
                f"{result.cpus} cores); only more cores, raw records or the cache go faster."
            )
        else:
            # The ceiling's CPU time per image over the pipeline's: the share of the
            # pipeline's CPU time that decoding at the ceiling's cost accounts for.
            share = min(wall if cpu is None else cpu, 1.0)
            part = "nearly all" if share >= 0.85 else "most" if share >= 0.5 else "less than half"
            by_cpu = "" if cpu is None else f" (by CPU time per image: {cpu:.2f}x)"
            f.append(
                f"The TFRecord JPEG pipeline runs at {wall:.2f}x the decode ceiling{by_cpu}: "
                f"decoding at the ceiling's cost is about {share:.0%} of its CPU time per "
                f"image ({part}); the rest is tf.data's reading, parsing, batching, the float "
                "conversion and its own decoding overhead."
            )
        if cpu is not None and (wall > 1.0 or abs(wall - cpu) > 0.25 * cpu):
            f.append(
                "The machine was busy: wall-clock ratios and CPU-time ratios disagree "
                "(a many-threaded pipeline takes a larger share of contended cores than "
                "one decoding process per core). On an idle machine expect about the "
                "CPU-time ratio."
            )
    if "jpeg+aug/jpeg" in r:
        aug = result.case("jpeg+aug").augment
        cost = 1 - r["jpeg+aug/jpeg"]
        f.append(
            f"Augmentation ({aug}) "
            + _cost(cost, "the JPEG pipeline's throughput", "the pipeline without it")
        )
    if "jpeg-sj/jpeg" in r:
        f.append(
            f"Decoding with simplejpeg (one call per batch) is {r['jpeg-sj/jpeg']:.2f}x "
            "tf.io.decode_jpeg (one op per image) in the same pipeline, same pixels."
        )
    if "jpeg-uint8/ceiling" in r and "jpeg-uint8/jpeg" in r:
        cost = 1 - 1 / r["jpeg-uint8/jpeg"]
        f.append(
            f"uint8 batches (normalised on the accelerator) run at "
            f"{r['jpeg-uint8/ceiling']:.2f}x the ceiling: the host's float conversion "
            # The pipeline without the stage is the uint8 one: its throughput is the base
            # (926 float32 against 1341 uint8 images/s is 31% of 1341, not of 926).
            + _cost(cost, "the uint8 pipeline's throughput", "uint8 batches")
        )
    if "cached/jpeg" in r:
        f.append(
            f"Caching decoded images is {r['cached/jpeg']:.1f}x the uncached JPEG "
            "pipeline: after the first epoch nothing is decoded."
        )
    if "raw/jpeg" in r:
        sizes = result.record_bytes
        more = (
            f"{sizes['raw'] / sizes['jpeg']:.1f}x the bytes to read"
            if sizes.get("jpeg") and sizes.get("raw")
            else "more bytes to read"
        )
        f.append(
            f"Raw-pixel records are {r['raw/jpeg']:.1f}x the JPEG records (no decoding, "
            f"but {more})."
        )
    if "jpeg/folder" in r:
        f.append(
            "Per-file reading (read, decode and resize every source file) is "
            f"{_faster(1 / r['jpeg/folder'], 'the TFRecord JPEG pipeline')}."
        )
    if result.remote.get("sharded_over_per_file"):
        rem = result.remote
        f.append(
            f"With {rem['latency_ms']:g} ms per request, sharded records read "
            f"{_faster(rem['sharded_over_per_file'], 'per-file requests')} "
            f"({rem['sharded_reads_per_s']:,.0f} vs {rem['per_file_reads_per_s']:,.0f} "
            f"reads/s, {rem['parallel_requests']} requests in flight for both)."
        )
    for label, target in TARGETS.items():
        if label in r:
            line = f"target {label} >= {target:g}: wall {r[label]:.2f}"
            latency = result.remote.get("latency_ms")
            if label.startswith("remote") and latency != TARGET_LATENCY_MS:
                f.append(
                    f"{line} at {latency:g} ms per request (not judged: the target is "
                    f"defined at {TARGET_LATENCY_MS:g} ms)"
                )
                continue
            verdict = r[label] >= target
            if f"cpu: {label}" in r:
                line += f", CPU-time {r[f'cpu: {label}']:.2f}"
                verdict = verdict and r[f"cpu: {label}"] >= target
            f.append(f"{line} ({'meets' if verdict else 'MISSES'})")


# --- output ----------------------------------------------------------------------------------


def format_table(result: BenchResult) -> str:
    lines = [
        f"petal bench input: {result.records}  batch {result.batch_size}, "
        f"{result.seconds:g} s per case, {result.cpus} CPUs",
        f"{'case':<14}{'images/s':>12}{'batches/s':>12}{'x ceiling':>11}{'CPU ms/img':>12}  note",
    ]
    for c in result.cases:
        rel = "-" if c.x_ceiling is None else f"{c.x_ceiling:.2f}"
        lines.append(
            f"{c.name:<14}{c.images_per_s:>12,.0f}{c.batches_per_s:>12,.1f}{rel:>11}"
            f"{c.cpu_ms_per_image:>12.3f}  {c.note}"
        )
    if result.remote:
        rem = result.remote
        lines.append(
            f"remote ({rem['latency_ms']:g} ms/request, {rem['parallel_requests']} in flight, "
            f"median of {rem.get('rounds', 1)} round(s)):"
        )
        for key in (
            "per_file_reads_per_s",
            "sharded_reads_per_s",
            "per_file_pipeline_images_per_s",
            "sharded_pipeline_images_per_s",
        ):
            if key in rem:
                lines.append(f"  {key.replace('_', ' '):<34}{rem[key]:>12,.0f}")
    lines.append(
        "(images/s: median of rounds; x ceiling and ratios: median of within-round ratios, "
        "so with --repeat > 1 not images/s over the ceiling's; 'cpu:' ratios compare CPU "
        "time per image)"
    )
    if result.ratios:
        lines.append("ratios: " + ", ".join(f"{k} {v:.2f}" for k, v in result.ratios.items()))
    lines += [f"- {line}" for line in result.findings]
    return "\n".join(lines)


def write_json(result: BenchResult, path: str) -> None:
    """The result as JSON, through a temporary file: a full disk left an empty file."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    text = json.dumps(result.to_dict(), indent=2)
    save_atomically(Path(path), lambda tmp: Path(tmp).write_text(text))


def chart_scale(values) -> tuple[str, float]:
    """``(x scale, left edge)`` of the bar chart, so that bar lengths do not mislead.

    Values within a factor of 10 of each other: a linear axis from 0 (a bar twice as long is
    twice as fast). Wider ranges (per-file reads to cached batches) need a log axis; its bars
    then start at a power of ten at least a decade below the smallest value, not wherever
    matplotlib's autoscale puts the edge (which made a case at 0.54x of the ceiling look a
    tenth as long), nor at the decade holding the smallest (1,080 images/s drawn about an
    eighteenth as long as 3,871 from an edge at 1,000).
    """
    positive = [v for v in values if v > 0]
    if not positive or max(positive) <= 10 * min(positive):
        return "linear", 0.0
    return "log", 10.0 ** math.floor(math.log10(min(positive)) - 1)


def chart_bars(result: BenchResult) -> list[tuple[str, float]]:
    """The bar chart's ``(name, images/s)`` pairs: every case, then the remote store's two
    training pipelines (decoding included), which compare with the local cases. Its raw
    reads count records fetched without decoding, which drawn beside decoded cases made
    the remote store look faster than the local pipeline; they stand in only where no
    pipeline was measured, named as reads."""
    bars = [(c.name, c.images_per_s) for c in result.cases]
    remote = result.remote or {}
    for pipeline, reads, what in (
        ("per_file_pipeline_images_per_s", "per_file_reads_per_s", "per-file"),
        ("sharded_pipeline_images_per_s", "sharded_reads_per_s", "sharded"),
    ):
        if pipeline in remote:
            bars.append((f"remote {what} pipeline", remote[pipeline]))
        elif reads in remote:
            bars.append((f"remote {what} reads (no decoding)", remote[reads]))
    return bars


def write_png(result: BenchResult, path: str) -> str:
    """A horizontal bar chart of images/s per case, the decode ceiling marked.

    Returns the path written: ``.png`` is added to a name without an extension
    (:func:`petal.data.inspect.image_path`).
    """
    import matplotlib

    from petal.data.inspect import image_path

    path = image_path(path, "--png")

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bars = chart_bars(result)
    names, values = [n for n, _ in bars], [v for _, v in bars]
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(names) + 1.2))
    colors = [
        "#555555" if n == "ceiling" else "#4c72b0" if "aug" not in n else "#dd8452" for n in names
    ]
    ax.barh(names[::-1], values[::-1], color=colors[::-1])
    ceiling = result.case("ceiling")
    if ceiling:
        ax.axvline(ceiling.images_per_s, color="#555555", linestyle="--", linewidth=1)
    scale, left = chart_scale(values)
    if scale == "log":
        ax.set_xscale("log")
    # Room on the right for the largest bar's figure, which ran into the frame.
    top = max(values, default=1.0) or 1.0
    ax.set_xlim(left=left, right=top * (3.0 if scale == "log" else 1.15))
    ax.set_xlabel("images per second" + (" (log scale)" if scale == "log" else ""))
    ax.set_title(f"petal bench input: batch {result.batch_size}, {result.cpus} CPUs")
    for i, v in enumerate(values[::-1]):
        ax.text(v, i, f" {v:,.0f}", va="center", fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    try:  # through a temporary file, as write_json
        save_atomically(Path(path), lambda tmp: fig.savefig(tmp, dpi=120))
    finally:
        plt.close(fig)
    return path
