"""petal inspect: the summary, --verify naming the damaged shard and record, --grid."""

from __future__ import annotations

import json
import re
import shutil

import pytest
import tensorflow as tf
from PIL import Image

from conftest import CLASSES, break_image, corrupt_record, link_photos, titles_apart
from petal.data import inspect_records, read_manifest, schema
from petal.errors import PetalError


@pytest.fixture
def damaged(small_records, tmp_path):
    """A private copy of small_records to break."""
    return shutil.copytree(small_records, tmp_path / "copy")


def _record_offsets(path) -> list[int]:
    """Byte offset of each record's data in a TFRecord file (8-byte length + 4-byte CRC)."""
    offsets, pos = [], 0
    data = path.read_bytes()
    while pos < len(data):
        length = int.from_bytes(data[pos : pos + 8], "little")
        offsets.append(pos + 12)
        pos += 12 + length + 4
    return offsets


def test_summary(small_records):
    report = inspect_records(small_records, progress=False)
    text = str(report)
    assert report.ok and report.verified is None
    assert "60 records, jpeg 64x64 (resize fill, quality 95), 5 classes, seed 0" in text
    assert "daisy" in text and "20.0%" in text
    assert [line.split() for line in text.splitlines() if line.startswith("all ")] == [
        ["all", "50", "10", "60", "100.0%"]
    ]
    assert "balance: every class 12 images" in text
    for shard in ("train-00000-of-00002-25.tfrec", "validation-00001-of-00002-5.tfrec"):
        assert shard in text


def test_summary_names_the_largest_and_smallest_class(small_flowers, tmp_path):
    from petal.data import convert

    for cls, n in (("daisy", 6), ("roses", 4)):
        (tmp_path / "photos" / cls).mkdir(parents=True)
        for f in sorted((small_flowers / cls).iterdir())[:n]:
            (tmp_path / "photos" / cls / f.name).symlink_to(f.resolve())
    convert(tmp_path / "photos", tmp_path / "records", image_size=16, shards=2, workers=1,
            progress=False)  # fmt: skip
    text = str(inspect_records(tmp_path / "records", progress=False))
    assert "balance: largest/smallest class 1.50 (daisy 6 / roses 4)" in text
    # A shard of one record ("1 records" before).
    assert "validation: 2 shards, 2 records, " in text
    assert re.search(r"validation-00000-of-00002-1\.tfrec  1 record  ", text), text


def test_verify_ok(small_records):
    report = inspect_records(small_records, verify=True, progress=False)
    assert report.ok and report.verified == 60
    assert "verify: OK, 60 records in 4 shards" in str(report)


def test_verify_ok_of_one_shard(make_records):
    """It said "in 1 shards"."""
    records = make_records(counts={"train": [3]})
    assert "verify: OK, 3 records in 1 shard read" in str(
        inspect_records(records, verify=True, progress=False)
    )


def test_manifest_counts_that_disagree_with_the_records_are_problems(damaged):
    """An edited manifest (per-class counts moved within a split, written and images_found
    changed) was summarised as given and verified OK."""
    manifest = json.loads((damaged / "manifest.json").read_text())
    train = manifest["splits"]["train"]["per_class"]
    train["daisy"], train["dandelion"] = train["daisy"] - 3, train["dandelion"] + 3
    manifest["written"], manifest["images_found"] = 63, 64
    (damaged / "manifest.json").write_text(json.dumps(manifest))
    totals = [
        "manifest.json: written 63, but its splits hold 60 records (train 50 + validation 10)",
        "manifest.json: images_found 64, but its splits hold 60 records and it lists 0 skipped "
        "(60)",
    ]
    report = inspect_records(damaged, progress=False)
    assert report.problems == totals
    assert str(report).startswith(f"{damaged}: 60 records, ")
    report = inspect_records(damaged, verify=True, progress=False)
    assert report.verified == 60 and report.problems == totals + [
        "train: class 'daisy': 10 records read, the manifest's per_class says 7",
        "train: class 'dandelion': 10 records read, the manifest's per_class says 13",
    ]
    # Numbered as train's and evaluate's errors number them ("record 3 (0-based)").
    assert "verify: 4 problems (60 records read; a shard's first record is record 0):" in str(
        report)


def test_verify_names_shard_and_record_of_a_flipped_byte(damaged):
    shard = damaged / "train-00001-of-00002-25.tfrec"
    data = bytearray(shard.read_bytes())
    data[_record_offsets(shard)[7] + 100] ^= 0xFF  # inside record 7's image
    shard.write_bytes(bytes(data))
    report = inspect_records(damaged, verify=True, progress=False)
    assert not report.ok
    assert "train-00001-of-00002-25.tfrec: sha256 differs from the manifest" in report.problems
    assert any(
        p.startswith("train-00001-of-00002-25.tfrec: record 7: corrupted record")
        for p in report.problems
    ), report.problems
    assert report.verified == 25 + 7 + 10  # the other shards were read in full


def test_verify_truncated_and_missing_shards(damaged):
    shard = damaged / "validation-00000-of-00002-5.tfrec"
    offsets = _record_offsets(shard)
    shard.write_bytes(shard.read_bytes()[: offsets[3] + 10])
    (damaged / "train-00000-of-00002-25.tfrec").unlink()
    problems = inspect_records(damaged, verify=True, progress=False).problems
    assert "train-00000-of-00002-25.tfrec: missing" in problems
    truncated = [p for p in problems if p.startswith("validation-00000-of-00002-5.tfrec: rec")]
    assert truncated == [
        f"validation-00000-of-00002-5.tfrec: record 3: truncated record at byte {offsets[3] - 12}:"
        f" {truncated[0].rsplit(': ', 1)[1]}"
    ]  # TensorFlow's "truncated record at N' failed with ..." once came through as it was


def test_verify_finds_records_that_do_not_parse(damaged, tmp_path):
    """Intact frames whose content is wrong: bad fields are named by record index."""
    m = read_manifest(damaged)
    name = m["splits"]["validation"]["shards"][1]["file"]
    records = [r.numpy() for r in tf.data.TFRecordDataset(str(damaged / name))]
    wrong = tf.train.Example.FromString(records[2])
    wrong.features.feature[schema.LABEL].bytes_list.value[0] = b"lilies"
    records[2] = wrong.SerializeToString()
    records[4] = b"not an example"
    with tf.io.TFRecordWriter(str(damaged / name)) as w:
        for r in records:
            w.write(r)
    problems = inspect_records(damaged, verify=True, progress=False).problems
    assert any(p.startswith(f"{name}: record 2: label 'lilies'") for p in problems), problems
    # One line in TensorFlow's words, without tf.data's wrapping of a map function's error.
    assert f"{name}: record 4: Could not parse example input, value: 'not an example'" in problems


def test_grid(small_records, tmp_path):
    out = tmp_path / "plots" / "grid.png"
    report = inspect_records(small_records, grid=out, grid_per_class=3, progress=False)
    assert report.grid == str(out) and "grid: " in str(report)
    with Image.open(out) as image:
        assert image.format == "PNG" and image.size[0] > 300 and image.size[1] > 500
    with pytest.raises(PetalError, match=r"grid_per_class must be an integer >= 1\. "
                       r"Received: '2'"):
        inspect_records(small_records, grid=out, grid_per_class="2", progress=False)
    # Columns stop at the fullest class: a million asked for a figure matplotlib refused.
    splits = read_manifest(small_records)["splits"].values()
    fullest = max(sum(split["per_class"][name] for split in splits) for name in CLASSES)
    sizes = []
    for per_class in (fullest, 10**6):
        inspect_records(small_records, grid=out, grid_per_class=per_class, progress=False)
        with Image.open(out) as image:
            sizes.append(image.size)
    assert sizes[0] == sizes[1]


def test_skipped_files_are_listed(small_records, tmp_path):
    copy = shutil.copytree(small_records, tmp_path / "copy")
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["skipped"] = [{"file": f"daisy/bad{i}.jpg", "reason": "empty file"} for i in range(12)]
    manifest["images_found"] += 12
    (copy / "manifest.json").write_text(json.dumps(manifest))
    report = inspect_records(copy, progress=False)
    text = str(report)
    assert report.ok and "skipped (12):" in text and "daisy/bad0.jpg: empty file" in text
    assert "... and 2 more" in text


def test_the_summary_counts_every_list_of_files_not_read(small_flowers, tmp_path):
    """Only the hidden entries were counted; images in no class, files of other types,
    empty folders and folder loops were in the manifest alone."""
    from petal.data import convert

    photos = link_photos(small_flowers, tmp_path / "photos", per_class=3, classes=2)
    (photos / "loose.jpg").symlink_to(next((photos / "daisy").iterdir()).resolve())
    (photos / "daisy" / "scan.tiff").write_bytes(b"II*\x00")
    (photos / "daisy" / "notes").write_bytes(b"x")
    (photos / "daisy" / ".ipynb_checkpoints").mkdir()
    (photos / "later").mkdir()
    (photos / "dandelion" / "loop").symlink_to("../dandelion", target_is_directory=True)
    convert(photos, tmp_path / "records", image_size=16, workers=1, progress=False)
    text = str(inspect_records(tmp_path / "records", progress=False))
    assert (
        "found 6, written 6, skipped 0, images in no class not read 1, other-type files not "
        "read 2, hidden entries not read 1, empty folders 1, folder loops not followed 1\n"
    ) in text


def test_no_manifest(tmp_path):
    with pytest.raises(PetalError, match="No readable manifest.json"):
        inspect_records(tmp_path)
    # Nothing there, or a file: said so (both once read as "no readable manifest.json"),
    # offering what inspect reads (a folder of class sub-folders was offered, and refused).
    what = (
        "; pass a records folder (petal convert writes one) or codelab shards (their folder, "
        "or a glob such as DIR/*.tfrec)."
    )
    with pytest.raises(PetalError) as info:
        inspect_records(tmp_path / "nope")
    assert str(info.value) == f"Records not found: {tmp_path / 'nope'}{what}"
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(PetalError) as info:
        inspect_records(tmp_path / "notes.txt")
    assert str(info.value) == f"{tmp_path / 'notes.txt'} is a file, not a records folder{what}"
    (tmp_path / "one.tfrec").write_text("x")  # its folder is named
    with pytest.raises(PetalError, match=r"a file, not a folder: .*one.tfrec; pass the folder"):
        inspect_records(tmp_path / "one.tfrec")


@pytest.mark.slow  # 32 s in a loaded suite run (session 40): `pytest -m slow` runs it
def test_codelab_shards_without_a_manifest_as_training_reads_them(make_records, tmp_path):
    # 16 codelab-named shards (no filename or original_size in the records): the first
    # int(16 * 0.19) = 3 files are validation; labels are record index % 5.
    folder = make_records(
        "codelab", counts={"all": [3] * 15 + [2]}, codelab=True, fmt="jpeg", size=(16, 16)
    )
    report = inspect_records(folder, verify=True, grid=tmp_path / "grid.png", progress=False)
    text = str(report)
    assert report.ok and report.verified == 47, report.problems
    assert text.startswith(f"{folder}: 47 records, jpeg 16x16, 5 classes\nno manifest.json")
    rows = {line.split()[0]: line.split()[1:4] for line in text.splitlines() if line.strip()}
    assert rows["all"] == ["38", "9", "47"]
    assert [int(rows[c][2]) for c in ("daisy", "dandelion", "roses", "sunflowers", "tulips")] == [
        10, 10, 9, 9, 9
    ]
    assert "validation: 3 shards, 9 records" in text and "flowers00-3.tfrec" in text
    assert Image.open(tmp_path / "grid.png").size[0] > 100
    # A glob of some of them: just those, split the same way among themselves.
    some = inspect_records(folder / "flowers0*.tfrec", progress=False)
    assert some.ok and some.path == str(folder) and some.manifest["written"] == 30
    assert len(some.manifest["splits"]["validation"]["shards"]) == 1


def test_a_glob_says_what_it_matched(small_records, tmp_path):
    # It once fell back to reading "<glob>/manifest.json" and said no manifest was there.
    with pytest.raises(PetalError, match=r"No files match the pattern .*/\*\.tfrec\.$"):
        inspect_records(tmp_path / "*.tfrec", progress=False)
    with pytest.raises(PetalError, match="records folder .*: pass the folder itself"):
        inspect_records(small_records / "train-*.tfrec", progress=False)


def test_a_records_folder_named_with_glob_characters(small_records, tmp_path):
    folder = shutil.copytree(small_records, tmp_path / "records [64]")
    assert inspect_records(folder, progress=False).manifest["written"] == 60


def test_codelab_shards_with_a_damaged_record(make_records):
    folder = make_records("codelab", counts={"all": [4, 4, 4]}, codelab=True, fmt="jpeg")
    shard = folder / "flowers01-4.tfrec"
    data = bytearray(shard.read_bytes())
    data[_record_offsets(shard)[2] + 40] ^= 0xFF
    shard.write_bytes(bytes(data))
    counted = inspect_records(folder, progress=False)
    assert not counted.ok
    assert counted.problems[0].startswith("flowers01-4.tfrec: ") and "--verify" in str(counted)
    verified = inspect_records(folder, verify=True, progress=False)
    assert any(p.startswith("flowers01-4.tfrec: record 2: ") for p in verified.problems)


def test_codelab_class_table_adds_up_when_records_cannot_be_read(make_records):
    """Its "all" row counts the records read, as its classes do, and says how many the
    file names promised. A validation shard holding fewer records than its name says is a
    problem of its own, also after one in the train split."""
    folder = make_records(
        "codelab", counts={"all": [3] * 15 + [2]}, codelab=True, fmt="jpeg", size=(16, 16)
    )  # validation: flowers00-02
    shard = folder / "flowers05-3.tfrec"
    data = bytearray(shard.read_bytes())
    data[_record_offsets(shard)[1] + 40] ^= 0xFF
    shard.write_bytes(bytes(data))
    (folder / "flowers00-3.tfrec").rename(folder / "flowers00-4.tfrec")
    counted = inspect_records(folder, progress=False)
    [row] = [line.split() for line in str(counted).splitlines() if line.startswith("all ")]
    assert int(row[1]) + int(row[2]) == int(row[3])
    assert int(row[1]) < 38 and int(row[2]) == 9
    assert f"train {row[1]} of 38, validation 9 of 10 that the file names count" in str(counted)
    assert "flowers00-4.tfrec: 3 records read, file name says 4" in counted.problems


def test_a_folder_of_images_says_convert_it_first(small_flowers):
    with pytest.raises(PetalError, match=r"is a folder of images; inspect reads records: conv"):
        inspect_records(small_flowers, progress=False)


def test_a_run_folder_is_named_as_one(tmp_path):
    # `petal inspect RUN` said "No readable manifest.json at RUN/manifest.json: not a petal
    # records folder, or its conversion did not finish (run petal convert again)".
    run = tmp_path / "run"
    (run / "eval").mkdir(parents=True)
    (run / "eval" / "confusion_matrix.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    (run / "config.json").write_text('{"model": "squeezenet", "resolved": {"classes": ["a"]}}')
    (run / "history.csv").write_text("epoch,loss\n")
    with pytest.raises(PetalError) as caught:
        inspect_records(run, progress=False)
    assert str(caught.value) == (
        f"{run} is the work directory of a `petal train` run, not records; pass a records "
        "folder (petal convert writes one) or codelab shards (their folder, or a glob such as "
        "DIR/*.tfrec)."
    )


def test_petal_shards_without_their_manifest_are_not_codelab_shards(make_records):
    folder = make_records(counts={"train": [4], "validation": [2]}, manifest=False)
    # Said as training and evaluate say it: what is missing and how to get it back.
    with pytest.raises(PetalError, match=r"holds shards written by petal convert "
                       r"\(train-00000-of-00001-4.tfrec, ...\) but no manifest.json: .* Copy "
                       r"manifest.json beside them, or convert again"):
        inspect_records(folder, progress=False)


def test_damaged_manifest_is_one_line(damaged):
    manifest = json.loads((damaged / "manifest.json").read_text())
    manifest["splits"]["train"]["shards"][0]["count"] = "x"
    (damaged / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(PetalError, match="manifest.json is damaged: shard 0 of split 'train'"):
        inspect_records(damaged, progress=False)
    (damaged / "manifest.json").write_text(json.dumps({**manifest, "splits": []}))
    with pytest.raises(PetalError, match="'splits' must be an object"):
        inspect_records(damaged, progress=False)


def test_manifest_without_convert_s_bookkeeping(make_records):
    """A manifest with only what readers need (no written/skipped/per_class, one split)."""
    folder = make_records(counts={"train": [7, 6]})
    report = inspect_records(folder, verify=True, progress=False)
    assert report.ok and report.verified == 13
    assert "found 13, written 13, skipped 0" in str(report)


def test_the_manifest_path_itself_inspects_its_folder(small_records):
    report = inspect_records(small_records / "manifest.json", progress=False)
    assert report.ok and report.path == str(small_records)


def test_a_manifest_under_another_name_inspects_the_shards_beside_it(damaged):
    # read_manifest takes any *.json path; inspect once took only the name manifest.json and
    # looked for the shards under "backup.json/".
    (damaged / "manifest.json").rename(damaged / "backup.json")
    report = inspect_records(damaged / "backup.json", verify=True, progress=False)
    assert report.path == str(damaged) and report.verified == report.manifest["written"] > 0
    assert report.problems == []


def test_a_manifest_with_fewer_classes_than_the_records_is_one_line_per_record(damaged, tmp_path):
    """Each record's one_hot_class is longer than the manifest's class list: said so in
    petal's words (TensorFlow's parse error was three lines per record), and the listing
    stops after 20 problems; the grid still draws the classes the manifest names."""
    manifest = json.loads((damaged / "manifest.json").read_text())
    *manifest["classes"], dropped = manifest["classes"]
    for split in manifest["splits"].values():  # counts that still add up
        split["per_class"][manifest["classes"][-1]] += split["per_class"].pop(dropped)
    (damaged / "manifest.json").write_text(json.dumps(manifest))
    report = inspect_records(damaged, verify=True, grid=tmp_path / "grid.png", progress=False)
    assert report.verified == 60 and len(report.problems) == 60
    assert report.problems[0] == (
        "train-00000-of-00002-25.tfrec: record 0: one_hot_class has 5 values but the manifest "
        "lists 4 classes (the manifest does not belong to these shards)"
    )
    lines = str(report).splitlines()
    assert lines[-22:-1] == [f"  {p}" for p in report.problems[:20]] + ["  ... and 40 more"]
    assert (tmp_path / "grid.png").stat().st_size > 0


def test_missing_resized_and_unlisted_shards_without_verify(damaged):
    """A stat per shard, no read: what petal train would refuse is reported, not listed as fine."""
    (damaged / "train-00000-of-00002-25.tfrec").unlink()
    grown = damaged / "validation-00001-of-00002-5.tfrec"
    size = grown.stat().st_size
    grown.write_bytes(grown.read_bytes() + b"x")
    (damaged / "train-00000-of-00001-3.tfrec").write_bytes(b"")
    report = inspect_records(damaged, progress=False)
    assert report.verified is None and not report.ok
    assert report.problems == [
        "train-00000-of-00002-25.tfrec: missing",
        f"validation-00001-of-00002-5.tfrec: {size + 1} bytes, the manifest says {size}",
        "train-00000-of-00001-3.tfrec: not listed in the manifest (another conversion's shard?)",
    ]
    assert "check: 3 problems" in str(report)


def test_shards_of_a_conversion_in_progress_are_not_unlisted_shards(small_records, tmp_path):
    """convert --overwrite writes its new shards beside the old complete output."""
    from petal.data import open_source

    copy = shutil.copytree(small_records, tmp_path / "copy")
    (copy / f"{schema.TEMP_PREFIX}train-00000.tfrec").write_bytes(b"partial")
    (copy / f"{schema.TEMP_PREFIX}piece-000003.tfrec").write_bytes(b"partial")
    assert inspect_records(copy, progress=False).ok
    assert open_source(copy).count("train") == open_source(small_records).count("train")
    (copy / "train-00000-of-00001-3.tfrec").write_bytes(b"")  # a real stray shard still counts
    assert not inspect_records(copy, progress=False).ok
    with pytest.raises(PetalError, match="manifest does not list: train-00000-of-00001-3"):
        open_source(copy)


def test_grid_is_written_through_gfile_to_a_remote_path(small_records):
    """matplotlib writes local files only; ram:// is TensorFlow's in-memory filesystem."""
    out = "ram://petal-test/grids/sample.png"
    report = inspect_records(small_records, grid=out, grid_per_class=1, progress=False)
    assert report.grid == out
    with tf.io.gfile.GFile(out, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_grid_extension_is_checked_first(small_records, tmp_path, monkeypatch):
    from petal.data import inspect as inspect_module

    def no_read(*args):
        raise AssertionError("the manifest was read before the grid path was checked")

    monkeypatch.setattr(inspect_module, "read_manifest", no_read)
    with pytest.raises(PetalError, match=r"--grid must name an image file \(\.png, \.jpg"):
        inspect_records(small_records, grid=tmp_path / "g.txt", progress=False)
    assert not (tmp_path / "g.txt").exists()


def test_grid_without_extension_reports_the_png_written(small_records, tmp_path):
    report = inspect_records(
        small_records, grid=tmp_path / "grid", grid_per_class=1, progress=False
    )
    assert report.grid == str(tmp_path / "grid.png")
    assert f"grid: {tmp_path / 'grid.png'}" in str(report)
    with Image.open(tmp_path / "grid.png") as image:
        assert image.format == "PNG"


def test_class_names_in_any_script_line_up_and_are_drawn(small_flowers, tmp_path, capfd):
    """CJK names take two terminal columns a character; a plot labels a name that no
    installed font can draw by its number, with one warning, not a box per glyph."""
    import warnings

    from petal.data import convert
    from petal.display import can_draw, columns
    from petal.evaluation.plots import plot_confusion_matrix

    src = tmp_path / "src"
    names = ["玫瑰", "tulips", "été"]
    for name, folder in zip(names, ("roses", "tulips", "daisy"), strict=True):
        (src / name).mkdir(parents=True)
        for f in sorted((small_flowers / folder).iterdir())[:3]:
            (src / name / f.name).symlink_to(f.resolve())
    convert(src, tmp_path / "records", image_size=16, workers=1, progress=False)
    capfd.readouterr()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # matplotlib's "Glyph ... missing from font(s)"
        report = inspect_records(tmp_path / "records", grid=tmp_path / "grid.png",
                                 grid_per_class=2, progress=False)  # fmt: skip
        classes = read_manifest(tmp_path / "records")["classes"]
        assert classes == ["tulips", "été", "玫瑰"]
        plot_confusion_matrix([[1, 0, 0], [0, 1, 0], [0, 0, 1]], classes, tmp_path / "cm.png")
    table = [line for line in str(report).splitlines() if line.startswith(("class ", *names))]
    assert len(table) == 4
    # Each count ends at the same terminal column in every row.
    ends = {columns(line) for line in table}
    assert len(ends) == 1, table
    err = capfd.readouterr().err
    if can_draw("玫瑰"):  # a CJK font is installed: drawn as it is
        assert "class name" not in err
    else:
        assert err.count("no installed font draws 1 class name(s)") == 1
        assert "(玫瑰 as 'class 2')" in err


def _rewrite(folder, name: str, change) -> None:
    """Shard ``name`` written again with ``change(examples)`` applied, sound CRCs, and its
    manifest entry updated to the new file: damage that only reading the records finds."""
    import hashlib

    path = folder / name
    examples = [tf.train.Example.FromString(r.numpy()) for r in tf.data.TFRecordDataset(str(path))]
    change(examples)
    with tf.io.TFRecordWriter(str(path)) as writer:
        for example in examples:
            writer.write(example.SerializeToString())
    manifest = json.loads((folder / "manifest.json").read_text())
    for split in manifest["splits"].values():
        for shard in split["shards"]:
            if shard["file"] == name:
                shard["bytes"] = path.stat().st_size
                shard["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    (folder / "manifest.json").write_text(json.dumps(manifest))


def test_grid_draws_the_records_that_read_and_names_the_others(damaged, tmp_path, capsys):
    """Each damage that --verify names once raised out of --grid as a traceback."""
    from petal import cli

    corrupt_record(damaged / "train-00000-of-00002-25.tfrec", 1)  # a bad frame ends the shard
    break_image(damaged / "train-00001-of-00002-25.tfrec", 0)  # sound CRC, no JPEG
    _rewrite(damaged, "train-00001-of-00002-25.tfrec",
             lambda ex: ex[2].features.feature.pop(schema.FILENAME))  # fmt: skip
    (damaged / "validation-00000-of-00002-5.tfrec").unlink()  # named by the check alone
    out = tmp_path / "grid.png"
    report = inspect_records(damaged, grid=out, grid_per_class=2, progress=False)
    assert report.problems[0] == "validation-00000-of-00002-5.tfrec: missing"
    assert report.problems[1].startswith(
        "train-00000-of-00002-25.tfrec: record 1: corrupted record at "
    )
    assert report.problems[2:] == [
        "train-00001-of-00002-25.tfrec: record 0: Unknown image file format. One of JPEG, "
        "JPEG XL, PNG, GIF, BMP, WebP required.",
        "train-00001-of-00002-25.tfrec: record 2: Feature: filename (data type: string) is "
        "required but could not be found.",
    ]
    assert report.grid == str(out) and Image.open(out).size[0] > 100
    assert "check: 4 problems (shard files and the records read for the grid; " in str(report)
    # --verify names the same records in the same words, and the grid adds no second line.
    verified = inspect_records(damaged, verify=True, grid=out, progress=False)
    assert verified.problems == [
        "train-00000-of-00002-25.tfrec: sha256 differs from the manifest",
        *report.problems[1:],
        report.problems[0],
    ]
    # The command: the report, exit 1, no traceback.
    assert cli.main(["inspect", str(damaged), "--grid", str(out)]) == 1
    assert "record 2: Feature: filename" in capsys.readouterr().out


def test_grid_names_a_raw_record_whose_bytes_do_not_fit_its_size(make_records, tmp_path):
    folder = make_records(counts={"train": [6]}, fmt="raw", size=(16, 16))

    def shorten(examples):
        examples[3].features.feature[schema.IMAGE].bytes_list.value[0] = b"x" * 10

    _rewrite(folder, "train-00000-of-00001-6.tfrec", shorten)
    issue = (
        "train-00000-of-00001-6.tfrec: record 3: raw image holds 10 bytes, size [16, 16] needs 768"
    )
    report = inspect_records(folder, grid=tmp_path / "grid.png", grid_per_class=2, progress=False)
    assert report.problems == [issue]  # said as --verify says it
    assert inspect_records(folder, verify=True, progress=False).problems == [issue]


def test_verify_takes_a_shard_name_without_a_count(damaged):
    """check_manifest and training take a count from the manifest where the name has none."""
    manifest = json.loads((damaged / "manifest.json").read_text())
    manifest["splits"]["train"]["shards"][0]["file"] = "train_part0.tfrec"
    (damaged / "manifest.json").write_text(json.dumps(manifest))
    (damaged / "train-00000-of-00002-25.tfrec").rename(damaged / "train_part0.tfrec")
    report = inspect_records(damaged, verify=True, progress=False)
    assert report.ok and report.verified == 60, report.problems


def test_verify_names_a_folder_where_a_shard_should_be(damaged):
    shard = damaged / "validation-00001-of-00002-5.tfrec"
    shard.unlink()
    shard.mkdir()
    for verify in (False, True):
        report = inspect_records(damaged, verify=verify, progress=False)
        assert report.problems == [
            "validation-00001-of-00002-5.tfrec: unreadable (not a regular file)"
        ]
    assert report.verified == 55


def test_a_manifest_without_shard_sizes_lists_its_shards_without(damaged):
    """Sizes are optional in a manifest (check_manifest); inspect once raised KeyError."""
    manifest = json.loads((damaged / "manifest.json").read_text())
    for split in manifest["splits"].values():
        for shard in split["shards"]:
            del shard["bytes"], shard["sha256"]
    (damaged / "manifest.json").write_text(json.dumps(manifest))
    text = str(inspect_records(damaged, progress=False))
    assert "train: 2 shards, 50 records, sizes not in the manifest" in text
    assert "  train-00000-of-00002-25.tfrec  25 records\n" in text
    assert inspect_records(damaged, verify=True, progress=False).ok
    manifest["splits"]["train"]["shards"][0]["bytes"] = -1
    (damaged / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(PetalError, match=r"a record 'count' and, if it gives one, a size in "
                       r"'bytes'; it has file='train-00000-of-00002-25.tfrec', count=25, "
                       r"bytes=-1; convert"):  # fmt: skip
        inspect_records(damaged, progress=False)


def test_a_glob_across_folders_reads_each_shard_where_it_lies(make_records, tmp_path):
    """Shards were once looked up by name in the first one's folder: reported missing, or
    one read twice in place of its namesake."""
    # Labels are record index % 5: cl holds 0-4, cl2 0-4, 0, 1; flowers01-2 in both.
    make_records("cl", counts={"all": [3, 2]}, codelab=True, fmt="jpeg")
    make_records("cl2", counts={"all": [5, 2]}, codelab=True, fmt="jpeg")
    pattern = tmp_path / "cl*" / "*.tfrec"
    for verify in (False, True):
        report = inspect_records(pattern, verify=verify, progress=False)
        assert report.ok, report.problems
    assert report.verified == 12 and report.path == str(tmp_path)
    train = report.manifest["splits"]["train"]  # 4 files: none validate
    assert [s["file"] for s in train["shards"]] == [
        "cl/flowers00-3.tfrec", "cl/flowers01-2.tfrec", "cl2/flowers00-5.tfrec",
        "cl2/flowers01-2.tfrec",
    ]
    assert list(train["per_class"].values()) == [3, 3, 2, 2, 2]
    assert "\n  cl2/flowers01-2.tfrec  2 records" in str(report)


def test_control_characters_in_class_and_file_names_stay_on_one_line(small_flowers, tmp_path):
    """A newline once split a skipped entry; an escape in a class name reached the terminal."""
    from petal.data import convert

    photos = link_photos(small_flowers, tmp_path / "photos", per_class=3, classes=2)
    (photos / "daisy").rename(photos / "c\x1b[2Jd")
    (photos / "dandelion" / "bad\nname.jpg").write_bytes(b"")
    convert(photos, tmp_path / "records", image_size=16, workers=1, progress=False)
    text = str(inspect_records(tmp_path / "records", progress=False))
    assert "\x1b" not in text and "\n  dandelion/bad\\nname.jpg: " in text
    assert "\nc\\x1b[2Jd " in text


def test_shards_of_image_and_class_alone_verify_and_draw(make_records, tmp_path):
    """Training reads shards holding only image and class (Kaggle's copy of the flowers);
    --verify and --grid called every record broken ("Feature: label ... is required") and
    drew an empty grid."""
    from conftest import keep_only

    folder = keep_only(make_records("cl", counts={"all": [4, 4, 4]}, codelab=True, fmt="jpeg"))
    report = inspect_records(str(folder), verify=True, grid=str(tmp_path / "g.png"))
    assert report.ok, report.problems
    assert report.verified == 12
    assert (tmp_path / "g.png").stat().st_size > 10_000


def test_grid_draws_names_with_dollars_as_written(make_records, tmp_path):
    """matplotlib read `price_$1_to_$5` as mathematics and failed to parse it."""
    records = make_records("rec $1 to $5", classes=("price_$1_to_$5", "save$ 50% off $"))
    out = tmp_path / "grid.png"
    report = inspect_records(str(records), grid=str(out), grid_per_class=2, progress=False)
    assert report.grid == str(out) and out.stat().st_size > 1_000


def test_a_manifest_without_per_class_counts_shows_no_table_of_zeros(make_records):
    """check_manifest accepts a manifest without per_class: inspect showed a table of zeros,
    "every class 0 images" and "see the problems below" with none below, even with --verify,
    which counted every record's class. Now --verify shows the counts read; without it the
    summary says the manifest has none."""
    folder = make_records()  # train 7 + 6, validation 5, labels i % 5; no per_class
    assert "per_class" not in json.loads((folder / "manifest.json").read_text())["splits"]["train"]
    report = inspect_records(folder, progress=False)
    text = str(report)
    assert "balance" not in text and "problems below" not in text and "daisy" not in text
    assert "the manifest gives no per-class counts for train and validation" in text
    assert report.ok and report.uncounted == ["train", "validation"]

    report = inspect_records(folder, verify=True, progress=False)
    text = str(report).splitlines()
    assert report.ok and report.verified == 18
    assert report.manifest["splits"]["train"]["per_class"] == {
        "daisy": 3, "dandelion": 3, "roses": 3, "sunflowers": 2, "tulips": 2
    }  # fmt: skip
    assert [line.split() for line in text if line.startswith(("daisy", "tulips", "all"))] == [
        ["daisy", "3", "1", "4", "22.2%"],
        ["tulips", "2", "1", "3", "16.7%"],
        ["all", "13", "5", "18", "100.0%"],
    ]
    assert "balance: largest/smallest class 1.33 (daisy 4 / sunflowers 3)" in text
    assert not any("problems below" in line for line in text)


def test_a_folder_of_codelab_shards_one_without_a_count_gives_the_reason(make_records):
    """The folder said "No readable manifest.json ... not a petal records folder" where the
    glob and petal train name the shard whose name carries no record count."""
    folder = make_records("cl", counts={"all": [4, 4, 4, 4]}, codelab=True, fmt="jpeg")
    (folder / "flowers03-4.tfrec").rename(folder / "flowers03.tfrec")
    reason = (
        f"Codelab shard {folder}/flowers03.tfrec carries no record count in its name "
        "(expected '...-<count>.tfrec') and there is no manifest.json: rename each shard to "
        "NAME-<count>.tfrec, <count> its number of records (this one flowers03-<count>.tfrec), "
        "or convert the original images with petal convert."
    )
    for path in (folder, f"{folder}/", f"{folder}/*.tfrec"):
        with pytest.raises(PetalError) as info:
            inspect_records(path, progress=False)
        assert str(info.value) == reason


def test_a_class_holding_a_newline_gets_no_font_warning(small_flowers, tmp_path, capfd):
    """It printed the name as it is, its newline splitting the warning in two; then it was
    drawn as 'class 1', and the warning told to install CJK fonts: no font draws a newline.
    It is drawn escaped (display.plot_labels)."""
    from petal.data import convert

    photos = link_photos(small_flowers, tmp_path / "photos", per_class=2, classes=2)
    (photos / "daisy").rename(photos / "new\nline")
    convert(photos, tmp_path / "records", image_size=16, workers=1, progress=False)
    capfd.readouterr()
    inspect_records(tmp_path / "records", grid=tmp_path / "grid.png", grid_per_class=1,
                    progress=False)  # fmt: skip
    err = capfd.readouterr().err
    assert "font" not in err and "new\nline" not in err, err
    assert (tmp_path / "grid.png").is_file()


def test_codelab_class_counts_keep_the_records_before_a_bad_frame(make_records):
    """Classes were counted a batch of records at a time: a bad frame lost the whole batch
    (the whole shard), so the table counted fewer records than --verify read."""
    from conftest import CLASSES

    folder = make_records("codelab", counts={"all": [4, 4, 4, 4]}, codelab=True, fmt="jpeg")
    corrupt_record(folder / "flowers01-4.tfrec", 2)
    shard = folder / "flowers02-4.tfrec"
    shard.write_bytes(shard.read_bytes()[: _record_offsets(shard)[3] + 10])
    read = [0, 1, 2, 3, 4, 5, 8, 9, 10, 12, 13, 14, 15]  # labels are record index % 5
    assert inspect_records(folder, verify=True, progress=False).verified == len(read)
    counted = inspect_records(folder, progress=False)
    assert counted.manifest["splits"]["train"]["per_class"] == {
        c: sum(i % 5 == k for i in read) for k, c in enumerate(CLASSES)
    }
    assert "(classes of the records read: train 13 of 16 that the file names count" in str(
        counted
    )


def test_codelab_shard_counts_that_cancel_out_within_a_split_are_problems(make_records, capsys):
    """Two file names off by one each way added up to the split's records: nothing was
    said, and --verify spoke of a manifest that codelab shards do not have."""
    from petal import cli

    folder = make_records("codelab", counts={"all": [4, 4, 4, 4]}, codelab=True, fmt="jpeg")
    (folder / "flowers01-4.tfrec").rename(folder / "flowers01-5.tfrec")
    (folder / "flowers02-4.tfrec").rename(folder / "flowers02-3.tfrec")
    problems = [
        "flowers01-5.tfrec: 4 records read, file name says 5",
        "flowers02-3.tfrec: 4 records read, file name says 3",
    ]
    for verify in (False, True):
        assert inspect_records(folder, verify=verify, progress=False).problems == problems
    assert cli.main(["inspect", str(folder)]) == 1
    assert problems[0] in capsys.readouterr().out


def test_codelab_shards_that_name_no_classes_are_said_to_have_assumed_names(make_records):
    """Shards of class ids alone were shown with the codelab's flower names, "classes from
    the records"; their names are class_0, ..., assumed, and the fix is named."""
    from conftest import keep_only

    folder = keep_only(make_records("cl", counts={"all": [6, 6]}, codelab=True, fmt="jpeg"))
    text = str(inspect_records(str(folder), progress=False)).splitlines()
    # Not "original sizes": these records were resized, and their size is not recorded.
    assert text[0] == f"{folder}: 12 records, jpeg sizes not recorded, 5 classes"
    assert text[1:3] == [
        "no manifest.json (the codelab's shards): counts from the file names, classes by "
        "index (names assumed), split by file as petal train reads them",
        f"warning: the shards at {folder} name no classes (no label in their records, no "
        "manifest.json): their 5 classes are called class_0 ... class_4, by index; pass "
        "--classes NAMES (comma-separated, in index order) to petal train and evaluate to name "
        "them",
    ]
    assert [line.split()[0] for line in text if line.startswith("class_")] == [
        f"class_{i}" for i in range(5)
    ]
    named = str(inspect_records(str(make_records("named", counts={"all": [6, 6]}, codelab=True,
                                                 fmt="jpeg")), progress=False))  # fmt: skip
    assert "classes from the records" in named and "warning" not in named and "daisy" in named


def _label_records(shard, label, which) -> None:
    """Rewrite codelab ``shard`` giving the records ``which(k, class)`` picks ``label``."""
    examples = [tf.train.Example.FromString(r.numpy()) for r in tf.data.TFRecordDataset(str(shard))]
    with tf.io.TFRecordWriter(str(shard)) as writer:
        for k, example in enumerate(examples):
            feature = example.features.feature
            if which(k, feature["class"].int64_list.value[0]):
                feature["label"].bytes_list.value[:] = [label]
            writer.write(example.SerializeToString())


def test_one_wrong_label_does_not_rename_its_class_and_two_classes_of_one_name_are_refused(
    make_records,
):
    """One record labelled with another class's name, first of its class in its shard,
    named the whole class: two classes were called 'dandelion' (inspect showed one twice,
    train wrote both, evaluate's per-class rows lost one), --verify blamed every correct
    record of the class, and --classes with the true names was refused."""
    from conftest import CLASSES
    from petal.data.reader import open_source

    folder = make_records("cl", counts={"all": [10] * 6}, codelab=True, fmt="jpeg")
    shard = folder / "flowers00-10.tfrec"
    first = [int(tf.train.Example.FromString(r.numpy()).features.feature["class"].int64_list
                 .value[0]) for r in tf.data.TFRecordDataset(str(shard))].index(0)  # fmt: skip
    _label_records(shard, b"dandelion", lambda k, c: k == first)
    source = open_source(str(folder))
    assert source.classes == tuple(CLASSES)
    assert source.notes == (
        f"the records of class index 0 in the shards at {folder} do not agree on its name "
        "(every record): 'daisy' by 11, 'dandelion' by 1; it is called 'daisy'. petal inspect "
        "--verify names the records whose label disagrees with their class",
    )
    assert open_source(str(folder), classes=CLASSES).classes == tuple(CLASSES)
    report = inspect_records(str(folder), verify=True, progress=False)
    assert report.problems == [
        f"flowers00-10.tfrec: record {first}: label 'dandelion' does not match class 0 ('daisy')"
    ]
    assert f"warning: {source.notes[0]}" in str(report).splitlines()
    for k in range(6):  # now every record of class 1 says daisy
        _label_records(folder / f"flowers{k:02d}-10.tfrec", b"daisy", lambda k, c: c == 1)
    with pytest.raises(PetalError, match=(
        f"^The records of the shards at {folder} name class indices 0 and 1 both 'daisy' "
        r"\(their label field, read in every record; petal inspect --verify names")):
        open_source(str(folder))  # fmt: skip


def test_tfrecord_files_and_a_glob_matching_other_files_are_named_for_what_they_are(
    make_records, tmp_path
):
    """A folder of .tfrecord files was "No readable manifest.json" (inspect) or "empty"
    (train); a glob of them or one matching a README said the file "carries no record count
    in its name", and told to rename it 'flowers00-6.tf-<count>.tfrec'."""
    from petal.data.reader import open_source

    folder = make_records("cl", counts={"all": [6] * 6}, codelab=True, fmt="jpeg")
    other = tmp_path / "other"
    other.mkdir()
    for shard in sorted(folder.glob("*.tfrec")):
        shutil.copy(shard, other / f"{shard.stem}.tfrecord")
    (other / "partA.TFRECORDS").write_bytes(b"")  # no count: the count is asked for
    said = (f"{other}/flowers00-6.tfrecord is named .tfrecord, and codelab shards (no "
            "manifest.json) are read by the name NAME-<count>.tfrec, <count> their number of "
            "records: rename each (this one flowers00-6.tfrec).")  # fmt: skip
    for path in (str(other), f"{other}/*.tfrecord"):
        for read in (open_source, lambda p: inspect_records(p, progress=False)):
            with pytest.raises(PetalError) as err:
                read(path)
            assert str(err.value) == said
    with pytest.raises(PetalError, match=r"partA.TFRECORDS is named .TFRECORDS, .* \(this one "
                       r"partA-<count>.tfrec\)\.$"):  # fmt: skip
        open_source(f"{other}/part*")
    (folder / "README.txt").write_text("the flowers")
    with pytest.raises(PetalError) as err:
        open_source(f"{folder}/*")
    assert str(err.value) == (
        f"{folder}/* matches {folder}/README.txt, which is not a codelab shard "
        f"(NAME-<count>.tfrec): pass a glob of the shards alone (such as {folder}/*.tfrec)."
    )
    # The suggestion keeps what the glob named: flowers* is not widened to every shard.
    (folder / "flowers-notes.txt").write_text("picked in May")
    (folder / "flowers00-6.tfrec.bak").write_bytes(b"")
    for glob, alone in (("flowers*", "flowers*.tfrec"), ("flowers*.tfrec*", "flowers*.tfrec"),
                        ("flowers*.tfrec.*", "flowers*.tfrec"), ("flowers*.tf*", "*.tfrec")):
        with pytest.raises(PetalError, match=rf"\(such as {re.escape(f'{folder}/{alone}')}\)\.$"):
            open_source(f"{folder}/{glob}")


def test_inspect_draws_a_progress_bar_only_on_a_terminal_by_default(small_records, monkeypatch):
    """The library drew its bar into a log file or a pipe by default (evaluate's default,
    and the CLI's, is a terminal only)."""
    import io
    import sys

    from conftest import Terminal

    for stderr, drawn in ((io.StringIO(), False), (Terminal(), True)):
        monkeypatch.setattr(sys, "stderr", stderr)
        assert inspect_records(small_records, verify=True).problems == []
        assert ("verify: 100%" in stderr.getvalue()) is drawn, stderr.getvalue()


def test_inspect_refuses_codelab_shards_without_class_in_one_line(make_records):
    """inspect crashed in its class table (TypeError: 'int' object is not iterable) on
    shards whose records carry image and label but no class: an empty class list."""
    from conftest import keep_only

    folder = keep_only(make_records("nocls", counts={"all": [6] * 4}, codelab=True),
                       keys=("image", "label"))  # fmt: skip
    with pytest.raises(PetalError, match=r"flowers00-6\.tfrec holds records without a 'class'"):
        inspect_records(str(folder), progress=False)


def test_grid_titles_fit_their_columns_and_the_title_its_row(make_records, tmp_path, monkeypatch):
    """Long class names ran into their neighbours and out of the figure, and a tall grid's
    title (30 classes) was drawn over its first row."""
    from matplotlib.figure import Figure

    classes = tuple(f"{c}_long_haired_domestic_cat_breed_number_{i:02d}"
                    for i, c in enumerate("abcdef"))  # fmt: skip
    folder = make_records(classes=classes, counts={"train": [12], "validation": [6]})
    drawn = []
    savefig = Figure.savefig

    def check(fig, *args, **kwargs):
        drawn.append(titles_apart(fig)[0].get_text())
        return savefig(fig, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", check)
    inspect_records(folder, grid=tmp_path / "grid.png", grid_per_class=2, progress=False)
    assert drawn and drawn[0].startswith("a_long_") and "…" in drawn[0], drawn


def test_a_class_without_images_is_named_in_the_balance_line_and_its_grid_row(
    make_records, tmp_path, monkeypatch
):
    """The balance line gave the ratio ``inf`` naming one empty class, and the grid left
    the class's row blank, without its name: it looked like a drawing glitch."""
    from matplotlib.figure import Figure

    folder = make_records(classes=("a", "b", "c", "d"), counts={"train": [2], "validation": [1]})
    drawn = []
    savefig = Figure.savefig

    def keep(fig, *args, **kwargs):
        drawn.append([(ax.get_title(), [t.get_text() for t in ax.texts]) for ax in fig.axes])
        return savefig(fig, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep)
    report = inspect_records(folder, verify=True, grid=tmp_path / "g.png", grid_per_class=2,
                             progress=False)  # fmt: skip
    assert "balance: no images of d; every other class 1 image" in str(report).splitlines()
    # One column: the fullest class holds one image (grid_per_class=2 drew an empty one).
    assert len(drawn[0]) == 4
    rows = drawn[0]
    assert [title.splitlines()[0] for title, _ in rows] == ["a", "b", "c", "d"]
    assert [texts for _, texts in rows] == [[], [], [], ["no images"]]


def test_a_grid_whose_write_fails_leaves_the_earlier_grid(small_records, tmp_path,
                                                         monkeypatch):
    """Ctrl-C while the grid was written left a PNG cut short over the earlier one."""
    from matplotlib.figure import Figure

    out = tmp_path / "grid.png"
    inspect_records(small_records, grid=out, grid_per_class=1, progress=False)
    earlier = out.read_bytes()

    def savefig(self, fname, **kwargs):
        with open(fname, "wb") as f:
            f.write(b"cut short")
        raise KeyboardInterrupt

    monkeypatch.setattr(Figure, "savefig", savefig)
    with pytest.raises(KeyboardInterrupt):
        inspect_records(small_records, grid=out, grid_per_class=1, progress=False)
    assert out.read_bytes() == earlier
    assert [p.name for p in tmp_path.iterdir()] == ["grid.png"]


def test_records_being_converted_say_so_not_that_their_conversion_failed(tmp_path):
    """A folder a live conversion is writing into said "its conversion did not finish
    (run petal convert again)"."""
    import os
    import socket
    import subprocess
    import sys

    from petal.running import RUNNING_FILE

    folder = tmp_path / "records"
    folder.mkdir()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (folder / RUNNING_FILE).write_text(json.dumps(
            {"pid": live.pid, "host": socket.gethostname(), "doing": "converting into it"}))
        with pytest.raises(PetalError) as caught:
            inspect_records(folder, progress=False)
        assert str(caught.value) == (
            f"{folder} holds no manifest.json yet: process {live.pid} on "
            f"{socket.gethostname()} is converting into it; wait for it to end, then run "
            "this again.")  # fmt: skip
    finally:
        live.kill()
        live.wait()
    # Once that process has gone, its marker is a conversion that did not finish.
    with pytest.raises(PetalError, match=r"its conversion did not finish"):
        read_manifest(folder)
    os.remove(folder / RUNNING_FILE)
    with pytest.raises(PetalError, match=r"its conversion did not finish"):
        read_manifest(folder)


def test_a_run_folder_or_an_unreadable_marker_is_no_conversion_in_progress(tmp_path):
    """The "conversion in progress" line came for any live marker: a training run's too."""
    from petal.running import RUNNING_FILE

    folder = tmp_path / "run"
    folder.mkdir()
    # On another host: taken as live.
    (folder / RUNNING_FILE).write_text(json.dumps(
        {"pid": 1, "host": "elsewhere.example", "doing": "training in it"}))  # fmt: skip
    with pytest.raises(PetalError, match=r"^No readable manifest.json at .*not a petal records"):
        read_manifest(folder)
    (folder / RUNNING_FILE).write_text("{not json")  # an unknown process
    with pytest.raises(PetalError, match=r"^No readable manifest.json at "):
        read_manifest(folder)


def test_verify_names_a_record_whose_jpeg_data_end_early(make_records):
    """A scan cut off by a marker decodes part grey, with a line on stderr that names no
    record: --verify said OK (convert now refuses such photos; others' shards may hold one)."""
    import io

    import numpy as np

    folder = make_records("codelab", counts={"all": [3, 3]}, codelab=True, fmt="jpeg")
    shard = folder / "flowers01-3.tfrec"
    examples = [tf.train.Example.FromString(r.numpy()) for r in tf.data.TFRecordDataset(str(shard))]
    noise = np.random.default_rng(0).integers(0, 255, (16, 16, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(noise).save(buffer, "JPEG", quality=90)
    jpeg = buffer.getvalue()
    cut = jpeg.index(b"\xff\xda") + (len(jpeg) - jpeg.index(b"\xff\xda")) // 2
    examples[1].features.feature["image"].bytes_list.value[0] = (
        jpeg[:cut] + b"\xff\xd9" + jpeg[cut + 2 :]
    )
    with tf.io.TFRecordWriter(str(shard)) as writer:
        for example in examples:
            writer.write(example.SerializeToString())
    report = inspect_records(folder, verify=True, progress=False)
    assert report.problems == [
        "flowers01-3.tfrec: record 1: its JPEG data end early (Corrupt JPEG data: premature end "
        "of data segment): it decodes part grey"
    ]
