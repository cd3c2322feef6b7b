"""Training and evaluation datasets: shapes, counts, splits, determinism, caching, sharding."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import textwrap
from collections import Counter

import numpy as np
import pytest
import tensorflow as tf

from petal.data import pipeline
from petal.data.pipeline import eval_dataset, steps_per_epoch, train_dataset
from petal.data.reader import open_source
from petal.errors import PetalError

COUNTS = {"train": [7, 6, 6], "validation": [5, 4]}  # 19 train (ids 0..18), 9 validation


def _ids(images) -> list[int]:
    px = np.asarray(images)[:, 0, 0, :2].astype(np.int64)
    return list(px[:, 0] + 256 * px[:, 1])


def _all_ids(dataset, steps=None) -> list[int]:
    out = []
    for images, _ in dataset.take(steps) if steps else dataset:
        out += _ids(images)
    return out


@pytest.fixture
def records(make_records):
    return make_records(counts=COUNTS)


def test_pipelines_run_without_the_autotune_thread_that_delays_dropping_an_iterator(records):
    """Dropping an iterator waited for tf.data's autotune thread, which could sleep out its
    optimisation period (up to 60 s): in the suite, single tests waited up to 47 s."""
    for ds in (train_dataset(str(records), batch_size=4, seed=1),
               train_dataset(str(records), batch_size=4),
               eval_dataset(str(records), batch_size=4)):
        assert ds.options().autotune.enabled is False
        images, _ = next(iter(ds))
        assert images.shape == (4, 16, 16, 3)


def test_train_shapes_dtypes_and_labels(records):
    ds = train_dataset(str(records), batch_size=4, seed=1)
    spec_images, spec_labels = ds.element_spec
    assert spec_images.shape == (4, 16, 16, 3) and spec_images.dtype == tf.float32
    assert spec_labels.shape == (4, 5) and spec_labels.dtype == tf.float32
    images, labels = next(iter(ds))
    assert float(tf.reduce_min(images)) >= 0.0 and float(tf.reduce_max(images)) <= 1.0
    np.testing.assert_allclose(labels.numpy().sum(axis=1), 1.0)

    sparse = train_dataset(
        str(records), batch_size=4, label_mode="sparse", augment=None, seed=1, normalization="raw"
    )
    images, labels = next(iter(sparse))
    assert labels.dtype == tf.int32 and labels.shape == (4,)
    # Label of test image i is i % 5.
    np.testing.assert_array_equal(labels.numpy(), np.array(_ids(images)) % 5)


@pytest.mark.parametrize(
    ("normalization", "lo", "hi"),
    [("unit", 0.0, 1.0), ("symmetric", -1.0, 1.0), ("raw", 0.0, 255.0), ("imagenet", -2.2, 2.7)],
)
def test_normalization_ranges(normalization, lo, hi):
    values = pipeline.normalize(tf.constant([[[[0, 128, 255]]]], tf.uint8), normalization)
    assert values.dtype == tf.float32
    slack = 1e-6 if normalization == "imagenet" else 0.0  # the others: exactly in range
    assert lo - slack <= float(tf.reduce_min(values)) and float(tf.reduce_max(values)) <= hi + slack
    white = pipeline.normalize(tf.fill([1, 1, 3], tf.constant(255, tf.uint8)), normalization)
    expected = {"unit": 1.0, "symmetric": 1.0, "raw": 255.0, "imagenet": (1 - 0.406) / 0.225}
    assert float(white[0, 0, 2]) == pytest.approx(expected[normalization], abs=1e-5)


@pytest.mark.parametrize("normalization", ["unit", "symmetric"])
def test_the_pipeline_keeps_normalised_pixels_in_range(normalization):
    # The batches' XLA-compiled pass once fused "x / 127.5 - 1" into 1.0000001 for 255.
    finish = pipeline._finish_fn(2, "sparse", normalization, None, 0)
    pixels = tf.constant([0, 1, 127, 128, 254, 255] * 8, tf.uint8)
    ds = tf.data.Dataset.from_tensors((tf.reshape(pixels, [2, 4, 2, 3]), tf.constant([0, 1])))
    images, _ = next(iter(ds.enumerate().map(finish)))
    lo = 0.0 if normalization == "unit" else -1.0
    assert float(tf.reduce_min(images)) == lo and float(tf.reduce_max(images)) == 1.0


def test_eval_counts_every_image_once_and_splits_never_overlap(records):
    ids = _all_ids(eval_dataset(str(records), batch_size=4, normalization="raw"))
    assert sorted(ids) == list(range(19, 28))  # 9 images: batches 4, 4, 1; none dropped
    train_ids = set(
        _all_ids(
            train_dataset(str(records), batch_size=4, normalization="raw", augment=None, seed=0),
            steps=20,
        )
    )
    assert train_ids == set(range(19)) and not train_ids & set(ids)


def test_train_epochs_cover_the_split(records):
    # 19 images, batch 19: each batch is exactly one epoch, reshuffled.
    ds = train_dataset(str(records), batch_size=19, augment=None, normalization="raw", seed=3)
    epochs = [sorted(_ids(x)) for x, _ in ds.take(3)]
    assert all(e == list(range(19)) for e in epochs)
    orders = [tuple(_ids(x)) for x, _ in ds.take(2)]
    assert orders[0] != orders[1]


def test_auto_does_not_cache_on_a_temporary_folder_in_memory(
    records, tmp_path, monkeypatch, caplog
):
    """Where /tmp is a tmpfs (Fedora, Arch), the images that did not fit in RAM were cached
    "on local disk" there: back in the memory found short."""
    from petal.data import pipeline
    from petal.data.reader import open_source

    mounts = tmp_path / "mounts"
    mounts.write_text(
        "/dev/sda1 / ext4 rw 0 0\n"
        f"tmpfs {tmp_path}/ram tmpfs rw 0 0\n"
        f"/dev/sdb1 {tmp_path}/ram/disk\\040here ext4 rw 0 0\n"
        # The kernel escapes a tab, a newline and a backslash too (only \040 was read).
        f"/dev/sdc1 {tmp_path}/ram/a\\011b\\134c\\012d ext4 rw 0 0\n"
    )
    (tmp_path / "ram" / "disk here").mkdir(parents=True)
    (tmp_path / "ram" / "a\tb\\c\nd").mkdir(parents=True)
    assert pipeline._memory_file_system(f"{tmp_path}/ram/a\tb\\c\nd/x", str(mounts)) is None
    assert pipeline._memory_file_system(f"{tmp_path}/ram/petal-cache", str(mounts)) == "tmpfs"
    assert pipeline._memory_file_system(f"{tmp_path}/ram/disk here/x", str(mounts)) is None
    assert pipeline._memory_file_system(f"{tmp_path}/elsewhere", str(mounts)) is None
    assert pipeline._memory_file_system("/x", str(tmp_path / "none")) is None  # no table

    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(pipeline, "_available_memory", lambda: 1000)  # nothing fits
    src = open_source(str(records))
    for kind, cached in (("tmpfs", None), (None, "disk")):
        monkeypatch.setattr(pipeline, "_memory_file_system", lambda folder, kind=kind: kind)
        choice = pipeline.auto_cache_choice(src, "train", (16, 16))
        got = pipeline._resolve_cache("auto", src, "train", (16, 16), None)
        if cached is None:
            assert got is None and choice.startswith("nowhere: ") and "(tmpfs)" in choice
            assert "decoded again each epoch (TMPDIR=a folder on disk caches them there)" \
                in choice
        else:
            assert got and choice.startswith("on local disk in ")
    # cache="disk" asked for in so many words still writes there, but says it is memory.
    import logging

    monkeypatch.setattr(pipeline, "_WARNED_IN_MEMORY", set())
    seen = set()
    for kind in ("ramfs", "ramfs", None):  # said once, not for each phase or pipeline
        monkeypatch.setattr(pipeline, "_memory_file_system", lambda folder, kind=kind: kind)
        with caplog.at_level(logging.WARNING, logger="petal.data.pipeline"):
            caplog.clear()
            assert pipeline._resolve_cache("disk", src, "train", (16, 16), None)
        said = [r.getMessage() for r in caplog.records if "cache='disk'" in r.getMessage()]
        assert len(said) == (kind is not None and kind not in seen), said
        if said:
            assert f"{tmp_path}/petal-cache is in memory (ramfs)" in said[0]
            assert said[0].endswith("set TMPDIR to a folder on disk, or use cache='off'.")
        seen.add(kind)


def test_a_disk_cache_of_a_killed_run_is_removed_by_the_next(records, tmp_path, monkeypatch):
    """Only the run's exit removed its disk cache: a run killed outright (SIGKILL, the OOM
    killer) left a decoded copy of its split in the temporary folder for good."""
    import subprocess
    import sys
    import tempfile

    from petal.data import pipeline

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    folder = tmp_path / "petal-cache"
    folder.mkdir()
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    dead = pipeline._owner_mark(int(gone.stdout))
    other_host = "h00000000-p" + gone.stdout.strip()
    names = {
        f"train-0123456789abcdef-{dead}-0badcafe.index": False,
        f"train-0123456789abcdef-{dead}-0badcafe.data-00000-of-00001": False,
        f"train-0123456789abcdef-{dead}-0badcafe_0.lockfile": False,
        f"train-0123456789abcdef-{pipeline._owner_mark()}-0badcafe.index": True,  # running
        f"train-0123456789abcdef-{other_host}-0badcafe.index": True,  # another machine's
        "train-0123456789abcdef-0badcafe.index": True,  # no owner named: kept
        "notes.txt": True,
    }
    for name in names:
        (folder / name).write_bytes(b"x")
    ds = train_dataset(str(records), batch_size=4, seed=1, cache="disk")
    next(iter(ds))
    left = {p.name for p in folder.iterdir()}
    assert {name for name, kept in names.items() if kept} <= left
    assert not {name for name, kept in names.items() if not kept} & left
    # The run's own cache is named as its own: the next run keeps it while this one runs.
    mine = [n for n in left - set(names) if n.endswith(".index")]
    assert mine and all(pipeline._owner_mark() in n for n in mine)
    assert pipeline._remove_orphaned_caches(str(folder)) == []


@pytest.mark.parametrize("cache", ["off", "ram", "disk"])
def test_seeded_pipeline_is_reproducible(records, cache, tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))

    def run(seed):
        ds = train_dataset(
            str(records), batch_size=4, seed=seed, cache=cache, augment="codelab+crop"
        )
        return [x.numpy() for x, _ in ds.take(6)]  # more than one epoch

    first, second, other = run(7), run(7), run(8)
    for a, b in zip(first, second, strict=True):
        np.testing.assert_array_equal(a, b)
    assert any(not np.array_equal(a, b) for a, b in zip(first, other, strict=True))


@pytest.mark.parametrize(
    ("cache", "image_size"),
    [("off", None), ("off", 12), ("ram", None)],  # records decoded by batch, by image; cached
)
def test_a_seeded_pipeline_started_at_a_step_yields_the_batches_it_would_have_reached(
    records, cache, image_size
):
    # What a resumed training run reads: the batches an uninterrupted run trains on from
    # there, augmentation included (it used to restart the shuffles and the draws).
    kw = dict(
        batch_size=4,
        seed=7,
        cache=cache,
        image_size=image_size,
        augment="codelab",
        shuffle_buffer=8,
        normalization="raw",
    )
    # 19 images: 4 batches a pass. Steps 4 and 8 start passes, 6 and 9 fall inside one.
    whole = [(x.numpy(), y.numpy()) for x, y in train_dataset(str(records), **kw).take(14)]
    for start in (4, 6, 8, 9):
        resumed = train_dataset(str(records), start_step=start, **kw)
        for (x, y), (want_x, want_y) in zip(resumed, whole[start:], strict=False):
            np.testing.assert_array_equal(x.numpy(), want_x, err_msg=f"start_step={start}")
            np.testing.assert_array_equal(y.numpy(), want_y, err_msg=f"start_step={start}")
    if image_size is not None:
        return  # resized: pixel (0, 0) no longer names the image
    # Each pass still covers 16 of the 19 images, in an order of its own.
    plain = {**kw, "augment": None}
    passes = [
        sum((_ids(x) for x, _ in train_dataset(str(records), **plain).skip(4 * k).take(4)), [])
        for k in range(2)
    ]
    assert all(len(set(p)) == 16 and set(p) <= set(range(19)) for p in passes)
    assert passes[0] != passes[1]


@pytest.mark.parametrize("cache", ["off", "ram"])
def test_a_seeded_pipeline_reads_the_same_whatever_the_global_seed(records, cache):
    # A training run sets the global seed after it builds its input: a second run in the
    # same process (or a resumed one) built it under another global seed.
    kw = dict(batch_size=4, seed=7, cache=cache, augment="codelab", normalization="raw")
    seen = []
    try:
        for global_seed in (None, 0, 123):
            tf.random.set_seed(global_seed)
            seen.append([x.numpy() for x, _ in train_dataset(str(records), **kw).take(10)])
    finally:
        tf.random.set_seed(None)
    for other in seen[1:]:
        for a, b in zip(seen[0], other, strict=True):
            np.testing.assert_array_equal(a, b)


def test_a_resumed_pipeline_fills_its_cache_once(small_flowers, monkeypatch):
    fits = []
    fit_file = pipeline._fit_file
    monkeypatch.setattr(
        pipeline, "_fit_file", lambda *a, **kw: fits.append(1) or fit_file(*a, **kw)
    )
    src = open_source(str(small_flowers))
    per_pass = src.count("train") // 8
    ds = train_dataset(
        src, batch_size=8, image_size=16, seed=1, cache="ram", augment=None, start_step=3
    )
    for _ in ds.take(3 * per_pass):  # into a third pass
        pass
    assert len(fits) == src.count("train")  # decoded once, not once a pass


def test_cache_modes_yield_the_same_images(records, tmp_path):
    seen = {}
    for cache in ["off", "ram", str(tmp_path / "cache")]:
        ds = train_dataset(
            str(records), batch_size=19, seed=0, cache=cache, augment=None, normalization="raw"
        )
        seen[cache] = [sorted(_ids(x)) for x, _ in ds.take(2)]
    assert seen["off"] == seen["ram"] == seen[str(tmp_path / "cache")]
    assert any(p.name.startswith("train-") for p in (tmp_path / "cache").iterdir())
    # Every cache gives a seed's batches, order and augmentation (train_dataset's docstring);
    # "off" shuffles the shards' order too.
    batches = {
        cache: [np.asarray(x) for x, _ in train_dataset(
            str(records), batch_size=4, seed=3, cache=cache, normalization="raw").take(6)]
        for cache in ["ram", "disk", str(tmp_path / "cache"), "off"]
    }  # fmt: skip
    ram, disk, folder, off = (np.stack(b) for b in batches.values())
    assert np.array_equal(ram, disk) and np.array_equal(ram, folder)
    assert not np.array_equal(ram, off)


def test_a_folder_cache_holds_pixels_of_one_fitting_and_one_version_of_the_photos(
    small_originals, tmp_path, monkeypatch
):
    """Keyed on the resize mode, the fitting size and an image folder's file sizes and times:
    'fill' read 'pad' pixels from a cache written before, and edited photos their old ones.
    "RAM" is the RAM cache, not a folder of that name."""
    import shutil

    photos = tmp_path / "photos"
    shutil.copytree(small_originals, photos, symlinks=False)
    cache = tmp_path / "cache"

    def read(resize, **options):
        ds = eval_dataset(str(photos), batch_size=64, image_size=24, normalization="raw",
                          split="all", resize=resize, **options)  # fmt: skip
        return np.concatenate([np.asarray(x) for x, _ in ds])

    for resize in ("pad", "fill"):
        assert np.array_equal(read(resize, cache=str(cache)), read(resize))
    first = sorted(p for p in photos.rglob("*") if p.is_file())[0]
    second = sorted(p for p in photos.rglob("*") if p.is_file())[-1]
    first.write_bytes(second.read_bytes())  # the photo edited: another one saved over it
    assert np.array_equal(read("fill", cache=str(cache)), read("fill"))
    monkeypatch.chdir(tmp_path)
    read("fill", cache="RAM")
    assert not (tmp_path / "RAM").exists()


@pytest.mark.slow  # 24 s in a loaded suite run (session 40): `pytest -m slow` runs it
def test_a_folder_cache_of_codelab_shards_is_read_again_once_they_are_rewritten(
    make_records, tmp_path
):
    """Codelab shards have no manifest (no conversion time to key on): their files' sizes
    and times are. Shards rewritten under the same names used to give the old pixels."""
    folder = make_records("codelab", counts={"all": [4, 4, 4, 4, 4, 4]}, codelab=True, fmt="jpeg")
    cache = tmp_path / "cache"

    def read(**options):
        ds = eval_dataset(str(folder), batch_size=64, normalization="raw", split="all", **options)
        return np.concatenate([np.asarray(x) for x, _ in ds])

    before = read(cache=str(cache))
    assert np.array_equal(before, read())
    shards = sorted(folder.glob("*.tfrec"))
    first, last = shards[0].read_bytes(), shards[-1].read_bytes()
    shards[0].write_bytes(last)  # same names and counts, other photos
    shards[-1].write_bytes(first)
    after = read()
    assert not np.array_equal(after, before)
    assert np.array_equal(read(cache=str(cache)), after)


def test_a_folder_cache_left_locked_by_a_killed_run_is_named(make_records, tmp_path):
    """TensorFlow's lock file of a cache being written stays when the run is killed: every
    later run failed with its traceback. It is named, with what to delete."""
    folder = make_records("jpeg", counts=COUNTS, fmt="jpeg")
    cache = tmp_path / "cache"

    def read():
        ds = eval_dataset(str(folder), batch_size=64, normalization="raw", cache=str(cache))
        return np.concatenate([np.asarray(x) for x, _ in ds])

    first = read()
    (index,) = cache.glob("*.index")
    prefix = index.with_suffix("")
    for path in cache.iterdir():
        path.unlink()
    lock = cache / f"{prefix.name}_0.lockfile"
    lock.write_text("")  # as a run killed while caching leaves it
    with pytest.raises(PetalError, match=rf"The cache folder {cache} holds the lock of an "
                       r"unfinished cache of this data \(.*_0.lockfile\): another run is "
                       rf"filling it, or one was stopped while it did. If none is running, "
                       rf"delete {prefix}_\* and run again, or pass cache='off'."):
        read()
    lock.unlink()
    assert np.array_equal(read(), first)


def test_a_folder_cache_is_one_per_layout_of_input_pipelines(records, tmp_path):
    """Pipeline 0 of 2 and a single pipeline read different shares: one cache file for both
    lost images (or counted some twice) without a word."""
    cache = str(tmp_path / "cache")

    def ids(pipelines, index=0):
        ctx = tf.distribute.InputContext(
            num_input_pipelines=pipelines, input_pipeline_id=index, num_replicas_in_sync=pipelines
        )
        kw = dict(batch_size=pipelines, normalization="raw", cache=cache)
        return _all_ids(eval_dataset(str(records), input_context=ctx, **kw))

    halves = ids(2, 0) + ids(2, 1)
    assert sorted(halves) == list(range(19, 28))
    assert sorted(ids(1)) == list(range(19, 28))  # all 9, not pipeline 0's share


def test_a_folder_cache_is_refused_with_skip_corrupt(records, tmp_path):
    """A kept cache written while corrupt records were skipped holds fewer images, and a
    later run reading it neither fails nor counts them."""
    with pytest.raises(PetalError, match=r"^skip_corrupt=True with the cache folder \S+cache: "
                       r"records skipped while it is written would not be counted by the runs "
                       r"that read it again; pass cache='ram', 'disk' or 'off'"):  # fmt: skip
        train_dataset(str(records), batch_size=4, cache=str(tmp_path / "cache"), skip_corrupt=True)
    for cache in ("ram", "disk", "off"):  # kept for this run only: its own count stands
        train_dataset(str(records), batch_size=4, cache=cache, skip_corrupt=True)


def test_a_cache_folder_that_cannot_be_written_is_named(records, tmp_path):
    (tmp_path / "file").write_text("x")
    for path, why in [
        (tmp_path / "file", "is a file, not a folder"),
        (tmp_path / "file" / "cache", "is a file, not a folder"),
        ("/proc/petal-cache", "nothing can be written in /proc"),
    ]:
        with pytest.raises(PetalError, match=rf"^The cache folder {path} cannot be written: "
                           rf".*{why}.*; pass another folder or cache='off'"):  # fmt: skip
            eval_dataset(str(records), batch_size=4, cache=str(path))


def test_more_bad_arguments_are_named(records):
    src = open_source(str(records))
    bad = [
        (dict(shuffle_buffer="big"), r"shuffle_buffer must be an int >= 0\. Received: "
         r"shuffle_buffer='big'"),  # fmt: skip
        (dict(shuffle_buffer=2.5), r"shuffle_buffer=2\.5"),
        (dict(deterministic="no"), r"deterministic must be True, False or None\. Received: "
         r"deterministic='no'"),  # fmt: skip
        (dict(skip_corrupt="yes"), r"skip_corrupt must be True or False"),
        (dict(input_context="x"), r"input_context must be a tf\.distribute\.InputContext or "
         r"None\. Received: input_context='x'"),  # fmt: skip
    ]
    for kw, message in bad:
        with pytest.raises(PetalError, match=message):
            train_dataset(src, batch_size=2, **kw)
    with pytest.raises(PetalError, match=r"fit_size must be .*Received: fit_size='x'"):
        eval_dataset(src, batch_size=2, fit_size="x")
    for size in [(True, True), (32.9, 32), "8x"]:  # no size, not a whole number
        with pytest.raises(PetalError, match=r"image_size must be a positive int"):
            eval_dataset(src, batch_size=2, image_size=size)
    # numpy integers are ints; choices are not case-sensitive (as augment names are).
    kw = dict(batch_size=np.int64(3), image_size=np.int64(8), normalization="Raw")
    images, _ = next(iter(eval_dataset(src, **kw)))
    assert images.shape == (3, 8, 8, 3) and float(tf.reduce_max(images)) > 1


def test_cache_choices_are_no_folder_names_in_any_case(records, tmp_path, monkeypatch):
    """ "Disk" made a kept cache folder named Disk where the program ran."""
    monkeypatch.chdir(tmp_path)
    for cache in ("Disk", "AUTO", "Off"):
        eval_dataset(str(records), batch_size=4, cache=cache)
    assert [p.name for p in tmp_path.iterdir()] == ["records"]


def test_records_without_a_size_feature_are_named_as_such(make_records):
    """Shards that record no size (the codelab's with only image and class) are not
    "of mixed sizes"."""
    from conftest import keep_only

    folder = keep_only(make_records("cl", counts={"all": [5, 5]}, codelab=True))
    with pytest.raises(PetalError, match=r"record no image size \(no 'size' feature\); pass "
                       r"image_size"):  # fmt: skip
        eval_dataset(str(folder), batch_size=2, split="all")


def test_jpeg_records_and_resize(make_records):
    folder = make_records("jpeg", counts=COUNTS, fmt="jpeg")
    images, _ = next(iter(eval_dataset(str(folder), batch_size=3, normalization="raw")))
    assert images.shape == (3, 16, 16, 3)
    # Flat colour 60 + 30 * label away from pixel (0, 0): JPEG error stays small.
    assert abs(float(images[0, 8, 8, 1]) - (60 + 30 * (19 % 5))) < 4
    small, _ = next(iter(train_dataset(str(folder), batch_size=2, image_size=(8, 12), seed=0)))
    assert small.shape == (2, 8, 12, 3)


def test_simplejpeg_and_tf_decoders_give_the_same_pixels(small_records):
    pytest.importorskip("simplejpeg")
    kw = dict(batch_size=8, augment=None, cache="off", seed=5, normalization="raw")
    batches = {
        decoder: [b.numpy() for b, _ in train_dataset(small_records, decoder=decoder, **kw).take(3)]
        for decoder in ("tf", "simplejpeg")
    }
    for a, b in zip(batches["tf"], batches["simplejpeg"], strict=True):
        assert a.shape == (8, 64, 64, 3)
        np.testing.assert_array_equal(a, b)


def test_simplejpeg_batch_names_a_size_mismatch(small_records):
    pytest.importorskip("simplejpeg")
    blob = next(iter(tf.data.TFRecordDataset(sorted(map(str, small_records.glob("train-*"))))))
    image = tf.io.parse_single_example(blob, {"image": tf.io.FixedLenFeature([], tf.string)})
    blobs = np.array([image["image"].numpy()], dtype=object)
    # Larger than its slot, and smaller than its slot.
    with pytest.raises(ValueError, match="image 0 of the batch is 64x64, the records say 32x32"):
        pipeline._simplejpeg_batch(32, 32)(blobs)
    with pytest.raises(ValueError, match="image 0 of the batch is 64x64, the records say 96x96"):
        pipeline._simplejpeg_batch(96, 96)(blobs)
    with pytest.raises(ValueError):  # not a JPEG: simplejpeg's own error
        pipeline._simplejpeg_batch(64, 64)(np.array([blobs[0], b"not a jpeg"], dtype=object))
    batch = pipeline._simplejpeg_batch(64, 64)(blobs.repeat(3))
    assert batch.shape == (3, 64, 64, 3)
    # Aligned as TensorFlow needs to take the batch without copying it.
    assert batch.ctypes.data % pipeline._TF_ALIGN == 0


@pytest.mark.parametrize("augment", [None, "codelab", "flip"])  # flip keeps uint8 (it failed)
def test_uint8_batches_match_the_float_pipeline(records, augment):
    kw = dict(batch_size=4, augment=augment, seed=3, normalization="raw", label_mode="sparse")
    u8 = train_dataset(str(records), dtype="uint8", **kw)
    assert u8.element_spec[0].dtype == tf.uint8 and u8.element_spec[0].shape == (4, 16, 16, 3)
    floats = train_dataset(str(records), **kw)
    for (a, la), (b, lb) in zip(u8.take(3), floats.take(3), strict=True):
        np.testing.assert_array_equal(la, lb)
        # Same draws: the uint8 batch is the float batch rounded (exact without augmentation).
        diff = np.abs(a.numpy().astype(np.float32) - np.round(b.numpy()))
        assert diff.max() <= (1 if augment == "codelab" else 0)
    images, _ = next(iter(eval_dataset(str(records), batch_size=3, dtype="uint8", normalization="raw")))
    assert images.dtype == tf.uint8
    with pytest.raises(PetalError, match="pass normalization='raw'"):
        train_dataset(str(records), batch_size=4, dtype="uint8")
    with pytest.raises(PetalError, match="dtype must be one of float32, uint8"):
        eval_dataset(str(records), batch_size=4, dtype="float16")
    with pytest.raises(PetalError, match="decoder must be one of tf, simplejpeg"):
        train_dataset(str(records), batch_size=4, decoder="pil")


def test_bad_arguments(records):
    src = open_source(str(records))
    with pytest.raises(PetalError, match="batch_size=0"):
        train_dataset(src, batch_size=0)
    with pytest.raises(PetalError, match="fewer than one batch"):
        train_dataset(src, batch_size=64)
    with pytest.raises(PetalError, match="normalization"):
        eval_dataset(src, batch_size=2, normalization="zscore")
    with pytest.raises(PetalError, match="image_size=-3"):
        eval_dataset(src, batch_size=2, image_size=-3)
    with pytest.raises(PetalError, match="label_mode='one_hot'"):
        train_dataset(src, batch_size=2, label_mode="sparse", augment="mixup")
    with pytest.raises(PetalError, match="Unknown augmentation 'blur'"):
        train_dataset(src, batch_size=2, augment="flip+blur")
    assert steps_per_epoch(src, 4) == 4
    with pytest.raises(PetalError, match=r"has 19 images per input pipeline, fewer than one "
                       r"batch of 64.*Received: batch_size=64$"):  # fmt: skip
        steps_per_epoch(src, 64)  # it was 0: Keras' fit trained nothing


def test_global_batch_must_divide_across_replicas(records):
    ctx = tf.distribute.InputContext(
        num_input_pipelines=1, input_pipeline_id=0, num_replicas_in_sync=8
    )
    with pytest.raises(PetalError, match="nearest valid sizes: 96 or 104"):
        train_dataset(str(records), batch_size=100, input_context=ctx)
    with pytest.raises(PetalError, match="nearest valid sizes: 8"):
        train_dataset(str(records), batch_size=6, input_context=ctx)


@pytest.mark.parametrize("pipelines", [2, 4])  # 3 train files: by file for 2, by record for 4
def test_input_pipelines_share_the_data(records, pipelines):
    train_parts, eval_parts = [], []
    for index in range(pipelines):
        ctx = tf.distribute.InputContext(
            num_input_pipelines=pipelines, input_pipeline_id=index, num_replicas_in_sync=pipelines
        )
        eval_parts.append(
            _all_ids(
                eval_dataset(
                    str(records), batch_size=pipelines, input_context=ctx, normalization="raw"
                )
            )
        )
        ds = train_dataset(
            str(records),
            batch_size=pipelines,
            input_context=ctx,
            augment=None,
            normalization="raw",
            seed=0,
        )
        assert ds.element_spec[0].shape[0] == 1  # per-replica batch
        train_parts.append(set(_all_ids(ds, steps=40)))
    assert sorted(sum(eval_parts, [])) == list(range(19, 28))  # every image exactly once
    assert set().union(*train_parts) == set(range(19))
    for a in range(pipelines):
        for b in range(a + 1, pipelines):
            assert not train_parts[a] & train_parts[b]


def test_input_pipelines_given_shares_of_other_sizes_are_warned_of(make_records, caplog):
    """Three shards read by two pipelines: one read 20 images, the other 10, each a batch
    per step, so the 10 were seen twice as often, without a word."""
    folder = make_records(counts={"train": [10, 10, 10], "validation": [4]})
    for pipelines, said in ((2, True), (3, False)):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="petal.data.pipeline"):
            for index in range(pipelines):
                ctx = tf.distribute.InputContext(pipelines, index, pipelines)
                train_dataset(str(folder), batch_size=pipelines, input_context=ctx)
        warned = [r.getMessage() for r in caplog.records if "input pipelines" in r.getMessage()]
        assert warned == ([
            f"Split 'train' of {folder}: its 3 shards give its 2 input pipelines 10 to 20 "
            "images each (whole shards), and each pipeline gives a batch per step, so the "
            "images of the smallest share are seen 2.0x as often as those of the largest; "
            "convert with --shards a multiple of 2 for equal shares."
        ] if said else [])  # fmt: skip
    # A share of nothing (shards of no record) is refused by the count, not divided by.
    empty = make_records("empty", counts={"train": [10, 0, 10, 0], "validation": [4]})
    train_dataset(str(empty), batch_size=2, input_context=tf.distribute.InputContext(2, 0, 2))
    with pytest.raises(PetalError, match=r"has 0 images per input pipeline"):
        train_dataset(str(empty), batch_size=2, input_context=tf.distribute.InputContext(2, 1, 2))


_STRATEGY_SCRIPT = textwrap.dedent(
    """
    import sys
    import tensorflow as tf

    # Logical devices must be set before TensorFlow initialises its devices.
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    from petal.data.pipeline import distributed_dataset, eval_dataset, train_dataset
    from petal.errors import PetalError

    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    src = sys.argv[1]
    dist = distributed_dataset(
        strategy,
        lambda ctx: train_dataset(src, batch_size=4, input_context=ctx, seed=0,
                                  normalization="raw", augment=None),
    )
    images, labels = next(iter(dist))
    shapes = [tuple(t.shape) for t in strategy.experimental_local_results(images)]
    print("train", shapes, strategy.num_replicas_in_sync)
    dist = distributed_dataset(
        strategy, lambda ctx: eval_dataset(src, batch_size=4, input_context=ctx, normalization="raw")
    )
    seen = []
    for images, _ in dist:
        for part in strategy.experimental_local_results(images):
            px = part.numpy()[:, 0, 0, :2].astype(int)
            seen += list(px[:, 0] + 256 * px[:, 1])
    print("eval", sorted(seen))
    try:
        distributed_dataset(strategy, lambda ctx: train_dataset(src, batch_size=5, input_context=ctx))
    except PetalError as err:
        print("error", err)

    def steps(start, n, skip_corrupt=False):
        # The images of each of n steps from step start: a batch of 2 for each replica.
        dist = distributed_dataset(
            strategy,
            lambda ctx: train_dataset(src, batch_size=4, input_context=ctx, seed=0, augment=None,
                                      normalization="raw", start_step=start,
                                      skip_corrupt=skip_corrupt),
        )
        out = []
        for (images, _), _ in zip(dist, range(n)):
            parts = strategy.experimental_local_results(images)
            px = [p.numpy()[:, 0, 0, :2].astype(int) for p in parts]
            out.append(sorted(int(i) for p in px for i in p[:, 0] + 256 * p[:, 1]))
        return out

    # 19 images: 4 steps of 4 an epoch; each epoch's images distinct, and a run resumed
    # after an epoch yields the steps of one that was not stopped.
    run = steps(0, 12)
    print("epochs", [len({i for s in run[e:e + 4] for i in s}) for e in (0, 4, 8)])
    print("resumed", steps(4, 8) == run[4:], steps(7, 5) == run[7:])
    run = steps(0, 12, skip_corrupt=True)  # (no record is corrupt: the same passes)
    print("skipping", [len({i for s in run[e:e + 4] for i in s}) for e in (0, 4, 8)],
          steps(4, 8, True) == run[4:], steps(7, 5, True) == run[7:])
    """
)


def test_mirrored_strategy_on_two_logical_cpus(records):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""}
    out = subprocess.run(
        [sys.executable, "-c", _STRATEGY_SCRIPT, str(records)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    lines = {
        line.split(" ", 1)[0]: line.split(" ", 1)[1]
        for line in out.stdout.splitlines()
        if line.split(" ", 1)[0] in ("train", "eval", "error", "epochs", "resumed", "skipping")
    }
    assert lines["train"] == "[(2, 16, 16, 3), (2, 16, 16, 3)] 2"
    assert Counter(eval(lines["eval"])) == Counter(range(19, 28))
    assert "nearest valid sizes: 4 or 6" in lines["error"]
    # A pass held 9 batches of one replica's, an epoch 8: epochs drifted across passes,
    # seeing images twice; and a resumed run skipped one replica's batches per step only,
    # replaying half an epoch.
    assert lines["epochs"] == "[16, 16, 16]"
    assert lines["resumed"] == "True True"
    assert lines["skipping"] == "[16, 16, 16] True True"


@pytest.mark.slow  # 34 s in a loaded suite run (session 40): `pytest -m slow` runs it
def test_bench_input_cli(make_records, tmp_path, capsys):
    from petal.cli import main

    folder = make_records("jpeg", counts={"train": [12, 12], "validation": [4]}, fmt="jpeg")
    out = tmp_path / "bench.json"
    code = main(
        [
            "bench",
            "input",
            str(folder),
            "--batch-size",
            "4",
            "--seconds",
            "0.2",
            "--cases",
            "ceiling,jpeg,raw,cached",
            "--json",
            str(out),
            "--png",
            str(tmp_path / "b.png"),
        ]
    )
    assert code == 0
    text = capsys.readouterr().out
    assert "ceiling" in text and "cached+aug" in text and "target cached/jpeg >= 3" in text
    result = json.loads(out.read_text())
    assert {c["name"] for c in result["cases"]} == {
        "ceiling",
        "jpeg",
        "raw",
        "cached",
        "jpeg+aug",
        "raw+aug",
        "cached+aug",
    }
    assert (tmp_path / "b.png").stat().st_size > 0
    assert main(["bench", "input", str(folder), "--cases", "nope"]) == 2


def _records_and_their_photos(make_records, small_flowers, tmp_path):
    """Records of two classes (24 train, 4 validation) and a folder of 3 photos of each."""
    photos = tmp_path / "photos"
    for cls in ("daisy", "roses"):
        (photos / cls).mkdir(parents=True)
        for f in sorted((small_flowers / cls).iterdir())[:3]:
            (photos / cls / f.name).symlink_to(f.resolve())
    records = make_records("jpeg", counts={"train": [12, 12], "validation": [4]}, fmt="jpeg",
                           classes=("daisy", "roses"))
    return records, photos


def test_bench_input_names_an_undecodable_file_of_its_folder(
    make_records, small_flowers, tmp_path, capsys
):
    from petal.cli import main

    records, photos = _records_and_their_photos(make_records, small_flowers, tmp_path)
    (photos / "roses" / "cut.jpg").write_bytes(b"\xff\xd8\xff\xe0 not the rest")
    argv = ["bench", "input", str(records), "--folder", str(photos), "--cases", "folder",
            "--batch-size", "2", "--seconds", "0.2"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"petal bench: error: 1 image(s) in --folder {photos} cannot be decoded, e.g. "
        f"{photos}/roses/cut.jpg: {err[0].split('cut.jpg: ', 1)[1].split(';')[0]}; pass a folder "
        "without them (petal convert skips them and lists them in its manifest)."
    ]
    assert "function_node" not in err[0] and "Iterator::" not in err[0]


def test_bench_input_refuses_a_folder_smaller_than_a_batch_before_timing_anything(
    make_records, small_flowers, tmp_path, capsys
):
    """The ceiling was measured first, then the folder case stopped naming batch_size."""
    from petal.cli import main

    records, photos = _records_and_their_photos(make_records, small_flowers, tmp_path)
    argv = ["bench", "input", str(records), "--folder", str(photos), "--cases", "ceiling,folder",
            "--batch-size", "8", "--seconds", "0.2"]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    n = int(err.split(" training images")[0].rsplit(" ", 1)[1])
    assert 0 < n < 8 and "ceiling" not in out
    assert err == (f"petal bench: error: --folder {photos} has {n} training images, fewer than "
                   f"one batch of 8: pass --batch-size N (at most {n}). Received: batch_size=8\n")


def test_bench_input_warns_when_the_folder_is_not_where_the_records_came_from(
    small_records, small_flowers, tmp_path, capsys
):
    from conftest import _link_subset
    from petal.cli import main

    photos = _link_subset(small_flowers, tmp_path / "photos", 2)
    argv = ["bench", "input", str(small_records), "--cases", "folder", "--batch-size", "2",
            "--seconds", "0.2"]
    assert main([*argv, "--folder", str(photos)]) == 0
    assert (f"warning: --folder {photos} is not {small_flowers}, the folder RECORDS were "
            "converted from: the per-file case reads its photos, which may be others.") in (
        capsys.readouterr().out.splitlines()
    )
    assert main([*argv, "--folder", str(small_flowers)]) == 0
    assert "warning" not in capsys.readouterr().out


def test_bench_input_names_the_files_its_folder_leaves_out_once(small_records, small_flowers,
                                                                 tmp_path, capsys, caplog):
    from conftest import _link_subset
    from petal.cli import main

    photos = _link_subset(small_flowers, tmp_path / "photos", 2)
    (next(photos.iterdir()) / "notes.txt").write_text("not a photo")
    argv = ["bench", "input", str(small_records), "--cases", "folder", "--batch-size", "2",
            "--seconds", "0.2", "--repeat", "2", "--folder", str(photos)]
    assert main(argv) == 0
    said = capsys.readouterr().out + caplog.text
    assert said.count("notes.txt") == 1, said


def test_bench_input_says_which_options_its_cases_do_not_use(small_records, capsys):
    from petal.cli import main

    argv = ["bench", "input", str(small_records), "--cases", "jpeg", "--batch-size", "2",
            "--seconds", "0.2", "--raw-records", "/nonexistent", "--remote-latency-ms", "20"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    for option in ("--raw-records", "--remote-latency-ms"):
        assert f"warning: {option} is not used by the cases chosen (jpeg)." in out, out
    assert "--folder is not used" not in out


def test_codelab_style_shards_of_only_image_and_class_are_read(tmp_path):
    """Shards written with the image bytes and the class alone (Kaggle's flowers): JPEGs
    carry their own size (a required size feature made every record 'corrupt')."""
    import io

    from PIL import Image

    sizes = [(20, 30), (24, 24), (30, 18)]
    for shard in range(2):
        with tf.io.TFRecordWriter(str(tmp_path / f"flowers{shard:02d}-6.tfrec")) as writer:
            for i in range(6):
                buffer = io.BytesIO()
                Image.new("RGB", sizes[i % 3][::-1], (40 * i, 0, 0)).save(buffer, "JPEG")
                feature = {
                    "image": tf.train.Feature(bytes_list=tf.train.BytesList(
                        value=[buffer.getvalue()])),
                    "class": tf.train.Feature(int64_list=tf.train.Int64List(value=[i % 2])),
                }
                example = tf.train.Example(features=tf.train.Features(feature=feature))
                writer.write(example.SerializeToString())
    src = open_source(str(tmp_path), classes=["a", "b"], val_fraction=0.5)
    assert src.kind == "codelab" and src.count("all") == 12
    for split in ("train", "validation"):
        images = [x for x, _ in eval_dataset(src, batch_size=4, image_size=16, split=split)]
        assert sum(len(x) for x in images) == 6 and images[0].shape[1:] == (16, 16, 3)
    x, y = next(iter(train_dataset(src, batch_size=4, image_size=16)))
    assert x.shape == (4, 16, 16, 3) and y.shape == (4, 2)


def test_raw_copy_of_codelab_shards_holds_the_same_pixels(make_records, tmp_path):
    # bench input's case 'raw' copies the records with decoded pixels; codelab shards have
    # no manifest to copy (it crashed with a TypeError).
    from petal.data.bench import make_raw_copy

    folder = make_records("codelab", counts={"all": [4, 4, 4, 4, 4, 4]}, codelab=True, fmt="jpeg")
    raw = open_source(make_raw_copy(str(folder), str(tmp_path / "raw")))
    assert raw.kind == "records" and raw.format == "raw" and raw.count("train") == 20

    def pixels(source):
        ds = eval_dataset(source, batch_size=5, split="train", normalization="raw")
        return np.concatenate([images.numpy() for images, _ in ds])

    np.testing.assert_array_equal(pixels(raw), pixels(open_source(str(folder))))


@pytest.mark.parametrize(
    ("which", "options", "message"),
    [
        ("images", [], r"is a folder of images; bench input measures records: convert it first"),
        ("raw", [], r"holds raw records: pass them as --raw-records"),
        ("jpeg", ["--cases", "folder"], r"Case 'folder' needs --folder SRC"),
        ("jpeg", ["--cases", "remote"], r"Case 'remote' needs --remote-latency-ms MS"),
        ("jpeg", ["--cases", ","], r"cases \(--cases\) needs one or more of ceiling"),
        ("jpeg", ["--remote-latency-ms", "-5"], r"--remote-latency-ms must be >= 0"),
        ("jpeg", ["--remote-latency-ms", "inf"], r"--remote-latency-ms must be >= 0 \(and fin"),
        ("jpeg", ["--seconds", "nan"], r"seconds \(--seconds\) must be positive and finite"),
        ("jpeg", ["--augment", "bogus"], r"Unknown augmentation 'bogus'"),
        # The "+aug" cases ran as their twins; the noise between them was called a cost.
        ("jpeg", ["--augment", "None"], r"--augment None leaves nothing to measure in the "
         r"'\+aug' cases, .*the default is codelab\)\. Received: augment='None'$"),
        ("jpeg", ["--folder", "{jpeg}"], r"--folder .* is not a folder of images"),
        # Photos of other classes: the per-file case would measure other images.
        ("jpeg", ["--folder", "{tmp}/pets"], r"--folder .*pets has no class daisy, dandelion, "
         r"roses, sunflowers, tulips of RECORDS' classes \(cat, dog against daisy, .*\): pass "
         r"the image folder RECORDS came from\.$"),
        ("jpeg", ["--raw-records", "{jpeg}"], r"--raw-records .* holds jpeg records, not raw"),
        # Raw records of other images (or at another size): no comparison.
        ("jpeg", ["--raw-records", "{fewer}"], r"--raw-records .*fewer are not RECORDS' images "
         r"as raw pixels \(20 images at 16x16 from .* against 28 images at 16x16 from .*\); "
         r"convert RECORDS' source with --format raw"),
        ("jpeg", ["--folder", "{tmp}/nope"], r"--folder .*nope: Data source not found"),
        ("jpeg", ["--raw-records", "{tmp}/nope"], r"--raw-records .*nope: Data source not found"),
        ("jpeg", ["--json", "{tmp}"], r"--json .* is a folder; pass a file path"),
        ("jpeg", ["--png", "{tmp}/b.json/x.png"], r"--png .*b.json is a file, not a folder"),
        # Where nothing can be created whatever the permission bits say (root passes them).
        ("jpeg", ["--json", "/proc/petal/b.json"],
         r"--json /proc/petal/b.json: nothing can be written in /proc \("),
        ("jpeg", ["--png", "{tmp}/bench.xyz"], r"--png must name an image file \(\.png, .*bench.xyz"),
        ("jpeg", ["--png", "{tmp}/bench.rgba"], r"--png must name an image file"),
        ("jpeg", ["--repeat", "0"], r"repeats \(--repeat\) must be >= 1"),
    ],
)
def test_bench_input_checks_its_arguments_before_measuring(
    which, options, message, make_records, small_flowers, tmp_path, capsys
):
    import re

    from petal.cli import main

    folders = {
        "jpeg": make_records("jpeg", counts={"train": [12, 12], "validation": [4]}, fmt="jpeg"),
        "raw": make_records("raw", counts={"train": [12, 12], "validation": [4]}, fmt="raw"),
        "images": small_flowers,
    }
    (tmp_path / "b.json").write_text("{}")
    from PIL import Image

    for pet in ("cat", "dog"):
        (tmp_path / "pets" / pet).mkdir(parents=True)
        Image.new("RGB", (8, 8)).save(tmp_path / "pets" / pet / "a.jpg")
    fewer = make_records("fewer", counts={"train": [8, 8], "validation": [4]}, fmt="raw")
    options = [o.format(jpeg=folders["jpeg"], fewer=fewer, tmp=tmp_path) for o in options]
    argv = ["bench", "input", str(folders[which]), "--batch-size", "4", "--seconds", "0.2"]
    assert main([*argv, *options]) == 2
    out, err = capsys.readouterr()
    assert "images/s" not in out  # nothing measured
    err = err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("petal bench: error: "), err
    assert re.search(message, err[0]), err[0]


def test_bench_input_takes_augment_none_when_no_case_is_augmented(make_records):
    # Refused with every case (the "+aug" twins would run unaugmented); the ceiling has none.
    from petal.data import bench

    folder = make_records("jpeg", counts={"train": [12, 12], "validation": [4]}, fmt="jpeg")
    result = bench.run(str(folder), cases=("ceiling",), augment="none", batch_size=4,
                       seconds=0.1, progress=lambda line: None)  # fmt: skip
    assert [case.name for case in result.cases] == ["ceiling"]


def test_bench_chart_axis_keeps_bar_lengths_honest():
    from petal.data.bench import chart_scale

    # Close values (ceiling, jpeg, jpeg+aug): linear from 0.
    assert chart_scale([3492.0, 2126.0, 1879.0]) == ("linear", 0.0)
    # Per-file reads to sharded reads: log, starting at a power of ten at least a decade
    # below the smallest, so that its bar is never a sliver (1,080 from an edge at 1,000).
    assert chart_scale([3780.0, 604.0, 15331.0, 305.0, 26073.0]) == ("log", 10.0)
    assert chart_scale([1080.0, 3871.0, 12720.0, 61151.0]) == ("log", 100.0)
    assert chart_scale([5.0, 0.0, 2000.0]) == ("log", 0.1)
    assert chart_scale([]) == ("linear", 0.0)


def test_bench_chart_draws_the_remote_pipelines_beside_the_local_cases():
    from petal.data import bench

    result = bench.BenchResult(records="r", batch_size=4, seconds=1.0, cpus=1, decoder="")
    result.cases.append(bench.Case("jpeg", "r", "none", 3774.0, 25.0, 1.0, 1, 1.0))
    remote = {"per_file_reads_per_s": 460.0, "sharded_reads_per_s": 4878.0,
              "sharded_pipeline_images_per_s": 2019.0}  # fmt: skip
    result.remote = dict(remote)
    # The raw reads (records fetched, not decoded) drew the store faster than the local
    # pipeline; its decoding pipelines compare, and reads stand in only named as such.
    assert bench.chart_bars(result) == [
        ("jpeg", 3774.0),
        ("remote per-file reads (no decoding)", 460.0),
        ("remote sharded pipeline", 2019.0),
    ]
    result.remote["per_file_pipeline_images_per_s"] = 453.0
    assert [name for name, _ in bench.chart_bars(result)][1:] == [
        "remote per-file pipeline", "remote sharded pipeline"]  # fmt: skip


def test_bench_png_follows_the_grid_rule_for_names_without_an_extension(tmp_path):
    from PIL import Image

    from petal.data import bench

    result = bench.BenchResult(records="r", batch_size=4, seconds=1.0, cpus=1, decoder="")
    result.cases.append(bench.Case("jpeg", "r", "none", 100.0, 25.0, 1.0, 1, 1.0))
    # One rule with inspect --grid: no extension -> .png added, and the path is returned.
    assert bench.write_png(result, str(tmp_path / "chart")) == str(tmp_path / "chart.png")
    assert not (tmp_path / "chart").exists()
    with Image.open(tmp_path / "chart.png") as image:
        assert image.format == "PNG"
    assert bench.write_png(result, str(tmp_path / "chart.jpg")) == str(tmp_path / "chart.jpg")
    with Image.open(tmp_path / "chart.jpg") as image:
        assert image.format == "JPEG"


def test_undecodable_files_names_an_unreadable_file_in_one_clean_line(small_flowers, tmp_path):
    """A dangling link: the reason without TensorFlow's function-node and op decorations."""
    folder = tmp_path / "photos"
    for cls in ("daisy", "roses"):
        (folder / cls).mkdir(parents=True)
        first = sorted((small_flowers / cls).iterdir())[0]
        (folder / cls / first.name).symlink_to(first.resolve())
    (folder / "roses" / "gone.jpg").symlink_to(tmp_path / "nowhere.jpg")
    bad = pipeline.undecodable_files(str(folder))
    assert bad == [(str(folder / "roses" / "gone.jpg"), "unreadable: No such file or directory")]


@pytest.mark.parametrize("make", [eval_dataset, train_dataset])
def test_an_empty_split_names_the_splits_that_hold_images(make_records, make):
    # train_dataset said "0 images per input pipeline, fewer than one batch of 1; Use a
    # smaller batch" (no batch size helps): it shares eval_dataset's message now.
    folder = make_records(counts={"train": [7, 6]})
    with pytest.raises(PetalError, match=r"^Split 'validation' of .* holds no images; choose a "
                       r"split that does: train \(13 images\), all \(13 images\)\.$"):
        make(str(folder), batch_size=1, split="validation")


def test_image_folders_are_decoded_as_convert_and_predict_decode_them(tmp_path):
    """EXIF orientation applied and transparency composited on white on the folder path,
    as petal convert and petal predict do (TensorFlow's decode_image does neither)."""
    from PIL import Image

    from petal.data import images as image_io

    upright = np.zeros((48, 64, 3), np.uint8)
    upright[:, :32] = (200, 30, 30)  # red left half, blue right half
    upright[:, 32:] = (30, 30, 200)
    folder = tmp_path / "photos"
    (folder / "a").mkdir(parents=True)
    (folder / "b").mkdir()
    Image.fromarray(upright).save(folder / "a" / "upright.jpg", quality=95)
    exif = Image.Exif()
    exif[0x0112] = 6  # stored turned a quarter; viewers turn it back clockwise
    turned = Image.fromarray(upright).transpose(Image.Transpose.ROTATE_90)
    turned.save(folder / "a" / "turned.jpg", quality=95, exif=exif)
    rgba = np.zeros((48, 64, 4), np.uint8)
    rgba[:, :32] = (30, 200, 30, 255)  # green left half; the right half is transparent black
    Image.fromarray(rgba, "RGBA").save(folder / "b" / "cutout.png")

    files = {p.name: p for p in folder.rglob("*.*")}
    expected = {
        name: image_io.resize(image_io.decode_rgb(p.read_bytes())[0], (24, 32), "fill")
        for name, p in files.items()
    }
    for name in ("upright.jpg", "turned.jpg"):
        left, right = expected[name][:, :16].mean((0, 1)), expected[name][:, 16:].mean((0, 1))
        assert left[0] > 150 > left[2] and right[2] > 150 > right[0], name
    assert (expected["cutout.png"][:, 17:] == 255).all()  # white, not black

    ds = eval_dataset(
        str(folder), batch_size=8, image_size=(24, 32), split="all", normalization="raw"
    )
    got = [image.astype(np.uint8) for batch, _ in ds for image in batch.numpy()]
    assert len(got) == 3
    for name, want in expected.items():
        assert sum(np.array_equal(image, want) for image in got) == 1, name
        one = pipeline.load_image(str(files[name]), (24, 32)).numpy()
        np.testing.assert_array_equal(one, want)

    # Fitted into a square as convert --resize pad fits them: bands of black above and below.
    ds = eval_dataset(str(folder), batch_size=8, image_size=32, split="all",
                      normalization="raw", resize="pad")
    got = [image.astype(np.uint8) for batch, _ in ds for image in batch.numpy()]
    for name, p in files.items():
        want = image_io.resize(image_io.decode_rgb(p.read_bytes())[0], (32, 32), "pad")
        assert (want[:4] == 0).all() and (want[-4:] == 0).all() and want[8:24].any()
        assert sum(np.array_equal(image, want) for image in got) == 1, name
    # "none": as records that keep each photo's size are read (resize_fill); evaluate and
    # predict fit new photos so for a run on such records. Training on a folder fits them.
    ds = eval_dataset(str(folder), batch_size=8, image_size=(24, 32), split="all",
                      normalization="raw", resize="none")
    got = [image.astype(np.uint8) for batch, _ in ds for image in batch.numpy()]
    for name, p in files.items():
        want = pipeline.resize_fill(image_io.decode_rgb(p.read_bytes())[0], (24, 32)).numpy()
        assert sum(np.array_equal(image, want) for image in got) == 1, name
    with pytest.raises(PetalError, match=r"resize must be one of fill, pad, stretch\. "
                       r"Received: resize='none'"):
        train_dataset(str(folder), batch_size=2, image_size=32, resize="none")


@pytest.mark.parametrize("batch", [3, pipeline.MAX_GROUP_DECODE + 1])
def test_raw_batches_are_decoded_in_one_op(make_records, batch):
    """One decode_raw for the whole batch (no per-image decode and stack), any batch size."""
    records = make_records(counts={"train": [batch + 2], "validation": [1]})
    src = open_source(str(records))
    decode_batch = pipeline._batch_decoder(src, (16, 16), batch)
    blobs = list(tf.data.TFRecordDataset(src.files("train")).take(batch))
    graph = tf.function(decode_batch).get_concrete_function(
        tf.TensorSpec([batch], tf.string)
    ).graph
    assert [op.type for op in graph.get_operations()].count("DecodeRaw") == 1
    images, labels = decode_batch(tf.stack(blobs))
    single = pipeline._decoder(src, (16, 16))
    expected = [single(blob) for blob in blobs]
    np.testing.assert_array_equal(images.numpy(), np.stack([e[0].numpy() for e in expected]))
    np.testing.assert_array_equal(labels.numpy(), [int(e[1]) for e in expected])


def test_the_library_names_the_files_an_image_folder_leaves_out(small_flowers, tmp_path,
                                                                 caplog):
    # petal train and evaluate printed these; the datasets built from a path were silent.
    folder = tmp_path / "photos"
    for cls in sorted(p.name for p in small_flowers.iterdir())[:2]:
        (folder / cls).mkdir(parents=True)
        for photo in sorted((small_flowers / cls).iterdir())[:4]:
            (folder / cls / photo.name).symlink_to(photo.resolve())
    (folder / "loose.jpg").symlink_to(next((folder / cls).iterdir()).resolve())
    (folder / cls / "notes.txt").write_text("not a photo")
    with caplog.at_level("WARNING", logger="petal.data.pipeline"):
        eval_dataset(str(folder), batch_size=4, image_size=32)
    said = [r.getMessage() for r in caplog.records if r.name == "petal.data.pipeline"]
    assert len(said) == 1 and "loose.jpg" in said[0] and "notes.txt" in said[0], said
    caplog.clear()
    with caplog.at_level("WARNING", logger="petal.data.pipeline"):
        train_dataset(str(folder), batch_size=4, image_size=32)
        train_dataset(open_source(str(folder)), batch_size=4, image_size=32)  # caller's notes
    said = [r.getMessage() for r in caplog.records if r.name == "petal.data.pipeline"]
    assert len(said) == 1 and "loose.jpg" in said[0], said


def test_a_class_index_past_the_sources_classes_stops_in_one_line(make_records, monkeypatch):
    """Codelab shards naming no class, whose sixth class comes after the records read when
    opened: its records were trained on with all-zero one-hot labels, and evaluate failed
    at its end naming neither the data nor the fix."""
    import keras

    from conftest import CLASSES, keep_only, relabel_after
    from petal.data import reader

    folder = make_records("late", counts={"all": [40] * 6}, codelab=True, fmt="jpeg")
    relabel_after(keep_only(folder), 34, 5)  # records 34-39 of each shard: class index 5
    # As shards too large to read whole (raising=False: the defect's test, before the fix).
    monkeypatch.setattr(reader, "MAX_CLASS_SCAN_BYTES", 0, raising=False)
    src = open_source(str(folder))
    assert src.num_classes == 5
    expected = (
        f"{folder} holds class index 5 but the source has 5 classes (counted from the first "
        "32 records of each shard; the shards name none): pass --classes NAME,NAME,... "
        "(classes=[...] in Python) listing every class in index order (the class of every "
        "record is counted only in local shards of up to 0 GB in all)."
    )
    with pytest.raises(tf.errors.InvalidArgumentError) as caught:
        for _ in eval_dataset(src, batch_size=8, image_size=16, split="all"):
            pass
    assert str(reader.input_error(caught.value, str(folder), "evaluate")) == expected
    # As a Keras training step raises it (train turns it into the same line).
    model = keras.Sequential([keras.Input((16, 16, 3)), keras.layers.Flatten(),
                              keras.layers.Dense(5, activation="softmax")])  # fmt: skip
    model.compile("sgd", "categorical_crossentropy")
    with pytest.raises(tf.errors.InvalidArgumentError) as caught:
        ds = train_dataset(src, batch_size=8, image_size=16, seed=0, augment=None)
        model.fit(ds, steps_per_epoch=25, epochs=1, verbose=0)
    assert str(reader.input_error(caught.value, src, "train")) == expected
    # Every class named: the sixth class's 36 records have its label.
    named = open_source(str(folder), classes=[*CLASSES, "sixth"])
    ds = eval_dataset(named, batch_size=64, image_size=16, split="all")
    labels = np.concatenate([y for _, y in ds])
    assert labels.shape == (240, 6) and labels[:, 5].sum() == 36
    assert np.all(labels.sum(axis=1) == 1)


def _set_class(value):
    def edit(feature):
        feature["class"].int64_list.value[:] = [value]

    return edit


@pytest.mark.slow  # 25 s in a loaded suite run (session 40): `pytest -m slow` runs it
def test_a_negative_class_index_names_its_record_and_says_no_classes_list_mends_it(
    make_records,
):
    """Record 2 of a shard with class -1 said "holds class index -1 but the source has 5
    classes (counted from every record): pass --classes NAME,NAME,... listing every class":
    no list of classes makes -1 one, and it named neither shard nor record. Read, with
    skip_corrupt too, or trained on; and an index past a records folder's classes."""
    from conftest import edit_record
    from petal.data import reader

    folder = make_records("neg", counts={"all": [4] * 6}, codelab=True, fmt="jpeg")
    shard = folder / "flowers01-4.tfrec"  # a training shard (validation: flowers00)
    edit_record(shard, 2, _set_class(-1))
    src = open_source(str(folder))
    expected = (
        f"{folder} holds class index -1 ({shard}: record 2) but class indices run from 0 to 4 "
        "(5 classes): the record is wrong (no --classes names a negative index): write it "
        "again with its class index, or convert the original images with petal convert."
    )
    for skip_corrupt in (False, True):
        with pytest.raises(tf.errors.InvalidArgumentError) as caught:
            for _ in eval_dataset(src, batch_size=4, split="all", skip_corrupt=skip_corrupt):
                pass
        assert str(reader.input_error(caught.value, str(folder), "evaluate")) == expected
    with pytest.raises(tf.errors.InvalidArgumentError) as caught:
        for _ in train_dataset(src, batch_size=4, seed=0, augment=None).take(12):
            pass
    assert str(reader.input_error(caught.value, src, "train")) == expected

    records = make_records("records", counts={"train": [7, 6], "validation": [5]})
    shard = records / "train-00001-of-00002-6.tfrec"
    edit_record(shard, 3, _set_class(9))  # (the same bytes: the manifest still agrees)
    with pytest.raises(tf.errors.InvalidArgumentError) as caught:
        for _ in eval_dataset(str(records), batch_size=4, split="train"):
            pass
    assert str(reader.input_error(caught.value, records, "evaluate", split="train")) == (
        f"{records} holds class index 9 ({shard}: record 3) but the source has 5 classes (its "
        "manifest lists them): its shards were changed after petal convert wrote them; convert "
        "again."
    )


def test_a_record_without_a_class_is_said_to_lack_it_not_to_hold_a_bad_image(make_records):
    """Record 2 of a shard (not its first, which opening checks) without 'class' was "1
    record(s) whose image cannot be decoded: ...: record 2: Feature: class (data type:
    int64) is required but could not be found", and skip_corrupt said it "cannot be
    decoded"."""
    from conftest import edit_record
    from petal.data import reader

    def drop_class(feature):
        del feature["class"]

    folder = make_records("nocls", counts={"all": [4] * 6}, codelab=True, fmt="jpeg")
    shard = folder / "flowers00-4.tfrec"  # the validation shard
    edit_record(shard, 2, drop_class)
    src = open_source(str(folder))
    named = (
        f"{shard}: record 2: the record has no 'class' feature (the int64 class index; it "
        "carries image, label, one_hot_class, size)"
    )
    with pytest.raises(tf.errors.InvalidArgumentError) as caught:
        list(eval_dataset(src, batch_size=4, split="validation"))
    assert str(reader.input_error(caught.value, str(folder), "evaluate", split="validation")) == (
        f"1 record(s) of {folder} lack a feature the pipeline reads: {named}. Write them again "
        "with it (codelab shards: image and class), or convert the original images with petal "
        "convert; or evaluate with --skip-corrupt to skip and count them."
    )
    bad, line = pipeline.decode_skips(src, "validation", "eval.json")
    assert bad == [(f"{shard}: record 2", named.split(": ", 2)[2])]
    assert line == f"1 of 4 records lack a feature the pipeline reads and are skipped: {named}"
    labels = np.concatenate([y for _, y in eval_dataset(src, batch_size=4, split="validation",
                                                        skip_corrupt=True)])  # fmt: skip
    assert len(labels) == 3


def test_a_kept_cache_folder_gives_each_seed_the_batches_it_fills_itself(records, tmp_path):
    """The cache held the records in the order of the seed that filled it, and the key left
    the seed out: a run of seed 3 reading a cache that seed 5 (or an unseeded run) filled
    got other batches than seed 3 filling its own."""

    def take(seed, cache):
        ds = train_dataset(str(records), batch_size=4, seed=seed, cache=cache, augment=None,
                           normalization="raw", dtype="uint8")  # fmt: skip
        return [_ids(x) for x, _ in ds.take(10)]  # two passes: the cache is filled

    by_5, unseeded, own = (str(tmp_path / name) for name in ("by_5", "unseeded", "own"))
    take(5, by_5)
    take(None, unseeded)
    expected = take(3, own)
    assert take(3, by_5) == take(3, unseeded) == take(3, "ram") == expected
    assert take(4, by_5) != expected


def test_load_image_names_a_file_it_cannot_read_or_decode(tmp_path):
    # A missing file raised TensorFlow's NotFoundError, with its op names and a traceback.
    with pytest.raises(PetalError, match=r"^Cannot load the image .*nowhere\.jpg: No such file "
                       r"or directory\.$"):
        pipeline.load_image(str(tmp_path / "nowhere.jpg"))
    (tmp_path / "notes.jpg").write_text("not a photo")
    with pytest.raises(PetalError, match=r"^Cannot load the image .*notes\.jpg: not an image"):
        pipeline.load_image(str(tmp_path / "notes.jpg"), 8)


def test_fit_size_with_resize_none_is_refused(records):
    # resize 'none' keeps each file's size: a fit_size would be a second, other resize.
    with pytest.raises(PetalError, match=r"fit_size=32, resize='none'$"):
        eval_dataset(str(records), batch_size=2, resize="none", fit_size=32)


@pytest.mark.parametrize("spec", ["flip+", "flip++crop", "+"])
def test_an_augment_list_with_an_empty_name_is_refused(records, spec):
    with pytest.raises(PetalError, match=r"augment holds an empty name"):
        train_dataset(str(records), batch_size=2, augment=spec)


def test_split_names_in_any_case(records):
    # As normalization and label_mode are; 'Train' was an unknown split.
    ids = _all_ids(eval_dataset(str(records), batch_size=4, split="Validation",
                                normalization="raw"))  # fmt: skip
    assert sorted(ids) == list(range(19, 28))
    ds = train_dataset(str(records), batch_size=4, split="TRAIN", seed=0)
    assert next(iter(ds))[0].shape == (4, 16, 16, 3)


def test_skip_corrupt_names_and_counts_an_image_folders_undecodable_files(
    small_flowers, tmp_path, caplog, capfd
):
    """Library callers of an image folder with skip_corrupt: its undecodable files were
    dropped unnamed and uncounted, with two anonymous Python tracebacks on stderr."""
    import logging

    from conftest import link_photos

    photos = link_photos(small_flowers, tmp_path / "photos", per_class=4, classes=2)
    a, b = sorted(p for p in photos.iterdir())
    (a / "zz_bad.jpg").write_bytes(b"notanimage")
    first = sorted(small_flowers.glob(f"{a.name}/*.jpg"))[0]
    (b / "zz_trunc.jpg").write_bytes(first.read_bytes()[:3000])
    caplog.set_level(logging.WARNING, logger="petal")
    images = [x for x, _ in eval_dataset(str(photos), batch_size=3, image_size=32, split="all",
                                         skip_corrupt=True)]  # fmt: skip
    assert sum(len(x) for x in images) == 8
    # Decoded in parallel: either file may come first.
    lines = sorted(r.getMessage().rsplit("; ", 1) for r in caplog.records)
    assert lines == [
        [f"petal: skipped {a}/zz_bad.jpg of {photos}: it cannot be decoded (not an image (no "
         "known image format in the file))", lines[0][1]],
        [f"petal: skipped {b}/zz_trunc.jpg of {photos}: it cannot be decoded (corrupt or "
         "truncated image: image file is truncated (15 bytes not processed))", lines[1][1]],
    ]  # fmt: skip
    assert sorted(line[1] for line in lines) == [
        "1 file(s) skipped so far", "2 file(s) skipped so far"
    ]
    assert "Traceback" not in capfd.readouterr().err
    # Training: each file named once, not again every epoch (8 images: 2 batches a pass).
    caplog.clear()
    ds = train_dataset(str(photos), batch_size=4, image_size=32, split="all",
                       skip_corrupt=True, seed=0, cache="off")  # fmt: skip
    assert sum(len(x) for x, _ in ds.take(6)) == 24
    assert len(caplog.records) == 2 and "Traceback" not in capfd.readouterr().err
    # Named up front by the caller (as petal train and evaluate do): not named again.
    caplog.clear()
    bad, _ = pipeline.decode_skips(str(photos), "all")
    assert len(bad) == 2
    assert sum(len(x) for x, _ in eval_dataset(str(photos), batch_size=3, image_size=32,
                                               split="all", skip_corrupt=True)) == 8  # fmt: skip
    assert not caplog.records


def test_per_replica_batch_takes_numpy_ints_for_replicas_too():
    # "replicas must be at least 1. Received: replicas=np.int64(2)", while a NumPy
    # batch_size was taken.
    assert pipeline.per_replica_batch(8, np.int64(2)) == 4
    assert pipeline.per_replica_batch(np.int64(8), np.int32(4)) == 2
    with pytest.raises(PetalError, match=r"replicas must be at least 1\. Received: replicas=0"):
        pipeline.per_replica_batch(8, np.int64(0))
    with pytest.raises(PetalError, match=r"replicas must be at least 1\. Received: replicas=2\.0"):
        pipeline.per_replica_batch(8, 2.0)


def test_fit_image_checks_its_size_as_load_image_does(small_flowers):
    # (0, 64) gave a (0, 64, 3) image, and 64 a TypeError, while load_image took 64.
    path = sorted(small_flowers.glob("daisy/*.jpg"))[0]
    data = tf.io.read_file(str(path))
    assert pipeline.fit_image(data, 24).shape == (24, 24, 3)
    assert pipeline.fit_image(data, "24x16", "pad").shape == (24, 16, 3)
    assert pipeline.fit_image(data, np.int64(8), "none").shape == (8, 8, 3)
    for size in [(0, 64), -3, (8,), "big", 8.5]:
        with pytest.raises(PetalError, match=r"^size must be a positive int, \(height, width\) "
                           rf"or 'HxW'\. Received: size={re.escape(repr(size))}$"):
            pipeline.fit_image(data, size)


def test_a_misspelt_cache_mode_is_no_folder_to_create(records, tmp_path, monkeypatch):
    """cache='rams' made a disk cache folder named rams where the program ran."""
    monkeypatch.chdir(tmp_path)
    for cache, mode in [("rams", "ram"), ("dsk", "disk"), ("Auot", "auto"), ("of", "off")]:
        with pytest.raises(PetalError, match=(
            rf"^cache='{cache}' is no cache mode \(auto, ram, disk, off\) nor an existing "
            rf"folder: did you mean '{mode}'\? a cache folder is given as a path, e\.g\. "
            rf"\./{cache}\. Received: cache='{cache}'$"
        )):
            train_dataset(str(records), batch_size=4, cache=cache)
    assert [p.name for p in tmp_path.iterdir()] == ["records"]
    # A path, a folder that exists, or a name close to no mode: a cache folder, as before.
    (tmp_path / "disks").mkdir()
    for cache in ("./rams", "disks", "my-cache"):
        eval_dataset(str(records), batch_size=4, cache=cache)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["disks", "my-cache", "rams", "records"]


def test_an_image_folder_with_fewer_files_than_input_pipelines(small_flowers, tmp_path):
    """eval_dataset raised a TypeError (an empty file list became a float32 tensor) for the
    pipeline with no file of its own; train_dataset told it to use a smaller batch than 1."""
    folder = tmp_path / "photos"
    for cls in ("daisy", "roses", "tulips"):
        (folder / cls).mkdir(parents=True)
        first = sorted((small_flowers / cls).iterdir())[0]
        (folder / cls / first.name).symlink_to(first.resolve())
    seen = 0
    for index in range(4):
        ctx = tf.distribute.InputContext(4, index, 4)
        ds = eval_dataset(str(folder), batch_size=4, image_size=32, split="all",
                          input_context=ctx)  # fmt: skip
        seen += sum(int(images.shape[0]) for images, _ in ds)
    assert seen == 3
    with pytest.raises(PetalError, match=r"has 0 images per input pipeline, fewer than one batch "
                       r"of 1; .* Add images to the split or read it with fewer than 4 input "
                       r"pipelines\. Received: batch_size=4$"):  # fmt: skip
        train_dataset(str(folder), batch_size=4, image_size=32, split="all",
                      input_context=tf.distribute.InputContext(4, 3, 4))  # fmt: skip


def test_load_image_takes_a_pathlib_path(small_flowers, tmp_path):
    """A pathlib.Path failed as "Attempt to convert a value (PosixPath(...)) ... to a
    Tensor", a missing one too, instead of saying that it does not exist."""
    path = sorted(small_flowers.glob("daisy/*.jpg"))[0]
    image = pipeline.load_image(path, 24)
    assert np.array_equal(image.numpy(), pipeline.load_image(str(path), 24).numpy())
    with pytest.raises(PetalError, match=r"^Cannot load the image .*nowhere\.jpg: No such file "
                       r"or directory\.$"):  # fmt: skip
        pipeline.load_image(tmp_path / "nowhere.jpg", 24)
    with pytest.raises(PetalError, match=r"^path must be an image file's path\. "
                       r"Received: path=None$"):  # fmt: skip
        pipeline.load_image(None, 24)


@pytest.mark.parametrize("resize", ["fill", "none"])
def test_fit_image_raises_invalid_argument_for_junk_eagerly_as_in_a_graph(resize):
    """Eagerly, fit_image raised a bare ValueError for bytes that are no image, while its
    docstring (and tf.data) gave InvalidArgumentError."""
    for data in (b"junk", tf.constant(b"junk")):
        with pytest.raises(tf.errors.InvalidArgumentError, match=r"not an image"):
            pipeline.fit_image(data, 16, resize)
    ds = tf.data.Dataset.from_tensors(b"junk").map(lambda d: pipeline.fit_image(d, 16, resize))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"not an image"):
        next(iter(ds))


def test_distributed_dataset_names_a_strategy_or_function_of_the_wrong_kind(small_records):
    """A records path for fn ended in "'str' object is not callable", None for the strategy
    in an AttributeError."""
    from petal.data.pipeline import distributed_dataset

    strategy = tf.distribute.get_strategy()
    with pytest.raises(PetalError, match=r"^distributed_dataset needs fn as a function of a "
                       r"tf\.distribute\.InputContext .* Received: fn='records'$"):
        distributed_dataset(strategy, "records")
    with pytest.raises(PetalError, match=r"^distributed_dataset needs strategy as a "
                       r"tf\.distribute\.Strategy .* Received: strategy=None$"):
        distributed_dataset(None, lambda ctx: eval_dataset(small_records, batch_size=2))
    # The error named get_strategy, and its (strategy, info) pair was refused the same way.
    with pytest.raises(PetalError, match=r"^distributed_dataset needs strategy as a "
                       r"tf\.distribute\.Strategy \(the first of the pair petal\.training\."
                       r"strategy\.get_strategy returns; this is the pair\)\.$"):
        distributed_dataset((strategy, {}), lambda ctx: eval_dataset(small_records, batch_size=2))


_FILL_A_STRIP = """
import resource, sys
import numpy as np, tensorflow as tf
from petal.data.pipeline import resize_fill
strip = tf.constant(np.arange(20000 * 3, dtype=np.uint8).reshape(1, 20000, 3))
resize_fill(strip[:, :100], (96, 96))  # TensorFlow's first-op set-up, outside the measure
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
out = resize_fill(strip, (96, 96))
print(out.shape, (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)
"""


def test_resize_fill_computes_only_the_window_it_keeps(tmp_path):
    """resize_fill (records kept at their own size, other-size records, predict and the
    SavedModel of such runs) resized the whole cover size before cropping: a 1x20000 strip
    became a 96x1920000 float image (2.2 GB), a 1x40000 one at 192 px 18 GB."""
    from petal.data import images as image_io

    # The cover size is convert's (images.fill_geometry): in float32 ceil(312 * (40 / 312))
    # was 41, which stretched the photo a row, and shifted a square 331 photo at 224.
    rng = np.random.default_rng(0)
    for shape, size in [((300, 200), (96, 96)), ((97, 131), (64, 48)), ((1, 400), (32, 32)),
                        ((50, 50), (192, 192)), ((1000, 3), (24, 32)), ((481, 640), (64, 64)),
                        ((312, 500), (40, 40)), ((331, 331), (224, 224))]:
        image = tf.constant(rng.integers(0, 256, (*shape, 3), dtype=np.uint8))
        new_h, new_w = image_io.fill_geometry(*shape, size)
        whole = tf.image.resize(image, (new_h, new_w), antialias=True)
        top, left = (new_h - size[0]) // 2, (new_w - size[1]) // 2
        want = tf.round(whole[top : top + size[0], left : left + size[1]]).numpy()
        got = pipeline.resize_fill(image, size).numpy().astype(np.float64)
        assert got.shape == (*size, 3)
        assert np.abs(got - np.clip(want, 0, 255)).max() <= 1, (shape, size)
    # A gradient down the rows comes out symmetric: the crop is centred, nothing stretched.
    rows = np.repeat(np.repeat(np.linspace(0, 255, 312)[:, None, None], 500, 1), 3, 2)
    out = pipeline.resize_fill(tf.constant(rows.round().astype(np.uint8)), (40, 40)).numpy()
    assert abs(int(out[0, 0, 0]) + int(out[-1, 0, 0]) - 255) <= 1
    out = subprocess.run([sys.executable, "-c", _FILL_A_STRIP], capture_output=True, text=True,
                         timeout=120, check=True)
    shape, grown_mb = out.stdout.split(") ")
    assert shape == "(96, 96, 3" and int(grown_mb) < 300, out.stdout


@pytest.mark.slow  # 12 s in CI on a Zen 3 host (session 39: 775 s): `pytest -m slow` runs it
def test_skip_corrupt_training_too_short_for_a_batch_stops_rather_than_hangs(tmp_path):
    # A pass that skip_corrupt leaves with less than one batch yielded nothing, and the next
    # pass too, for ever. Run in a process of its own: a regression times out, not hangs.
    from conftest import break_image, corrupt_record, run_script, write_test_records

    one = write_test_records(tmp_path / "one", counts={"train": [12], "validation": [2]})
    corrupt_record(one / "train-00000-of-00001-12.tfrec", 3)  # 3 records readable
    none = write_test_records(tmp_path / "none", counts={"train": [12], "validation": [2]})
    corrupt_record(none / "train-00000-of-00001-12.tfrec", 0)
    bad = write_test_records(tmp_path / "bad", counts={"train": [6], "validation": [2]}, fmt="jpeg")
    for record in range(4):
        break_image(bad / "train-00000-of-00001-6.tfrec", record)
    # Every image fails to decode (the records' CRCs hold): unseeded, the passes followed one
    # another for ever.
    dead = write_test_records(tmp_path / "dead", counts={"train": [6], "validation": [2]},
                              fmt="jpeg")
    for record in range(6):
        break_image(dead / "train-00000-of-00001-6.tfrec", record)
    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent(f"""
        import tensorflow as tf
        from petal.data.pipeline import train_dataset
        from petal.data.reader import input_error

        def first(data, **kw):
            ds = train_dataset(data, batch_size=4, skip_corrupt=True, cache="off", **kw)
            try:
                next(iter(ds))
            except tf.errors.InvalidArgumentError as err:
                return str(input_error(err, data, "train"))
            return "no error"

        print(first({str(one)!r}, seed=1))
        print(first({str(none)!r}, seed=1))
        print(first({str(none)!r}, deterministic=False))
        print(first({str(bad)!r}, seed=1))
        print(first({str(one)!r}, seed=1, start_step=2))  # resumed: no pass is checked twice
        print(first({str(dead)!r}, deterministic=False))
    """))
    done = run_script(script, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    fix = ("fewer than one batch of 4: skip_corrupt dropped the rest (after a corrupt record, "
           "the rest of its shard), and training drops incomplete batches, so it would yield "
           "nothing. Use a smaller batch size (--batch-size), or restore the data it skipped "
           "or convert the photos again.")  # fmt: skip
    assert lines[0] == (
        f"Split 'train' of {one}: a pass over it read 3 of the 12 images of an input pipeline, "
        f"{fix} Cut short: {one}/train-00000-of-00001-12.tfrec."
    )
    assert lines[1].startswith(f"Split 'train' of {none}: a pass over it read 0 of the 12 ")
    assert lines[2] == lines[1]
    assert lines[3].startswith(f"Split 'train' of {bad}: a pass over it read 2 of the 6 ")
    assert lines[4] == lines[0]
    assert lines[5].startswith(f"Split 'train' of {dead}: a pass over it read 0 of the 6 "), lines


def test_train_takes_a_numpy_seed_as_the_int(records):
    # np.int64(1) was refused as "seed must be a non-negative int", as batch_size was not.
    def first(seed):
        ds = train_dataset(str(records), batch_size=4, seed=seed, cache=None)
        return [t.numpy() for t in next(iter(ds))]

    for got, want in zip(first(np.int64(1)), first(1), strict=True):
        np.testing.assert_array_equal(got, want)
    for bad in (np.int64(-1), True, 1.0):
        with pytest.raises(PetalError, match=r"^seed must be a non-negative int or None"):
            train_dataset(str(records), batch_size=4, seed=bad)


def test_seeds_far_apart_give_other_batches(records):
    """Seeds were taken modulo 2**31 - 1024: seed 2**31 - 1023 read and augmented as seed 1,
    and a run's seed may be any 32-bit number."""
    def batches(seed):
        ds = train_dataset(str(records), batch_size=4, seed=seed, augment="flip+crop+mixup",
                           deterministic=True)
        return [t.numpy() for t in next(iter(ds))]

    one, far = batches(1), batches(1 + 2**31 - 1024)
    assert not np.array_equal(one[0], far[0])
    np.testing.assert_array_equal(batches(2**32 - 1)[0], batches(2**32 - 1)[0])


def test_bench_json_and_png_keep_an_earlier_file_when_their_write_fails(monkeypatch, tmp_path):
    """Written in place, a failed write (a full disk, Ctrl-C) left an empty or cut-short
    file, over the earlier one; now the earlier file stays and no temporary file is left."""
    import errno

    from matplotlib.figure import Figure

    from petal.data import bench

    result = bench.BenchResult(records="r", batch_size=4, seconds=1.0, cpus=1, decoder="")
    result.cases.append(bench.Case("jpeg", "r", "none", 100.0, 25.0, 1.0, 1, 1.0))
    json_out, png_out = tmp_path / "b.json", tmp_path / "b.png"
    json_out.write_text("earlier")
    png_out.write_bytes(b"earlier")
    # json.dump wrote the first keys, then met a value it cannot write.
    monkeypatch.setattr(bench.BenchResult, "to_dict", lambda self: {"a": 1, "b": object()})
    with pytest.raises(TypeError):
        bench.write_json(result, str(json_out))

    def savefig(self, fname, **kwargs):
        with open(fname, "wb") as f:
            f.write(b"cut short")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Figure, "savefig", savefig)
    with pytest.raises(OSError) as caught:
        bench.write_png(result, str(png_out))
    assert caught.value.filename == str(png_out)  # the message names the file
    assert (json_out.read_text(), png_out.read_bytes()) == ("earlier", b"earlier")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.json", "b.png"]


def test_an_image_folder_dataset_names_the_file_that_does_not_decode(tmp_path):
    """train_dataset and eval_dataset on an image folder with an empty file raised
    TensorFlow's error with the reason ("empty file (0 bytes)") but not the file."""
    from conftest import FLOWERS, link_photos

    if not FLOWERS.is_dir():
        pytest.skip(f"sample data not found at {FLOWERS}")
    src = link_photos(FLOWERS, tmp_path / "photos", 4, classes=2)
    (src / "daisy" / "zero.jpg").write_bytes(b"")
    named = re.escape(f"{src / 'daisy' / 'zero.jpg'}: empty file (0 bytes)")
    with pytest.raises(tf.errors.InvalidArgumentError, match=named):
        for _ in eval_dataset(str(src), batch_size=3, image_size=16, split="all"):
            pass
    with pytest.raises(tf.errors.InvalidArgumentError, match=named):
        for _ in train_dataset(str(src), batch_size=3, image_size=16, seed=0,
                               split="all").take(10):  # fmt: skip
            pass
