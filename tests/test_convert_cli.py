"""`petal convert` and `petal inspect` on the command line: output, exit codes, one-line errors."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from conftest import run_script
from petal.cli import main


def _error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert err, "expected an error message"
    return err[-1]


def test_convert_then_inspect(small_flowers, tmp_path, capsys):
    out = tmp_path / "records"
    args = ["convert", str(small_flowers), str(out), "--image-size", "24x32", "--workers", "1"]
    assert main([*args, "--shards", "2", "--seed", "3", "--val-fraction", "0.25"]) == 0
    printed = capsys.readouterr().out
    assert (
        "written 60 (train 45 in 2 shards, validation 15 in 2 shards), skipped 0 of 60" in printed
    )
    assert "images/s" in printed and str(out) in printed

    grid = tmp_path / "grid.png"
    assert main(["inspect", str(out), "--verify", "--grid", str(grid)]) == 0
    printed = capsys.readouterr().out
    assert "jpeg 24x32" in printed and "verify: OK, 60 records in 4 shards" in printed
    assert grid.is_file()

    # A complete output is not replaced without --overwrite.
    assert main(args) == 2
    assert "--overwrite" in _error_line(capsys)
    assert main([*args, "--overwrite", "--format", "raw", "--classes", "roses,daisy"]) == 0
    assert "written 24 (train 20 in 1 shard, validation 4 in 1 shard)" in capsys.readouterr().out


def test_inspect_exit_code_on_damage(small_records, tmp_path, capsys):
    copy = shutil.copytree(small_records, tmp_path / "copy")
    shard = copy / "validation-00000-of-00002-5.tfrec"
    shard.write_bytes(shard.read_bytes()[:-3])
    assert main(["inspect", str(copy), "--verify"]) == 1
    assert "validation-00000-of-00002-5.tfrec: record 4:" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--quality", "80", "--format", "raw"], "(--format raw)"),
        (["--image-size", "64", "--resize", "none"], "(--resize none: images keep"),
        (["--classes", "daisy,lilies"], "Unknown class 'lilies'"),
        (["--val-fraction", "1.5"], "val_fraction must be in [0, 1)"),
        (["--image-size", "big"], "image_size must be a positive size"),
    ],
)
def test_refused_options(small_flowers, tmp_path, capsys, extra, message):
    out = tmp_path / "out"
    assert main(["convert", str(small_flowers), str(out), *extra]) == 2
    line = _error_line(capsys)
    assert line.startswith("petal convert: error:") and message in line
    assert not out.exists()


def test_shards_and_shard_mb_are_exclusive(small_flowers, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(
            ["convert", str(small_flowers), str(tmp_path / "o"), "--shards", "2", "--shard-mb", "9"]
        )
    assert exit_info.value.code == 2
    assert "not allowed with argument" in _error_line(capsys)


def test_bad_trees(tmp_path, capsys):
    out = str(tmp_path / "out")
    assert main(["convert", str(tmp_path / "missing"), out]) == 2
    assert "does not exist" in _error_line(capsys)

    (tmp_path / "empty" / "daisy").mkdir(parents=True)
    assert main(["convert", str(tmp_path / "empty"), out]) == 2
    assert ".jpg" in _error_line(capsys)

    (tmp_path / "one" / "daisy").mkdir(parents=True)
    shutil.copy(__file__, tmp_path / "one" / "daisy" / "x.jpg")
    assert main(["convert", str(tmp_path / "one"), out]) == 2
    assert "only one class" in _error_line(capsys)

    (tmp_path / "one" / "roses").mkdir()
    shutil.copy(__file__, tmp_path / "one" / "roses" / "y.jpg")
    assert main(["convert", str(tmp_path / "one"), str(tmp_path / "one" / "out")]) == 2
    assert "inside the source" in _error_line(capsys)

    assert main(["convert", str(tmp_path / "one"), out, "--workers", "1"]) == 2
    assert "None of the 2 image files" in _error_line(capsys)  # both are text files
    assert not (tmp_path / "out").exists()


def test_inspect_without_manifest(tmp_path, capsys):
    assert main(["inspect", str(tmp_path)]) == 2
    assert "No readable manifest.json" in _error_line(capsys)


# --- paths, sizes and outputs that used to end in a traceback -----------------------------------


@pytest.mark.parametrize("which", ["source", "output"])
def test_unsupported_remote_scheme(small_flowers, tmp_path, capsys, which):
    paths = {"source": str(small_flowers), "output": str(tmp_path / "out")}
    paths[which] = f"s3://bucket/{which}"
    assert main(["convert", paths["source"], paths["output"]]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"petal convert: error: Cannot open s3://bucket/{which}: ")
    assert "s3:// are not supported (supported: local paths" in err and "\n" not in err
    assert not (tmp_path / "out").exists()


def test_unreachable_remote_output(small_flowers, tmp_path, capsys, monkeypatch):
    import tensorflow as tf

    def unreachable(path):
        raise tf.errors.FailedPreconditionError(
            None, None, f"Could not resolve host: www.googleapis.com\n\t when reading {path}"
        )

    monkeypatch.setattr(tf.io.gfile, "exists", unreachable)
    assert main(["convert", str(small_flowers), "gs://petal-no-bucket/out"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("petal convert: error: Cannot reach gs://petal-no-bucket/out (Could")
    assert "\n" not in err


def test_remote_output_failing_part_way(small_flowers, monkeypatch):
    """ram:// is TensorFlow's in-memory filesystem: the remote write path, no network (the
    library's: the command refuses ram:// as DST)."""
    import tensorflow as tf

    from petal.data import convert
    from petal.errors import PetalError

    real = tf.io.TFRecordWriter

    class Failing(real):
        writes = 0

        def write(self, record):
            Failing.writes += 1
            if Failing.writes == 5:
                raise tf.errors.UnavailableError(None, None, "Connection reset by peer")
            return super().write(record)

    monkeypatch.setattr(tf.io, "TFRecordWriter", Failing)
    out = "ram://petal-failing/out"
    with pytest.raises(PetalError) as caught:
        convert(small_flowers, out, workers=1, progress=False)
    assert str(caught.value) == (
        f"Cannot reach {out} (Connection reset by peer); check the path, the network and the "
        "credentials."
    )
    assert not tf.io.gfile.glob(out + "/*")  # no temporaries, no manifest

    monkeypatch.setattr(tf.io, "TFRecordWriter", real)
    assert convert(small_flowers, out, workers=1, progress=False).written == 60
    assert tf.io.gfile.exists(out + "/manifest.json")


def test_remote_source_failing_part_way_stops_instead_of_skipping(
    small_flowers, tmp_path, capsys, monkeypatch
):
    """A store that stops answering is not a folder of bad images: no mostly-skipped output."""
    import tensorflow as tf

    src = "ram://petal-flaky/photos"
    for path in sorted(small_flowers.rglob("*.jpg"))[:20]:
        tf.io.gfile.makedirs(f"{src}/{path.parent.name}")
        tf.io.gfile.copy(str(path), f"{src}/{path.parent.name}/{path.name}", overwrite=True)
    real = tf.io.gfile.GFile
    reads = []

    def flaky(path, mode="r"):
        if "rb" in mode and str(path).startswith(src):
            reads.append(path)
            if len(reads) >= 6:
                raise tf.errors.UnavailableError(None, None, "Connection reset by peer")
        return real(path, mode)

    monkeypatch.setattr(tf.io.gfile, "GFile", flaky)
    out = tmp_path / "out"
    assert main(["convert", src, str(out), "--workers", "1", "--val-fraction", "0.2"]) == 2
    line = _error_line(capsys)
    assert line.startswith(f"petal convert: error: Cannot reach {src} (reading ")
    assert line.endswith(
        ": Connection reset by peer); nothing was written: check the network and the "
        "credentials, then run again."
    )
    assert not out.exists()


def test_image_size_over_jpeg_limit(small_flowers, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["convert", str(small_flowers), str(out), "--image-size", "70000x1"]) == 2
    assert "at most 65500 pixels per side" in _error_line(capsys)
    assert not out.exists()


def test_max_pixels_below_the_default_size_names_both(small_flowers, tmp_path, capsys):
    """The error said "Received: image_size=None" for the default size and left out the
    option that was really at fault."""
    out = tmp_path / "out"
    assert main(["convert", str(small_flowers), str(out), "--max-pixels", "100"]) == 2
    assert _error_line(capsys) == (
        "petal convert: error: image_size 192x192 is 36,864 pixels, more than max_pixels 100; "
        "choose a smaller --image-size or raise --max-pixels. Received: image_size=192 (the "
        "default), max_pixels=100"
    )
    assert not out.exists()


def test_inspect_grid_paths(small_records, tmp_path, capsys):
    assert main(["inspect", str(small_records), "--grid", str(tmp_path / "g.txt")]) == 2
    line = _error_line(capsys)
    assert line.startswith("petal inspect: error: --grid must name an image file (.png, .jpg")
    assert main(["inspect", str(small_records), "--grid", str(tmp_path / "gnoext")]) == 0
    assert f"grid: {tmp_path / 'gnoext.png'}\n" in capsys.readouterr().out
    assert (tmp_path / "gnoext.png").is_file()
    # Checked before the records are read: a parent that is a file, no name at all.
    (tmp_path / "afile").write_text("x")
    assert main(["inspect", str(small_records), "--grid", str(tmp_path / "afile" / "g.png")]) == 2
    assert _error_line(capsys) == (f"petal inspect: error: --grid {tmp_path}/afile/g.png: "
                                   f"{tmp_path}/afile is a file, not a folder; pass another path.")
    assert main(["inspect", str(small_records), "--grid", "/proc/petal/g.png"]) == 2
    assert _error_line(capsys).startswith(
        "petal inspect: error: --grid /proc/petal/g.png: nothing can be written in /proc ("
    )
    assert main(["inspect", str(small_records), "--grid", ""]) == 2
    assert _error_line(capsys) == ("petal inspect: error: --grid needs a file name, such as "
                                   "grid.png. Received: --grid ''")
    # An existing folder, named without its '/': "--grid plots" wrote plots.png beside it.
    (tmp_path / "plots").mkdir()
    assert main(["inspect", str(small_records), "--grid", str(tmp_path / "plots")]) == 2
    assert _error_line(capsys) == (f"petal inspect: error: --grid {tmp_path}/plots is a folder; "
                                   f"pass a file name, such as {tmp_path}/plots/grid.png.")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "gnoext.png", "plots"]


def test_inspect_missing_shard_without_verify(small_records, tmp_path, capsys):
    copy = shutil.copytree(small_records, tmp_path / "copy")
    (copy / "train-00001-of-00002-25.tfrec").unlink()
    assert main(["inspect", str(copy)]) == 1
    assert "  train-00001-of-00002-25.tfrec: missing" in capsys.readouterr().out.splitlines()


def test_convert_warns_about_no_validation_split(small_flowers, tmp_path, capsys):
    out = tmp_path / "out"
    args = ["convert", str(small_flowers), str(out), "--image-size", "16", "--workers", "1"]
    assert main([*args, "--val-fraction", "0"]) == 0
    printed = capsys.readouterr()
    assert printed.out.startswith("written 60 (train 60 in 1 shard, validation 0 in 0 shards)")
    assert printed.out.count("\n") == 1  # the summary; warnings go to stderr
    assert printed.err.splitlines()[-1].startswith(  # after the progress bars
        "petal convert: warning: no validation split (--val-fraction 0); petal train"
    )


def test_a_skipped_file_with_a_newline_in_its_name_stays_on_one_line(tmp_path, capsys):
    src = _two_classes(tmp_path / "photos")
    (src / "a" / "bad\nname\x1b[2J.jpg").write_bytes(b"not an image")
    assert main(["convert", str(src), str(tmp_path / "out"), "--workers", "1"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert "skipped a/bad\\nname\\x1b[2J.jpg: not an image (no known image format in the file)" \
        in err


def test_ctrl_c_dropped_by_a_garbage_collector_callback_still_stops(small_flowers, tmp_path):
    # Python drops the exception of a signal that lands in a gc callback (JAX, which
    # TensorFlow imports, registers one): Ctrl-C during the import was often ignored.
    out = tmp_path / "out"
    script = tmp_path / "ctrl_c.py"
    script.write_text(
        "import gc, signal, sys, time\n"
        "from petal import cli\n"
        "def start():\n"
        "    def callback(phase, info):\n"
        "        gc.callbacks.remove(callback)\n"
        "        signal.raise_signal(signal.SIGINT)  # raised in here, then dropped\n"
        "    gc.callbacks.append(callback)\n"
        "    gc.collect()\n"
        "    time.sleep(20)  # Ctrl-C delivered again ends this at once\n"
        "cli.start_tensorflow_quietly = start\n"
        f"sys.exit(cli.main(['convert', {str(small_flowers)!r}, {str(out)!r},\n"
        "                   '--workers', '1', '--image-size', '16']))\n"
    )
    done = run_script(script)
    assert done.returncode == 130, done.stderr[-2000:]
    assert done.stderr.splitlines()[-1] == (
        "petal convert: interrupted; DST is as it was, or holds the whole new conversion if it "
        "had just finished (never a part of one)"
    )
    assert not out.exists()


def _two_classes(src: Path) -> Path:
    """``src`` with classes ``a`` and ``b`` of two different small PNGs each."""
    for c, cls in enumerate(("a", "b")):
        (src / cls).mkdir(parents=True)
        for i in range(2):
            (src / cls / f"{i}.png").write_bytes(_tiny_png(10 * c + i))
    return src


def _tiny_png(seed: int) -> bytes:
    import io

    import numpy as np
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 255, (20, 20, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


def test_names_in_warnings_stay_on_their_line(tmp_path, capsys):
    """Names in the warnings were printed raw: a newline split one, an escape sequence
    reached the terminal. They are escaped as the skipped files' are."""
    src = _two_classes(tmp_path / "photos")
    (src / "stray\n.png").write_bytes(_tiny_png(5))  # in no class
    (src / "a" / "notes\x1b[2J.txt").write_text("x")  # not of a type petal reads
    (src / "a" / ".hid\nden.png").write_bytes(_tiny_png(6))  # hidden
    (src / "empty\x1b]0;title\x07").mkdir()  # no files, so no class
    (src / "c\x1b[31m").mkdir()
    (src / "c\x1b[31m" / "x.png").write_bytes(b"not an image")  # a class with no records
    assert main(["convert", str(src), str(tmp_path / "out"), "--workers", "1"]) == 0
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\x07" not in err
    warnings = [line for line in err.splitlines() if line.startswith("petal convert: warning:")]
    assert len(warnings) == 6  # and the empty validation split
    for name in ("(stray\\n.png;", "(a/notes\\x1b[2J.txt;", "(a/.hid\\nden.png;",
                 "(empty\\x1b]0;title\\x07;", "for class c\\x1b[31m:"):  # fmt: skip
        assert sum(name in w for w in warnings) == 1, name


def test_names_that_are_not_utf8(tmp_path, capsys):
    """A file is skipped with the reason; a class folder is refused in one line."""
    import os

    src = _two_classes(tmp_path / "photos")
    (src / "a" / os.fsdecode(b"\xff\xfe.png")).write_bytes(_tiny_png(3))
    assert main(["convert", str(src), str(tmp_path / "out"), "--workers", "2"]) == 0
    out = capsys.readouterr()
    assert "skipped a/\\xff\\xfe.png: file name is not valid UTF-8 (records store it as UTF-8 " \
        "text); rename it" in out.err.splitlines()
    assert out.out.startswith("written 4 (") and "skipped 1 of 5 found" in out.out

    (src / "b").rename(src / os.fsdecode(b"\xe9t\xe9"))
    assert main(["convert", str(src), str(tmp_path / "out2"), "--workers", "1"]) == 2
    assert capsys.readouterr().err == (
        f"petal convert: error: The name of the class folder {src}/\\xe9t\\xe9 is not valid "
        "UTF-8, and class names are stored as UTF-8 text: rename the folder (e.g. with convmv) "
        "and run again.\n"
    )
    assert not (tmp_path / "out2").exists()


def test_a_dst_whose_name_is_not_utf8_is_refused_before_the_old_conversion_goes(
    small_flowers, small_records, tmp_path, capsys
):
    """TensorFlow cannot open such a path: the manifest failed after the shards were written
    (a traceback), and --overwrite had removed the complete conversion already."""
    old = shutil.copytree(small_records, tmp_path / os.fsdecode(b"old\xffrecs"))
    before = {p.name: p.read_bytes() for p in old.iterdir()}
    new = old.parent / os.fsdecode(b"new\xferecs")
    for dst, shown, extra in ((old, "old\\xffrecs", ["--overwrite"]), (new, "new\\xferecs", [])):
        args = ["convert", str(small_flowers), str(dst), "--image-size", "8", "--workers", "1"]
        assert main([*args, *extra]) == 2
        assert _error_line(capsys) == (
            "petal convert: error: The output folder's name is not valid UTF-8 (TensorFlow "
            "writes and reads records only under UTF-8 paths); rename it, or pass another DST. "
            f"Received: output={tmp_path / shown}"
        )
    assert {p.name: p.read_bytes() for p in old.iterdir()} == before
    assert not new.exists()


def test_a_ram_url_dst_is_refused_and_not_listed_as_supported(small_flowers, tmp_path, capsys):
    """ram:// records vanished as the command ended, after "written 60 ... -> ram://recs"."""
    import tensorflow as tf

    assert main(["convert", str(small_flowers), "ram://petal-cli/recs", "--workers", "1"]) == 2
    assert _error_line(capsys) == (
        "petal convert: error: DST ram://petal-cli/recs is TensorFlow's in-memory file system: "
        "its records would be gone when petal exits; pass a local folder or a gs:// one."
    )
    assert not tf.io.gfile.exists("ram://petal-cli/recs")
    assert main(["convert", str(small_flowers), "http://example.com/recs"]) == 2
    line = _error_line(capsys)
    assert line.startswith("petal convert: error: Cannot open http://example.com/recs: paths ")
    assert "(supported: local paths, " in line and "ram://" not in line
