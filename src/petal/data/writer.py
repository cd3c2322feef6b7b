"""``petal convert``: an image folder -> sharded TFRecords plus ``manifest.json``.

The conversion reads the files twice:

1. *scan* (this process; threads for remote sources): the size of every file, and the
   hash of each whose size is shared (only those can be byte-identical), so the split keeps
   duplicates together. Unreadable files are skipped here.
2. *convert* (worker processes): decode, orient, resize, encode, serialise and frame each
   record (TFRecord length and CRC32C headers). Undecodable files, non-images and images
   over the pixel limit are skipped here. For a local output folder each worker writes a
   run of up to 32 consecutive records of a shard to a piece file of its own, and the main
   process appends the pieces to their shard in record order, hashing as it goes: it
   touches no record, so it no longer competes with the workers for the cores. The output
   does not depend on the number of workers.

Between the passes the files are split (seeded, stratified by class, disjoint by content),
shuffled with the seed and cut into shards. Files that pass 2 skips leave their class's
validation share short or long; where they do, the files are split again without them (the
others keep their seeded order) and every shard is written again. Shards are written under
temporary names and renamed once all are complete; the manifest is written last, so a folder
without ``manifest.json`` is never a finished conversion, and the next run removes what an
interrupted one left behind. A complete conversion being replaced (``overwrite``) is
removed only once the new shards are complete, so a run that fails keeps it (at the cost
of room for both on disk meanwhile). A conversion holds a local output folder
(``petal.running.RUNNING_FILE``) from before its scan to its manifest, so a second one into
it is refused, as is one into records a ``petal train`` reads; remote outputs are not held.

Workers import only PIL, NumPy and google-crc32c (``petal.data.images``) and serialise
the ``tf.train.Example`` themselves; TensorFlow is used in the main process for
``tf.io.gfile`` paths (remote outputs, whose records the main process writes itself with
``tf.io.TFRecordWriter``).
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import datetime
import functools
import hashlib
import json
import logging
import math
import multiprocessing
import os
import random
import re
import select
import signal
import struct
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from petal.data import folders, images, schema
from petal.data.folders import some_names
from petal.errors import (
    PetalError,
    cannot_write,
    dangling_link,
    is_int_at_least,
    need_bool,
    need_bool_or_none,
    need_folder,
    printable,
)
from petal.running import (
    READING_PREFIX,
    RUNNING_FILE,
    in_use_error,
    reading_elsewhere,
    running_elsewhere,
    signals_held,
)

log = logging.getLogger(__name__)

DEFAULT_SEED = 42
DEFAULT_VAL_FRACTION = 0.19
# Shards of 100-200 MB suit cloud storage: big enough to amortise the per-file latency,
# small enough to spread over many parallel readers. The count is ceil(bytes / 200 MB).
DEFAULT_SHARD_MB = 200.0
_MB = 1_000_000
# Bytes a record adds around its image (keys, label, file name, sizes); an estimate.
_RECORD_OVERHEAD = 256
# TFRecord framing: length (8), its CRC (4), data CRC (4).
_FRAME = 16
_ESTIMATE_SAMPLE = 16

_TEMP_PREFIX = schema.TEMP_PREFIX
_NOT_UTF8 = "file name is not valid UTF-8 (records store it as UTF-8 text); rename it"
_SHARD_RE = re.compile(r"^(train|validation)-\d{5}-of-\d{5}-\d+\.tfrec$")


@dataclass(frozen=True)
class _Options:
    """What the workers need to turn a file into record bytes (picklable)."""

    size: tuple[int, int] | None
    resize: str
    format: str
    quality: int | None
    max_pixels: int
    classes: tuple[str, ...] = ()


@dataclass(frozen=True)
class _Probed:
    file: folders.ImageFile
    content: str  # equal for byte-identical files, unique otherwise
    nbytes: int


@dataclass
class ConvertSummary:
    """What ``convert`` did; ``str()`` gives the closing one-line summary.

    Attributes:
        output: the records folder.
        classes: class names in index order.
        images_found: candidate files discovered (``written + skipped``).
        written: records written.
        skipped: files not written; each is listed with its reason in the manifest.
        counts: records per split.
        shards: shard files per split.
        bytes: total bytes of the shard files.
        seconds: wall time of the conversion, TensorFlow's start-up (once per process)
            left out, as in ``images_per_s``.
        manifest: the manifest as written.
        warnings: one line per thing the user should know about the source and the split:
            empty splits or classes, files not read (other types, files directly in the
            source, hidden entries, broken links), empty folders, duplicates across classes
            (``str()`` prints them).
    """

    output: str
    classes: list[str]
    images_found: int
    written: int
    skipped: int
    counts: dict[str, int]
    shards: dict[str, int]
    bytes: int
    seconds: float
    manifest: dict = field(repr=False, default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    @property
    def images_per_second(self) -> float:
        return self.written / self.seconds if self.seconds > 0 else 0.0

    def __str__(self) -> str:
        splits = ", ".join(
            f"{s} {self.counts.get(s, 0)} in {self.shards.get(s, 0)} shard"
            f"{'' if self.shards.get(s, 0) == 1 else 's'}"
            for s in schema.SPLITS
        )
        if copies := self.manifest.get("duplicates"):
            # Each written, on its original's side: counted as images in every count.
            splits += (f"; {copies} of them "
                       f"{'a byte-identical copy' if copies == 1 else 'byte-identical copies'} "
                       "of another")  # fmt: skip
        line = (
            f"written {self.written} ({splits}), skipped {self.skipped} of "
            f"{self.images_found} found, {self.images_per_second:.0f} images/s, "
            f"{self.bytes / _MB:.1f} MB in {self.seconds:.1f} s -> {self.output}"
        )
        return "\n".join([line, *(f"warning: {w}" for w in self.warnings)])

    def skipped_lines(self, limit: int = 10, manifest: str = "manifest.json") -> list[str]:
        """One line per skipped file, ``skipped FILE: reason``, the first ``limit`` of them,
        then where the rest are listed (``manifest``: the manifest's path as shown)."""
        lines = [
            f"skipped {printable(item['file'])}: {item['reason']}"
            for item in self.manifest.get("skipped", [])[:limit]
        ]
        if self.skipped > limit:
            lines.append(f"... {self.skipped - limit} more skipped: see {manifest}")
        return lines


# --- worker side: plain functions of a path (no TensorFlow) ----------------------------------


# Prefixes a reason that is not the file's fault: the object store failed (see
# folders.StoreError). The conversion stops on it instead of skipping the file.
_STORE_FAILURE = "store failure: "


def _read(path: str) -> bytes | str:
    """The file's bytes, or the reason it cannot be read."""
    try:
        return folders.read_bytes(path)
    except folders.StoreError as err:
        return f"{_STORE_FAILURE}{err}"
    except OSError as err:
        return _unreadable(path, err)


def _size(path: str) -> int | str:
    """Size in bytes of a readable file, or the reason it is skipped."""
    try:
        return folders.file_size(path)
    except folders.StoreError as err:
        return f"{_STORE_FAILURE}{err}"
    except OSError as err:
        return _unreadable(path, err)


def _unreadable(path: str, err: OSError) -> str:
    """Why a file cannot be read: a link to a missing target (an unmounted disk) says so, as
    the links that are no photos are listed (``broken_links``)."""
    if isinstance(err, FileNotFoundError) and (why := folders.missing_target_reason(path)):
        return f"unreadable: {why}"
    return f"unreadable: {err.strerror or err}"


def _check_store(reason: str, source: str, relpath: str) -> None:
    """Stops the conversion when a file's reason is the store's failure, not the file's."""
    if reason.startswith(_STORE_FAILURE):
        raise PetalError(
            f"Cannot reach {source} (reading {printable(relpath)}: "
            f"{reason[len(_STORE_FAILURE):]}); "
            "nothing was written: check the network and the credentials, then run again."
        )


def _hash(path: str) -> str:
    """sha256 hex of a file's bytes, or the reason it is skipped (prefixed with '!')."""
    data = _read(path)
    if isinstance(data, str):
        return "!" + data
    return hashlib.sha256(data).hexdigest()


def _convert(task: tuple[str, int, str], options: _Options) -> tuple[bytes, bytes] | str:
    """One serialised record for (path, label, relpath) and a digest of the image it
    stores, or the reason the file is skipped.

    The worker serialises the record too, so the main process only frames and writes it.
    The digest finds files of other bytes that store the same image (:func:`_identical`).
    """
    path, label, relpath = task
    data = _read(path)
    if isinstance(data, str):
        return data
    try:
        encoded = images.convert_image(
            data,
            size=options.size,
            mode=options.resize,
            format=options.format,
            quality=options.quality,
            max_pixels=options.max_pixels,
        )
    except images.PixelLimitError as err:
        return f"{err}: --max-pixels N accepts larger images"
    except images.ImageError as err:
        return str(err)
    digest = hashlib.blake2b(encoded.data, digest_size=16)
    digest.update(b"%dx%d" % (encoded.height, encoded.width))  # raw pixels of another shape
    return example_bytes(encoded, label, relpath, options.classes), digest.digest()


# A tf.train.Example, serialised by hand: workers stay free of TensorFlow, and the bytes are
# those of ``tf.train.Example.SerializeToString(deterministic=True)`` (map keys sorted),
# which a test checks. Everything but the image, sizes and file name is built once per class.


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # int64 two's complement, as protobuf encodes negatives
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _bytes_feature(values: Sequence[bytes]) -> bytes:
    # Feature.bytes_list (1) -> BytesList.value (1, repeated)
    return _field(1, b"".join(_field(1, v) for v in values))


def _float_feature(values: Sequence[float]) -> bytes:
    # Feature.float_list (2) -> FloatList.value (1, packed little-endian float32)
    return _field(2, _field(1, struct.pack(f"<{len(values)}f", *values)))


def _int64_feature(values: Sequence[int]) -> bytes:
    # Feature.int64_list (3) -> Int64List.value (1, packed varints)
    return _field(3, _field(1, b"".join(_varint(v) for v in values)))


def _entry(key: str, feature: bytes) -> bytes:
    """One entry of the Features map (field 1): key (1) and value (2)."""
    return _field(1, _field(1, key.encode("utf-8")) + _field(2, feature))


@functools.lru_cache(maxsize=4096)
def _class_entries(classes: tuple[str, ...], label: int) -> dict[str, bytes]:
    return {
        schema.CLASS: _entry(schema.CLASS, _int64_feature([label])),
        schema.LABEL: _entry(schema.LABEL, _bytes_feature([classes[label].encode("utf-8")])),
        schema.ONE_HOT: _entry(
            schema.ONE_HOT, _float_feature([float(i == label) for i in range(len(classes))])
        ),
    }


def example_bytes(
    encoded: images.Encoded, label: int, relpath: str, classes: Sequence[str]
) -> bytes:
    """The serialised ``tf.train.Example`` of one record (keys in ``petal.data.schema``)."""
    entries = dict(_class_entries(tuple(classes), label))
    entries[schema.SIZE] = _entry(schema.SIZE, _int64_feature([encoded.height, encoded.width]))
    entries[schema.FILENAME] = _entry(schema.FILENAME, _bytes_feature([relpath.encode("utf-8")]))
    entries[schema.ORIGINAL_SIZE] = _entry(
        schema.ORIGINAL_SIZE,
        _int64_feature([encoded.original_height, encoded.original_width]),
    )
    # The image is most of the record: write its headers around it so that its bytes are
    # copied once, by the final join.
    data = encoded.data
    bytes_list = b"\x0a" + _varint(len(data))  # BytesList.value (1)
    feature = b"\x0a" + _varint(len(bytes_list) + len(data))  # Feature.bytes_list (1)
    value = b"\x12" + _varint(len(feature) + len(bytes_list) + len(data))  # entry value (2)
    key = _field(1, schema.IMAGE.encode("utf-8"))  # entry key (1)
    value_size = len(key) + len(value) + len(feature) + len(bytes_list) + len(data)
    image_head = b"\x0a" + _varint(value_size) + key + value + feature + bytes_list
    parts = []
    for name in sorted([*entries, schema.IMAGE]):
        parts += [image_head, data] if name == schema.IMAGE else [entries[name]]
    size = sum(map(len, parts))
    # Example.features (1) -> Features.feature (map entries, sorted by key).
    return b"".join([b"\x0a", _varint(size), *parts])


def _masked_crc(data: bytes) -> bytes:
    """TFRecord's masked CRC32C of ``data``, little-endian (as TensorFlow's writer)."""
    crc = _crc32c(data)
    rotated = ((crc >> 15) | (crc << 17)) & 0xFFFFFFFF
    return ((rotated + 0xA282EAD8) & 0xFFFFFFFF).to_bytes(4, "little")


def frame_record(record: bytes) -> bytes:
    """One TFRecord: length, CRC of the length, data, CRC of the data.

    The same bytes ``tf.io.TFRecordWriter`` writes for ``record`` (a test checks).
    """
    length = len(record).to_bytes(8, "little")
    return b"".join((length, _masked_crc(length), record, _masked_crc(record)))


def _crc32c(data: bytes) -> int:
    import google_crc32c

    return google_crc32c.value(data)


def _write_piece(job: tuple[list[tuple[str, int, str]], str], options: _Options) -> list:
    """Converts a run of consecutive records and writes them, framed, to one piece file.

    Returns per task the digest of the image written (bytes) or the reason it was skipped
    (str). No file is left when every task is skipped.
    """
    tasks, path = job
    results, framed = [], []
    for task in tasks:
        result = _convert(task, options)
        if isinstance(result, str):
            results.append(result)
        else:
            results.append(result[1])
            framed.append(frame_record(result[0]))
    if framed:
        with open(path, "wb") as f:
            f.write(b"".join(framed))
    return results


def _worker_setup(converter: int) -> None:
    """Ends the worker with the converting process ``converter``, and makes glibc keep
    freed memory instead of returning each large block to the OS.

    A worker waits on a queue whose writing end it holds itself, and holds the forkserver's
    liveness pipe, so a conversion killed outright (SIGKILL) left its workers and the
    forkserver waiting for ever; a thread now ends the worker when ``converter`` exits.

    Every image allocates and frees arrays of hundreds of kB (decoded pixels, float
    intermediates); by default glibc serves those with mmap and unmaps them on free, so
    each image pays hundreds of page faults: about half the CPU time of a 224-px image.
    TensorFlow's import changes this in the main process; the workers never import it.
    """
    threading.Thread(target=_exit_with, args=(converter,), daemon=True).start()
    _keep_freed_memory()


def _keep_freed_memory() -> None:
    """Makes glibc's allocator keep freed blocks of up to 64 MB for reuse (see
    :func:`_worker_setup`); nothing where the C library is not glibc."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc
        return
    m_trim_threshold, m_mmap_threshold = -1, -3
    mallopt(m_mmap_threshold, 64 << 20)
    mallopt(m_trim_threshold, 256 << 20)


def _exit_with(pid: int) -> None:
    """Exits this process once process ``pid`` has ended (a pidfd where there is one)."""
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):  # not Linux 5.3+, or already gone
        fd = None
    if fd is not None:
        select.select([fd], [], [])
    else:
        while True:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            except PermissionError:
                pass
            time.sleep(1.0)
    os._exit(1)


def usable_cpus() -> int:
    """The CPUs this process may run on (``taskset``, a container's cpuset), not the
    machine's: convert's default workers, and the benchmarks' (under ``taskset -c 0`` the
    decode ceiling ran two decoding processes on one CPU and its table said 2 CPUs)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1


def _start_workers_server() -> None:
    """Starts the forkserver now (if used), so its imports overlap the caller's work.

    The server, and every worker it forks, starts with SIGINT blocked. Ctrl-C reaches the
    whole process group: it killed the server while it imported, and a worker while it
    wrote a result, leaving part of one in the result pipe, where the pool's manager
    thread then waited for the rest for ever (the conversion hung in its clean-up). The
    converting process stops the workers itself, as it does on SIGTERM.
    """
    if _context().get_start_method() == "forkserver":
        from multiprocessing import forkserver, resource_tracker

        # The tracker unblocks SIGINT once it has started: start it first.
        resource_tracker.ensure_running()
        # Only this thread's mask: a Ctrl-C meanwhile still reaches this process.
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            forkserver.ensure_running()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def _context():
    """The multiprocessing context for the workers.

    Never 'fork': the parent may hold TensorFlow's threads, which a fork copies in an
    undefined state. 'forkserver' starts one clean server process per parent process
    that has imported this module (PIL and NumPy, not TensorFlow) and forks every worker
    from it, so workers start in milliseconds, also on a second conversion; 'spawn'
    (a fresh interpreter per worker) where forkserver does not exist.
    """
    if "forkserver" in multiprocessing.get_all_start_methods():
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload([__name__])
        _short_socket_folder()
        return context
    return multiprocessing.get_context("spawn")


# The longest path of an AF_UNIX socket (sun_path: 108 bytes, its NUL included).
_SOCKET_PATH_MAX = 107


def _short_socket_folder() -> None:
    """Moves multiprocessing's temporary folder, where the forkserver's socket is made, under
    /tmp (or /var/tmp) when the one under TMPDIR makes the socket's path too long for
    AF_UNIX: convert failed with "AF_UNIX path too long" under a deep TMPDIR. Python 3.12
    does this itself."""
    import shutil
    import tempfile
    from multiprocessing import process, util

    config = process.current_process()._config
    folder = config.get("tempdir") or os.path.join(tempfile.gettempdir(), "pymp-xxxxxxxx")
    if len(os.fsencode(folder)) + len("/listener-xxxxxxxx") <= _SOCKET_PATH_MAX:
        return
    for place in ("/tmp", "/var/tmp"):
        if os.path.isdir(place) and os.access(place, os.W_OK | os.X_OK):
            short = tempfile.mkdtemp(prefix="pymp-", dir=place)
            util.Finalize(None, shutil.rmtree, args=(short, True), exitpriority=-100)
            config["tempdir"] = short
            return


@contextlib.contextmanager
def _caller_script_hidden() -> Iterator[None]:
    """Keeps multiprocessing from running the caller's script again in each new worker.

    A process started by 'forkserver' or 'spawn' first imports the parent's ``__main__``
    (its file, or its module under ``python -m``), so that functions defined there can be
    unpickled. The workers only run this module's functions, and re-running the caller's
    script costs each worker its top-level imports (``import tensorflow``: seconds, on
    every conversion) or, in a script without an ``if __name__ == "__main__":`` guard,
    starts the conversion again inside the worker, which multiprocessing refuses. The
    parent reads ``__main__.__file__`` and ``__spec__`` when it starts a process: hide
    them for that moment.
    """
    main = sys.modules.get("__main__")
    saved = {k: getattr(main, k) for k in ("__file__", "__spec__") if hasattr(main, k)}
    try:
        if "__file__" in saved:
            del main.__file__
        if "__spec__" in saved:
            main.__spec__ = None
        yield
    finally:
        for key, value in saved.items():
            setattr(main, key, value)


def _run_chunk(fn: Callable, chunk: Sequence) -> list:
    return [fn(item) for item in chunk]


class _Mapper:
    """Ordered map over worker processes, or in this process for one worker.

    ``concurrent.futures.ProcessPoolExecutor`` rather than ``multiprocessing.Pool``: the
    latter's worker-handler thread wakes on every pending result, and with records of tens
    of kB it spun for more than half of the main process's CPU time.
    """

    def __init__(self, workers: int):
        self.workers = workers
        self._pool = None
        if workers > 1:
            self._pool = ProcessPoolExecutor(
                workers, mp_context=_context(), initializer=_worker_setup, initargs=(os.getpid(),)
            )

    def imap(self, fn: Callable, items: Sequence, chunk: int | None = None) -> Iterator:
        if self._pool is None:
            return map(fn, items)
        return self._imap(fn, items, chunk)

    def _imap(self, fn: Callable, items: Sequence, chunk: int | None) -> Iterator:
        # Chunks of up to 32 files: fewer, larger messages cost the main process about a
        # third less than chunks of 8, while 8+ chunks per worker keep the load even.
        size = chunk or max(1, min(32, len(items) // (self.workers * 8)))
        # A bounded number of chunks in flight, so that results waiting for the writer
        # never pile up in memory; taken in order, so the output does not depend on the
        # number of workers.
        pending: collections.deque = collections.deque()
        for start in range(0, len(items), size):
            pending.append(self._submit(fn, items[start : start + size]))
            if len(pending) >= 4 * self.workers:
                yield from self._result(pending.popleft())
        while pending:
            yield from self._result(pending.popleft())

    def submit(self, fn: Callable, items: Sequence) -> Callable[[], list]:
        """Starts ``fn`` over ``items`` now (in the workers); returns a function that waits
        for and returns the results. Runs in this process, when called, for one worker."""
        if self._pool is None:
            return lambda: [fn(item) for item in items]
        future = self._submit(fn, list(items))
        return lambda: self._result(future)

    def _submit(self, fn: Callable, chunk: Sequence):
        # A submit starts a worker process when none is idle. Ctrl-C or SIGTERM wait until
        # it is started and known to the pool: raised while the forkserver forked it (the
        # first one waits for the server's imports), it left a worker the pool did not
        # know, which read the pool's queue after close() had removed its semaphores and
        # printed a traceback under "interrupted".
        with _caller_script_hidden(), signals_held("a worker process's start"):
            return self._pool.submit(_run_chunk, fn, chunk)

    @staticmethod
    def _result(future) -> list:
        try:
            return future.result()
        except BrokenProcessPool as err:
            # Most often the system's OOM killer, which ends the largest process: a worker
            # holding large decoded images.
            raise PetalError(
                f"A worker process died ({err}): most likely it ran out of memory and the "
                "system's OOM killer ended it (pass a smaller --image-size, or fewer --workers), "
                "or a file crashes the image decoder (run again with --workers 1 to see which)."
            ) from None

    def close(self) -> None:
        if self._pool is not None:
            workers = list((getattr(self._pool, "_processes", None) or {}).values())
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
            # Ctrl-C between a submit's start of the first worker and its start of the
            # pool's manager thread left no one to stop that worker, and Python's exit
            # waited for it for ever: end what shutdown() did not.
            for worker in workers:
                if worker.is_alive():
                    worker.terminate()
                    worker.join()


# --- validation -------------------------------------------------------------------------------


def _plain_number(value):
    """A NumPy integer or float as Python's ``int`` or ``float``; anything else unchanged."""
    import numpy as np

    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    return value


def _resolve_options(
    image_size, resize, format, quality, val_fraction, seed, shards, shard_mb, workers, max_pixels
) -> tuple[_Options, dict]:
    """Checks every option before anything is read or written."""
    # NumPy numbers count as Python's (and are written to the manifest as such).
    numbers = (quality, val_fraction, seed, shards, shard_mb, workers, max_pixels)
    quality, val_fraction, seed, shards, shard_mb, workers, max_pixels = map(
        _plain_number, numbers
    )
    if resize not in images.RESIZE_MODES:
        raise PetalError(
            f"resize must be one of {', '.join(images.RESIZE_MODES)}. Received: resize={resize!r}"
        )
    if format not in schema.FORMATS:
        raise PetalError(
            f"format must be one of {', '.join(schema.FORMATS)}. Received: format={format!r}"
        )
    if resize == "none":
        if image_size is not None:
            raise PetalError(
                "image_size (--image-size) conflicts with resize='none' (--resize none: images "
                f"keep their own size). Received: image_size={image_size!r}"
            )
        size = None
    else:
        try:
            size = images.parse_image_size(
                images.DEFAULT_IMAGE_SIZE if image_size is None else image_size
            )
        except ValueError as err:
            raise PetalError(str(err)) from None
    if format == schema.FORMAT_RAW and quality is not None:
        raise PetalError(
            "quality (--quality) applies to JPEG only and conflicts with format='raw' "
            f"(--format raw). Received: quality={quality!r}"
        )
    if format == schema.FORMAT_JPEG:
        quality = images.DEFAULT_QUALITY if quality is None else quality
        if not is_int_at_least(quality, 1) or quality > 100:
            raise PetalError(f"quality must be an integer in 1..100. Received: quality={quality!r}")
    if not _is_number(val_fraction) or not 0.0 <= val_fraction < 1.0:
        raise PetalError(
            f"val_fraction must be in [0, 1) (0 writes no validation split). "
            f"Received: val_fraction={val_fraction!r}"
        )
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise PetalError(f"seed must be an integer. Received: seed={seed!r}")
    if shards is not None and shard_mb is not None:
        raise PetalError(
            "--shards and --shard-mb both choose the shard count; give one. "
            f"Received: shards={shards}, shard_mb={shard_mb}"
        )
    if shards is not None and not is_int_at_least(shards, 1):
        raise PetalError(f"shards must be a positive integer. Received: shards={shards!r}")
    if shard_mb is not None and (
        not _is_number(shard_mb) or not math.isfinite(shard_mb) or shard_mb <= 0
    ):
        raise PetalError(
            f"shard_mb must be a positive finite number. Received: shard_mb={shard_mb!r}"
        )
    if workers is not None and not is_int_at_least(workers, 1):
        raise PetalError(f"workers must be a positive integer. Received: workers={workers!r}")
    if not is_int_at_least(max_pixels, 1):
        raise PetalError(
            f"max_pixels must be a positive integer. Received: max_pixels={max_pixels!r}"
        )
    if size is not None:
        _check_stored_size(size, format, max_pixels, image_size)
    options = _Options(size, resize, format, quality, max_pixels)
    recorded = {
        "image_size": list(size) if size else None,
        "resize": resize,
        "format": format,
        "quality": quality,
        "val_fraction": float(val_fraction),
        "seed": seed,
        "shards": shards,
        "shard_mb": shard_mb if shards is not None or shard_mb is not None else DEFAULT_SHARD_MB,
        "workers": workers or usable_cpus(),
        "max_pixels": max_pixels,
    }
    if shards is not None:
        recorded["shard_mb"] = None
    return options, recorded


def _is_number(value) -> bool:
    """An int or float, not a bool (``True`` is an int to Python, and no fraction or size)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def _check_stored_size(size: tuple[int, int], format: str, max_pixels: int, received) -> None:
    """Refuses a stored size that no image could be written at, before any work is done.

    ``received`` is the ``image_size`` given (None: the default was used, and is named).
    """
    h, w = size
    if received is None:
        received = f"image_size={images.DEFAULT_IMAGE_SIZE} (the default)"
    else:
        received = f"image_size={received!r}"
    if format == schema.FORMAT_JPEG and max(size) > images.JPEG_MAX_SIDE:
        raise PetalError(
            f"image_size {h}x{w} is too large for JPEG, which allows at most "
            f"{images.JPEG_MAX_SIDE} pixels per side; choose a smaller --image-size or "
            f"--format raw. Received: {received}"
        )
    # Each worker holds several float32 copies of the stored image, so the limit on the
    # images it decodes applies to the images it writes too.
    if h * w > max_pixels:
        raise PetalError(
            f"image_size {h}x{w} is {h * w:,} pixels, more than max_pixels {max_pixels:,}; "
            f"choose a smaller --image-size or raise --max-pixels. Received: {received}, "
            f"max_pixels={max_pixels}"
        )
    if format == schema.FORMAT_RAW and h * w * 3 > images.RAW_MAX_BYTES:
        raise PetalError(
            f"image_size {h}x{w} needs {h * w * 3:,} bytes per raw record, more than a "
            f"record can hold ({images.RAW_MAX_BYTES:,}); choose a smaller --image-size or "
            f"--format jpeg. Received: {received}"
        )


def _norm(path: str) -> str:
    local = folders.local_path(path)
    if local is None:
        return path.rstrip("/") + "/"
    return os.path.join(os.path.realpath(local), "")


def _check_paths(source: str, output: str) -> None:
    src, dst = _norm(source), _norm(output)
    if dst.startswith(src):
        why = (
            "is the source folder: the shards would be written among its class folders"
            if dst == src
            else "is inside the source folder, so it would be read as a class"
        )
        raise PetalError(
            f"The output folder {why}. Choose an output outside it. Received: "
            f"source={source}, output={output}"
        )
    if folders.exists(output) and not folders.isdir(output):
        raise PetalError(
            f"The output {output} is a file, not a folder; pass a new or empty folder as DST. "
            f"Received: output={output}"
        )


# --- the output folder --------------------------------------------------------------------------


def _listdir(path: str) -> list[str]:
    if not folders.exists(path):
        return []
    if folders.is_remote(path):
        import tensorflow as tf

        try:
            return sorted(n.rstrip("/") for n in tf.io.gfile.listdir(path))
        except tf.errors.OpError as err:
            raise folders.gfile_error(path, err) from None
    return sorted(os.listdir(path))


def _is_ours(name: str) -> bool:
    return (
        name in (schema.MANIFEST_NAME, RUNNING_FILE)
        or name.startswith((_TEMP_PREFIX, READING_PREFIX))
        or bool(_SHARD_RE.match(name))
    )


def _is_petal_manifest(path: str) -> bool:
    """Whether the ``manifest.json`` at ``path`` is a records manifest (petal's keys), not
    another program's file of that name."""
    try:
        manifest = json.loads(folders.read_bytes(path).decode("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(manifest, dict) and {"classes", "splits", "format"} <= manifest.keys()


def _check_writable(output: str) -> None:
    """Refuses (before the scan, which reads every file) a local folder that cannot be
    written."""
    if not folders.is_remote(output) and (reason := dangling_link(output)):
        raise PetalError(
            f"Cannot create the output folder {output} ({reason}); create the folder it links "
            f"to, or pass another DST. Received: output={output}"
        )
    if not folders.is_remote(output) and (reason := cannot_write(output, folder=True)):
        if os.path.isdir(output):  # said "Cannot create" it, and to mend its parents
            raise PetalError(
                f"Cannot write into the output folder {output} ({reason}); make it "
                f"writable, or pass another DST. Received: output={output}"
            )
        raise PetalError(
            f"Cannot create the output folder {output} ({reason}); pass a DST whose parents "
            f"are folders you can write. Received: output={output}"
        )


def _make_folder(output: str) -> None:
    if folders.is_remote(output):
        import tensorflow as tf

        try:
            tf.io.gfile.makedirs(output)
        except tf.errors.OpError as err:
            raise folders.gfile_error(output, err) from None
    else:
        try:
            os.makedirs(output, exist_ok=True)
        except OSError as err:
            raise PetalError(
                f"Cannot create the output folder {output} ({err.strerror or err}); pass a DST "
                f"whose parents are folders you can write. Received: output={output}"
            ) from None


@contextlib.contextmanager
def _claimed(output: str) -> Iterator[None]:
    """Holds a local output folder for this conversion: creates it and keeps
    :data:`~petal.running.RUNNING_FILE` in it meanwhile, so that a second conversion into it
    is refused (both wrote the same temporary files, and one's clean-up deleted the
    other's), and removes the folders it created again (``n2/a/b``: the three) where
    nothing is left in them.

    Remote outputs are not held: an object store has no exclusive create to build it on.
    (:func:`convert` has made a ``file://`` output its local folder.)
    """
    if folders.is_remote(output):
        yield
        return
    with folders.held_output(
        output, lambda: _make_folder(output), "DST", "converting into it"
    ):
        if reader := reading_elsewhere(Path(output)):
            # Its shards replaced under it: epochs that mix two conversions' records.
            who, marker = reader
            raise in_use_error(output, who, "DST", marker=marker)
        yield


def _check_output(output: str, overwrite: bool) -> None:
    """Refuses to replace a complete conversion or to mix with foreign files."""
    names = _listdir(output)
    if schema.MANIFEST_NAME in names and not _is_petal_manifest(
        folders.join(output, schema.MANIFEST_NAME)
    ):
        # Another program's file of that name (a web app's): petal's manifest would replace
        # it, so --overwrite, which replaces only petal's files, is no fix.
        raise PetalError(
            f"The output folder {output} holds a {schema.MANIFEST_NAME} petal did not write "
            "(not a records manifest), which petal's own would replace; choose an empty or new "
            "folder, or move that file out of it."
        )
    if schema.MANIFEST_NAME in names and not overwrite:
        raise PetalError(
            f"{output} already holds a complete conversion ({schema.MANIFEST_NAME}); "
            "pass --overwrite (overwrite=True) to replace it."
        )
    foreign = [n for n in names if not _is_ours(n)]
    if foreign and not overwrite:
        raise PetalError(
            f"The output folder {output} holds files petal did not write (e.g. "
            f"{printable(foreign[0])!r}); "
            "choose an empty or new folder, or pass --overwrite to replace only petal's files."
        )


def _remove(path: str) -> None:
    if folders.is_remote(path):
        import tensorflow as tf

        tf.io.gfile.remove(path)
    else:
        os.remove(path)


def _rename(src: str, dst: str) -> None:
    if folders.is_remote(src):
        import tensorflow as tf

        tf.io.gfile.rename(src, dst, overwrite=True)
    else:
        os.replace(src, dst)


def _prepare_output(output: str) -> list[str]:
    """Creates the folder and removes what an interrupted run left behind (not the marker
    of this run, see :func:`_claimed`).

    Returns:
        The files of a complete conversion already there (``--overwrite``), manifest first:
        they stay until the new shards are complete, so a conversion that fails keeps them.
    """
    _make_folder(output)
    names = [n for n in _listdir(output) if n != RUNNING_FILE]
    # Without a manifest, shards are leftovers of an interrupted run; temporary files always are.
    complete = schema.MANIFEST_NAME in names
    kept = [n for n in names if complete and (n == schema.MANIFEST_NAME or _SHARD_RE.match(n))]
    removed = [n for n in names if _is_ours(n) and n not in kept]
    for name in removed:
        _remove(folders.join(output, name))
    if shards := [n for n in removed if _SHARD_RE.match(n)]:
        log.warning(
            "petal: removed %d shard(s) with no manifest.json beside them from %s, the output "
            "of a conversion that did not finish: %s",
            len(shards),
            output,
            some_names(shards),
        )
    return sorted(kept, key=lambda n: n != schema.MANIFEST_NAME)


# --- split, order, shards ----------------------------------------------------------------------


def validation_count(val_fraction: float, n: int) -> int:
    """How many of a class's ``n`` files :func:`split_files` sends to validation:
    ``round(val_fraction * n)``, halves rounded up."""
    return math.floor(val_fraction * n + 0.5)


def photos_to_validate(val_fraction: float) -> int:
    """The fewest files a class needs for :func:`validation_count` to validate one of them
    at ``val_fraction`` (above 0)."""
    need = max(1, math.ceil(0.5 / val_fraction) - 1)  # one below, for 0.5 / fraction's rounding
    while validation_count(val_fraction, need) < 1:
        need += 1
    return need


def fraction_to_validate(n: int) -> float:
    """The smallest two-decimal val_fraction that validates one of a class's ``n`` files
    (2 or more): at most 0.25, so that every class of 2 or more keeps one to train on."""
    fraction = math.ceil(50 / n) / 100
    while validation_count(fraction, n) < 1:
        fraction = round(fraction + 0.01, 2)
    return fraction


def split_files(
    probed: Sequence[_Probed],
    classes: Sequence[str],
    val_fraction: float,
    seed: int,
    failed: Collection[str] = (),
) -> dict[str, list[_Probed]]:
    """Seeded, class-stratified split, disjoint by file content.

    Files with identical bytes form a group that goes to one side as a whole, so no
    file is in both splits. (Files of other bytes holding the same pixels are found only
    once converted, and listed: :func:`_identical`.) Each class sends
    ``round(val_fraction * n)`` of its files (counting groups it owns) to validation,
    chosen by a generator seeded with the seed and the class name, so one class's split
    does not depend on the others; a group of copies goes there only if that leaves the
    class no further from its share (it may end a file or more off it), and leaves it a
    file to train on where its share does (two copies of one photo train). A group under
    several classes belongs to the first: a copy filed under a later class goes with it.

    ``failed`` names (by relpath) files that could not be converted: they are left out of
    both sides and of ``n``, and a class's next files in the same seeded order take their
    places, so the share holds over the images written. With none failed the split is
    the same as without the argument.
    """
    failed = frozenset(failed)
    groups: dict[str, list[_Probed]] = {}
    for item in probed:
        groups.setdefault(item.content, []).append(item)
    owned: dict[int, list[list[_Probed]]] = {}
    for group in groups.values():  # a group belongs to its first member's class
        owned.setdefault(group[0].file.label, []).append(group)
    totals = Counter(item.file.label for item in probed if item.file.relpath not in failed)
    in_val: Counter = Counter()
    splits: dict[str, list[_Probed]] = {"train": [], "validation": []}
    for label, name in enumerate(classes):
        target = validation_count(val_fraction, totals[label])
        # Shuffled with the failed files still in: the order, and so the choice of the
        # others, stays that of the split made before they failed.
        class_groups = owned.get(label, [])
        random.Random(f"petal-split:{seed}:{name}").shuffle(class_groups)
        decisions = []  # [side, group, files of the class]
        # A group of copies may not take the class's last training images where single
        # photos would leave it some (two copies of one photo at 0.25, one place due): the
        # model then never saw the class.
        room = max(target, totals[label] - 1)
        for group in class_groups:
            group = [item for item in group if item.file.relpath not in failed]
            # A group of copies goes to validation while the class is short of its share,
            # unless it would overshoot it by more than it is short (five copies of one photo
            # took five of a class's six places where one was due).
            own = sum(1 for item in group if item.file.label == label)
            short = target - in_val[label]
            fits = own - short <= short and in_val[label] + own <= room
            side = "validation" if short > 0 and fits else "train"
            decisions.append([side, group, own])
            if side == "validation":
                in_val.update(item.file.label for item in group)
        if target > 0 and in_val[label] == 0:
            # Every group overshot (three copies each of two photos, one place due): the
            # smallest goes, rather than none, which left the class's accuracy unmeasured.
            held = [d for d in decisions if 0 < d[2] <= room]
            if held:
                smallest = min(held, key=lambda d: d[2])
                smallest[0] = "validation"
                in_val.update(item.file.label for item in smallest[1])
        for side, group, _ in decisions:
            splits[side] += group
    for split, items in splits.items():
        # Records are shuffled before sharding: shards are then uniform samples, which
        # readers rely on (the codelab's "well shuffled on disk").
        items.sort(key=lambda item: item.file.relpath)
        random.Random(f"petal-shuffle:{seed}:{split}").shuffle(items)
    return splits


def _shard_sizes(count: int, shards: int) -> list[int]:
    """Sizes of ``shards`` contiguous blocks of ``count`` records, differing by at most one."""
    if count == 0:
        return []
    shards = max(1, min(shards, count))
    return [count // shards + (1 if i < count % shards else 0) for i in range(shards)]


def _task(item: _Probed) -> tuple[str, int, str]:
    return item.file.path, item.file.label, item.file.relpath


def _start_size_estimate(files, options: _Options, mapper: _Mapper) -> Callable[[], float | None]:
    """Starts converting a spread-out sample of the files; returns a function giving the
    average record size on disk (None when no sampled file converts).

    Started before the scan, so the workers convert the sample while this process stats and
    hashes the files: the shard count costs no time of its own.
    """
    # Evenly spread over the whole list (files[::len // 16][:16] took the first 16 of 31,
    # all of the first class, whose sizes may be nothing like the others').
    n = min(_ESTIMATE_SAMPLE, len(files))
    sample = [(f.path, f.label, f.relpath) for f in (files[i * len(files) // n] for i in range(n))]
    results = mapper.submit(functools.partial(_convert, options=options), sample)

    def average() -> float | None:
        sizes = [len(r[0]) + _FRAME for r in results() if not isinstance(r, str)]
        return sum(sizes) / len(sizes) if sizes else None

    return average


def _known_record_bytes(options: _Options, largest_split: int, shard_mb) -> int | None:
    """Bytes per record where they follow from the options alone, else None.

    Raw records have exactly the pixels' size. JPEG records are smaller than their pixels,
    so when the largest split fits one shard even at that bound, the bound decides as well
    as the true size would (one shard). Otherwise the encoded size must be measured.
    """
    if options.size is None:
        return None
    bound = options.size[0] * options.size[1] * 3 + _RECORD_OVERHEAD
    if options.format == schema.FORMAT_RAW:
        return bound  # exact
    if bound * largest_split <= (shard_mb or DEFAULT_SHARD_MB) * _MB:
        return bound  # one shard either way
    return None


def _needs_estimate(options: _Options, shards, shard_mb, count: int) -> bool:
    """Whether the shard count of ``count`` files depends on their (unknown) encoded size."""
    return shards is None and _known_record_bytes(options, count, shard_mb) is None


def _shard_counts(
    splits: dict[str, list[_Probed]],
    options: _Options,
    shards: int | None,
    shard_mb: float | None,
    estimate: Callable[[], float | None] | None,
) -> dict[str, int]:
    if shards is not None:
        return {s: min(shards, len(items)) for s, items in splits.items()}
    target = (shard_mb or DEFAULT_SHARD_MB) * _MB
    everything = [p for items in splits.values() for p in items]
    per_record = _known_record_bytes(options, max(map(len, splits.values())), shard_mb)
    if per_record is None:
        # From the sample converted during the scan, else from the source files' sizes.
        per_record = (estimate() if estimate is not None else None) or (
            _RECORD_OVERHEAD + sum(p.nbytes for p in everything) / max(1, len(everything))
        )
    return {
        s: min(len(items), max(1, math.ceil(len(items) * per_record / target)))
        for s, items in splits.items()
    }


# --- records ---------------------------------------------------------------------------------------


def _file_digest(path: str) -> tuple[int, str]:
    """(size in bytes, sha256 hex) of a written file."""
    digest = hashlib.sha256()
    size = 0
    if folders.is_remote(path):
        import tensorflow as tf

        opened = tf.io.gfile.GFile(path, "rb")
    else:
        opened = open(path, "rb")  # noqa: SIM115  (closed by the with below)
    with opened as f:
        while chunk := f.read(8 * _MB):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


def _progress(total: int, desc: str, enabled: bool | None):
    from tqdm.auto import tqdm

    if enabled is None:  # as evaluate's: a bar redrawn into a log file or a pipe is noise
        enabled = sys.stderr.isatty()
    return tqdm(total=total, desc=desc, unit="img", disable=not enabled, dynamic_ncols=True)


# --- the conversion --------------------------------------------------------------------------------


def convert(
    source: str | os.PathLike,
    output: str | os.PathLike,
    *,
    image_size: int | str | tuple[int, int] | None = None,
    resize: str = "fill",
    format: str = "jpeg",
    quality: int | None = None,
    val_fraction: float = DEFAULT_VAL_FRACTION,
    seed: int = DEFAULT_SEED,
    shards: int | None = None,
    shard_mb: float | None = None,
    classes: Sequence[str] | str | None = None,
    workers: int | None = None,
    max_pixels: int = images.DEFAULT_MAX_PIXELS,
    overwrite: bool = False,
    progress: bool | None = None,
) -> ConvertSummary:
    """Converts a folder of class sub-folders into sharded TFRecords and a manifest.

    Args:
        source: folder whose sub-folders are the classes (local or ``gs://``).
        output: records folder to create (must not be inside ``source``).
        image_size: stored size, ``192`` or ``"HxW"``; default 192 (not allowed with
            ``resize="none"``).
        resize: ``fill`` (cover and centre-crop, the codelab's), ``pad``, ``stretch`` or
            ``none`` (keep the source size, and the source bytes of plain JPEGs).
        format: ``jpeg`` or ``raw`` (uint8 pixels, no decoding for readers).
        quality: JPEG quality, default 95 (not allowed with ``format="raw"``).
        val_fraction: fraction of each class for the validation split, in [0, 1).
        seed: seeds the split and the record order.
        shards: shards per split (capped at the split's record count).
        shard_mb: target shard size in MB instead (default 200, so shards of about
            100-200 MB once a split is bigger than that): the shard count comes from the
            average record size, so a shard of larger images may run past it.
        classes: class names in index order (a list or tuple, not a set, or a
            comma-separated string); default all sub-folders with images, sorted.
        workers: processes decoding and encoding; default the CPUs this process may run on.
        max_pixels: images with more pixels are skipped unread (decompression bombs).
        overwrite: replace a complete conversion already in ``output`` (removed only once
            the new shards are complete); never one still being written by another process.
        progress: show progress bars on stderr (default: only when it is a terminal).

    Returns:
        A summary; the full account is in ``output/manifest.json``.

    Raises:
        PetalError: bad options, a missing, unreachable or unusable source, an output that
            would be clobbered, is in use by another conversion or cannot be reached, no image
            that could be converted, or an empty train split. Nothing is left half-written.
    """
    started = time.perf_counter()
    source, output = folders.expand_home(source), folders.expand_home(output)
    for name, value, what in (("source", source, "a folder of class sub-folders"),
                              ("output", output, "the records folder to write")):
        need_folder(value, name, what, empty=False)
        folders.refuse_url(value, name, "records", urls=True)  # a Path made gs:/b of gs://b
    source, output = str(source), str(output)
    if not folders.is_utf8(output):
        # TensorFlow takes paths as UTF-8 text: the manifest could not be written (after the
        # shards, and after --overwrite had removed the conversion it replaced).
        raise PetalError(
            "The output folder's name is not valid UTF-8 (TensorFlow writes and reads records "
            "only under UTF-8 paths); rename it, or pass another DST. "
            f"Received: output={printable(folders.utf8_name(output))}"
        )
    overwrite = need_bool(overwrite, "overwrite")
    progress = need_bool_or_none(progress, "progress")
    # A file:// DST is the local folder it names, written as one: the workers write pieces
    # of its shards (TensorFlow's file system layer wrote every record in this process).
    output = folders.local_path(output) or output
    options, recorded = _resolve_options(
        image_size,
        resize,
        format,
        quality,
        val_fraction,
        seed,
        shards,
        shard_mb,
        workers,
        max_pixels,
    )
    folder = folders.find_images(source, classes)
    _check_paths(source, output)
    _check_writable(output)
    # From here on the folder is this conversion's: a second one is refused (one line
    # naming this process), and what it finds there cannot change under it.
    with _claimed(output):
        _check_output(output, overwrite)
        # A record keeps its file name as UTF-8 text: a name that is not cannot be written.
        files, not_utf8 = folder.by_utf8()
        skipped: list[dict] = [
            {"file": folders.utf8_name(f.relpath), "reason": _NOT_UTF8} for f in not_utf8
        ]
        workers = min(recorded["workers"], len(files))
        options = replace(options, classes=folder.classes)
        if workers > 1:
            _start_workers_server()
        # TensorFlow's start-up (seconds, once per process) is not conversion work: keep it
        # out of the summary's time and images/s.
        before_import = time.perf_counter()
        import tensorflow  # noqa: F401

        started += time.perf_counter() - before_import

        # Pass 1: the size of every file, then the hash of those whose size is not unique:
        # only they can be byte-identical. Threads hide the latency of object stores (and
        # hashing releases the GIL).
        probed: list[_Probed] = []
        # Local files: a plain loop is cheaper than handing each stat to a thread.
        readers = ThreadPoolExecutor(32) if folders.is_remote(source) else None
        each = readers.map if readers is not None else map
        mapper = None
        try:
            with _progress(len(files), "scan", progress) as bar:
                sizes = each(_size, [f.path for f in files])
                mapper = _Mapper(workers)  # the worker processes start while the threads read
                estimate = None
                if _needs_estimate(options, shards, shard_mb, len(files)):
                    estimate = _start_size_estimate(files, options, mapper)
                found: list[tuple[folders.ImageFile, int]] = []
                for f, size in zip(files, sizes, strict=True):
                    if isinstance(size, str):
                        _check_store(size, source, f.relpath)
                        skipped.append({"file": f.relpath, "reason": size})
                    else:
                        found.append((f, size))
                    bar.update()
                same_size = Counter(size for _, size in found)
                shared = [f for f, size in found if same_size[size] > 1]
                hashes = dict(zip(shared, each(_hash, [f.path for f in shared]), strict=True))
            for f, size in found:
                content = hashes.get(f, f"unique size:{f.relpath}")
                if content.startswith("!"):
                    _check_store(content[1:], source, f.relpath)
                    skipped.append({"file": f.relpath, "reason": content[1:]})
                else:
                    probed.append(_Probed(f, content, size))
        except BaseException:
            if mapper is not None:
                mapper.close()
            raise
        finally:
            if readers is not None:
                readers.shutdown(wait=False, cancel_futures=True)
        try:
            if not probed:
                raise PetalError(_nothing_usable(source, skipped))
            splits = split_files(probed, folder.classes, val_fraction, seed)
            if not splits["train"]:
                raise PetalError(
                    f"The train split would be empty: val_fraction={val_fraction} sends all "
                    f"{len(probed)} image files under {source} to validation (each class's "
                    "share is rounded)"
                    + (f", and {len(skipped)} more are skipped (e.g. "
                       f"{printable(skipped[0]['file'])}: {skipped[0]['reason']})" if skipped
                       else "")
                    + "; lower --val-fraction or add images."
                )
            shard_counts = _shard_counts(splits, options, shards, shard_mb, estimate)

            def resplit(failed: set[str]) -> tuple[dict, dict[str, int]] | None:
                """The split over the files that converted, where it is not the one written
                less the failed files (their class's share counted them)."""
                if not failed:
                    return None
                again = split_files(probed, folder.classes, val_fraction, seed, failed)
                if all(
                    {p.file.relpath for p in again[s]}
                    == {p.file.relpath for p in splits[s]} - failed
                    for s in schema.SPLITS
                ):
                    return None
                if not again["train"]:
                    raise PetalError(
                        f"The train split would be empty: val_fraction={val_fraction} sends "
                        f"all {len(probed) - len(failed)} images under {source} that could be "
                        "converted to validation (each class's share is rounded); lower "
                        "--val-fraction or add images."
                    )
                return again, _shard_counts(again, options, shards, shard_mb, estimate)

            try:
                with contextlib.ExitStack() as finish:
                    stored: dict[str, tuple[str, bytes]] = {}
                    written = _write(
                        source, output, splits, shard_counts, options, mapper, progress,
                        skipped, folder, resplit, finish, stored,
                    )  # fmt: skip
                    manifest = _manifest(
                        source, folder, recorded, classes, written, skipped, probed, stored
                    )
                    _write_manifest(output, manifest)
            except tensorflow.errors.OpError as err:
                # Writing to an object store failed part-way (network, credentials, quota).
                raise folders.gfile_error(output, err) from None
        finally:
            mapper.close()

    seconds = time.perf_counter() - started
    return ConvertSummary(
        output=output,
        classes=list(folder.classes),
        images_found=manifest["images_found"],
        written=manifest["written"],
        skipped=len(manifest["skipped"]),
        counts={s: manifest["splits"][s]["count"] for s in schema.SPLITS},
        shards={s: len(manifest["splits"][s]["shards"]) for s in schema.SPLITS},
        bytes=sum(sh["bytes"] for s in schema.SPLITS for sh in manifest["splits"][s]["shards"]),
        seconds=seconds,
        manifest=manifest,
        warnings=_warnings(manifest),
    )


def _warnings(manifest: dict) -> list[str]:
    """What makes the records less useful than asked for: an empty split or class, images
    outside any class or in hidden folders, links not followed, the same photo under two
    classes."""
    splits, fraction = manifest["splits"], manifest["val_fraction"]
    train, val = splits["train"]["per_class"], splits["validation"]["per_class"]
    out = []

    def fill(n: int) -> str:
        """The fix for classes of ``n`` files at most that validate none at ``fraction``: a
        class of one photo cannot give one to validation and keep one to train on; one of
        2 or more can at the fraction that :func:`fraction_to_validate` names."""
        more = (
            f"add images (at val_fraction {fraction} a class needs "
            f"{photos_to_validate(fraction)} or more to validate on one)"
        )
        if n < 2:
            return more
        return (
            f"raise --val-fraction to {fraction_to_validate(n)} (a class of {n} validates one) "
            f"or {more}"
        )

    # A class with a share due and none given: its files are copies of too few photos, and
    # each group would have taken its last training images (split_files).
    copies = _copies_of_others(manifest)
    no_val = [c for c in manifest["classes"] if val[c] == 0 and train[c] > 0]
    copied_to_train = [c for c in no_val if len(copies.get(c, [])) == train[c]]
    grouped = [
        c for c in no_val
        if c not in copied_to_train and validation_count(fraction, train[c]) > 0
    ]
    per_class = splits["validation"]["count"] > 0 or grouped
    if splits["validation"]["count"] == 0:
        if grouped:  # (not "rounds to 0": the lines below say why, class by class)
            out.append(
                "the validation split is empty, and petal train needs one: the warnings "
                "below say why, class by class"
            )
        elif fraction == 0:
            out.append(
                "no validation split (--val-fraction 0); petal train evaluates on the "
                "validation split and needs one: convert with --val-fraction above 0 "
                f"(default {DEFAULT_VAL_FRACTION}) to train on these records"
            )
        else:
            most = max((train[c] + val[c] for c in manifest["classes"]), default=0)
            fix = fill(most)
            out.append(
                f"the validation split is empty: val_fraction {fraction} of each class rounds "
                f"to 0 images; {fix}"
            )
    empty = [c for c in manifest["classes"] if train[c] + val[c] == 0]
    if empty:
        out.append(
            f"no records for class {some_names(empty)}: every one of its files was skipped "
            "(see the skipped files in manifest.json)"
        )
    # A class whose images are all copies of another class's went where that class's went:
    # the share is not the cause, and changing it is not the fix.
    no_train = [c for c in manifest["classes"] if train[c] == 0 and val[c] > 0]
    copied_to_validation = [c for c in no_train if len(copies.get(c, [])) == val[c]]
    if shared := [c for c in no_train if c not in copied_to_validation]:
        out.append(
            f"no training images for class {some_names(shared)} (all went to validation): "
            "the model never sees it; lower --val-fraction or add images"
        )
    out += [
        _copied(c, copies[c], "training", "validation", "the model never sees it")
        for c in copied_to_validation
    ]
    unclassified = manifest.get("unclassified_images") or []
    if unclassified:
        out.append(
            f"{len(unclassified)} image file(s) directly in the source folder belong to no "
            f"class and were not converted ({some_names(unclassified)}; listed in manifest.json "
            "as unclassified_images): move each into its class's sub-folder and convert again"
        )
    other = manifest.get("other_files") or []
    if other:
        # A sub-folder holding only such files is no class at all.
        lost = sorted({n.split("/", 1)[0] for n in other} - set(manifest["classes"]))
        lost_line = f"; {some_names(lost)} held nothing else, so is not a class" if lost else ""
        out.append(
            f"{len(other)} file(s) in the class folders are not of a type petal reads and were "
            f"not converted ({some_names(other)}; listed in manifest.json as other_files"
            f"{lost_line}): it reads {', '.join(folders.IMAGE_EXTENSIONS)}; save any photo "
            "among them as one of those (or add the extension it lacks) and convert again"
        )
    hidden = manifest.get("hidden_entries") or []
    if hidden:
        out.append(
            f"{len(hidden)} hidden folder(s) or image file(s) were not read ({some_names(hidden)}; "
            "names starting with '.', or __MACOSX: notebook checkpoints, macOS metadata; "
            "listed in manifest.json as hidden_entries): rename any that hold photos to "
            "convert them"
        )
    if loops := manifest.get("folder_loops"):
        out.append(
            f"{len(loops)} folder link(s) lead back to a folder that holds them and were not "
            f"followed ({some_names(loops)}; listed in manifest.json as folder_loops): a folder "
            "in the source is read once, where it lies, and none above it is read; remove the "
            "links to silence this"
        )
    if empty_folders := manifest.get("empty_folders"):
        out.append(
            f"{len(empty_folders)} sub-folder(s) of the source hold no files and are not classes "
            f"({some_names(empty_folders)}; listed in manifest.json as empty_folders): the "
            f"records have {len(manifest['classes'])} classes; add their photos and convert "
            "again if they are classes"
        )
    if broken := manifest.get("broken_links"):
        out.append(
            f"{len(broken)} link(s) in the source lead nowhere (a missing or unmounted target) "
            f"and were not read ({some_names(broken)}; listed in manifest.json as broken_links): "
            "a class folder behind one is not in the records; mount or fix their targets and "
            "convert again"
        )
    conflicting = manifest.get("duplicates_across_classes") or []
    if conflicting:
        groups = some_names([" = ".join(g) for g in conflicting])
        out.append(
            f"{len(conflicting)} image(s) are byte-identical copies filed under more than one "
            f"class ({groups}; listed in manifest.json as "
            "duplicates_across_classes): each copy was written with its own class, so the "
            "labels contradict each other; keep each photo in one class and convert again"
        )
    if identical := manifest.get("identical_images"):
        groups = some_names([" = ".join(g) for g in identical])
        out.append(
            f"{len(identical)} image(s) are stored more than once, from files that are not "
            f"byte-identical (the same pixels saved again, as .png or with other metadata: "
            f"{groups}; listed in manifest.json as identical_images), in both splits or under "
            "two classes: validation then scores images the model trains on, or the labels "
            "contradict each other; keep one file of each and convert again"
        )
    if per_class:
        if grouped:
            out.append(
                f"no validation images for class {some_names(grouped)}: its files are "
                "byte-identical copies of too few photos to spare one (copies stay together, "
                "and the class keeps its training images): its accuracy is not measured; add "
                "other photos of it and convert again"
            )
        if shared := [c for c in no_val if c not in copied_to_train and c not in grouped]:
            # One photo: it trains, or it validates. Else the fraction that gives one to the
            # smallest class of 2 or more (a larger class then validates one too).
            fix = fill(min((train[c] for c in shared if train[c] >= 2), default=1))
            out.append(
                f"no validation images for class {some_names(shared)} (too few images for "
                f"val_fraction {fraction}): its accuracy is not measured; {fix}"
            )
        out += [
            _copied(c, copies[c], "validation", "training", "its accuracy is not measured")
            for c in copied_to_train
        ]
    return out


def _copies_of_others(manifest: dict) -> dict[str, list[str]]:
    """Per class, its files that are byte-identical copies of an image of a class listed
    before it: :func:`split_files` sends them to the side that class sends the image to."""
    index = {c: i for i, c in enumerate(manifest["classes"])}
    out: dict[str, list[str]] = {}
    for group in manifest.get("duplicates_across_classes") or []:
        owner = min(index[f.split("/", 1)[0]] for f in group)
        for f in group:
            if index[f.split("/", 1)[0]] != owner:
                out.setdefault(f.split("/", 1)[0], []).append(f)
    return out


def _copied(name: str, copies: list[str], missing: str, side: str, effect: str) -> str:
    """The warning for a class with no ``missing`` images because every one of its images
    is a copy of another class's, which took it to ``side``."""
    return (
        f"no {missing} images for class {some_names([name])}: its {len(copies)} image(s) "
        f"({some_names(copies, 3)}) are byte-identical copies of images of another class "
        f"and went to {side} with them (listed in manifest.json as duplicates_across_classes): "
        f"{effect}; keep each photo in one class and convert again"
    )


def _nothing_usable(source: str, skipped: list[dict]) -> str:
    reasons = Counter(s["reason"].split(":")[0].split(" (")[0] for s in skipped)
    common = ", ".join(f"{n} x {r}" for r, n in reasons.most_common(3))
    return (
        f"None of the {len(skipped)} image files under {source} could be converted ({common}; "
        f"e.g. {printable(skipped[0]['file'])}: {skipped[0]['reason']})."
    )


def _one_class_left(source: str, folder, kept: set[int], skipped: list[dict]) -> str:
    """The error for a conversion whose records would hold one class of ``folder``'s (labels
    ``kept``): every file of the others was skipped, so no classifier can train on them."""
    classes = folder.classes
    label = {f.relpath: f.label for f in folder.files}
    lost = [i for i in range(len(classes)) if i not in kept]
    example = min(
        (s for s in skipped if label.get(s["file"]) in lost), key=lambda s: s["file"], default=None
    )
    why = f" (e.g. {printable(example['file'])}: {example['reason']})" if example else ""
    return (
        f"Only class {classes[min(kept)]!r} of the {len(classes)} under {source} has images "
        f"that could be converted: every file of {some_names([classes[i] for i in lost])} was "
        f"skipped{why}, and a classifier needs two classes; replace those files, or add a "
        "class, then convert again."
    )


def _write(
    source: str,
    output: str,
    splits: dict[str, list[_Probed]],
    shard_counts: dict[str, int],
    options: _Options,
    mapper: _Mapper,
    progress: bool | None,
    skipped: list[dict],
    folder: folders.ImageFolder,
    resplit: Callable[[set[str]], tuple[dict, dict[str, int]] | None] = lambda failed: None,
    finish: contextlib.ExitStack | None = None,
    stored: dict[str, tuple[str, bytes]] | None = None,
) -> dict[str, list[dict]]:
    """Pass 2: converts and writes every shard; returns per split its shards' entries.

    Each entry holds the final file name, record count, bytes, checksum and per-class
    counts. Files that fail to convert are appended to ``skipped``; each file written is
    put in ``stored`` as (split, digest of the image its record holds). When they change the
    split, ``resplit(failed)`` gives the new one (splits and shard counts) and every shard
    is written again without them (converted again: a cost only conversions with such
    files pay). Shards that would hold one class of ``folder``'s are refused, naming the
    classes whose files were all skipped.

    From the removal of the conversion it replaces on, Ctrl-C waits (held in ``finish``,
    which the caller closes once the manifest is written): an interruption leaves the
    folder as it was, or the whole new conversion, never a part of either.
    """
    write = _write_pieces if _pieces_possible(output) else _write_records
    previous = _prepare_output(output)
    temp_paths: list[str] = []
    try:
        before = len(skipped)
        plan = _plan(splits, shard_counts)
        shards = write(source, output, plan, options, mapper, progress, skipped, temp_paths)
        if shards and (again := resplit({s["file"] for s in skipped[before:]})):
            log.info("petal: files that could not be converted changed the split: writing again")
            for shard in shards.values():
                _remove(shard["temp"])
            splits, shard_counts = again
            plan = _plan(splits, shard_counts)
            shards = write(source, output, plan, options, mapper, progress, skipped, temp_paths)
        if not shards:
            raise PetalError(_nothing_usable(source, skipped))
        if stored is not None:
            for (split, _), shard in shards.items():
                stored.update((name, (split, d)) for name, d in shard["images"].items())
        kept = set().union(*(s["per_class"] for s in shards.values()))
        if len(kept) < 2:
            raise PetalError(_one_class_left(source, folder, kept, skipped))
        if not any(split == "train" for split, _ in shards):
            train_files = {item.file.relpath for item in splits["train"]}
            example = next(s for s in skipped if s["file"] in train_files)
            raise PetalError(
                f"None of the {len(train_files)} images of the train split under {source} "
                f"could be converted (e.g. {printable(example['file'])}: {example['reason']}); "
                "records without a train split cannot train a model."
            )

        # All shards are complete: only now remove the conversion they replace (manifest
        # first, so the folder never looks complete with a mix), then give the new shards
        # their final names (count and total included).
        if finish is not None:
            finish.enter_context(signals_held())
        for name in previous:
            _remove(folders.join(output, name))
        entries: dict[str, list[dict]] = {s: [] for s in schema.SPLITS}
        for split in schema.SPLITS:
            mine = [shards[key] for key in sorted(shards) if key[0] == split]
            for index, shard in enumerate(mine):
                name = schema.shard_name(split, index, len(mine), shard["count"])
                final = folders.join(output, name)
                _rename(shard["temp"], final)
                if "sha256" in shard:
                    size, digest = shard["bytes"], shard["sha256"]
                else:
                    size, digest = _file_digest(final)
                entries[split].append(
                    {
                        "file": name,
                        "count": shard["count"],
                        "bytes": size,
                        "sha256": digest,
                        "per_class": shard["per_class"],
                    }
                )
        return entries
    except BaseException:
        # Interrupted or failed: leave nothing that a reader could mistake for output (a
        # complete earlier conversion is still whole unless the failure came after its
        # removal above). The workers stop first: Ctrl-C leaves them to finish the pieces
        # they are writing, which came after the clean-up and stayed. A second signal waits
        # for the clean-up (`timeout` signals the process, then its group): raised while
        # close() waited, it left the workers to write pieces after this.
        with signals_held():
            mapper.close()
            try:
                for path in temp_paths:
                    if folders.exists(path):
                        _remove(path)
            except Exception as cleanup:  # e.g. the store became unreachable: report the cause
                log.warning("Could not remove the temporary files in %s: %s", output, cleanup)
        raise


def _plan(
    splits: dict[str, list[_Probed]], shard_counts: dict[str, int]
) -> list[tuple[str, int, _Probed]]:
    """(split, shard index, file) for every record, in writing order."""
    plan: list[tuple[str, int, _Probed]] = []
    for split in schema.SPLITS:
        items = iter(splits[split])
        for index, size in enumerate(_shard_sizes(len(splits[split]), shard_counts[split])):
            plan += [(split, index, next(items)) for _ in range(size)]
    return plan


def _temp_shard(output: str, key: tuple[str, int], temp_paths: list[str]) -> str:
    """The temporary path of shard ``key`` = (split, index), registered for clean-up."""
    path = folders.join(output, f"{_TEMP_PREFIX}{key[0]}-{key[1]:05d}.tfrec")
    temp_paths.append(path)
    return path


def _pieces_possible(output: str) -> bool:
    """Workers write pieces of a local output folder when they can frame records."""
    if folders.is_remote(output):
        return False
    try:
        import google_crc32c
    except ImportError:
        return False
    return google_crc32c.implementation == "c"  # the pure-Python fallback is far too slow


def _shard_runs(plan, size: int):
    """Consecutive runs of at most ``size`` plan entries, never crossing a shard boundary."""
    run: list = []
    for entry in plan:
        if run and (len(run) == size or run[-1][:2] != entry[:2]):
            yield run
            run = []
        run.append(entry)
    if run:
        yield run


def _write_pieces(source, output, plan, options, mapper, progress, skipped, temp_paths) -> dict:
    """Workers write framed pieces; this process appends them to their shards and hashes."""
    size = 32
    runs = list(_shard_runs(plan, size))
    jobs = []
    for n, run in enumerate(runs):
        piece = folders.join(output, f"{_TEMP_PREFIX}piece-{n:06d}.tfrec")
        jobs.append(([_task(item) for _, _, item in run], piece))
        temp_paths.append(piece)  # removed on failure even if a worker wrote it late
    results = mapper.imap(functools.partial(_write_piece, options=options), jobs, chunk=1)
    shards: dict[tuple[str, int], dict] = {}
    out = None
    digest = None
    current = None

    def finish_shard():
        if out is not None:
            out.close()
            shards[current]["sha256"] = digest.hexdigest()

    with _progress(len(plan), "convert", progress) as bar:
        for run, (_, piece), statuses in zip(runs, jobs, results, strict=True):
            key = run[0][:2]
            written = any(not isinstance(status, str) for status in statuses)
            if key != current and written:
                finish_shard()
                current = key
                path = _temp_shard(output, key, temp_paths)
                out = open(path, "wb")  # noqa: SIM115  (closed by finish_shard)
                digest = hashlib.sha256()
                shards[key] = {"temp": path, "count": 0, "per_class": Counter(), "bytes": 0,
                               "images": {}}  # fmt: skip
            for (_, _, item), status in zip(run, statuses, strict=True):
                if isinstance(status, str):
                    _check_store(status, source, item.file.relpath)
                    skipped.append({"file": item.file.relpath, "reason": status})
                else:
                    shards[key]["count"] += 1
                    shards[key]["per_class"][item.file.label] += 1
                    shards[key]["images"][item.file.relpath] = status
            if written:
                with open(piece, "rb") as f:
                    data = f.read()
                out.write(data)
                digest.update(data)
                shards[key]["bytes"] += len(data)
                os.remove(piece)
            bar.update(len(run))
    finish_shard()
    return shards


def _write_records(source, output, plan, options, mapper, progress, skipped, temp_paths) -> dict:
    """Workers return serialised records; this process frames and writes them (any path)."""
    import tensorflow as tf

    convert_fn = functools.partial(_convert, options=options)
    results = mapper.imap(convert_fn, [_task(item) for _, _, item in plan])
    shards: dict[tuple[str, int], dict] = {}
    writer = None
    current = None
    with _progress(len(plan), "convert", progress) as bar:
        for (split, index, item), result in zip(plan, results, strict=True):
            bar.update()
            if isinstance(result, str):
                _check_store(result, source, item.file.relpath)
                skipped.append({"file": item.file.relpath, "reason": result})
                continue
            if (split, index) != current:
                if writer is not None:
                    writer.close()
                current = (split, index)
                path = _temp_shard(output, current, temp_paths)
                writer = tf.io.TFRecordWriter(path)
                shards[current] = {"temp": path, "count": 0, "per_class": Counter(),
                                   "images": {}}  # fmt: skip
            writer.write(result[0])
            shards[current]["count"] += 1
            shards[current]["per_class"][item.file.label] += 1
            shards[current]["images"][item.file.relpath] = result[1]
    if writer is not None:
        writer.close()
    return shards


def _manifest(
    source: str,
    folder: folders.ImageFolder,
    recorded: dict,
    classes_arg,
    written: dict[str, list[dict]],
    skipped: list[dict],
    probed: list[_Probed],
    stored: dict[str, tuple[str, bytes]],
) -> dict:
    import tensorflow as tf

    from petal import __version__

    splits = {}
    for split in schema.SPLITS:
        per_class: Counter = Counter()
        for shard in written[split]:
            per_class.update(shard.pop("per_class"))
        splits[split] = {
            "count": sum(s["count"] for s in written[split]),
            "per_class": {name: per_class[i] for i, name in enumerate(folder.classes)},
            "shards": written[split],
        }
    n_written = sum(s["count"] for s in splits.values())
    copies: dict[str, list[folders.ImageFile]] = {}
    for p in probed:
        copies.setdefault(p.content, []).append(p.file)
    # The same photo under two classes is written once per class, each time with its own
    # label: the records then contradict themselves. Listed, so the user can keep one.
    # Copies that were skipped (the same unreadable bytes twice) wrote no label, nor count
    # among the duplicates written.
    not_written = {s["file"] for s in skipped}
    conflicting = []
    duplicates = 0
    for group in copies.values():
        group = [f for f in group if f.relpath not in not_written]
        duplicates += max(len(group) - 1, 0)
        if len({f.label for f in group}) > 1:
            conflicting.append(sorted(f.relpath for f in group))
    conflicting.sort()
    return {
        "petal_version": __version__,
        "tensorflow_version": tf.__version__,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "source": folders.utf8_name(
            source if folders.is_remote(source) else os.path.abspath(source)
        ),
        "classes": list(folder.classes),
        "image_size": recorded["image_size"],
        "format": recorded["format"],
        "resize": recorded["resize"],
        "quality": recorded["quality"],
        "seed": recorded["seed"],
        "val_fraction": recorded["val_fraction"],
        "splits": splits,
        "images_found": len(folder.files),
        "written": n_written,
        "skipped": sorted(skipped, key=lambda s: s["file"]),
        "duplicates": duplicates,
        "duplicates_across_classes": conflicting,
        # Files of other bytes whose records hold the same image (a photo saved again as
        # .png), split apart or filed under two classes: found only once converted.
        "identical_images": _identical(probed, stored),
        "ignored_files": len(folder.ignored),
        # Images directly in the source folder belong to no class: listed, not converted.
        # (Names that are not valid UTF-8 with their bytes escaped, as JSON holds text.)
        "unclassified_images": _utf8_names(folder.unclassified_images()),
        # Class folders' files of other types (a.tiff, a photo without an extension).
        "other_files": _utf8_names(folder.other_files()),
        # Hidden folders and image-named hidden files, never read: listed, not converted.
        "hidden_entries": _utf8_names(folder.hidden()),
        # Sub-folders with nothing in them: no classes (photos still to come?).
        "empty_folders": _utf8_names(folder.empty),
        # Links back to a folder that holds them (b/loop -> ../b): not followed.
        "folder_loops": _utf8_names(folder.loops()),
        # Links whose target is missing (an unmounted disk): a class may lie behind one.
        "broken_links": _utf8_names(folder.broken),
        "options": {**recorded, "classes": _classes_option(classes_arg)},
    }


def _identical(probed: list[_Probed], stored: dict[str, tuple[str, bytes]]) -> list[list[str]]:
    """Groups of files, sorted, that are not all byte-identical but whose records hold the
    same image (the same pixels saved as .png and .jpg, or with other metadata), where the
    group is in both splits or under more than one class.

    The split keeps byte-identical files together (:func:`split_files`); it is made before
    any file is decoded, so such copies can land apart, and are found here."""
    by_name = {p.file.relpath: p for p in probed}
    groups: dict[bytes, list[str]] = {}
    for name, (_, digest) in stored.items():
        groups.setdefault(digest, []).append(name)
    out = []
    for names in groups.values():
        if len({by_name[n].content for n in names}) < 2:
            continue  # byte-identical (or alone): one side, and duplicates_across_classes
        apart = len({stored[n][0] for n in names}) > 1
        if apart or len({by_name[n].file.label for n in names}) > 1:
            out.append(_utf8_names(sorted(names)))
    return sorted(out)


def _utf8_names(names: Sequence[str]) -> list[str]:
    return [folders.utf8_name(n) for n in names]


def _classes_option(classes) -> list[str] | None:
    if classes is None:
        return None
    return [c.strip() for c in classes.split(",")] if isinstance(classes, str) else list(classes)


def _write_manifest(output: str, manifest: dict) -> None:
    import tensorflow as tf

    temp = folders.join(output, f"{_TEMP_PREFIX}{schema.MANIFEST_NAME}")
    with tf.io.gfile.GFile(temp, "w") as f:
        f.write(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")
    _rename(temp, folders.join(output, schema.MANIFEST_NAME))


def read_manifest(path: str | os.PathLike) -> dict:
    """The manifest of a records folder (or of the ``manifest.json`` path itself).

    Raises:
        PetalError: no manifest (not a records folder, or an interrupted conversion), a
            damaged one (``schema.check_manifest``), or a remote path that cannot be reached.
    """
    if not isinstance(path, str | os.PathLike) or not str(path):
        raise PetalError(
            "read_manifest needs path as a records folder or its manifest.json (str or Path). "
            f"Received: path={path!r}"
        )
    path = str(folders.expand_home(path))
    if not path.endswith(".json"):
        path = folders.join(path, schema.MANIFEST_NAME)
    if folders.is_remote(path):
        # An unreachable store or an unsupported scheme says so, instead of "no manifest".
        folders.exists(path)
    try:
        text = folders.read_bytes(path).decode("utf-8")
    except (OSError, UnicodeDecodeError) as err:
        folder = os.path.dirname(path)
        who = None
        if isinstance(err, FileNotFoundError) and not folders.is_remote(path):
            # A training run's marker, or one that cannot be read, is no conversion.
            who = running_elsewhere(Path(folder or "."), "converting into it", only=True)
        if who:
            # Said "its conversion did not finish (run petal convert again)".
            raise PetalError(
                f"{folder or '.'} holds no {schema.MANIFEST_NAME} yet: {who}; wait for it "
                "to end, then run this again."
            ) from None
        raise PetalError(
            f"No readable {schema.MANIFEST_NAME} at {path}: not a petal records folder, or "
            f"its conversion did not finish (run petal convert again). ({err})"
        ) from None
    try:
        manifest = json.loads(text)
    except json.JSONDecodeError as err:
        raise PetalError(f"{path} is not valid JSON ({err}); convert again.") from None
    return schema.check_manifest(manifest, path)


def summary_dict(summary: ConvertSummary) -> dict:
    """The summary as plain data (for JSON), without the manifest."""
    out = asdict(summary)
    out.pop("manifest")
    out["images_per_second"] = summary.images_per_second
    return out
