"""Shared test fixtures: tiny real data drawn from ../shared/data, never copied into the repo.

Fixtures are added here by each area with str_replace edits only (several people edit this
file); keep each fixture small and session-scoped where it builds something expensive.
"""

from __future__ import annotations

import io
import os
import signal
from pathlib import Path

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("PETAL_SHARED_DATA", REPO.parent / "shared" / "data"))
FLOWERS = SHARED_DATA / "flowers"
ORIGINALS = SHARED_DATA / "flowers-originals"
CLASSES = ["daisy", "dandelion", "roses", "sunflowers", "tulips"]


def _link_subset(src: Path, dst: Path, per_class: int) -> Path:
    """A folder of class sub-folders holding symlinks to the first `per_class` images of each."""
    if not src.is_dir():
        pytest.skip(f"sample data not found at {src} (set PETAL_SHARED_DATA)")
    for cls in CLASSES:
        (dst / cls).mkdir(parents=True, exist_ok=True)
        for f in sorted((src / cls).iterdir())[:per_class]:
            (dst / cls / f.name).symlink_to(f)
    return dst


@pytest.fixture(scope="session")
def flowers_dir() -> Path:
    """The full 224x224 flowers folder (3,119 images). Read only."""
    if not FLOWERS.is_dir():
        pytest.skip(f"sample data not found at {FLOWERS}")
    return FLOWERS


@pytest.fixture(scope="session")
def originals_dir() -> Path:
    """40 original-resolution photos per class (sizes and aspect ratios vary). Read only."""
    if not ORIGINALS.is_dir():
        pytest.skip(f"sample data not found at {ORIGINALS}")
    return ORIGINALS


@pytest.fixture(scope="session")
def small_flowers(tmp_path_factory) -> Path:
    """12 real 224x224 photos per class (60 in all), as symlinks in a temporary folder."""
    return _link_subset(FLOWERS, tmp_path_factory.mktemp("small_flowers"), 12)


@pytest.fixture(scope="session")
def small_originals(tmp_path_factory) -> Path:
    """6 original-resolution photos per class (30 in all), as symlinks."""
    return _link_subset(ORIGINALS, tmp_path_factory.mktemp("small_originals"), 6)


# --- records (issue 2) ------------------------------------------------------------------------


@pytest.fixture(scope="session")
def small_records(small_flowers, tmp_path_factory) -> Path:
    """`small_flowers` converted by `petal.data.convert`: 64x64 JPEG, seed 0, 2 shards per split.

    60 records: train 50 (10 per class), validation 10 (2 per class). Read only.
    """
    from petal.data import convert

    out = tmp_path_factory.mktemp("small_records") / "records"
    convert(small_flowers, out, image_size=64, seed=0, shards=2, workers=1, progress=False)
    return out


def tiny_config(records: Path, **changes):
    """The quick preset shrunk to seconds: 32 px, batch 10, 2 steps per epoch, float32, and
    its squeezenet cut to one fire module (BatchNorm and all) unless ``changes`` name the
    model or its options: Keras traces the train step in about half the time."""
    from petal.training.config import get_preset

    base = dict(
        data=str(records),
        image_size=32,
        epochs=2,
        batch_size=10,
        steps_per_epoch=2,
        precision="float32",
        tensorboard=False,
    )
    if "model" not in changes and "model_options" not in changes:
        base["model_options"] = {"fires": [[8, 16]]}
    return get_preset("quick").replace(**{**base, **changes})


@pytest.fixture(scope="session")
def trained(small_records, tmp_path_factory) -> Path:
    """One short run: 64 px records trained at 32 px (so inference must resize too).

    Shared by the evaluation tests, which write eval/, plots/, export/ and report.html into
    it, and the bad-input tests of predict, export and report, which damage only copies.
    The quick preset's squeezenet cut to one fire module (BatchNorm and all, traced in half
    the time).
    """
    from petal.training.loop import train

    workdir = tmp_path_factory.mktemp("eval_run") / "run"
    cfg = tiny_config(small_records, epochs=1, steps_per_epoch=3)
    train(cfg, workdir, log=lambda line: None)
    return workdir


def image_ids(dataset) -> list[int]:
    """Image ids (pixel (0, 0) of `write_test_records` raw records) of every dataset element."""
    import numpy as np

    out = []
    for images, _ in dataset:
        px = images.numpy()[:, 0, 0, :2].astype(np.int64)
        out += list(px[:, 0] + 256 * px[:, 1])
    return out


# --- training: interrupted and resumed runs --------------------------------------------


class Interrupt(Exception):
    """What :func:`interrupt_at`'s log function raises."""


def interrupt_at(prefix: str):
    """A log function that raises when the line for ``prefix`` (e.g. "epoch 2/3") is logged.

    The epoch line is printed once that epoch's checkpoint is saved (Ctrl-C just after a
    line once lost its epoch): this leaves the work directory as Ctrl-C after the line.
    """

    def log(line: str) -> None:
        if line.startswith(prefix):
            raise Interrupt(line)

    return log


def _quiet(line: str) -> None:
    pass


def whole_and_resumed_at_epoch_1(cfg, tmp_path):
    """The (loss, accuracy, val_loss, val_accuracy) rows of ``cfg`` trained without a stop,
    and of ``cfg`` interrupted during epoch 1 and resumed."""
    from petal.training.callbacks import read_history
    from petal.training.loop import train

    train(cfg, tmp_path / "whole", log=_quiet)
    with pytest.raises(Interrupt):
        train(cfg, tmp_path / "resumed", log=interrupt_at("epoch 1/3"))
    train(cfg, tmp_path / "resumed", resume=True, log=_quiet)
    measured = ("loss", "accuracy", "val_loss", "val_accuracy")
    return (
        [[row[k] for k in measured] for row in read_history(tmp_path / run / "history.csv")]
        for run in ("whole", "resumed")
    )


def corrupt_record(path: Path, record: int) -> None:
    """Flip one byte inside record number ``record`` of a TFRecord file (breaks its data CRC)."""
    data = bytearray(path.read_bytes())
    offset = 0
    for _ in range(record):
        offset += 12 + int.from_bytes(data[offset : offset + 8], "little") + 4
    data[offset + 12 + 40] ^= 0xFF
    path.write_bytes(bytes(data))


def link_photos(src: Path, dst: Path, per_class: int, classes: int | None = None) -> Path:
    """A folder ``dst`` of ``per_class`` of ``src``'s photos in each of its first ``classes``
    classes (all by default), as links to them."""
    for cls in sorted(p.name for p in src.iterdir())[:classes]:
        (dst / cls).mkdir(parents=True)
        for f in sorted((src / cls).iterdir())[:per_class]:
            (dst / cls / f.name).symlink_to(f.resolve())
    return dst


def break_image(path: Path, record: int) -> None:
    """Replace the image bytes of record number ``record`` of a TFRecord file with as many
    bytes that are no image: the CRC is sound (the file is rewritten), the decode fails,
    and the shard keeps the size its manifest says."""
    import tensorflow as tf

    examples = [tf.train.Example.FromString(r.numpy()) for r in tf.data.TFRecordDataset(str(path))]
    image = examples[record].features.feature["image"].bytes_list.value
    image[0] = b"x" * len(image[0])
    with tf.io.TFRecordWriter(str(path)) as writer:
        for example in examples:
            writer.write(example.SerializeToString())


# --- input pipeline (B): synthetic records with known contents ------------------------------


def interrupt_when_called(monkeypatch, owner, name: str) -> None:
    """Ctrl-C (SIGINT) as ``owner.name`` is called, which then runs: the signal arrives in
    the middle of the work that calls it."""
    original = getattr(owner, name)

    def interrupted(*args, **kwargs):
        signal.raise_signal(signal.SIGINT)
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, interrupted)


class Terminal(io.StringIO):
    """A stream that says it is a terminal: stderr as a user watching sees it."""

    def isatty(self) -> bool:
        return True


def keep_only(folder: Path, keys=("image", "class")) -> Path:
    """Rewrite every ``*.tfrec`` in ``folder`` with only ``keys`` of each record (Kaggle's
    copy of the codelab's shards holds image and class alone)."""
    import tensorflow as tf

    for shard in sorted(folder.glob("*.tfrec")):
        records = tf.data.TFRecordDataset(str(shard))
        examples = [tf.train.Example.FromString(r.numpy()) for r in records]
        with tf.io.TFRecordWriter(str(shard)) as writer:
            for example in examples:
                feature = example.features.feature
                for key in [k for k in feature if k not in keys]:
                    del feature[key]
                writer.write(example.SerializeToString())
    return folder


def edit_record(path: Path, record: int, edit) -> None:
    """Rewrite the TFRecord file ``path`` with ``edit(features)`` applied to record number
    ``record`` (its ``tf.train.Example``'s feature map, changed in place): every frame is
    sound, the record says something else."""
    import tensorflow as tf

    examples = [tf.train.Example.FromString(r.numpy()) for r in tf.data.TFRecordDataset(str(path))]
    edit(examples[record].features.feature)
    with tf.io.TFRecordWriter(str(path)) as writer:
        for example in examples:
            writer.write(example.SerializeToString())


def relabel_after(folder: Path, first: int, label: int) -> Path:
    """Rewrite every ``*.tfrec`` in ``folder`` giving record ``first`` and those after it in
    each shard class ``label`` (a class that the first records of a shard never show)."""
    import tensorflow as tf

    for shard in sorted(folder.glob("*.tfrec")):
        records = tf.data.TFRecordDataset(str(shard))
        examples = [tf.train.Example.FromString(r.numpy()) for r in records]
        with tf.io.TFRecordWriter(str(shard)) as writer:
            for k, example in enumerate(examples):
                if k >= first:
                    example.features.feature["class"].int64_list.value[:] = [label]
                writer.write(example.SerializeToString())
    return folder


def write_test_records(
    folder: Path,
    *,
    counts: dict[str, list[int]] | None = None,
    size: tuple[int, int] | None = (16, 16),
    fmt: str | None = None,
    classes: tuple[str, ...] = tuple(CLASSES),
    codelab: bool = False,
    manifest: bool = True,
    sizes: list[tuple[int, int]] | None = None,
) -> Path:
    """Writes shards (petal names + manifest, or codelab names ``flowersNN-COUNT.tfrec``).

    Image ``i`` (numbered across all shards) has pixel (0, 0) = (i % 256, i // 256, label * 40)
    and a flat colour elsewhere, so readers can tell exactly which images came out (use
    ``normalization="raw"``; exact with ``fmt="raw"``, the default but for codelab shards,
    which are JPEG). Label = i % len(classes).
    ``sizes`` gives each image its own size (image_size null in the manifest). With
    ``codelab=True`` pass ``counts={"all": [...]}``: one series of codelab-named shards.
    """
    import hashlib
    import json

    import numpy as np
    import tensorflow as tf

    counts = counts or {"train": [7, 6], "validation": [5]}
    fmt = fmt or ("jpeg" if codelab else "raw")  # the codelab's are JPEG (raw: refused)
    folder.mkdir(parents=True, exist_ok=True)
    feature = tf.train.Feature
    index = 0
    splits = {}
    for split, shard_counts in counts.items():
        shards = []
        for k, n in enumerate(shard_counts):
            if codelab:
                # The codelab's names: one numbered series, split later by file position.
                name = f"flowers{k:02d}-{n}.tfrec"
            else:
                name = f"{split}-{k:05d}-of-{len(shard_counts):05d}-{n}.tfrec"
            path = folder / name
            with tf.io.TFRecordWriter(str(path)) as writer:
                for _ in range(n):
                    label = index % len(classes)
                    h, w = sizes[index] if sizes else size
                    pixels = np.full((h, w, 3), 60 + 30 * label, np.uint8)
                    pixels[0, 0] = (index % 256, index // 256, label * 40)
                    data = (
                        pixels.tobytes()
                        if fmt == "raw"
                        else tf.io.encode_jpeg(pixels, quality=95).numpy()
                    )
                    one_hot = [float(c == label) for c in range(len(classes))]
                    feats = {
                        "image": feature(bytes_list=tf.train.BytesList(value=[data])),
                        "class": feature(int64_list=tf.train.Int64List(value=[label])),
                        "label": feature(
                            bytes_list=tf.train.BytesList(value=[classes[label].encode()])
                        ),
                        "size": feature(int64_list=tf.train.Int64List(value=[h, w])),
                        "one_hot_class": feature(float_list=tf.train.FloatList(value=one_hot)),
                    }
                    if not codelab:
                        feats["filename"] = feature(
                            bytes_list=tf.train.BytesList(
                                value=[f"{classes[label]}/{index}.png".encode()]
                            )
                        )
                        feats["original_size"] = feature(
                            int64_list=tf.train.Int64List(value=[h, w])
                        )
                    example = tf.train.Example(features=tf.train.Features(feature=feats))
                    writer.write(example.SerializeToString())
                    index += 1
            data = path.read_bytes()
            shards.append(
                {
                    "file": name,
                    "count": n,
                    "bytes": len(data),
                    "sha256": hashlib.sha256(data).hexdigest(),
                }
            )
        splits[split] = {"count": sum(shard_counts), "shards": shards}
    if manifest and not codelab:
        (folder / "manifest.json").write_text(
            json.dumps(
                {
                    "classes": list(classes),
                    "image_size": list(size) if size and not sizes else None,
                    "format": fmt,
                    "resize": "fill" if size and not sizes else "none",
                    "quality": 95,
                    "seed": 0,
                    "val_fraction": 0.19,
                    "splits": splits,
                    "created": "test",
                }
            )
        )
    return folder


@pytest.fixture
def make_records(tmp_path):
    """``make_records(name="records", **kw)`` -> folder written by :func:`write_test_records`."""

    def make(name: str = "records", **kw) -> Path:
        return write_test_records(tmp_path / name, **kw)

    return make


UNPREDICTED = ": the model predicted no image as "


def settled(lines) -> list[str]:
    """Warning lines (a list, or text) less the one naming the classes the model never
    predicted: which those are depends on how the barely trained test model came out."""
    lines = lines.splitlines() if isinstance(lines, str) else lines
    return [line for line in lines if UNPREDICTED not in line]


def run_script(script: Path, timeout: int = 120):
    """Runs a Python script in a session (process group) of its own, so a signal it sends
    to its group reaches no one else; returns the completed process (text output)."""
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=timeout,
        start_new_session=True,
    )


def titles_apart(fig) -> list:
    """The axes titles and texts (suptitle) of ``fig``, once checked to lie inside the
    figure and apart from each other."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    texts = [ax.title for ax in fig.axes if ax.get_title()] + [t for t in fig.texts if t.get_text()]
    boxes = [t.get_window_extent(renderer) for t in texts]
    for i, box in enumerate(boxes):
        assert box.x0 >= 0 and box.x1 <= fig.bbox.width and box.y1 <= fig.bbox.height, (
            texts[i].get_text())
        for j in range(i):
            assert not box.overlaps(boxes[j]), (texts[i].get_text(), texts[j].get_text())
    return texts


# A test that runs past HANG_S seconds has hung (the slowest take about a minute): its process
# writes every thread's stack and exits, so the test fails and the suite goes on in a new test
# process, instead of stalling CI until CI's own limit with nothing said. Under xdist a test
# process's stderr is not shown, so the stacks go to a folder the main process prints at the
# end; with -n 0 they go to stderr and the run stops. PETAL_TEST_HANG_S sets the limit (0:
# none).
HANG_S = float(os.environ.get("PETAL_TEST_HANG_S", "600"))
_HANGS = "PETAL_TEST_HANGS"


def pytest_configure(config):
    import tempfile

    if not hasattr(config, "workerinput"):  # the main process: its test processes inherit it
        os.environ[_HANGS] = os.path.join(tempfile.gettempdir(), f"petal-test-hangs-{os.getpid()}")
        _requeue_only_what_is_left()
    else:
        _share_the_cores(int(config.workerinput.get("workercount", 1)))


def _share_the_cores(workers: int) -> None:
    """Each test process's TensorFlow sized its thread pools for every core, so on 2 cores
    two test processes ran 4 busy threads or more that fought over the cores (session 39's
    suite times in benchmarks/README.md). Each test process now gets its share of the
    cores, and the programs a test starts inherit it. Set TF_NUM_INTRAOP_THREADS or
    TF_NUM_INTEROP_THREADS to choose otherwise; tf.data keeps its own pool."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    share = max(1, (cores or 1) // max(1, workers))
    os.environ.setdefault("TF_NUM_INTRAOP_THREADS", str(share))
    # One inter-op thread can deadlock ops that wait on another (tensorflow#38969).
    os.environ.setdefault("TF_NUM_INTEROP_THREADS", str(max(2, share)))


def _requeue_only_what_is_left() -> None:
    """pytest-xdist's --dist loadfile (3.8) gives the files of a test process that ended (a
    hang, above) back to the queue whole, and the run then stalled: the test that hung ran
    again, files it had finished went back empty, and a new test process given one file with
    one test left waited for a next test, for ever. After such an end, here, the test that
    hung counts as done (it failed), only files with tests left go back, and a test process
    takes files until it has more than two tests or none is left, then is told to finish.
    Runs without a hang are scheduled as xdist does. Left alone where xdist's scheduler is
    not the one known."""
    try:
        from xdist.scheduler.loadscope import LoadScopeScheduling as Scheduler
    except ImportError:
        return
    known = ("remove_node", "_reschedule", "_split_scope", "_pending_of", "_assign_work_unit")
    if getattr(Scheduler, "_petal_requeue", False) or not all(hasattr(Scheduler, n) for n in known):
        return
    remove_node, reschedule = Scheduler.remove_node, Scheduler._reschedule

    def remove_crashed(self, node):
        workload = self.assigned_work.get(node, {})
        left = [test for tests in workload.values() for test, done in tests.items() if not done]
        if not left:
            return remove_node(self, node)
        self._petal_crashed = True
        del self.assigned_work[node]
        crashed = left[0]  # in order: the test running when the process ended
        workload[self._split_scope(crashed)][crashed] = True
        self.workqueue.update(
            (scope, tests) for scope, tests in workload.items() if not all(tests.values())
        )
        for other in self.assigned_work:
            self._reschedule(other)
        return crashed

    def reschedule_after_a_crash(self, node):
        if not getattr(self, "_petal_crashed", False) or node.shutting_down:
            return reschedule(self, node)
        while self.workqueue and self._pending_of(self.assigned_work[node]) <= 2:
            self._assign_work_unit(node)
        if not self.workqueue and self._pending_of(self.assigned_work[node]) <= 1:
            node.shutdown()  # it runs its last test once told there is no next one

    Scheduler.remove_node, Scheduler._reschedule = remove_crashed, reschedule_after_a_crash
    Scheduler._petal_requeue = True


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    import threading

    if HANG_S <= 0:
        yield
        return
    timer = threading.Timer(HANG_S, _hung, (item,))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def _hung(item) -> None:
    """Write that ``item`` hung and every thread's stack, then end this process: into the
    main process's folder from an xdist test process, else to stderr."""
    import faulthandler

    head = f"\n{item.nodeid} ran for more than {HANG_S:.0f} s (PETAL_TEST_HANG_S): it hung.\n"
    if hasattr(item.config, "workerinput") and os.environ.get(_HANGS):
        folder = Path(os.environ[_HANGS])
        folder.mkdir(exist_ok=True)
        with open(folder / f"hung-{os.getpid()}.txt", "w") as out:
            out.write(head)
            out.flush()
            faulthandler.dump_traceback(file=out, all_threads=True)
    else:
        capture = item.config.pluginmanager.getplugin("capturemanager")
        if capture is not None:
            capture.suspend_global_capture(in_=True)  # the terminal's own stderr again
        os.write(2, head.encode())
        faulthandler.dump_traceback(file=2, all_threads=True)
    os._exit(1)


def pytest_terminal_summary(terminalreporter):
    folder = os.environ.get(_HANGS)
    hung = sorted(Path(folder).glob("hung-*.txt")) if folder else []  # none: no folder
    if hung:
        terminalreporter.section("tests that hung: every thread's stack")
        for path in hung:
            terminalreporter.write(path.read_text(errors="replace"))
