"""The converter: image handling, the record schema round trip, split, determinism, bad input,
crash safety. Conversions are tiny (tens of small images, one worker unless parallelism is
what is tested)."""

from __future__ import annotations

import functools
import hashlib
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image, ImageOps, JpegImagePlugin

from conftest import interrupt_when_called, run_script
from petal.data import convert, images, read_manifest, schema, writer
from petal.errors import PetalError
from petal.running import READING_PREFIX, RUNNING_FILE

# --- helpers ------------------------------------------------------------------------------------


def _photo(height: int, width: int, seed: int = 0) -> np.ndarray:
    """A smooth gradient with mild noise: compresses like a photo, not like noise."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 / width, y * 255 / height, (x + y) * 127 / (width + height)], -1)
    return np.clip(base + rng.normal(0, 8, base.shape), 0, 255).astype(np.uint8)


def _jpeg(pixels: np.ndarray, **kw) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "JPEG", quality=90, **kw)
    return buffer.getvalue()


def _records(path: Path, split: str | None = None) -> list[dict]:
    """Every record of a records folder, parsed with the full spec, in file order."""
    manifest = read_manifest(path)
    spec = schema.feature_spec(len(manifest["classes"]))
    out = []
    for s in [split] if split else schema.SPLITS:
        for shard in manifest["splits"][s]["shards"]:
            for raw in tf.data.TFRecordDataset(str(path / shard["file"])):
                ex = tf.io.parse_single_example(raw, spec)
                rec = {k: v.numpy() for k, v in ex.items()}
                rec["split"] = s
                rec["filename"] = rec["filename"].decode("utf-8")
                out.append(rec)
    return out


def _pixels(rec: dict, fmt: str = "jpeg") -> np.ndarray:
    h, w = rec["size"].tolist()
    if fmt == "raw":
        return np.frombuffer(rec["image"], np.uint8).reshape(h, w, 3)
    return np.asarray(Image.open(io.BytesIO(rec["image"])).convert("RGB"))


def _source_pixels(path: Path) -> np.ndarray:
    return images.decode_rgb(path.read_bytes())[0]


def _shard_bytes(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.glob("*.tfrec"))}


def _codelab_fill(pixels: np.ndarray, side: int) -> np.ndarray:
    """The codelab's converter step: resize to cover (float sizes, truncated), centre-crop,
    cast to uint8 -- written from its description, in TensorFlow."""
    h, w = pixels.shape[:2]
    # Wider than tall: the height becomes the side, else the width does.
    size = [side, int(w * side / h)] if h < w else [int(h * side / w), side]
    resized = tf.image.resize(pixels, size)
    cropped = tf.image.crop_to_bounding_box(
        resized, (size[0] - side) // 2, (size[1] - side) // 2, side, side
    )
    return tf.cast(cropped, tf.uint8).numpy()


# --- images: resize, modes, encoding -----------------------------------------------------------


@pytest.mark.parametrize("shape", [(37, 53), (53, 37), (20, 20), (333, 500), (7, 300)])
def test_fill_is_the_codelabs_algorithm(shape):
    pixels = np.random.default_rng(1).integers(0, 256, (*shape, 3), dtype=np.uint8)
    for side in (16, 32):
        np.testing.assert_array_equal(
            images.resize(pixels, (side, side), "fill"), _codelab_fill(pixels, side)
        )


def test_fill_non_square_covers_and_centres():
    pixels = np.random.default_rng(2).integers(0, 256, (40, 50, 3), dtype=np.uint8)
    out = images.resize(pixels, (12, 30), "fill")
    nh, nw = images.fill_geometry(40, 50, (12, 30))
    assert (nh, nw) == (24, 30)
    resized = tf.cast(tf.image.resize(pixels, [nh, nw]), tf.uint8).numpy()
    np.testing.assert_array_equal(out, resized[6:18, :])


def test_stretch_and_pad_and_none():
    pixels = np.random.default_rng(3).integers(1, 256, (30, 60, 3), dtype=np.uint8)
    stretched = images.resize(pixels, (20, 20), "stretch")
    np.testing.assert_array_equal(
        stretched, tf.cast(tf.image.resize(pixels, [20, 20]), tf.uint8).numpy()
    )
    padded = images.resize(pixels, (20, 20), "pad")
    assert padded.shape == (20, 20, 3)
    assert not padded[:5].any() and not padded[15:].any()  # black bars above and below
    np.testing.assert_array_equal(
        padded[5:15], tf.cast(tf.image.resize(pixels, [10, 20]), tf.uint8).numpy()
    )
    assert images.resize(pixels, None, "none") is pixels


@pytest.mark.parametrize(
    ("value", "expected"),
    [(192, (192, 192)), ("192", (192, 192)), ("128x256", (128, 256)), ((3, 4), (3, 4))],
)
def test_parse_image_size(value, expected):
    assert images.parse_image_size(value) == expected


@pytest.mark.parametrize(
    "value", ["0", "x", "1x2x3", -3, "axb", True, (True, 5), (19.5, 4), (64,), [64], ()]
)
def test_parse_image_size_rejects(value):
    with pytest.raises(ValueError, match="Received: image_size"):
        images.parse_image_size(value)


def _encode(image: Image.Image, fmt: str, **kw) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **kw)
    return buffer.getvalue()


def test_modes_become_rgb():
    rgba = np.zeros((8, 8, 4), np.uint8)
    rgba[:, :4] = (255, 0, 0, 255)  # left half opaque red, right half fully transparent
    decoded = images.decode_rgb(_encode(Image.fromarray(rgba, "RGBA"), "PNG"))[0]
    assert decoded[0, 0].tolist() == [255, 0, 0] and decoded[0, 7].tolist() == [255, 255, 255]

    la = Image.fromarray(np.full((4, 4, 2), (0, 0), np.uint8), "LA")
    assert images.decode_rgb(_encode(la, "PNG"))[0].min() == 255  # transparent black -> white

    grey = Image.fromarray(np.full((4, 4), 77, np.uint8), "L")
    assert images.decode_rgb(_encode(grey, "PNG"))[0][0, 0].tolist() == [77, 77, 77]

    deep = Image.fromarray(np.full((4, 4), 65535, np.uint16))  # 16-bit greyscale
    assert images.decode_rgb(_encode(deep, "PNG"))[0][0, 0].tolist() == [255, 255, 255]

    cmyk = Image.new("CMYK", (8, 8), (0, 255, 255, 0))  # red in CMYK
    red = images.decode_rgb(_encode(cmyk, "JPEG", quality=95))[0][4, 4]
    assert red[0] > 200 and red[1] < 60 and red[2] < 60

    palette = Image.new("P", (6, 6), 1)
    palette.putpalette([0, 0, 0, 0, 255, 0] + [0] * 762)
    assert images.decode_rgb(_encode(palette, "GIF"))[0][0, 0].tolist() == [0, 255, 0]
    palette.info["transparency"] = 1
    assert images.decode_rgb(_encode(palette, "PNG", transparency=1))[0].min() == 255


def test_animation_uses_the_first_frame():
    frames = [Image.new("RGB", (10, 10), c) for c in ((255, 0, 0), (0, 0, 255))]
    data = _encode(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=50)
    assert Image.open(io.BytesIO(data)).n_frames == 2
    pixel = images.decode_rgb(data)[0][5, 5]
    assert pixel[0] > 200 and pixel[2] < 50


def test_exif_orientation_is_applied():
    pixels = _photo(20, 40)  # landscape as stored
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 CW to display": the photo is portrait
    data = _jpeg(pixels, exif=exif.tobytes())
    decoded, _, plain = images.decode_rgb(data)
    assert decoded.shape == (40, 20, 3) and not plain
    encoded = images.convert_image(data, size=None, mode="none")
    assert (encoded.height, encoded.width) == (40, 20) and encoded.data != data


def _data_ending_early(jpeg: bytes) -> bytes:
    """``jpeg`` with an end-of-image marker over its scan's middle: libjpeg decodes the rest
    as grey, with a warning only ("premature end of data segment")."""
    scan = jpeg.index(b"\xff\xda")
    cut = scan + (len(jpeg) - scan) // 2
    return jpeg[:cut] + b"\xff\xd9" + jpeg[cut + 2 :]


def test_a_jpeg_whose_data_end_early_is_refused_not_half_grey():
    # PIL decoded it without a word, the lower half grey, and convert wrote it.
    damaged = _data_ending_early(_jpeg(_photo(64, 64, seed=5)))
    grey = np.asarray(Image.open(io.BytesIO(damaged)).convert("RGB"))
    assert (grey[-8:] == 128).all()  # what PIL gives
    with pytest.raises(images.ImageError) as caught:
        images.decode_rgb(damaged)
    assert str(caught.value) == (
        "corrupt or truncated image: Corrupt JPEG data: premature end of data segment"
    )


def test_a_rotated_or_cmyk_jpeg_whose_data_end_early_is_refused_too():
    """Only a JPEG with no rotation to apply was checked: a phone photo (EXIF orientation
    6) or a CMYK JPEG whose data end early was written with its lower part grey, and
    inspect --verify then passed the new, whole JPEG."""
    exif = Image.Exif()
    exif[0x0112] = 6
    rotated = _data_ending_early(_jpeg(_photo(64, 64, seed=5), exif=exif.tobytes()))
    cmyk = io.BytesIO()
    Image.fromarray(_photo(64, 64, seed=6)).convert("CMYK").save(cmyk, "JPEG", quality=90)
    for damaged in (rotated, _data_ending_early(cmyk.getvalue())):
        Image.open(io.BytesIO(damaged)).load()  # what PIL gives: no error
        with pytest.raises(images.ImageError, match="premature end of data segment"):
            images.decode_rgb(damaged)


@pytest.mark.parametrize("orientation", range(1, 9))
def test_rotated_jpegs_decode_upright_as_pil_turns_them(orientation):
    """Rotated JPEGs decode through simplejpeg too (the cut-short check), turned as PIL's
    exif_transpose turns them: the same pixels as before."""
    exif = Image.Exif()
    exif[0x0112] = orientation
    data = _jpeg(_photo(20, 36, seed=orientation), exif=exif.tobytes())
    decoded, _, plain = images.decode_rgb(data)
    upright = ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB")
    assert np.array_equal(decoded, np.asarray(upright)) and plain == (orientation == 1)


@pytest.mark.parametrize(
    "options", [{"subsampling": 0}, {"subsampling": 1}, {"subsampling": 2, "optimize": True},
                {"progressive": True}, {"grey": True}, {"quality": 40, "subsampling": 2}],
)  # fmt: skip
def test_plain_jpegs_decode_to_pils_pixels(options):
    """Plain JPEGs decode through simplejpeg (half PIL's time): PIL's pixels, every sampling."""
    options = dict(options)
    pixels = _photo(37, 53, seed=9)
    image = Image.fromarray(pixels).convert("L") if options.pop("grey", False) else None
    data = _encode(image or Image.fromarray(pixels), "JPEG", **{"quality": 90, **options})
    decoded, opened, plain = images.decode_rgb(data)
    assert plain and decoded.shape == (37, 53, 3) and decoded.dtype == np.uint8
    assert np.array_equal(decoded, np.asarray(Image.open(io.BytesIO(data)).convert("RGB")))


def test_jpeg_without_chroma_subsampling_and_plain_jpeg_kept():
    data = images.encode_jpeg(_photo(16, 16))
    assert JpegImagePlugin.get_sampling(Image.open(io.BytesIO(data))) == 0  # 4:4:4
    source = _jpeg(_photo(30, 20))
    kept = images.convert_image(source, size=None, mode="none")
    assert kept.data == source and (kept.height, kept.width) == (30, 20)


def test_hand_serialised_example_is_tensorflows():
    encoded = images.Encoded(b"\xff\xd8jpeg", 64, 48, 480, 640)
    classes = ["daisy", "dandelion", "roses"]
    ours = writer.example_bytes(encoded, 2, "roses/été 1.jpg", classes)
    feature = {
        "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[encoded.data])),
        "class": tf.train.Feature(int64_list=tf.train.Int64List(value=[2])),
        "label": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"roses"])),
        "size": tf.train.Feature(int64_list=tf.train.Int64List(value=[64, 48])),
        "one_hot_class": tf.train.Feature(float_list=tf.train.FloatList(value=[0, 0, 1])),
        "filename": tf.train.Feature(
            bytes_list=tf.train.BytesList(value=["roses/été 1.jpg".encode()])
        ),
        "original_size": tf.train.Feature(int64_list=tf.train.Int64List(value=[480, 640])),
    }
    theirs = tf.train.Example(features=tf.train.Features(feature=feature))
    assert ours == theirs.SerializeToString(deterministic=True)
    assert writer._varint(300) == b"\xac\x02" and len(writer._varint(-1)) == 10


# --- the records of small_flowers ----------------------------------------------------------------


def test_manifest_contract(small_records, small_flowers):
    m = read_manifest(small_records)
    assert read_manifest(small_records / "manifest.json") == m
    assert m["classes"] == ["daisy", "dandelion", "roses", "sunflowers", "tulips"]
    assert m["image_size"] == [64, 64] and m["format"] == "jpeg" and m["resize"] == "fill"
    assert m["quality"] == 95 and m["seed"] == 0 and m["val_fraction"] == 0.19
    assert m["images_found"] == 60 == m["written"] + len(m["skipped"]) and not m["skipped"]
    assert m["source"] == os.path.abspath(small_flowers)
    for key in ("petal_version", "tensorflow_version", "created", "options"):
        assert key in m
    assert m["splits"]["train"]["per_class"] == dict.fromkeys(m["classes"], 10)
    assert m["splits"]["validation"]["per_class"] == dict.fromkeys(m["classes"], 2)
    on_disk = sorted(p.name for p in small_records.iterdir())
    listed = []
    for split, n in (("train", 50), ("validation", 10)):
        shards = m["splits"][split]["shards"]
        assert m["splits"][split]["count"] == n == sum(s["count"] for s in shards)
        assert len(shards) == 2
        for i, shard in enumerate(shards):
            assert shard["file"] == schema.shard_name(split, i, 2, shard["count"])
            data = (small_records / shard["file"]).read_bytes()
            assert shard["bytes"] == len(data)
            assert shard["sha256"] == hashlib.sha256(data).hexdigest()
            listed.append(shard["file"])
    assert on_disk == sorted([*listed, "manifest.json"])  # nothing else left behind


def test_codelab_spec_parses_every_record(small_records):
    files = sorted(str(p) for p in small_records.glob("*.tfrec"))
    spec = schema.feature_spec(codelab=True)
    count = 0
    for raw in tf.data.TFRecordDataset(files):
        ex = tf.io.parse_single_example(raw, spec)
        image = tf.reshape(tf.io.decode_jpeg(ex["image"], channels=3), [64, 64, 3])
        one_hot = tf.sparse.to_dense(ex["one_hot_class"])
        assert image.dtype == tf.uint8 and ex["size"].numpy().tolist() == [64, 64]
        assert int(tf.argmax(one_hot)) == int(ex["class"]) and float(tf.reduce_sum(one_hot)) == 1
        count += 1
    assert count == 60


def test_round_trip_fields_and_pixels(small_records, small_flowers):
    m = read_manifest(small_records)
    errors = []
    for rec in _records(small_records):
        assert rec["label"].decode() == m["classes"][rec["class"]]
        assert rec["filename"].split("/")[0] == m["classes"][rec["class"]]
        assert rec["original_size"].tolist() == [224, 224]
        source = _source_pixels(small_flowers / rec["filename"])
        expected = images.resize(source, (64, 64), "fill")
        stored = _pixels(rec)
        errors.append(np.abs(stored.astype(int) - expected).mean())
        # Only the JPEG re-encoding (quality 95, 4:4:4) separates them: exactly.
        reencoded = Image.open(io.BytesIO(images.encode_jpeg(expected, 95))).convert("RGB")
        np.testing.assert_array_equal(stored, np.asarray(reencoded))
    # JPEG error on these detailed 64x64 crops: a few levels out of 255.
    assert max(errors) < 4.0 and np.mean(errors) < 2.5


def test_splits_are_disjoint_and_complete(small_records, small_flowers):
    records = _records(small_records)
    train = {r["filename"] for r in records if r["split"] == "train"}
    val = {r["filename"] for r in records if r["split"] == "validation"}
    assert not train & val
    everything = {f"{p.parent.name}/{p.name}" for p in small_flowers.glob("*/*")}
    assert train | val == everything and len(records) == 60


def test_same_seed_same_bytes_whatever_the_workers(small_records, small_flowers, tmp_path):
    again = convert(
        small_flowers, tmp_path / "w2", image_size=64, seed=0, shards=2, workers=2, progress=False
    )
    assert again.written == 60
    assert _shard_bytes(tmp_path / "w2") == _shard_bytes(small_records)


def test_workers_default_to_the_cpus_this_process_may_run_on(small_flowers, tmp_path, monkeypatch):
    # Under `taskset -c 0` (or a container's cpuset) on a 2-core machine, convert started two
    # workers on one CPU: it counted the machine's CPUs.
    monkeypatch.setattr(writer.os, "sched_getaffinity", lambda pid: {0}, raising=False)
    convert(small_flowers, tmp_path / "one", image_size=32, shards=1, progress=False)
    assert read_manifest(tmp_path / "one")["options"]["workers"] == 1


@pytest.mark.slow  # 9 s in CI on a Zen 3 host (session 39: 775 s): `pytest -m slow` runs it
def test_workers_do_not_run_the_callers_script_again(small_flowers, tmp_path):
    # multiprocessing would re-run a script's top level in every worker ('forkserver' and
    # 'spawn' import __main__): its imports cost each worker seconds, and in a script
    # without a __main__ guard the worker would start the conversion again and die.
    marker = tmp_path / "imports.txt"
    script = tmp_path / "user_script.py"
    script.write_text(
        "import os\n"
        f"open({str(marker)!r}, 'a').write(f'{{os.getpid()}}\\n')\n"
        "from petal.data import convert\n"
        f"s = convert({str(small_flowers)!r}, {str(tmp_path / 'out')!r}, image_size=16,\n"
        "            workers=2, shards=1, progress=False)\n"
        "print('written', s.written)\n"
    )
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "written 60" in done.stdout
    assert len(marker.read_text().splitlines()) == 1  # the script ran once, in the parent


def test_workers_end_with_a_conversion_killed_outright(tmp_path):
    # A worker holds its own queue's writing end and the forkserver's liveness pipe: after
    # a SIGKILL of the converting process, the workers (and the forkserver) idled for ever.
    import signal

    script = tmp_path / "pool.py"
    script.write_text(
        "import os, time\n"
        "from petal.data.writer import _Mapper\n"
        "pool = _Mapper(2)\n"
        "pids = {pool.submit(os.path.realpath, ['/proc/self'])()[0] for _ in range(8)}\n"
        "print(' '.join(p.rsplit('/', 1)[1] for p in pids), flush=True)\n"
        "time.sleep(120)\n"
    )
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    workers = [int(pid) for pid in proc.stdout.readline().split()]
    assert workers and proc.pid not in workers
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    proc.stdout.close()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and any(os.path.exists(f"/proc/{p}") for p in workers):
        time.sleep(0.2)
    alive = [p for p in workers if os.path.exists(f"/proc/{p}")]
    for pid in alive:  # do not leave them behind when the test fails
        os.kill(pid, signal.SIGKILL)
    assert not alive


def test_workers_outlive_a_ctrl_c_that_the_converting_process_handles(tmp_path):
    # Ctrl-C reaches the whole process group. A worker interrupted while writing a result
    # left part of it in the result pipe, and the conversion hung in its clean-up: the
    # workers leave Ctrl-C to the converting process, which stops them itself.
    script = tmp_path / "ctrl_c.py"
    script.write_text(
        "import os, signal\n"
        "from petal.data import writer\n"
        "writer._start_workers_server()\n"
        "pool = writer._Mapper(2)\n"
        "assert pool.submit(abs, [-1])() == [1]  # a worker is up\n"
        "signal.signal(signal.SIGINT, signal.SIG_IGN)  # handled here, as convert does\n"
        "os.killpg(0, signal.SIGINT)\n"
        "print(sum(pool.imap(abs, range(-64, 0), chunk=1)), flush=True)\n"
        "pool.close()\n"
    )
    # A session of its own: the SIGINT must reach only the script's process group.
    done = run_script(script)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["2080"]


def test_ctrl_c_while_the_pool_starts_leaves_no_worker_to_wait_for(tmp_path):
    # Ctrl-C after a submit started the first worker but before it started the pool's
    # manager thread: shutdown() stopped no worker, and Python's exit waited for it for ever.
    import signal

    script = tmp_path / "pool.py"
    script.write_text(
        "import os, time\n"
        "from concurrent.futures import process\n"
        "from petal.data import writer\n"
        "def interrupted(self, executor):\n"
        "    (worker,) = executor._processes.values()\n"
        "    deadline = time.monotonic() + 60\n"
        "    while len(os.listdir(f'/proc/{worker.pid}/task')) < 2:  # its initializer ran\n"
        "        assert time.monotonic() < deadline\n"
        "        time.sleep(0.05)\n"
        "    print(worker.pid, flush=True)\n"
        "    raise KeyboardInterrupt\n"
        "process._ExecutorManagerThread.__init__ = interrupted\n"
        "pool = writer._Mapper(2)\n"
        "try:\n"
        "    pool.submit(abs, [-1])\n"
        "except KeyboardInterrupt:\n"
        "    pool.close()\n"
    )
    try:
        done = subprocess.run(
            [sys.executable, str(script)], capture_output=True, text=True, timeout=60
        )
    except subprocess.TimeoutExpired as err:
        done = err
    worker = int(done.stdout.split()[0])
    alive = os.path.exists(f"/proc/{worker}")
    if alive:  # do not leave it behind when the test fails
        os.kill(worker, signal.SIGKILL)
    assert isinstance(done, subprocess.CompletedProcess), "hung at exit"
    assert done.returncode == 0, done.stderr[-2000:]
    assert not alive


def test_worker_pieces_equal_tensorflows_writer(small_records, small_flowers, tmp_path, monkeypatch):
    # Framing: our length/CRC headers are the bytes tf.io.TFRecordWriter writes.
    records = [b"", b"x", bytes(range(256)) * 300]
    path = tmp_path / "tf.tfrec"
    with tf.io.TFRecordWriter(str(path)) as w:
        for record in records:
            w.write(record)
    assert b"".join(map(writer.frame_record, records)) == path.read_bytes()
    # small_records came from worker pieces; TensorFlow's writer in this process gives the
    # same shards and the same manifest checksums.
    assert writer._pieces_possible(str(tmp_path))
    monkeypatch.setattr(writer, "_pieces_possible", lambda output: False)
    out = tmp_path / "tfwriter"
    convert(small_flowers, out, image_size=64, seed=0, shards=2, workers=1, progress=False)
    assert _shard_bytes(out) == _shard_bytes(small_records)
    shards = lambda m: [sh for s in ("train", "validation") for sh in m["splits"][s]["shards"]]  # noqa: E731
    assert shards(read_manifest(out)) == shards(read_manifest(small_records))


def test_another_seed_another_split(small_records, small_flowers, tmp_path):
    convert(
        small_flowers, tmp_path / "s1", image_size=64, seed=1, shards=2, workers=1, progress=False
    )
    val0 = {r["filename"] for r in _records(small_records, "validation")}
    val1 = {r["filename"] for r in _records(tmp_path / "s1", "validation")}
    assert val0 != val1 and len(val1) == 10


def test_raw_pixels_equal_a_direct_resize(small_originals, tmp_path):
    summary = convert(
        small_originals, tmp_path / "raw", image_size="24x32", format="raw", shards=1,
        workers=1, progress=False,
    )  # fmt: skip
    m = summary.manifest
    assert m["format"] == "raw" and m["quality"] is None and m["image_size"] == [24, 32]
    for rec in _records(tmp_path / "raw"):
        assert len(rec["image"]) == 24 * 32 * 3
        source = _source_pixels(small_originals / rec["filename"])
        assert rec["original_size"].tolist() == list(source.shape[:2])
        np.testing.assert_array_equal(_pixels(rec, "raw"), images.resize(source, (24, 32), "fill"))


def test_resize_none_keeps_sizes_and_jpeg_bytes(small_originals, tmp_path):
    summary = convert(
        small_originals, tmp_path / "none", resize="none", shards=1, workers=1, progress=False
    )
    assert summary.manifest["image_size"] is None
    sizes = set()
    for rec in _records(tmp_path / "none"):
        source = (small_originals / rec["filename"]).read_bytes()
        assert rec["image"] == source  # plain RGB JPEGs are stored as they are
        sizes.add(tuple(rec["size"].tolist()))
        assert rec["size"].tolist() == rec["original_size"].tolist()
    assert len(sizes) > 3


def test_pad_mode_through_convert(small_originals, tmp_path):
    convert(
        small_originals, tmp_path / "pad", image_size=32, resize="pad", format="raw",
        val_fraction=0.0, workers=1, progress=False,
    )  # fmt: skip
    m = read_manifest(tmp_path / "pad")
    assert m["splits"]["validation"] == {
        "count": 0, "per_class": dict.fromkeys(m["classes"], 0), "shards": []
    }  # fmt: skip
    for rec in _records(tmp_path / "pad"):
        source = _source_pixels(small_originals / rec["filename"])
        np.testing.assert_array_equal(_pixels(rec, "raw"), images.resize(source, (32, 32), "pad"))


# --- shards ---------------------------------------------------------------------------------------


def test_shard_counts(small_flowers, tmp_path):
    many = convert(
        small_flowers, tmp_path / "many", image_size=16, shards=1000, workers=1, progress=False
    )
    assert many.shards == {"train": 50, "validation": 10}  # never more shards than records
    small = convert(
        small_flowers, tmp_path / "mb", image_size=16, shard_mb=0.004, workers=1, progress=False
    )
    sizes = [s["bytes"] for s in small.manifest["splits"]["train"]["shards"]]
    assert 1 < len(sizes) < 50 and max(sizes) < 4000 * 1.5
    # Workers estimate the record size during the scan: same shards as in-process.
    convert(
        small_flowers, tmp_path / "mb2", image_size=16, shard_mb=0.004, workers=2, progress=False
    )
    assert _shard_bytes(tmp_path / "mb2") == _shard_bytes(tmp_path / "mb")
    default = convert(small_flowers, tmp_path / "one", image_size=16, workers=1, progress=False)
    assert default.shards == {"train": 1, "validation": 1}  # far below 200 MB


def test_shard_sizes_are_even():
    assert writer._shard_sizes(10, 4) == [3, 3, 2, 2]
    assert writer._shard_sizes(9, 4) == [3, 2, 2, 2]  # never an empty shard
    assert writer._shard_sizes(3, 8) == [1, 1, 1]
    assert writer._shard_sizes(0, 2) == []


# --- duplicates and the split ---------------------------------------------------------------------


def _write_class_tree(root: Path, per_class: int, classes=("a", "b")) -> None:
    for c, name in enumerate(classes):
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            (root / name / f"{i:02d}.jpg").write_bytes(_jpeg(_photo(12, 16, seed=100 * c + i)))


def test_records_with_a_class_whose_files_were_all_skipped_open(tmp_path):
    """Convert keeps such a class (with a warning): a check of the manifest's classes against
    its per-class counts refused the records it had just written as damaged."""
    from petal.data.reader import open_source

    src = tmp_path / "src"
    _write_class_tree(src, 4, classes=("a", "b"))
    (src / "c").mkdir()
    (src / "c" / "x.jpg").write_bytes(b"no image")
    summary = convert(src, tmp_path / "out", image_size=8, workers=1, progress=False)
    assert any("no records for class c" in w for w in summary.warnings)
    assert open_source(str(tmp_path / "out")).classes == ("a", "b", "c")


def test_duplicates_stay_on_one_side(tmp_path):
    src = tmp_path / "src"
    _write_class_tree(src, 10)
    # Three copies in class a, one copy in class b of the same image.
    for dup in ("a/dup1.jpg", "a/dup2.jpg", "b/dup3.jpg"):
        (src / dup).write_bytes((src / "a" / "00.jpg").read_bytes())
    copies = {"a/00.jpg", "a/dup1.jpg", "a/dup2.jpg", "b/dup3.jpg"}
    sides = set()
    for seed in (0, 1, 8, 9):  # the group lands in train for 0 and 1, validation for 8 and 9
        out = tmp_path / f"o{seed}"
        summary = convert(
            src, out, image_size=8, seed=seed, val_fraction=0.3, workers=1, progress=False
        )
        m = summary.manifest
        assert m["duplicates"] == 3
        # The closing line says so: each copy is a record, in every count.
        assert str(summary).startswith(f"written 23 (train {m['splits']['train']['count']} in ")
        assert "; 3 of them byte-identical copies of another), skipped 0 of 23" in str(summary)
        where = {r["filename"]: r["split"] for r in _records(out)}
        side = {where[f] for f in copies}
        assert len(side) == 1
        sides |= side
        per_class = m["splits"]["validation"]["per_class"]
        assert 3 <= per_class["a"] <= 6 and 3 <= per_class["b"] <= 5
    assert sides == {"train", "validation"}  # the group is not pinned to one side


def test_a_group_of_copies_does_not_overshoot_its_class_share(tmp_path):
    """Five copies of one photo and one other photo: the copies went to validation whole
    whenever the class was short of its one place (5 of 6, 83% at 0.19), without a word."""
    src = tmp_path / "src"
    _write_class_tree(src, 10, classes=("p",))
    (src / "q").mkdir()
    (src / "q" / "other.jpg").write_bytes(_jpeg(_photo(12, 16, seed=777)))
    for i in range(5):
        (src / "q" / f"copy{i}.jpg").write_bytes(_jpeg(_photo(12, 16, seed=555)))
    for seed in range(6):  # the group is drawn first or second in the class's order
        out = tmp_path / f"o{seed}"
        m = convert(src, out, image_size=8, seed=seed, workers=1, progress=False).manifest
        assert m["splits"]["validation"]["per_class"] == {"p": 2, "q": 1}
        where = {r["filename"]: r["split"] for r in _records(out)}
        assert where["q/other.jpg"] == "validation"
        assert {where[f"q/copy{i}.jpg"] for i in range(5)} == {"train"}
    # Where every group overshoots (three copies each of two photos, one place due), the
    # smallest still goes: none went, and the class's accuracy was not measured.
    few = tmp_path / "few"
    _write_class_tree(few, 10, classes=("p",))
    (few / "x").mkdir()
    for photo, copies in ((1, 3), (2, 4)):
        for i in range(copies):
            (few / "x" / f"{photo}-{i}.jpg").write_bytes(_jpeg(_photo(12, 16, seed=900 + photo)))
    m = convert(few, tmp_path / "few-out", image_size=8, workers=1, progress=False).manifest
    assert m["splits"]["validation"]["per_class"]["x"] == 3
    # A group no larger than the share still goes to validation (two copies where two of
    # eight are due, 0.19 of 8 rounded).
    for i in range(5, 10):
        (src / "q" / f"own{i}.jpg").write_bytes(_jpeg(_photo(12, 16, seed=i)))
    for i in range(2, 5):
        (src / "q" / f"copy{i}.jpg").unlink()
    sides = set()
    for seed in range(6):
        out = tmp_path / f"t{seed}"
        m = convert(src, out, image_size=8, seed=seed, workers=1, progress=False).manifest
        assert m["splits"]["validation"]["per_class"]["q"] in (2, 3)
        where = {r["filename"]: r["split"] for r in _records(out)}
        sides |= {where["q/copy0.jpg"]}
        assert where["q/copy0.jpg"] == where["q/copy1.jpg"]
    assert sides == {"train", "validation"}


def test_a_class_of_one_photo_s_copies_keeps_them_in_training(tmp_path):
    """Two copies of one photo at val_fraction 0.25 (one place due): the group went to
    validation whole, and the model never saw the class; the warning then told the user to
    lower --val-fraction, which 0.25 already is for a class of two."""
    src = tmp_path / "src"
    _write_class_tree(src, 8, classes=("p",))
    (src / "x").mkdir()
    for i in range(2):
        (src / "x" / f"copy{i}.jpg").write_bytes(_jpeg(_photo(12, 16, seed=555)))
    (src / "y").mkdir()  # three copies: the fallback that sends the smallest group
    for i in range(3):
        (src / "y" / f"copy{i}.jpg").write_bytes(_jpeg(_photo(12, 16, seed=556)))
    for fraction in (0.25, 0.34, 0.5):
        summary = convert(
            src, tmp_path / f"o{fraction}", image_size=8, val_fraction=fraction, workers=1,
            progress=False,
        )
        splits = summary.manifest["splits"]
        assert splits["train"]["per_class"]["x"] == 2, fraction
        assert splits["train"]["per_class"]["y"] == 3, fraction
        assert splits["validation"]["per_class"]["p"] >= 2
        told = [w for w in summary.warnings if w.startswith("no validation images for class")]
        assert len(told) == 1, summary.warnings
        assert "x, y" in told[0] and "byte-identical copies" in told[0], told[0]
        assert "val_fraction" not in told[0]  # no fraction validates one of them
        assert not any("no training images" in w for w in summary.warnings)
    # The same classes alone: no validation split at all, and the fix is not a fraction
    # ("val_fraction 0.25 of each class rounds to 0 images; raise --val-fraction to 0.17").
    shutil.rmtree(src / "p")
    summary = convert(src, tmp_path / "alone", image_size=8, val_fraction=0.25, workers=1,
                      progress=False)  # fmt: skip
    assert summary.warnings[0] == (
        "the validation split is empty, and petal train needs one: the warnings below say "
        "why, class by class"
    )
    assert not [w for w in summary.warnings if "rounds to 0" in w or "--val-fraction" in w]
    assert [w for w in summary.warnings if "x, y" in w and "byte-identical copies" in w]


def test_files_of_other_bytes_holding_the_same_image_are_listed(tmp_path):
    """The same pixels in two PNGs of other metadata: grouped by file bytes, the split sent
    them apart (validation scored an image the model trained on), and one filed under
    another class contradicted its label, without a word."""
    from PIL.PngImagePlugin import PngInfo

    def png(pixels, note: str) -> bytes:
        info = PngInfo()
        info.add_text("note", note)
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, "PNG", pnginfo=info)
        return buffer.getvalue()

    src = tmp_path / "src"
    _write_class_tree(src, 8)
    for i in range(3):  # a/NN.png and a/NN-again.png: the same pixels, other bytes
        pixels = _photo(12, 16, seed=500 + i)
        (src / "a" / f"{i:02d}.png").write_bytes(png(pixels, "first"))
        (src / "a" / f"{i:02d}-again.png").write_bytes(png(pixels, "second"))
    pixels = _photo(12, 16, seed=600)
    (src / "a" / "mine.png").write_bytes(png(pixels, "a's"))
    (src / "b" / "theirs.png").write_bytes(png(pixels, "b's"))
    apart_seen = together_seen = False
    for seed in range(6):
        out = tmp_path / f"o{seed}"
        summary = convert(src, out, image_size=8, seed=seed, val_fraction=0.4, workers=1,
                          progress=False)  # fmt: skip
        where = {r["filename"]: r["split"] for r in _records(out)}
        expected = [["a/mine.png", "b/theirs.png"]]  # two classes, whatever the split
        for i in range(3):
            pair = [f"a/{i:02d}-again.png", f"a/{i:02d}.png"]
            if where[pair[0]] != where[pair[1]]:
                expected.append(pair)
                apart_seen = True
            else:
                together_seen = True
        assert summary.manifest["identical_images"] == sorted(expected)
        [line] = [w for w in summary.warnings if "identical_images" in w]
        assert line.startswith(f"{len(expected)} image(s) are stored more than once, from "
                               "files that are not byte-identical")  # fmt: skip
        assert summary.manifest["duplicates"] == 0
    assert apart_seen and together_seen
    # petal inspect counts them with the duplicates.
    from petal.data.inspect import inspect_records

    assert (f", images stored from more than one file {len(expected)} (split apart or under "
            "two classes: manifest.json's identical_images)") in str(
        inspect_records(out, progress=False))  # fmt: skip


def test_split_is_stratified_per_class(tmp_path):
    src = tmp_path / "src"
    _write_class_tree(src, 20, classes=("a", "b", "c"))
    for i in range(20, 40):  # class c twice as big
        (src / "c" / f"{i:02d}.jpg").write_bytes(_jpeg(_photo(12, 16, seed=900 + i)))
    m = convert(src, tmp_path / "o", image_size=8, val_fraction=0.25, workers=1, progress=False)
    assert m.manifest["splits"]["validation"]["per_class"] == {"a": 5, "b": 5, "c": 10}
    assert m.counts == {"train": 60, "validation": 20}


def test_empty_splits_and_classes_are_warned_about(tmp_path):
    src = tmp_path / "src"
    _write_class_tree(src, 6)
    for i in range(2, 6):  # class b keeps 2 images
        (src / "b" / f"{i:02d}.jpg").unlink()

    summary = convert(src, tmp_path / "o1", image_size=8, workers=1, progress=False)
    assert summary.manifest["splits"]["validation"]["per_class"] == {"a": 1, "b": 0}
    assert summary.warnings == [
        "no validation images for class b (too few images for val_fraction 0.19): its "
        "accuracy is not measured; raise --val-fraction to 0.25 (a class of 2 validates one) "
        "or add images (at val_fraction 0.19 a class needs 3 or more to validate on one)"
    ]
    assert str(summary).splitlines()[1] == f"warning: {summary.warnings[0]}"

    summary = convert(src, tmp_path / "o2", image_size=8, val_fraction=0.0, workers=1,
                      progress=False)  # fmt: skip
    assert summary.counts == {"train": 8, "validation": 0} and summary.manifest["written"] == 8
    assert len(summary.warnings) == 1
    assert summary.warnings[0].startswith("no validation split (--val-fraction 0)")

    summary = convert(src, tmp_path / "o3", image_size=8, val_fraction=0.9, workers=1,
                      progress=False)  # fmt: skip
    assert summary.manifest["splits"]["train"]["per_class"] == {"a": 1, "b": 0}
    assert summary.counts == {"train": 1, "validation": 7} and summary.written == 8
    assert summary.warnings == [
        "no training images for class b (all went to validation): the model never sees it; "
        "lower --val-fraction or add images"
    ]


def test_images_outside_the_class_folders_are_listed_and_warned_about(tmp_path):
    """Not converted (no class), so not lost silently: listed in the manifest, warned about."""
    src = tmp_path / "src"
    _write_class_tree(src, 3)
    (src / "stray.JPG").write_bytes((src / "a" / "00.jpg").read_bytes())
    (src / "notes.txt").write_text("not an image")
    summary = convert(src, tmp_path / "out", image_size=8, workers=1, progress=False)
    assert summary.manifest["unclassified_images"] == ["stray.JPG"]
    assert summary.manifest["ignored_files"] == 2 and summary.written == 6
    assert summary.warnings == [
        "1 image file(s) directly in the source folder belong to no class and were not "
        "converted (stray.JPG; listed in manifest.json as unclassified_images): move each "
        "into its class's sub-folder and convert again"
    ]
    assert f"warning: {summary.warnings[0]}" in str(summary)


def test_class_folder_files_of_other_types_are_named(tmp_path):
    """A TIFF, or a JPEG saved without an extension, is not read: named in a warning and
    the manifest, not only counted. Hidden files and a class left out are not."""
    src = tmp_path / "src"
    _write_class_tree(src, 3)
    (src / "c").mkdir()
    (src / "a" / "scan.tiff").write_bytes(b"II*\x00")
    (src / "b" / "IMG_0001").write_bytes((src / "a" / "00.jpg").read_bytes())
    (src / "b" / ".DS_Store").write_bytes(b"\x00")
    (src / "c" / "c.heic").write_bytes(b"x")
    summary = convert(src, tmp_path / "out", image_size=8, classes="a,b", workers=1,
                      progress=False)  # fmt: skip
    assert summary.manifest["other_files"] == ["a/scan.tiff", "b/IMG_0001"]
    assert summary.written == 6
    assert summary.warnings == [
        "2 file(s) in the class folders are not of a type petal reads and were not converted "
        "(a/scan.tiff, b/IMG_0001; listed in manifest.json as other_files): it reads .bmp, "
        ".gif, .jpeg, .jpg, .png, .webp; save any photo among them as one of those (or add "
        "the extension it lacks) and convert again"
    ]
    # Without the class list, c holds only a HEIC photo: no class, and said so.
    summary = convert(src, tmp_path / "out2", image_size=8, workers=1, progress=False)
    assert summary.manifest["classes"] == ["a", "b"]
    assert summary.manifest["other_files"] == ["a/scan.tiff", "b/IMG_0001", "c/c.heic"]
    assert summary.warnings[0].startswith(
        "3 file(s) in the class folders are not of a type petal reads and were not converted "
        "(a/scan.tiff, b/IMG_0001, c/c.heic; listed in manifest.json as other_files; c held "
        "nothing else, so is not a class): it reads "
    )
    assert summary.manifest["empty_folders"] == []  # c is named above, not as empty
    # An empty sub-folder (or one of hidden files only): a class whose photos are still
    # to come is named, not dropped unseen.
    (src / "d" / "e").mkdir(parents=True)
    (src / "f").mkdir()
    (src / "f" / ".DS_Store").write_bytes(b"\x00")
    summary = convert(src, tmp_path / "out3", image_size=8, workers=1, progress=False)
    assert summary.manifest["empty_folders"] == ["d", "f"]
    assert summary.manifest["classes"] == ["a", "b"]
    assert (
        "2 sub-folder(s) of the source hold no files and are not classes (d, f; listed in "
        "manifest.json as empty_folders): the records have 2 classes; add their photos and "
        "convert again if they are classes"
    ) in summary.warnings
    from petal.data import open_source

    assert open_source(str(src)).notes[0].endswith(
        "; 2 sub-folder(s) empty, so no class (d/, f/). Images are read from class sub-folders, "
        "with the extensions .bmp, .gif, .jpeg, .jpg, .png, .webp"
    )


def test_a_folder_loop_is_listed_and_the_lists_add_up_to_the_ignored_files(tmp_path):
    """A link back to an enclosing folder was counted in ignored_files but named in no list
    and no warning."""
    src = tmp_path / "src"
    _write_class_tree(src, 3)
    (src / "b" / "loop").symlink_to("../b", target_is_directory=True)
    (src / "loose.jpg").write_bytes((src / "a" / "00.jpg").read_bytes())
    (src / "a" / "scan.tiff").write_bytes(b"II*\x00")
    (src / "a" / ".ipynb_checkpoints").mkdir()
    summary = convert(src, tmp_path / "out", image_size=8, workers=1, progress=False)
    m = summary.manifest
    assert summary.written == 6 and m["folder_loops"] == ["b/loop/"]
    lists = ("unclassified_images", "other_files", "hidden_entries", "folder_loops")
    assert sum(len(m[key]) for key in lists) == m["ignored_files"] == 4
    assert (
        "1 folder link(s) lead back to a folder that holds them and were not followed "
        "(b/loop/; listed in manifest.json as folder_loops): a folder in the source is read "
        "once, where it lies, and none above it is read; remove the links to silence this"
    ) in summary.warnings


def test_the_same_photo_under_two_classes_is_listed_and_warned_about(tmp_path):
    """Both copies are written (each is a file the user gave), but their labels contradict
    each other: listed in the manifest and named in a warning. Copies within one class are
    only counted."""
    src = tmp_path / "src"
    _write_class_tree(src, 4)
    (src / "b" / "copy of a0.jpg").write_bytes((src / "a" / "00.jpg").read_bytes())
    (src / "a" / "again.jpg").write_bytes((src / "a" / "01.jpg").read_bytes())
    summary = convert(src, tmp_path / "out", image_size=8, workers=1, progress=False)
    assert summary.written == 10 and summary.manifest["duplicates"] == 2
    assert summary.manifest["duplicates_across_classes"] == [["a/00.jpg", "b/copy of a0.jpg"]]
    assert summary.warnings == [
        "1 image(s) are byte-identical copies filed under more than one class (a/00.jpg = "
        "b/copy of a0.jpg; listed in manifest.json as duplicates_across_classes): each copy "
        "was written with its own class, so the labels contradict each other; keep each "
        "photo in one class and convert again"
    ]
    from petal.data.inspect import inspect_records

    report = inspect_records(str(tmp_path / "out"), verify=True, progress=False)
    assert report.ok and (
        "byte-identical duplicates 2 (1 photo(s) with copies under more than one class)"
    ) in str(report)


def test_a_class_of_copies_of_another_class_s_images_is_told_the_real_fix(tmp_path):
    """c's only image is a copy of one of a's: it goes to the split a sends its copy to.
    The warning said to lower --val-fraction or add images, which changes nothing."""
    src = tmp_path / "src"
    _write_class_tree(src, 4)
    (src / "c").mkdir()
    (src / "c" / "copy.jpg").write_bytes((src / "a" / "00.jpg").read_bytes())
    for seed, missing, side, effect in (
        (1, "training", "validation", "the model never sees it"),
        (0, "validation", "training", "its accuracy is not measured"),
    ):
        summary = convert(src, tmp_path / f"out{seed}", image_size=8, seed=seed, workers=1,
                          progress=False)  # fmt: skip
        assert (
            f"no {missing} images for class c: its 1 image(s) (c/copy.jpg) are byte-identical "
            f"copies of images of another class and went to {side} with them (listed in "
            f"manifest.json as duplicates_across_classes): {effect}; keep each photo in one "
            "class and convert again"
        ) in summary.warnings
    # With an image of its own, the share sent that one too: that warning stands.
    (src / "c" / "own.jpg").write_bytes(_jpeg(_photo(12, 16, seed=999)))
    summary = convert(src, tmp_path / "out", image_size=8, seed=0, workers=1, progress=False)
    assert summary.warnings[-1] == (
        "no validation images for class c (too few images for val_fraction 0.19): its "
        "accuracy is not measured; raise --val-fraction to 0.25 (a class of 2 validates one) "
        "or add images (at val_fraction 0.19 a class needs 3 or more to validate on one)"
    )


def test_skipped_copies_under_two_classes_are_not_a_contradiction(tmp_path):
    """The same unreadable bytes under two classes wrote no label: no contradiction."""
    src = tmp_path / "src"
    _write_class_tree(src, 3)
    for name in ("a", "b"):
        (src / name / "broken.jpg").write_bytes(b"not a jpeg at all")
    summary = convert(src, tmp_path / "out", image_size=8, workers=1, progress=False)
    assert [s["file"] for s in summary.manifest["skipped"]] == ["a/broken.jpg", "b/broken.jpg"]
    assert summary.manifest["duplicates_across_classes"] == []
    assert summary.manifest["duplicates"] == 0  # was 1: a copy never written
    assert summary.warnings == []
    from petal.data.inspect import inspect_records

    # Every file found is written or skipped: inspect checks the manifest's totals.
    assert inspect_records(str(tmp_path / "out"), verify=True, progress=False).ok


def test_hidden_folders_and_files_are_listed_and_warned_about(tmp_path):
    """A notebook checkpoint copy inside a class and a macOS ``__MACOSX`` folder beside the
    classes are not read (it was a class of metadata files with no records); they are
    listed in the manifest and named in a warning, and inspect counts them."""
    src = tmp_path / "src"
    _write_class_tree(src, 3)
    (src / "a" / ".ipynb_checkpoints").mkdir()
    (src / "a" / ".ipynb_checkpoints" / "00-checkpoint.jpg").write_bytes(
        (src / "a" / "00.jpg").read_bytes()
    )
    (src / "__MACOSX" / "a").mkdir(parents=True)
    (src / "__MACOSX" / "a" / "._00.jpg").write_bytes(b"Mac OS X        \x00\x05\x16\x07")
    summary = convert(src, tmp_path / "out", image_size=8, workers=1, progress=False)
    assert summary.manifest["classes"] == ["a", "b"]
    assert summary.written == 6 and summary.manifest["skipped"] == []
    assert summary.manifest["hidden_entries"] == ["__MACOSX/", "a/.ipynb_checkpoints/"]
    assert summary.warnings == [
        "2 hidden folder(s) or image file(s) were not read (__MACOSX/, a/.ipynb_checkpoints/; "
        "names starting with '.', or __MACOSX: notebook checkpoints, macOS metadata; listed "
        "in manifest.json as hidden_entries): rename any that hold photos to convert them"
    ]
    from petal.data.inspect import inspect_records

    report = str(inspect_records(str(tmp_path / "out"), progress=False))
    assert "skipped 0, hidden entries not read 2" in report
    # Beside duplicates, the count of those under two classes stays next to them.
    (src / "b" / "copy.jpg").write_bytes((src / "a" / "01.jpg").read_bytes())
    convert(src, tmp_path / "out", image_size=8, workers=1, progress=False, overwrite=True)
    report = str(inspect_records(str(tmp_path / "out"), progress=False))
    assert (
        "byte-identical duplicates 1 (1 photo(s) with copies under more than one class), "
        "hidden entries not read 2" in report
    )


def test_empty_train_split_is_refused(tmp_path):
    src = tmp_path / "src"
    _write_class_tree(src, 2)
    for extra in ("", ", and 1 more are skipped (e.g. a/gone.jpg: unreadable"):
        # It said "all 4 readable images" of files none of which was yet decoded.
        with pytest.raises(PetalError) as caught:
            convert(src, tmp_path / "out", image_size=8, val_fraction=0.9, workers=1,
                    progress=False)  # fmt: skip
        said = str(caught.value)
        assert said.startswith(
            f"The train split would be empty: val_fraction=0.9 sends all 4 image files under "
            f"{src} to validation (each class's share is rounded){extra}"
        ) and said.endswith("; lower --val-fraction or add images."), said
        assert not (tmp_path / "out").exists()
        if not extra:
            (src / "a" / "gone.jpg").symlink_to(tmp_path / "nowhere.jpg")  # not read: skipped


# --- bad input -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def zoo(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """Two classes of odd but valid images, plus bad files with the reason expected for each."""
    root = tmp_path_factory.mktemp("zoo") / "src"
    a, b = root / "a", root / "b"
    a.mkdir(parents=True)
    b.mkdir()
    for i in range(3):
        (a / f"ok{i}.jpg").write_bytes(_jpeg(_photo(40, 48, seed=i)))
        (b / f"ok{i}.jpg").write_bytes(_jpeg(_photo(48, 40, seed=10 + i)))
    (a / "été en fleur ü.jpg").write_bytes(_jpeg(_photo(30, 30, seed=20)))
    Image.fromarray(_photo(30, 30, 21)).convert("L").save(a / "grey.png")
    Image.fromarray(_photo(30, 30, 22)).convert("CMYK").save(a / "cmyk.jpg", quality=95)
    Image.fromarray(_photo(30, 30, 23)).convert("P").save(a / "palette.gif")
    rgba = np.zeros((30, 30, 4), np.uint8)
    rgba[:, :15] = (0, 0, 255, 255)
    Image.fromarray(rgba, "RGBA").save(a / "half transparent.png")
    frames = [Image.new("RGB", (30, 30), c) for c in ((255, 0, 0), (0, 255, 0))]
    frames[0].save(a / "anim.gif", save_all=True, append_images=frames[1:], duration=40)
    (a / "notes.txt").write_text("not a candidate")

    good = _jpeg(_photo(40, 48, seed=30))
    (b / "empty.jpg").write_bytes(b"")
    (b / "truncated.jpg").write_bytes(good[: len(good) // 2])
    (b / "half grey.jpg").write_bytes(_data_ending_early(good))
    (b / "random.jpg").write_bytes(np.random.default_rng(0).bytes(3000))
    (b / "text.JPG").write_text("hello, I am not a photo\n")
    Image.new("L", (1500, 1000)).save(b / "bomb.png")
    (b / "dangling.jpg").symlink_to(root / "nowhere.jpg")
    (b / "loop.jpg").symlink_to(b / "loop.jpg")  # once stopped the listing of the whole source
    os.mkfifo(b / "pipe.jpeg")
    reasons = {
        "b/empty.jpg": "empty file",
        "b/truncated.jpg": "corrupt or truncated",
        "b/half grey.jpg": "corrupt or truncated",
        "b/random.jpg": "not an image",
        "b/text.JPG": "not an image",
        "b/bomb.png": "too many pixels",
        "b/dangling.jpg": "unreadable",
        "b/loop.jpg": "unreadable",
        "b/pipe.jpeg": "unreadable: not a regular file",
    }
    return root, reasons


def test_bad_inputs_are_skipped_with_reasons(zoo, tmp_path):
    root, reasons = zoo
    summary = convert(
        root, tmp_path / "out", image_size=16, format="raw", shards=1, max_pixels=1_000_000,
        workers=1, progress=False,
    )  # fmt: skip
    m = summary.manifest
    skipped = {s["file"]: s["reason"] for s in m["skipped"]}
    assert set(skipped) == set(reasons)
    for file, reason in reasons.items():
        assert skipped[file].startswith(reason), (file, skipped[file])
    assert skipped["b/bomb.png"] == (
        "too many pixels (HxW 1000x1500 = 1,500,000 > max_pixels 1,000,000, a guard against "
        "decompression bombs): --max-pixels N accepts larger images"
    )
    assert m["images_found"] == 21 == m["written"] + len(m["skipped"])
    assert summary.written == 12 and summary.skipped == 9 and m["ignored_files"] == 1
    by_name = {r["filename"]: r for r in _records(tmp_path / "out")}
    assert "a/été en fleur ü.jpg" in by_name
    anim = _pixels(by_name["a/anim.gif"], "raw")
    assert anim[..., 0].min() > 200 and anim[..., 1].max() < 50  # first frame: red
    half = _pixels(by_name["a/half transparent.png"], "raw")
    assert half[8, 2].tolist() == [0, 0, 255] and half[8, 14].tolist() == [255, 255, 255]


def test_bad_inputs_with_workers(zoo, tmp_path):
    """The same accounting when workers do the reading and decoding."""
    root, reasons = zoo
    m = convert(
        root, tmp_path / "out", image_size=16, shards=1, max_pixels=1_000_000, workers=2,
        progress=False,
    ).manifest  # fmt: skip
    assert {s["file"] for s in m["skipped"]} == set(reasons) and m["written"] == 12


def test_nothing_readable(tmp_path):
    for c in ("a", "b"):
        (tmp_path / "src" / c).mkdir(parents=True)
        (tmp_path / "src" / c / "x.jpg").write_bytes(b"")
    with pytest.raises(PetalError, match=r"None of the 2 image files under \S+ could be "
                       r"converted \(2 x empty file; e\.g\. ./x\.jpg: empty file"):  # fmt: skip
        convert(tmp_path / "src", tmp_path / "out", workers=1, progress=False)
    assert not (tmp_path / "out").exists()


def test_records_of_one_class_are_refused(tmp_path):
    # Every file of one class skipped: exit 0 with a warning, and records of one class that
    # no classifier trains on; a source of one class folder is refused.
    source = tmp_path / "src"
    for c in ("cats", "dogs"):
        (source / c).mkdir(parents=True)
    for i in range(4):
        (source / "cats" / f"{i}.jpg").write_bytes(_jpeg(_photo(20, 20, seed=i)))
    (source / "dogs" / "d1.jpg").write_bytes(b"")
    (source / "dogs" / "d2.jpg").write_text("no")
    with pytest.raises(PetalError) as caught:
        convert(source, tmp_path / "out", workers=1, progress=False)
    assert str(caught.value) == (
        f"Only class 'cats' of the 2 under {source} has images that could be converted: every "
        "file of dogs was skipped (e.g. dogs/d1.jpg: empty file (0 bytes)), and a classifier "
        "needs two classes; replace those files, or add a class, then convert again."
    )
    # A class whose files were skipped before the split (a link that leads nowhere) counts.
    (source / "ants").mkdir()
    (source / "ants" / "a.jpg").symlink_to(tmp_path / "nowhere.jpg")
    with pytest.raises(PetalError) as caught:
        convert(source, tmp_path / "out", workers=2, progress=False)
    assert str(caught.value).startswith(
        f"Only class 'cats' of the 3 under {source} has images that could be converted: every "
        "file of ants, dogs was skipped (e.g. ants/a.jpg: unreadable"
    )
    assert not (tmp_path / "out").exists()


# --- refused operations: one line, nothing written ---------------------------------------------------


def test_an_output_that_is_no_path_is_refused(small_flowers, tmp_path, monkeypatch):
    """None once became a folder called 'None' in the working directory."""
    monkeypatch.chdir(tmp_path)
    for output in (None, 3):
        with pytest.raises(PetalError, match=r"^output must be a folder path \(the records "
                           rf"folder to write\)\. Received: output={output!r}$"):
            convert(small_flowers, output, progress=False)
    with pytest.raises(PetalError, match=r"^output is empty; pass the records folder to write\.$"):
        convert(small_flowers, "", progress=False)
    with pytest.raises(PetalError, match=r"^source must be a folder path \(a folder of class "
                       r"sub-folders\)\. Received: source=None$"):
        convert(None, tmp_path / "out", progress=False)
    assert list(tmp_path.iterdir()) == []


def test_a_missing_source_is_named_with_its_fix(tmp_path):
    """It said "Source folder does not exist" with no fix."""
    missing = tmp_path / "photoz"
    with pytest.raises(PetalError) as caught:
        convert(missing, tmp_path / "out", progress=False)
    assert str(caught.value) == (
        f"The source folder {missing} does not exist; check the path (a folder with one "
        f"sub-folder of images per class). Received: source={missing}"
    )
    assert not (tmp_path / "out").exists()


def test_numpy_numbers_are_numbers(small_flowers, tmp_path):
    """NumPy's ints and floats were refused as "must be an integer" (or "in [0, 1)")."""
    import numpy as np

    out = tmp_path / "out"
    convert(small_flowers, out, image_size=np.int64(8), quality=np.int64(90), seed=np.int64(3),
            shards=np.int64(1), workers=np.int64(1), val_fraction=np.float32(0.25),
            max_pixels=np.int64(10**8), progress=False)  # fmt: skip
    options = read_manifest(out)["options"]
    assert (options["quality"], options["seed"], options["shards"]) == (90, 3, 1)
    assert options["val_fraction"] == 0.25


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        # The library's parameters first (it said "--quality", "--image-size").
        ({"quality": 90, "format": "raw"}, r"^quality \(--quality\) .* format='raw'"),
        ({"image_size": 64, "resize": "none"}, r"^image_size \(--image-size\) .* resize='none'"),
        ({"shards": 2, "shard_mb": 100}, "give one"),
        ({"val_fraction": 1.0}, "val_fraction must be in"),
        ({"resize": "crop"}, "resize must be one of"),
        ({"format": "png"}, "format must be one of"),
        ({"quality": 0}, "quality must be"),
        ({"image_size": "12x"}, "image_size"),
        ({"workers": 0}, "workers must be"),
        ({"shard_mb": float("nan")}, "shard_mb must be a positive finite number"),
        ({"shard_mb": float("inf")}, "shard_mb must be a positive finite number"),
        ({"classes": "daisy,lilies"}, "Unknown class 'lilies'"),
        ({"image_size": "70000x1"}, "at most 65500 pixels per side"),
        ({"image_size": 2000, "max_pixels": 1_000_000}, "more than max_pixels 1,000,000"),
        ({"image_size": 30000, "format": "raw", "max_pixels": 10**9}, "per raw record"),
        # Through the Python API, True is an int to Python: it wrote 1x1 records, or was
        # written into the manifest's options as true.
        ({"image_size": True}, r"^image_size must be .* Received: image_size=True$"),
        # A 1-tuple was written at 64x64, where the input pipeline refuses it.
        ({"image_size": (64,)}, r"^image_size must be .* Received: image_size=\(64,\)$"),
        ({"image_size": [64]}, r"^image_size must be .* Received: image_size=\[64\]$"),
        ({"quality": True}, r"^quality must be an integer in 1\.\.100\. Received: quality=True$"),
        ({"seed": True}, r"^seed must be an integer\. Received: seed=True$"),
        ({"shards": True}, r"^shards must be a positive integer\. Received: shards=True$"),
        ({"shard_mb": True}, r"^shard_mb must be a positive .* Received: shard_mb=True$"),
        ({"workers": True}, r"^workers must be a positive integer\. Received: workers=True$"),
        ({"max_pixels": True}, r"^max_pixels must be a positive .* Received: max_pixels=True$"),
        ({"val_fraction": False}, r"^val_fraction must be in .* Received: val_fraction=False$"),
        ({"overwrite": "no"}, r"^overwrite must be True or False\. Received: overwrite='no'$"),
        ({"classes": 5}, r"^classes must be a list or tuple .* Received: classes=5$"),
        # A set's order (so the class indices) changes with PYTHONHASHSEED.
        ({"classes": {"daisy", "roses"}}, r"\(a set has no order\)\. Received: classes=\{"),
        ({"classes": ["daisy", 3]}, r"^classes must hold names \(strings\)\. Received: "),
    ],
)
def test_refused_options(small_flowers, tmp_path, kwargs, match):
    with pytest.raises(PetalError, match=match):
        convert(small_flowers, tmp_path / "out", progress=False, **kwargs)
    assert not (tmp_path / "out").exists()


def test_an_output_that_is_a_file_or_under_one_names_the_fix(small_flowers, tmp_path):
    target = tmp_path / "records.txt"
    target.write_text("keep me")
    with pytest.raises(PetalError, match=r"records.txt is a file, not a folder; pass a new or "
                       r"empty folder as DST"):
        convert(small_flowers, target, workers=1, progress=False)
    with pytest.raises(PetalError, match=r"Cannot create the output folder .*records.txt/out "
                       r"\(.*records.txt is a file, not a folder\); pass a DST whose parents"):
        convert(small_flowers, target / "out", workers=1, progress=False)
    # Nothing can be created in /proc, whatever the permission bits say (root passes them).
    with pytest.raises(PetalError, match=r"^Cannot create the output folder /proc/petal/out "
                       r"\(nothing can be written in /proc \("):
        convert(small_flowers, "/proc/petal/out", workers=1, progress=False)
    # A folder that exists but takes no files: its parents are not the fix.
    with pytest.raises(PetalError, match=r"^Cannot write into the output folder /proc/sys "
                       r"\(nothing can be written in /proc/sys \(.*\)\); make it writable, or "
                       r"pass another DST\."):
        convert(small_flowers, "/proc/sys", workers=1, progress=False)
    assert target.read_text() == "keep me"


def test_refused_options_leave_a_complete_output_alone(small_flowers, tmp_path):
    out = tmp_path / "out"
    convert(small_flowers, out, image_size=16, shards=1, workers=1, progress=False)
    before = _shard_bytes(out)
    with pytest.raises(PetalError, match="65500"):
        convert(small_flowers, out, image_size="70000x1", overwrite=True, progress=False)
    assert _shard_bytes(out) == before and read_manifest(out)["written"] == 60
    # numpy's bools are bools, as train and the datasets take them (np.bool_ is no bool)
    with pytest.raises(PetalError, match=r"already holds a complete conversion"):
        convert(small_flowers, out, image_size=16, overwrite=np.False_, progress=False)
    convert(small_flowers, out, image_size=16, shards=1, workers=1, overwrite=np.True_,
            progress=False)
    assert _shard_bytes(out) == before


def test_too_wide_for_jpeg_is_skipped_not_a_crash(tmp_path):
    """With resize none the stored size is the source's: checked per image."""
    wide = io.BytesIO()
    Image.new("RGB", (images.JPEG_MAX_SIDE + 1, 1)).save(wide, "PNG")
    with pytest.raises(images.ImageError, match="too large for JPEG"):
        images.convert_image(wide.getvalue(), size=None, mode="none")
    raw = images.convert_image(wide.getvalue(), size=None, mode="none", format="raw")
    assert (raw.height, raw.width) == (1, images.JPEG_MAX_SIDE + 1)


def test_output_inside_source(tmp_path):
    _write_class_tree(tmp_path / "src", 2)
    with pytest.raises(PetalError, match="inside the source"):
        convert(tmp_path / "src", tmp_path / "src" / "records", progress=False)
    assert not (tmp_path / "src" / "records").exists()


def test_complete_output_is_not_clobbered(small_flowers, tmp_path):
    out = tmp_path / "out"
    convert(small_flowers, out, image_size=16, shards=3, workers=1, progress=False)
    before = _shard_bytes(out)
    with pytest.raises(PetalError, match="--overwrite"):
        convert(small_flowers, out, image_size=16, shards=1, workers=1, progress=False)
    assert _shard_bytes(out) == before
    convert(small_flowers, out, image_size=16, shards=1, workers=1, overwrite=True, progress=False)
    assert sorted(_shard_bytes(out)) == [
        "train-00000-of-00001-50.tfrec",
        "validation-00000-of-00001-10.tfrec",
    ]


def test_foreign_files_in_output(small_flowers, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(PetalError, match="did not write"):
        convert(small_flowers, out, image_size=16, workers=1, progress=False)
    convert(small_flowers, out, image_size=16, workers=1, overwrite=True, progress=False)
    assert (out / "keep.txt").read_text() == "mine"


# --- crash safety ----------------------------------------------------------------------------------


def _interrupt_convert_at(monkeypatch, n: int):
    """Makes the ``n``-th file conversion raise KeyboardInterrupt (as Ctrl-C would).

    Returns the call counter (reset ``calls["n"]`` to interrupt again) and the real function.
    """
    calls = {"n": 0}
    real = writer._convert

    def flaky(path, options):
        calls["n"] += 1
        if calls["n"] == n:
            raise KeyboardInterrupt
        return real(path, options)

    monkeypatch.setattr(writer, "_convert", flaky)
    return calls, real


def test_interrupted_run_leaves_nothing_that_looks_complete(small_flowers, tmp_path, monkeypatch):
    out = tmp_path / "out"
    calls, real = _interrupt_convert_at(monkeypatch, 30)
    with pytest.raises(KeyboardInterrupt):
        convert(small_flowers, out, image_size=16, shards=3, workers=1, progress=False)
    assert calls["n"] == 30
    assert not out.exists()  # no manifest, no shards, no temporary files: no folder
    with pytest.raises(PetalError, match="manifest"):
        read_manifest(out)

    # Interrupted in a folder that existed: the folder stays, empty.
    out.mkdir()
    calls["n"] = 0
    with pytest.raises(KeyboardInterrupt):
        convert(small_flowers, out, image_size=16, shards=3, workers=1, progress=False)
    assert list(out.iterdir()) == []

    monkeypatch.setattr(writer, "_convert", real)
    summary = convert(small_flowers, out, image_size=16, shards=3, workers=1, progress=False)
    assert summary.written == 60


def test_interrupted_run_removes_the_pieces_workers_finish_late(
    small_flowers, tmp_path, monkeypatch
):
    # Ctrl-C leaves the workers to finish the pieces they are writing (the converting
    # process stops them): a piece written after the clean-up stayed in the output.
    class LateWorker(writer._Mapper):
        late = None

        def imap(self, fn, items, chunk=None):
            yield fn(items[0])
            self.late = functools.partial(fn, items[1])  # in a worker when Ctrl-C comes
            raise KeyboardInterrupt

        def close(self):
            if self.late is not None:
                self.late()  # the worker ends its piece while the pool shuts down
                self.late = None
            super().close()

    monkeypatch.setattr(writer, "_Mapper", LateWorker)
    out = tmp_path / "out"
    out.mkdir()  # a folder that existed stays
    with pytest.raises(KeyboardInterrupt):
        convert(small_flowers, out, image_size=16, shards=1, workers=1, progress=False)
    assert list(out.iterdir()) == []


def test_failed_overwrite_keeps_the_complete_conversion(small_flowers, tmp_path, monkeypatch):
    out = tmp_path / "out"
    convert(small_flowers, out, image_size=16, shards=3, workers=1, progress=False)
    before = _shard_bytes(out)
    manifest = (out / "manifest.json").read_text()
    calls, real = _interrupt_convert_at(monkeypatch, 30)
    with pytest.raises(KeyboardInterrupt):
        convert(small_flowers, out, image_size=8, shards=1, workers=1, overwrite=True,
                progress=False)  # fmt: skip
    assert calls["n"] == 30
    assert _shard_bytes(out) == before and (out / "manifest.json").read_text() == manifest
    assert sorted(p.name for p in out.iterdir()) == sorted([*before, "manifest.json"])

    monkeypatch.setattr(writer, "_convert", real)
    convert(small_flowers, out, image_size=8, shards=1, workers=1, overwrite=True, progress=False)
    assert sorted(_shard_bytes(out)) == [
        "train-00000-of-00001-50.tfrec",
        "validation-00000-of-00001-10.tfrec",
    ]
    assert read_manifest(out)["image_size"] == [8, 8]


def test_leftovers_of_a_killed_run_are_cleaned(small_flowers, tmp_path, caplog):
    out = tmp_path / "out"
    out.mkdir()
    # What a run killed between renaming its shards and writing the manifest leaves.
    (out / ".petal-tmp-train-00001.tfrec").write_bytes(b"partial")
    (out / "train-00000-of-00007-9.tfrec").write_bytes(b"old")
    (out / ".petal-tmp-manifest.json").write_text("{")
    convert(small_flowers, out, image_size=16, shards=1, workers=1, progress=False)
    # Shards that lost their manifest otherwise (a copy without it) are named as they go.
    assert caplog.messages == [
        f"petal: removed 1 shard(s) with no manifest.json beside them from {out}, the output "
        "of a conversion that did not finish: train-00000-of-00007-9.tfrec"
    ]
    assert sorted(p.name for p in out.iterdir()) == [
        "manifest.json",
        "train-00000-of-00001-50.tfrec",
        "validation-00000-of-00001-10.tfrec",
    ]
    m = json.loads((out / "manifest.json").read_text())
    assert m["written"] == 60


# --- one conversion at a time in a folder ------------------------------------------------------


def _start_waiting_conversion(source: Path, out: Path, go: Path) -> subprocess.Popen:
    """A conversion of ``source`` into ``out`` in another process, held at its first image
    until ``go`` exists; returns once it is there."""
    script = out.parent / "first.py"
    script.write_text(
        "import os, time\n"
        "from petal.data import convert, writer\n"
        "real = writer._convert\n"
        "def held(task, options):\n"
        "    print('converting', flush=True)\n"
        f"    while not os.path.exists({str(go)!r}):\n"
        "        time.sleep(0.05)\n"
        "    return real(task, options)\n"
        "writer._convert = held\n"
        f"convert({str(source)!r}, {str(out)!r}, image_size=16, shards=2, workers=1,\n"
        "        progress=False)\n"
    )
    first = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    assert first.stdout.readline() == "converting\n"
    return first


@pytest.mark.slow  # 8 s in CI on a Zen 3 host (session 39: 775 s): `pytest -m slow` runs it
def test_a_second_conversion_into_a_folder_in_use_is_refused(small_flowers, tmp_path):
    """Both wrote the same temporary files and one's clean-up deleted the other's: the first
    exited 0 with a manifest over shards that held the second's records."""
    out, go = tmp_path / "out", tmp_path / "go"
    first = _start_waiting_conversion(small_flowers, out, go)
    try:
        in_use = (
            f"{out} is in use: process {first.pid} on {socket.gethostname()} is converting "
            f"into it; wait for it to end or stop it, or pass another DST (if it is not "
            f"running, delete {out / RUNNING_FILE})."
        )
        for overwrite in (False, True):  # --overwrite does not replace a live run either
            with pytest.raises(PetalError) as caught:
                convert(small_flowers, out, image_size=8, shards=1, workers=1,
                        overwrite=overwrite, progress=False)  # fmt: skip
            assert str(caught.value) == in_use
        go.touch()
        assert first.wait(timeout=120) == 0
    finally:
        first.kill()
        first.wait()
        first.stdout.close()
    # A folder a training run is in is named as such (the marker says what its holder does).
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        busy = tmp_path / "busy"
        busy.mkdir()
        marker = {"pid": live.pid, "host": socket.gethostname(), "doing": "training in it"}
        (busy / RUNNING_FILE).write_text(json.dumps(marker))
        with pytest.raises(PetalError, match=rf"^{busy} is in use: process {live.pid} on "
                           r"\S+ is training in it; wait for it"):  # fmt: skip
            convert(small_flowers, busy, image_size=8, workers=1, progress=False)
    finally:
        live.kill()
        live.wait()
    # The first conversion's records, whole, and its marker gone.
    assert read_manifest(out)["image_size"] == [16, 16]
    assert sorted(p.name for p in out.iterdir()) == [
        "manifest.json",
        "train-00000-of-00002-25.tfrec",
        "train-00001-of-00002-25.tfrec",
        "validation-00000-of-00002-5.tfrec",
        "validation-00001-of-00002-5.tfrec",
    ]
    assert [r["size"].tolist() for r in _records(out)] == [[16, 16]] * 60


def test_the_marker_of_a_conversion_killed_outright_is_taken_over(small_flowers, tmp_path):
    out, go = tmp_path / "out", tmp_path / "go"
    first = _start_waiting_conversion(small_flowers, out, go)
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=30)
    first.stdout.close()
    assert sorted(p.name for p in out.iterdir()) == [RUNNING_FILE]  # left by the dead one
    with pytest.raises(PetalError, match="manifest"):  # which looks like no output
        read_manifest(out)
    summary = convert(small_flowers, out, image_size=8, shards=1, workers=1, progress=False)
    assert summary.written == 60
    assert sorted(p.name for p in out.iterdir()) == [
        "manifest.json",
        "train-00000-of-00001-50.tfrec",
        "validation-00000-of-00001-10.tfrec",
    ]


def test_records_a_training_run_reads_are_not_converted_into(small_flowers, tmp_path):
    """--overwrite replaced the shards under a running `petal train` (its epochs mixed two
    conversions' records, the new validation split among them); its marker (test_run_folder)
    refuses that, and one left by a reader that died does not."""
    out = tmp_path / "out"
    convert(small_flowers, out, image_size=8, shards=1, workers=1, progress=False)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    marker = out / f"{READING_PREFIX}{socket.gethostname()}-{live.pid}"
    try:
        marker.write_text(json.dumps(
            {"pid": live.pid, "host": socket.gethostname(), "doing": "training from it"}
        ))
        with pytest.raises(PetalError) as caught:
            convert(small_flowers, out, image_size=16, shards=1, workers=1, overwrite=True,
                    progress=False)  # fmt: skip
        assert str(caught.value) == (
            f"{out} is in use: process {live.pid} on {socket.gethostname()} is training from "
            f"it; wait for it to end or stop it, or pass another DST (if it is not running, "
            f"delete {marker})."
        )
        assert {p.name: p.read_bytes() for p in out.iterdir() if p != marker} == before
    finally:
        live.kill()
        live.wait()
    # The reader is gone: its marker protects nothing, and the replacement takes it away.
    convert(small_flowers, out, image_size=16, shards=1, workers=1, overwrite=True,
            progress=False)  # fmt: skip
    assert read_manifest(out)["image_size"] == [16, 16]
    assert not marker.exists()
    # Nor is a dead reader's marker a foreign file in a folder a conversion left unfinished.
    (out / schema.MANIFEST_NAME).unlink()
    marker.write_text(json.dumps({"pid": live.pid, "host": socket.gethostname()}))
    assert convert(small_flowers, out, image_size=8, shards=1, workers=1,
                   progress=False).written == 60  # fmt: skip


# --- names and metadata ------------------------------------------------------------------------


@pytest.mark.parametrize("workers", [1, 2])
def test_a_file_name_that_is_not_utf8_is_skipped_with_the_fix(tmp_path, workers):
    """A record keeps its file name as UTF-8 text: such a name crashed the conversion."""
    src = tmp_path / "src"
    _write_class_tree(src, 2)
    photo = (src / "a" / "00.jpg").read_bytes()
    (src / "a" / os.fsdecode(b"\xff\xfe.jpg")).write_bytes(photo)
    (src / "b" / os.fsdecode(b"caf\xe9")).mkdir()
    (src / "b" / os.fsdecode(b"caf\xe9") / "1.jpg").write_bytes(photo)
    (src / "b" / os.fsdecode(b"notes\xff.txt")).write_text("x")
    (src / os.fsdecode(b"empty\xff")).mkdir()
    summary = convert(src, tmp_path / "out", image_size=8, workers=workers, progress=False)
    reason = "file name is not valid UTF-8 (records store it as UTF-8 text); rename it"
    m = read_manifest(tmp_path / "out")
    assert m["skipped"] == [
        {"file": "a/\\xff\\xfe.jpg", "reason": reason},
        {"file": "b/caf\\xe9/1.jpg", "reason": reason},
    ]
    assert (m["images_found"], m["written"], summary.skipped) == (6, 4, 2)
    # The lists of what was not read name such files and folders the same way.
    assert m["other_files"] == ["b/notes\\xff.txt"] and m["empty_folders"] == ["empty\\xff"]


def test_a_damaged_exif_block_warns_about_nothing(tmp_path):
    """PIL's "Corrupt EXIF data" warning came from opening the file, outside the block that
    silences decoding's: it reached stderr, naming no file, for an image that converts."""
    tiff = b"II*\x00" + (8).to_bytes(4, "little")  # an IFD offset past the end
    app1 = b"Exif\x00\x00" + tiff
    jpeg = _jpeg(_photo(12, 16))
    data = jpeg[:2] + b"\xff\xe1" + (len(app1) + 2).to_bytes(2, "big") + app1 + jpeg[2:]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        encoded = images.convert_image(data, size=(8, 8))
    assert [str(w.message) for w in caught] == []
    assert (encoded.height, encoded.width, encoded.original_height) == (8, 8, 12)


def test_read_manifest_needs_a_path(tmp_path):
    for path in (None, 3, ""):
        with pytest.raises(PetalError, match=r"^read_manifest needs path as a records folder "
                           rf"or its manifest.json \(str or Path\)\. Received: path={path!r}$"):
            read_manifest(path)


def test_files_that_fail_to_convert_are_replaced_in_their_class_s_share(tmp_path, monkeypatch):
    """Undecodable files were dropped after the split: the validation photos of class a
    failing left it none ("too few images"), although 8 of its 10 converted. Now the share
    holds over the images written: a's next files in the seeded order replace them, and b,
    which lost 4 training photos, gives one of its validation photos back (round(0.2 * 6))."""
    src = tmp_path / "src"
    _write_class_tree(src, 10)
    before = convert(src, tmp_path / "o0", image_size=8, val_fraction=0.2, seed=3, workers=1,
                     progress=False)  # fmt: skip
    where = {r["filename"]: r["split"] for r in _records(tmp_path / "o0")}
    bad = sorted(f for f, s in where.items() if f.startswith("a/") and s == "validation")
    bad += sorted(f for f, s in where.items() if f.startswith("b/") and s == "train")[:4]
    for i, name in enumerate(bad):  # not images, and no two alike (copies go together)
        (src / name).write_bytes(np.random.default_rng(i).bytes(200 + i))
    outs = {}
    for name, workers in (("w1", 1), ("w2", 2), ("tf", 1)):
        if name == "tf":  # the records path (remote outputs) too
            monkeypatch.setattr(writer, "_pieces_possible", lambda output: False)
        summary = convert(src, tmp_path / name, image_size=8, val_fraction=0.2, seed=3,
                          workers=workers, progress=False)  # fmt: skip
        m = summary.manifest
        assert m["splits"]["validation"]["per_class"] == {"a": 2, "b": 1}
        assert m["splits"]["train"]["per_class"] == {"a": 6, "b": 5}
        assert sorted(s["file"] for s in m["skipped"]) == sorted(bad)
        assert m["images_found"] == 20 == m["written"] + len(m["skipped"])
        assert summary.warnings == []
        outs[name] = _shard_bytes(tmp_path / name)
        assert sorted(p.name for p in (tmp_path / name).iterdir() if p.name[0] == ".") == []
    assert outs["w1"] == outs["w2"] == outs["tf"]
    again = {r["filename"]: r["split"] for r in _records(tmp_path / "w1")}
    kept = {f for f, s in where.items() if s == "validation" and f.startswith("b/")}
    assert {f for f, s in again.items() if s == "validation"} - kept  # a's replacements
    assert {f for f, s in again.items() if s == "validation" and f.startswith("b/")} < kept
    assert set(again) == set(where) - set(bad)
    assert before.manifest["splits"]["validation"]["per_class"] == {"a": 2, "b": 2}


def test_ctrl_c_while_the_forkserver_forks_a_worker_prints_no_traceback(tmp_path):
    """Ctrl-C while a submit waited for the forkserver to fork a worker (the first one waits
    for the server's imports) left a worker the pool did not know; forked after close() had
    removed the pool's semaphores, it printed a FileNotFoundError traceback."""
    script = tmp_path / "fork.py"
    script.write_text(
        "import os, signal, time\n"
        "from multiprocessing import forkserver\n"
        "from petal.data import writer\n"
        "read_signed = forkserver.read_signed\n"
        "def interrupted(fd):  # the first call waits for the first worker's pid\n"
        "    forkserver.read_signed = read_signed\n"
        "    os.kill(os.getpid(), signal.SIGINT)  # while the server is still importing\n"
        "    return read_signed(fd)\n"
        "forkserver.read_signed = interrupted\n"
        "pool = writer._Mapper(2)\n"
        "try:\n"
        "    pool.submit(abs, [-1])\n"
        "except KeyboardInterrupt:\n"
        "    print('interrupted', flush=True)\n"
        "    pool.close()\n"
        "time.sleep(2)  # the server's imports end: it forks what it was asked to\n"
    )
    done = run_script(script)
    assert done.stdout.split() == ["interrupted"]
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-2000:]


def test_sizes_in_skip_reasons_are_height_by_width_and_say_so(tmp_path):
    """They read width x height, while --image-size and petal inspect give height x width."""
    wide = io.BytesIO()
    Image.new("RGB", (images.JPEG_MAX_SIDE + 1, 2)).save(wide, "PNG")  # 2 high
    with pytest.raises(images.ImageError) as info:
        images.convert_image(wide.getvalue(), size=None, mode="none")
    assert str(info.value).startswith(f"too large for JPEG (HxW 2x{images.JPEG_MAX_SIDE + 1};")
    tall = io.BytesIO()
    Image.new("RGB", (3, 5)).save(tall, "PNG")  # 5 high, 3 wide
    with pytest.raises(images.PixelLimitError, match=r"^too many pixels \(HxW 5x3 = 15 > "):
        images.convert_image(tall.getvalue(), size=(2, 2), max_pixels=10)


def test_float_images_are_scaled_by_their_range_and_bad_ones_skipped(tmp_path):
    """A float TIFF with values 0..1 was stored all black (0..1 rounded to 0 or 1)."""

    def grey(values) -> list[int]:
        data = _encode(Image.fromarray(np.asarray(values, np.float32)), "TIFF")
        stored = images.convert_image(data, size=None, mode="none", format="raw").data
        return list(stored[::3])

    assert grey([[0.0, 0.5, 1.0]]) == [0, 128, 255]  # 0..1: scaled by 255
    assert grey([[0.0, 77.0, 255.0]]) == [0, 77, 255]  # 0..255: as is
    assert grey([[0.0, 257.0, 65535.0]]) == [0, 1, 255]  # larger: as 16-bit
    for bad, reason in (
        ([[0.0, float("nan")]], "NaN or infinite"),
        ([[0.0, float("inf")]], "NaN or infinite"),
        ([[-0.5, 1.0]], r"negative values \(from -0.5 to 1\)"),
    ):
        with pytest.raises(images.ImageError, match=reason):
            grey(bad)
    # A conversion skips such an image with its reason, and the counts still add up.
    for c in ("a", "b"):
        (tmp_path / "src" / c).mkdir(parents=True)
        (tmp_path / "src" / c / "ok.jpg").write_bytes(_jpeg(_photo(12, 16)))
    nan = Image.fromarray(np.full((4, 4), np.nan, np.float32))
    nan.save(tmp_path / "src" / "a" / "nan.png", format="TIFF")  # a TIFF named .png
    convert(tmp_path / "src", tmp_path / "out", image_size=8, workers=1, progress=False)
    manifest = read_manifest(tmp_path / "out")
    assert manifest["images_found"] == 3 and manifest["written"] == 2
    assert [s["file"] for s in manifest["skipped"]] == ["a/nan.png"]
    assert "NaN" in manifest["skipped"][0]["reason"]


def test_16_bit_grey_png_colour_key_becomes_white():
    """The tRNS key of a 16-bit grey PNG was dropped: transparent pixels came out black,
    while the 8-bit equivalent gives white."""
    values = np.array([[0, 1000, 65535]], np.uint16)
    data = _encode(Image.fromarray(values), "PNG", transparency=0)
    assert Image.open(io.BytesIO(data)).info["transparency"] == 0
    assert images.decode_rgb(data)[0][0].tolist() == [[255] * 3, [4] * 3, [255] * 3]
    eight = _encode(Image.fromarray(np.array([[0, 4, 255]], np.uint8)), "PNG", transparency=0)
    assert images.decode_rgb(eight)[0][0].tolist() == [[255] * 3, [4] * 3, [255] * 3]


def _png(width: int, height: int, depth: int, colour: int, rows: list[bytes], trns: bytes):
    """A PNG written chunk by chunk (PIL writes neither 2-bit grey nor 16-bit RGB keys)."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(
            ">I", zlib.crc32(kind + data))  # fmt: skip

    header = struct.pack(">IIBBBBB", width, height, depth, colour, 0, 0, 0)
    pixels = zlib.compress(b"".join(b"\0" + row for row in rows))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"tRNS", trns)
            + chunk(b"IDAT", pixels) + chunk(b"IEND", b""))  # fmt: skip


def test_colour_keys_of_2_bit_grey_and_16_bit_rgb_pngs():
    """PIL scales 2- and 4-bit grey levels to 8 bits but not their tRNS key: the transparent
    level stayed (transparency dropped). It cuts 16-bit RGB to 8 bits but not the key:
    opaque pixels of the key's 8-bit value turned white, the transparent ones stayed."""
    import struct

    levels = _png(8, 1, 2, 0, [bytes([0b00011011, 0b00011011])], struct.pack(">H", 1))
    assert images.decode_rgb(levels)[0][0, :, 0].tolist() == [0, 255, 170, 255] * 2
    nibbles = _png(4, 1, 4, 0, [bytes([0x05, 0xAF])], struct.pack(">H", 5))  # 0, 5, 10, 15
    assert images.decode_rgb(nibbles)[0][0, :, 0].tolist() == [0, 255, 170, 255]
    rgb = np.full((2, 4, 3), 25700, ">u2")
    rgb[:, :2] = 100  # the key, transparent; 25700 is 100 in its high byte
    keyed = _png(4, 2, 16, 2, [row.tobytes() for row in rgb], struct.pack(">HHH", 100, 100, 100))
    with pytest.raises(images.ImageError, match=r"^16-bit RGB PNG with a transparent colour"):
        images.decode_rgb(keyed)


def test_a_class_folder_link_that_leads_nowhere_is_listed_and_warned_about(tmp_path):
    """A class folder linked to an unmounted disk vanished from the records with no warning:
    only "ignored_files": 1 said anything."""
    src = tmp_path / "src"
    _write_class_tree(src, 3, classes=("a", "b", "c"))
    (src / "tulips").symlink_to("/nonexistent/unmounted/tulips", target_is_directory=True)
    summary = convert(src, tmp_path / "out", image_size=8, workers=1, progress=False)
    m = summary.manifest
    assert m["classes"] == ["a", "b", "c"] and m["broken_links"] == ["tulips"]
    lists = ("unclassified_images", "other_files", "hidden_entries", "broken_links")
    assert sum(len(m[key]) for key in lists) == m["ignored_files"] == 1
    assert summary.warnings == [
        "1 link(s) in the source lead nowhere (a missing or unmounted target) and were not "
        "read (tulips; listed in manifest.json as broken_links): a class folder behind one "
        "is not in the records; mount or fix their targets and convert again"
    ]
    from petal.data.inspect import inspect_records

    text = str(inspect_records(str(tmp_path / "out"), progress=False))
    assert "skipped 0, broken links not followed 1\n" in text
    # A photo that is such a link was skipped as "unreadable: No such file or directory".
    (src / "a" / "x.jpg").symlink_to("/nonexistent/unmounted/x.jpg")
    m = convert(src, tmp_path / "out2", image_size=8, workers=1, progress=False).manifest
    assert m["skipped"] == [{"file": "a/x.jpg", "reason": "unreadable: a link whose target is "
                             "missing (/nonexistent/unmounted/x.jpg): mount or fix it"}]


def test_a_class_of_one_photo_is_told_to_add_images_not_to_raise_the_fraction(tmp_path):
    """Raising --val-fraction for classes of one photo leaves nothing to train on (convert
    refuses it), yet both warnings said to."""
    src = tmp_path / "src"
    _write_class_tree(src, 1)
    summary = convert(src, tmp_path / "o1", image_size=8, workers=1, progress=False)
    assert summary.warnings == [
        "the validation split is empty: val_fraction 0.19 of each class rounds to 0 images; "
        "add images (at val_fraction 0.19 a class needs 3 or more to validate on one)"
    ]
    _write_class_tree(src, 6, classes=("a",))
    summary = convert(src, tmp_path / "o2", image_size=8, workers=1, progress=False)
    assert summary.warnings == [
        "no validation images for class b (too few images for val_fraction 0.19): its "
        "accuracy is not measured; add images (at val_fraction 0.19 a class needs 3 or more "
        "to validate on one)"
    ]


def test_an_output_that_is_a_link_to_a_missing_folder_names_it(small_flowers, tmp_path):
    """It said `(File exists); pass a DST whose parents are folders you can write`."""
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "missing")
    for out in (link, link / "out"):
        with pytest.raises(PetalError) as caught:
            convert(small_flowers, out, workers=1, progress=False)
        assert str(caught.value) == (
            f"Cannot create the output folder {out} ({link} is a link to {tmp_path / 'missing'}, "
            f"which does not exist); create the folder it links to, or pass another DST. "
            f"Received: output={out}"
        )
    assert not (tmp_path / "missing").exists()


def test_a_manifest_json_petal_did_not_write_is_a_foreign_file(small_flowers, tmp_path):
    """Any manifest.json counted as a complete conversion, and --overwrite replaced it."""
    out = tmp_path / "web"
    out.mkdir()
    (out / "manifest.json").write_text('{"name": "my app"}\n')
    (out / "index.html").write_text("<html>\n")
    for overwrite in (False, True):
        with pytest.raises(PetalError) as caught:
            convert(small_flowers, out, image_size=8, workers=1, overwrite=overwrite,
                    progress=False)  # fmt: skip
        assert str(caught.value) == (
            f"The output folder {out} holds a manifest.json petal did not write (not a records "
            "manifest), which petal's own would replace; choose an empty or new folder, or "
            "move that file out of it."
        )
    assert (out / "manifest.json").read_text() == '{"name": "my app"}\n'
    assert sorted(p.name for p in out.iterdir()) == ["index.html", "manifest.json"]


def test_a_file_url_output_is_checked_as_its_local_folder(small_flowers, tmp_path):
    """A file:// DST skipped the output-inside-source check and the .petal-running guard."""
    src = tmp_path / "src"
    src.mkdir()
    for cls in ("daisy", "roses"):
        (src / cls).symlink_to(small_flowers / cls)
    with pytest.raises(PetalError, match="^The output folder is inside the source folder"):
        convert(src, f"file://{src}/recs", image_size=8, workers=1, progress=False)
    with pytest.raises(PetalError, match="^The output folder is the source folder: the shards "
                       "would be written among its class folders"):
        convert(src, src, image_size=8, workers=1, progress=False)  # "inside" it, it said
    assert sorted(p.name for p in src.iterdir()) == ["daisy", "roses"]
    busy = tmp_path / "busy"
    busy.mkdir()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        marker = {"pid": live.pid, "host": socket.gethostname(), "doing": "training in it"}
        (busy / RUNNING_FILE).write_text(json.dumps(marker))
        with pytest.raises(PetalError, match=rf"^{busy} is in use: process {live.pid} on "):
            convert(src, f"file://{busy}", image_size=8, workers=1, progress=False)
    finally:
        live.kill()
        live.wait()
    assert sorted(p.name for p in busy.iterdir()) == [RUNNING_FILE]


def test_the_shard_size_estimate_samples_every_class(tmp_path):
    """The sample was files[::len // 16][:16]: of 31 files, the first 16, all of class a,
    whose small images made one shard of the whole split."""
    src = tmp_path / "src"
    for cls, count, side in (("a_small", 16, 16), ("b_big", 15, 256)):
        (src / cls).mkdir(parents=True)
        for i in range(count):
            (src / cls / f"{i:02d}.jpg").write_bytes(_jpeg(_photo(side, side, seed=i)))
    big = sum(p.stat().st_size for p in (src / "b_big").iterdir())
    summary = convert(src, tmp_path / "out", resize="none", shard_mb=big / 4 / 1e6,
                      val_fraction=0, workers=1, progress=False)  # fmt: skip
    assert summary.shards["train"] >= 3  # 4 for their bytes; a_small's sizes gave 1


def test_a_failed_conversion_removes_the_parent_folders_it_created(small_flowers, tmp_path):
    """It removed b of a new n2/a/b, and left the empty n2/a it had created."""
    (tmp_path / "kept").mkdir()
    for out in (tmp_path / "n2" / "a" / "b", tmp_path / "kept" / "a" / "b"):
        with pytest.raises(PetalError, match="The train split would be empty"):
            convert(small_flowers, out, image_size=8, val_fraction=0.99, workers=1,
                    progress=False)  # fmt: skip
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept"]
    assert not any((tmp_path / "kept").iterdir())


def test_a_file_url_output_is_written_as_its_local_folder(
    small_records, small_flowers, tmp_path, monkeypatch
):
    # A file:// DST went through TensorFlow's file system layer: every record written by
    # this process, none of the workers' pieces.
    def no_writer(*args, **kwargs):
        raise AssertionError("records written one by one through TensorFlow")

    monkeypatch.setattr(writer, "_write_records", no_writer)
    out = tmp_path / "url"
    summary = convert(
        small_flowers, f"file://{out}", image_size=64, seed=0, shards=2, workers=1, progress=False
    )
    assert _shard_bytes(out) == _shard_bytes(small_records)
    assert summary.manifest["splits"] == read_manifest(small_records)["splits"]


def test_a_class_left_without_validation_is_told_the_size_or_fraction_that_gives_one(tmp_path):
    """At val_fraction 0.19 a class of 2 validates none (round(0.38) = 0), yet the warning said
    a class needs 2 or more; it names the class size the fraction needs and the fraction
    that validates one of the classes it has."""
    src = tmp_path / "src"
    _write_class_tree(src, 2)
    summary = convert(src, tmp_path / "o1", image_size=8, workers=1, progress=False)
    assert summary.warnings == [
        "the validation split is empty: val_fraction 0.19 of each class rounds to 0 images; "
        "raise --val-fraction to 0.25 (a class of 2 validates one) or add images (at "
        "val_fraction 0.19 a class needs 3 or more to validate on one)"
    ]
    for i in range(2, 10):
        (src / "b" / f"{i:02d}.jpg").write_bytes(_jpeg(_photo(12, 16, seed=900 + i)))
    (src / "c").mkdir()
    (src / "c" / "00.jpg").write_bytes(_jpeg(_photo(12, 16, seed=990)))
    summary = convert(src, tmp_path / "o2", image_size=8, val_fraction=0.05, workers=1,
                      progress=False)  # fmt: skip
    assert summary.manifest["splits"]["validation"]["per_class"] == {"a": 0, "b": 1, "c": 0}
    assert summary.warnings == [
        "no validation images for class a, c (too few images for val_fraction 0.05): its "
        "accuracy is not measured; raise --val-fraction to 0.25 (a class of 2 validates one) "
        "or add images (at val_fraction 0.05 a class needs 10 or more to validate on one)"
    ]


def test_ctrl_c_as_a_conversion_replaces_another_leaves_one_of_them_whole(
    small_flowers, tmp_path, monkeypatch
):
    # Ctrl-C between the removal of the old shards and the new manifest left no manifest,
    # old shards or new ones: neither conversion.
    out = tmp_path / "out"
    convert(small_flowers, out, image_size=16, workers=1, progress=False)
    interrupt_when_called(monkeypatch, writer, "_rename")
    with pytest.raises(KeyboardInterrupt):
        convert(small_flowers, out, image_size=24, workers=1, progress=False, overwrite=True)
    manifest = read_manifest(out)  # the new conversion, whole
    assert manifest["image_size"] == [24, 24]
    names = {sh["file"] for s in ("train", "validation") for sh in manifest["splits"][s]["shards"]}
    assert {p.name for p in out.iterdir()} == names | {"manifest.json"}


def test_convert_draws_progress_bars_only_on_a_terminal_by_default(
    small_flowers, tmp_path, monkeypatch
):
    """The library drew its bars into a log file or a pipe by default (evaluate's default,
    and the CLI's, is a terminal only)."""
    from conftest import Terminal

    for stderr, drawn in ((io.StringIO(), False), (Terminal(), True)):
        monkeypatch.setattr(sys, "stderr", stderr)
        out = tmp_path / f"bars-{drawn}"
        convert(small_flowers, out, image_size=16, shards=1, workers=1)
        assert ("convert: 100%" in stderr.getvalue()) is drawn, stderr.getvalue()


@pytest.mark.slow  # 8 s in CI on a Zen 3 host (session 39: 775 s): `pytest -m slow` runs it
def test_convert_works_under_a_deep_tmpdir(small_flowers, tmp_path):
    """The forkserver's socket is made under TMPDIR: under a deep one its path was longer than
    AF_UNIX takes, and convert failed with "AF_UNIX path too long"."""
    deep = tmp_path / ("t" * 100)
    deep.mkdir()
    out = tmp_path / "out"
    script = (f"from petal.data import convert\n"
              f"print(convert({str(small_flowers)!r}, {str(out)!r}, image_size=16, workers=2, "
              f"progress=False).written)\n")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "TMPDIR": str(deep)})  # fmt: skip
    assert done.returncode == 0 and done.stdout.split() == ["60"], done.stderr[-2000:]
    assert list(deep.iterdir()) == []


def test_a_second_ctrl_c_waits_for_the_clean_up_of_the_pieces(
    small_flowers, tmp_path, monkeypatch
):
    """`timeout` signals the process, then its group: the second SIGINT, raised while the
    clean-up waited for the workers, skipped it, and a piece stayed in DST."""
    real_piece, real_close = writer._write_piece, writer._Mapper.close

    def write_piece(job, options):
        real_piece(job, options)
        raise KeyboardInterrupt  # the first signal, with a piece written

    def close(self):
        os.kill(os.getpid(), signal.SIGINT)  # the second, while the workers are stopped
        real_close(self)

    monkeypatch.setattr(writer, "_write_piece", write_piece)
    monkeypatch.setattr(writer._Mapper, "close", close)
    out = tmp_path / "records"
    with pytest.raises(KeyboardInterrupt):
        convert(small_flowers, out, image_size=32, workers=1, progress=False)
    assert not out.exists() or not [p.name for p in out.iterdir()]


def test_a_worker_killed_outright_names_memory_as_well_as_the_decoder():
    """A worker the OOM killer ended (SIGKILL) was said to be a file crashing the image
    decoder only, with --workers 1 as the sole fix."""
    pool = writer._Mapper(2)
    try:
        (pid,) = pool.submit(os.path.realpath, ["/proc/self"])()
        os.kill(int(pid.rsplit("/", 1)[1]), signal.SIGKILL)
        with pytest.raises(PetalError) as caught:
            for _ in range(20):  # until the pool has seen the death
                pool.submit(abs, [-1])()
                time.sleep(0.1)
    finally:
        pool.close()
    message = str(caught.value)
    assert message.startswith("A worker process died (")
    assert "ran out of memory" in message and "smaller --image-size, or fewer --workers" in message
    assert message.endswith("a file crashes the image decoder (run again with --workers 1 to "
                            "see which).")
