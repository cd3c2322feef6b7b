"""Reader: opening records folders, codelab shards and image folders; bad input."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from conftest import corrupt_record, image_ids
from petal.data import inspect_records, reader
from petal.data.pipeline import eval_dataset, train_dataset
from petal.data.reader import CODELAB_CLASSES, open_source
from petal.errors import PetalError


def test_records_folder(make_records):
    folder = make_records(counts={"train": [7, 6], "validation": [5]})
    src = open_source(str(folder))
    assert src.kind == "records"
    assert src.classes == tuple(json.loads((folder / "manifest.json").read_text())["classes"])
    assert src.image_size == (16, 16)
    assert src.format == "raw"
    assert src.count("train") == 13 and src.count("validation") == 5 and src.count("all") == 18
    assert [f.split("/")[-1] for f in src.files("validation")] == [
        "validation-00000-of-00001-5.tfrec"
    ]
    assert set(src.files("train")).isdisjoint(src.files("validation"))


def test_codelab_shards_split_by_file_like_the_notebook(make_records):
    # 16 shards like the codelab's: int(16 * 0.19) = 3 validation files, the first three.
    folder = make_records("codelab", counts={"all": [3] * 15 + [2]}, codelab=True, fmt="jpeg")
    src = open_source(str(folder))
    assert src.kind == "codelab"
    names = [f.split("/")[-1] for f in src.files("validation")]
    assert names == ["flowers00-3.tfrec", "flowers01-3.tfrec", "flowers02-3.tfrec"]
    assert len(src.files("train")) == 13
    assert set(src.files("train")).isdisjoint(src.files("validation"))
    assert src.count("validation") == 9 and src.count("train") == 12 * 3 + 2
    assert src.classes == CODELAB_CLASSES  # from the records' label fields
    assert src.image_size == (16, 16)
    # A glob opens the same shards; the codelab's feature spec decodes them.
    assert open_source(str(folder / "flowers*.tfrec")).files("train") == src.files("train")
    images, labels = next(iter(eval_dataset(src, batch_size=4, label_mode="sparse")))
    assert images.shape == (4, 16, 16, 3) and labels.dtype == tf.int32


def test_petal_shards_without_their_manifest_are_refused(make_records):
    # Read as codelab shards they would split by file position: with one train and one
    # validation shard, int(2 * 0.19) = 0 validation files, the validation shard trained on.
    folder = make_records(counts={"train": [7], "validation": [5]}, manifest=False)
    for path in (folder, folder / "*.tfrec"):
        with pytest.raises(PetalError, match=r"written by petal convert .* but no manifest\.json"):
            open_source(str(path))
    with pytest.raises(PetalError, match="no manifest.json"):
        train_dataset(str(folder), batch_size=4)
    # With the manifest beside them, a glob of some of the shards names the folder to pass.
    folder = make_records("complete", counts={"train": [7], "validation": [5]})
    with pytest.raises(PetalError, match=f"records folder {folder}: pass the folder itself"):
        open_source(str(folder / "train-*.tfrec"))
    assert open_source(str(folder)).count("validation") == 5


def test_folders_named_with_glob_characters_open_as_folders(make_records, small_flowers, tmp_path):
    # "[192]" is also a glob character class; the folder exists, so it is the folder.
    folder = make_records("records [192]", counts={"train": [7], "validation": [5]})
    assert open_source(str(folder)).count("validation") == 5
    photos = tmp_path / "photos [2024]"
    photos.mkdir()
    (photos / "daisy").symlink_to(small_flowers / "daisy")
    (photos / "roses").symlink_to(small_flowers / "roses")
    assert open_source(str(photos)).classes == ("daisy", "roses")
    with pytest.raises(PetalError, match=r"No files match the pattern .*/records \[1\]\.$"):
        open_source(str(tmp_path / "records [1]"))


def test_temporary_files_of_an_unfinished_conversion_are_not_shards(make_records, tmp_path):
    # A killed petal convert leaves hidden pieces whose names end in "-<count>.tfrec": they
    # were read as codelab shards, and the pipeline failed on their counts.
    folder = make_records("codelab", counts={"all": [3, 3]}, codelab=True, fmt="jpeg")
    (folder / ".petal-tmp-piece-000003.tfrec").write_bytes(b"partial")
    (folder / ".petal-tmp-train-00000.tfrec").write_bytes(b"")
    src = open_source(str(folder))
    assert src.count("all") == 6 and not any(".petal-tmp-" in f for f in src.files("all"))
    assert open_source(str(folder / "*.tfrec")).count("all") == 6
    killed = tmp_path / "killed"
    killed.mkdir()
    (killed / ".petal-tmp-piece-000003.tfrec").write_bytes(b"partial")
    with pytest.raises(PetalError, match=r"killed holds only the temporary files of a petal "
                       r"convert that did not finish \(\.petal-tmp-\*\); run the conversion again"):
        open_source(str(killed))


def test_an_image_folder_with_a_fifo_opens_and_names_it(small_flowers, tmp_path, caplog):
    import os
    import signal

    photos = tmp_path / "photos"
    for cls in ("daisy", "roses"):
        (photos / cls).mkdir(parents=True)
        for f in sorted((small_flowers / cls).iterdir())[:2]:
            (photos / cls / f.name).symlink_to(f.resolve())
    os.mkfifo(photos / "daisy" / "pipe.jpg")  # reading it would wait for a writer forever
    (photos / "daisy" / "empty.jpg").write_bytes(b"")  # the same size (0) as the FIFO
    def hung(*args):
        raise TimeoutError("open_source read the FIFO")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(60)  # the copy check once read the FIFO: fail instead of hanging
    try:
        src = open_source(str(photos))
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert src.count("all") == 5 and not any(f.endswith("pipe.jpg") for f in src.files("all"))
    assert "left out 1 entries that are not regular files (a FIFO, a device): daisy/pipe.jpg" \
        in caplog.text


def test_an_image_folder_with_a_stray_temporary_file_opens(small_flowers, tmp_path):
    """A `.petal-tmp-*` name beside class sub-folders (a conversion into the wrong folder,
    once) is no unfinished conversion: only a folder without class sub-folders is one."""
    photos = tmp_path / "photos"
    for cls in ("daisy", "roses"):
        (photos / cls).mkdir(parents=True)
        for f in sorted((small_flowers / cls).iterdir())[:2]:
            (photos / cls / f.name).symlink_to(f.resolve())
    (photos / ".petal-tmp-train-00000.tfrec").write_bytes(b"left over")
    src = open_source(str(photos))
    assert src.kind == "folder" and src.count("all") == 4
    (photos / "daisy").rename(tmp_path / "daisy")
    (photos / "roses").rename(tmp_path / "roses")
    with pytest.raises(PetalError, match="holds only the temporary files of a petal convert"):
        open_source(str(photos))


def test_codelab_classes_from_labels(make_records):
    folder = make_records(
        "codelab", counts={"all": [4, 4]}, codelab=True, classes=("cat", "dog", "emu")
    )
    assert open_source(str(folder)).classes == ("cat", "dog", "emu")


def test_image_folder_split_is_stable_and_disjoint(small_flowers, tmp_path):
    src = open_source(str(small_flowers))
    assert src.kind == "folder" and src.image_size is None
    assert src.count("all") == 60
    train, val = set(src.files("train")), set(src.files("validation"))
    assert not train & val and 5 <= len(val) <= 20  # about 19%, by each file's own name
    assert open_source(str(small_flowers)).files("validation") == src.files("validation")
    assert sorted(set(src.labels("validation"))) == [0, 1, 2, 3, 4]
    assert sorted(set(src.labels("train"))) == [0, 1, 2, 3, 4]
    # Photos added later never move a training image into validation (a run trained on the
    # smaller folder keeps a held-out score): a file's side is its own name's. The photos
    # added here hash after every first one: ranked by hash, 1 of 5 validated, then 2 of 11,
    # the second being a training image of the first 5.
    import hashlib

    def rank(rel):
        return hashlib.sha1(rel.encode()).hexdigest()

    part = tmp_path / "part"
    photos = sorted((small_flowers / "daisy").iterdir())
    first = [f"daisy/{i:02d}.jpg" for i in range(5)]
    later = [r for r in (f"daisy/new-{i:03d}.jpg" for i in range(400))
             if rank(r) > max(map(rank, first))][:6]  # fmt: skip
    for rel, photo in zip(first + later, photos, strict=False):
        (part / rel).parent.mkdir(parents=True, exist_ok=True)
        (part / rel).symlink_to(photo.resolve())
        if rel == first[-1]:
            (part / "roses").mkdir()
            for f in sorted((small_flowers / "roses").iterdir())[:4]:
                (part / "roses" / f.name).symlink_to(f.resolve())
            before = open_source(str(part))
    trained = {os.path.relpath(f, part) for f in before.files("train")}
    after = open_source(str(part))
    validated = {os.path.relpath(f, part) for f in after.files("validation")}
    assert after.count("all") == 15 and not trained & validated
    with pytest.raises(PetalError, match="image_size"):
        train_dataset(src, batch_size=4)
    images, labels = next(iter(train_dataset(src, batch_size=4, image_size=24, seed=0)))
    assert images.shape == (4, 24, 24, 3) and labels.shape == (4, 5)


def test_missing_and_empty_sources(tmp_path):
    with pytest.raises(PetalError, match="not found"):
        open_source(str(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(PetalError, match="empty"):
        open_source(str(tmp_path / "empty"))


def test_a_file_given_as_the_data_source(small_flowers, small_records, tmp_path):
    """Each kind of file gets the fix that fits it; a records folder's manifest is its folder."""
    image = sorted((small_flowers / "roses").iterdir())[0]
    with pytest.raises(PetalError, match=r"is a file, not a folder: .*; training and evaluation "
                       r"need labelled images: .*use `petal predict RUN IMAGE`\.$"):
        open_source(str(image))
    shard = sorted(small_records.glob("train-*"))[0]
    # petal's shards are read with their manifest: only the folder is offered.
    with pytest.raises(PetalError, match=rf"pass the folder that holds the shards "
                       rf"\({small_records}\)\.$"):
        open_source(str(shard))
    # Codelab shards (no manifest) may also be a glob.
    (tmp_path / "codelab").mkdir()
    (tmp_path / "codelab" / "flowers00-230.tfrec").write_bytes(shard.read_bytes())
    with pytest.raises(PetalError, match=rf"pass the folder that holds the shards "
                       rf"\({tmp_path}/codelab\) or a glob such as {tmp_path}/codelab/\*\.tfrec\.$"):
        open_source(str(tmp_path / "codelab" / "flowers00-230.tfrec"))
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(PetalError, match=r"notes.txt; pass a records folder.*sub-folders\.$"):
        open_source(str(tmp_path / "notes.txt"))
    (tmp_path / "photos.zip").write_bytes(b"PK")
    with pytest.raises(PetalError, match=r"sub-folders; it is an archive: extract it first "
                       r"\(e.g. `unzip .*photos.zip`\) and pass the folder\.$"):
        open_source(str(tmp_path / "photos.zip"))
    source = open_source(str(small_records / "manifest.json"))
    assert source.kind == "records" and source.path == str(small_records)
    assert source.count("all") == 60


def test_a_flat_folder_of_images_is_not_called_empty(small_flowers, tmp_path):
    for f in sorted((small_flowers / "daisy").iterdir())[:3]:
        (tmp_path / f.name).symlink_to(f.resolve())
    with pytest.raises(PetalError, match=r"Data source .* holds 3 image file\(s\) directly but no "
                       r"class sub-folders; move each class's images into a sub-folder"):
        open_source(str(tmp_path))


def test_manifest_disagreeing_with_shards(make_records):
    folder = make_records()
    manifest = json.loads((folder / "manifest.json").read_text())
    missing = manifest["splits"]["train"]["shards"][1]["file"]
    (folder / missing).rename(folder / "elsewhere.bin")
    with pytest.raises(PetalError, match=f"{missing}.*missing"):
        open_source(str(folder))
    (folder / "elsewhere.bin").rename(folder / missing)

    manifest["splits"]["train"]["shards"][0]["count"] = 8
    manifest["splits"]["train"]["count"] = 14
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(PetalError, match="train-00000-of-00002-7.tfrec of split 'train' has "
                       "count 8, but its file name says 7"):
        open_source(str(folder))
    with pytest.raises(PetalError, match="has count 8, but its file name says 7"):
        inspect_records(folder, progress=False)  # without --verify too

    other = make_records("other")
    (other / "train-00005-of-00009-3.tfrec").write_bytes(b"")
    with pytest.raises(PetalError, match="does not list: train-00005"):
        open_source(str(other))


def _with_split(manifest: dict, split: str, **fields) -> dict:
    splits = {**manifest["splits"], split: {**manifest["splits"][split], **fields}}
    return {**manifest, "splits": splits}


@pytest.mark.parametrize(
    ("damage", "match"),
    [
        (lambda m: [m], "it holds a JSON list, not an object"),
        (lambda m: {**m, "classes": "daisy"}, "'classes' must be a list of class names"),
        (lambda m: {**m, "classes": ["a", "a", "b", "c", "d"]}, "'classes' names a class twice"),
        (lambda m: {**m, "splits": []}, "'splits' must be an object"),
        (lambda m: {**m, "image_size": [16]}, "'image_size' must be"),
        (lambda m: {**m, "format": "png"}, "unknown format 'png'"),
        (lambda m: {k: v for k, v in m.items() if k != "format"}, "it has no 'format'"),
        (  # the count in a shard's name is what readers of codelab-style shards trust
            lambda m: _with_split(
                m, "validation", shards=[{**m["splits"]["validation"]["shards"][0], "count": 4}]
            ),
            r"shard validation-00000-of-00001-5\.tfrec of split 'validation' has count 4, but "
            "its file name says 5",
        ),
        (
            lambda m: _with_split(m, "validation", count=99),
            r"split 'validation' has count 99 but its shards hold \d+",
        ),
        (
            lambda m: _with_split(m, "train", per_class={"daisy": 1}),
            r"the per_class counts of split 'train' add up to 1, but its shards hold \d+",
        ),
        (
            lambda m: _with_split(m, "train", per_class={"lilies": 1}),
            "split 'train' counts class 'lilies', which 'classes' lacks",
        ),
        (
            lambda m: _with_split(m, "train", per_class={"daisy": -1}),
            "split 'train' has per_class",
        ),
    ],
)
def test_damaged_manifest_is_one_line_naming_it(make_records, damage, match):
    """Not a TypeError/KeyError later, nor classes read letter by letter from a string."""
    folder = make_records()
    manifest = json.loads((folder / "manifest.json").read_text())
    (folder / "manifest.json").write_text(json.dumps(damage(manifest)))
    with pytest.raises(PetalError, match=f"manifest.json is damaged: {match}.*petal convert"):
        open_source(str(folder))


def test_damaged_shard_entry_names_the_shard(make_records):
    folder = make_records()
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["splits"]["train"]["shards"][1]["count"] = "x"
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(PetalError, match="shard 1 of split 'train' needs .* count='x'"):
        open_source(str(folder))


def test_mixed_image_sizes_need_image_size(make_records):
    sizes = [(16, 16), (20, 12), (12, 24)] * 6
    folder = make_records(counts={"train": [6, 6], "validation": [6]}, size=None, sizes=sizes)
    src = open_source(str(folder))
    assert src.image_size is None
    with pytest.raises(PetalError, match="mixed image sizes \\(converted with resize mode "):
        train_dataset(src, batch_size=4)
    images, _ = next(iter(eval_dataset(src, batch_size=6, image_size=10)))
    assert images.shape == (6, 10, 10, 3)
    # Codelab shards were not converted by petal: no resize mode is theirs.
    shards = make_records("cl", counts={"all": [3] * 6}, codelab=True, size=None, sizes=sizes)
    with pytest.raises(PetalError) as err:
        train_dataset(str(shards), batch_size=4)
    assert str(err.value) == (
        f"Records in {shards} have mixed image sizes; pass image_size to resize them to one "
        "size (e.g. image_size=192). Received: image_size=None"
    )


def test_corrupt_record_is_named_or_skipped(make_records, caplog):
    folder = make_records(counts={"train": [7, 6], "validation": [5]})
    corrupt_record(folder / "validation-00000-of-00001-5.tfrec", 3)
    # The manifest's byte counts still match: only reading finds the CRC failure.
    src = open_source(str(folder))
    with pytest.raises(
        tf.errors.InvalidArgumentError,
        match=r"validation-00000-of-00001-5\.tfrec: record 3 .*3 of 5",
    ):
        list(eval_dataset(src, batch_size=2))
    before = reader.SKIPPED.skipped
    with caplog.at_level(logging.WARNING, logger="petal.data.reader"):
        ids = image_ids(eval_dataset(src, batch_size=2, normalization="raw", skip_corrupt=True))
    assert ids == [13, 14, 15]
    assert reader.SKIPPED.skipped - before == 2
    assert "validation-00000-of-00001-5.tfrec" in caplog.text


@pytest.mark.slow  # 28 s in a loaded suite run (session 40): `pytest -m slow` runs it
def test_a_sound_shard_of_another_count_than_its_name_is_named_not_called_corrupt(
    make_records, caplog
):
    """A codelab shard renamed to more records than it holds was "corrupt or truncated ...
    record 4 could not be read (CRC failure or short file)", and skip_corrupt "skipped 2
    record(s)" that never were; one renamed to fewer was "holds more records than the 3",
    and skip_corrupt "skipped 0 record(s) ... record 4 is corrupt". Neither is corrupt: the
    shard, the count it holds and its right name are said, with or without skip_corrupt
    (nothing counted as skipped). A shard cut short inside a record still is corrupt."""
    folder = make_records("cl", counts={"all": [4] * 6}, codelab=True, fmt="jpeg")
    (folder / "flowers00-4.tfrec").rename(folder / "flowers00-3.tfrec")  # validation
    (folder / "flowers02-4.tfrec").rename(folder / "flowers02-6.tfrec")  # train
    src = open_source(str(folder))
    sound = "it is not corrupt (every record reads, and the file ends after the last)"
    fewer = (
        f"Codelab shard {folder}/flowers00-3.tfrec holds 4 records, not the 3 its file name "
        f"says: {sound}; rename it to flowers00-4.tfrec."
    )
    more = (
        f"Codelab shard {folder}/flowers02-6.tfrec holds 4 records, not the 6 its file name "
        f"says: {sound}; rename it to flowers02-4.tfrec (or copy it again, if it lost records)."
    )
    for split, expected, held in (("validation", fewer, 4), ("train", more, 20)):
        with pytest.raises(tf.errors.InvalidArgumentError) as caught:
            list(eval_dataset(src, split=split, batch_size=4))
        assert str(reader.input_error(caught.value, str(folder), "evaluate", split=split)) == (
            expected
        )
        mark, skipped = len(reader.SKIPPED.miscounted), reader.SKIPPED.skipped
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="petal.data.reader"):
            ids = image_ids(eval_dataset(src, split=split, batch_size=4, skip_corrupt=True))
        # Every record read, none counted as skipped; the caller stops on the count.
        assert len(ids) == held and reader.SKIPPED.skipped == skipped
        assert str(reader.SKIPPED.miscount_since(mark)) == expected
        assert expected in caplog.text and "corrupt (CRC" not in caplog.text

    # Cut inside its last record: corrupt, as before, whatever its name says.
    (folder / "flowers00-3.tfrec").rename(folder / "flowers00-4.tfrec")
    shard = folder / "flowers00-4.tfrec"
    shard.write_bytes(shard.read_bytes()[:-5])
    src = open_source(str(folder))
    with pytest.raises(tf.errors.InvalidArgumentError) as caught:
        list(eval_dataset(src, split="validation", batch_size=4))
    assert str(reader.input_error(caught.value, str(folder), "evaluate", split="validation")) == (
        f"Corrupt input in {folder}: corrupt or truncated shard {shard}: record 3 (0-based) could "
        "not be read (CRC failure or short file; 3 of 4 records read). Run `petal inspect "
        "--verify` on it, reconvert, or evaluate with --skip-corrupt to skip and count bad records."
    )
    mark, skipped = len(reader.SKIPPED.miscounted), reader.SKIPPED.skipped
    ids = image_ids(eval_dataset(src, split="validation", batch_size=4, skip_corrupt=True))
    assert len(ids) == 3 and reader.SKIPPED.skipped == skipped + 1
    assert reader.SKIPPED.miscount_since(mark) is None


def test_with_skip_corrupt_a_shard_removed_while_reading_is_named_as_gone(make_records, caplog):
    # It was skipped as "record 0 is corrupt (CRC failure or truncation)".
    folder = make_records(counts={"train": [7, 6], "validation": [5]})
    src = open_source(str(folder))
    gone = folder / "train-00001-of-00002-6.tfrec"
    gone.unlink()  # after the source was opened and checked
    before = reader.SKIPPED.skipped
    with caplog.at_level(logging.WARNING, logger="petal.data.reader"):
        ids = image_ids(eval_dataset(src, split="train", batch_size=4, normalization="raw",
                                     skip_corrupt=True))  # fmt: skip
    assert len(ids) == 7
    assert reader.SKIPPED.skipped - before == 6
    assert (
        f"petal: skipped 6 record(s) of {gone}: the shard cannot be opened (not found; removed "
        "while this ran? Restore it or convert again)"
    ) in caplog.text


def test_codelab_shards_open_past_a_damaged_first_record(make_records):
    # Opening peeks at the first records of each shard for class names and image size; a
    # CRC failure there stopped open_source with TensorFlow's bare DataLossError.
    folder = make_records("codelab", counts={"all": [4, 4, 4, 4, 4, 4]}, codelab=True)
    corrupt_record(folder / "flowers00-4.tfrec", 0)  # validation: the first int(6 * 0.19) file
    src = open_source(str(folder))
    assert src.classes == CODELAB_CLASSES and src.image_size == (16, 16)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"flowers00-4\.tfrec: record 0"):
        list(eval_dataset(src, batch_size=2))


def test_image_folder_keeps_byte_identical_copies_on_one_side(tmp_path):
    # The flowers folder files two pairs of identical sunflowers under different names; the
    # split by path hash put one copy of a pair in validation and the other in training.
    import hashlib
    import shutil

    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for cls in ("a", "b"):
        (tmp_path / cls).mkdir()
        for i in range(10):
            pixels = rng.integers(0, 255, (8, 8, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(tmp_path / cls / f"{i}.png")
    for i in range(10):
        shutil.copy(tmp_path / "a" / f"{i}.png", tmp_path / "a" / f"copy{i}.png")
    shutil.copy(tmp_path / "a" / "0.png", tmp_path / "b" / "from-a.png")  # across classes too
    # Larger files (only their last 4 kB are compared first): same size and same end but
    # different bytes are not copies; each has a copy of its own under another name.
    tail = bytes(range(256)) * 20
    for i, head in enumerate((b"x", b"y")):
        (tmp_path / "b" / f"big{i}.jpg").write_bytes(head * 10_000 + tail)
        shutil.copy(tmp_path / "b" / f"big{i}.jpg", tmp_path / "b" / f"big{i}-copy.jpg")
    src = open_source(str(tmp_path), val_fraction=0.5)
    sides: dict[str, set[str]] = {}
    for split in ("train", "validation"):
        for path in src.files(split):
            digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()
            sides.setdefault(digest, set()).add(split)
    assert len(sides) == 22 and all(len(s) == 1 for s in sides.values()), sides
    assert src.count("train") + src.count("validation") == 35 and src.count("validation") > 5
    # Copies under two classes contradict each other's label: said, as convert says it
    # (train and evaluate on the folder read it without a word).
    assert [n for n in src.notes if "more than one class" in n] == [
        "1 image(s) are byte-identical copies filed under more than one class (a/0.png = "
        "a/copy0.png = b/from-a.png): each copy is read with its own class, so the labels "
        "contradict each other; keep each photo in one class"
    ], src.notes
    # Same size and end, different bytes: each keeps its own side.
    bigs = [(str(tmp_path / "b" / n), f"b/{n}", 1) for n in ("big0.jpg", "big0-copy.jpg",
                                                             "big1.jpg", "big1-copy.jpg")]
    val = {"b/big0.jpg", "b/big0-copy.jpg"}
    reader._keep_copies_together(bigs, val)
    assert val == {"b/big0.jpg", "b/big0-copy.jpg"}


def test_unreachable_or_unsupported_remote_sources(monkeypatch):
    with pytest.raises(PetalError, match=r"s3:// are not supported \(supported: .*https://\)"):
        open_source("s3://bucket/records")

    def unreachable(path):
        raise tf.errors.FailedPreconditionError(
            None, None, f"Could not resolve host: www.googleapis.com\n\t when reading {path}"
        )

    monkeypatch.setattr(tf.io.gfile, "exists", unreachable)
    with pytest.raises(PetalError) as info:
        open_source("gs://petal-no-bucket/records")
    assert str(info.value).startswith("Cannot reach gs://petal-no-bucket/records (Could not")
    assert "\n" not in str(info.value)


def test_an_error_on_records_found_sound_is_not_called_corrupt(small_records):
    """An error the records are not to blame for (here, one Keras raised under several
    replicas) was reported as "Corrupt input ... reconvert" although the scan the message
    runs had found every record sound."""
    import tensorflow as tf

    from petal.data.reader import corrupt_input_error

    err = tf.errors.InvalidArgumentError(None, None, "Inputs to operation AddN must match.")
    message = str(corrupt_input_error(err, str(small_records), "train", split="validation"))
    assert message == (
        f"train stopped on {small_records}: Inputs to operation AddN must match. Every record "
        "of the validation split reads and decodes (checked just now), so the records may "
        "not be to blame; `petal inspect --verify` checks their other fields."
    )


def test_an_image_folder_leaves_out_names_that_are_not_utf8_with_a_note(small_flowers, tmp_path):
    """TensorFlow takes paths as UTF-8 text: such a name was a traceback (UnicodeEncodeError)
    for train, evaluate and the pipeline reading the folder."""
    import os

    from conftest import link_photos

    photos = link_photos(small_flowers, tmp_path / "photos", 3, classes=2)
    first = sorted((photos / "daisy").iterdir())[0]
    (photos / "daisy" / os.fsdecode(b"caf\xe9.jpg")).symlink_to(first.resolve())
    src = open_source(str(photos))
    assert src.count("all") == 6
    assert src.notes[-1] == (
        "1 file(s) whose names are not valid UTF-8 are not read (daisy/caf\\xe9.jpg): rename "
        "them to read them"
    )
    images = [x for x, _ in eval_dataset(src, batch_size=4, image_size=16, split="all")]
    assert sum(len(x) for x in images) == 6


def test_an_image_folder_with_a_class_folder_name_not_utf8_is_refused_naming_it(
    small_flowers, tmp_path
):
    """The root's listing went through tf.io.gfile, which decodes names as UTF-8: train,
    evaluate, bench and the pipeline ended in a UnicodeDecodeError traceback where convert
    refuses the folder in one line."""
    from conftest import link_photos

    photos = link_photos(small_flowers, tmp_path / "photos", 3, classes=2)
    os.rename(photos / "daisy", os.path.join(os.fsencode(photos), b"ros\xe9"))
    message = (
        f"The name of the class folder {photos}/ros\\xe9 is not valid UTF-8, and class names "
        "are stored as UTF-8 text: rename the folder (e.g. with convmv) and run again."
    )
    with pytest.raises(PetalError) as err:
        open_source(str(photos))
    assert str(err.value) == message
    with pytest.raises(PetalError) as err:
        train_dataset(str(photos), batch_size=2, image_size=16)
    assert str(err.value) == message



_GONE_SHARD = """
import os, sys
from petal.data import pipeline
from petal.data.reader import input_error, open_source

src = open_source(sys.argv[1])
os.remove(src.files("train")[1])  # removed after the source was opened and checked
make = getattr(pipeline, sys.argv[2])
extra = dict(cache="off") if sys.argv[2] == "train_dataset" else dict(split="train")
try:
    for _ in make(src, batch_size=4, **extra).take(10):
        pass
    print("no error")
except Exception as err:
    print(type(err).__name__)
    print(input_error(err, sys.argv[1], "train"))
"""


@pytest.mark.parametrize(  # 58-64 s a case in a loaded suite run (session 40): one in CI
    "fn", ["train_dataset", pytest.param("eval_dataset", marks=pytest.mark.slow)]
)
def test_a_shard_removed_while_reading_fails_naming_it_and_does_not_hang(make_records, fn):
    # TFRecordDataset(...).ignore_errors() retried a file it could not open forever: the
    # pipeline spun at full CPU (and a process exiting with such an iterator alive hung).
    import subprocess
    import sys

    folder = make_records(counts={"train": [10, 10], "validation": [5]})
    out = subprocess.run([sys.executable, "-c", _GONE_SHARD, str(folder), fn],
                         capture_output=True, text=True, timeout=120)
    lines = out.stdout.splitlines()
    assert lines[:1] == ["NotFoundError"], out.stdout + out.stderr[-2000:]
    assert lines[1] == (
        f"petal train stopped: 1 shard(s) of {folder} cannot be opened "
        "(train-00001-of-00002-10.tfrec: not found). Restore them (removed while it ran? "
        "convert again) or make them readable, then run it again."
    )


@pytest.fixture
def late_class(make_records):
    """Kaggle-style codelab shards (image and class only), 6 x 40 records, whose records 34
    and on in each shard are of a sixth class, index 5, past the first records read."""
    from conftest import keep_only, relabel_after

    folder = make_records("late", counts={"all": [40] * 6}, codelab=True, fmt="jpeg")
    return relabel_after(keep_only(folder), 34, 5)


def test_local_codelab_shards_count_the_class_of_every_record(late_class, monkeypatch):
    # The first 32 records of each shard counted five classes: the sixth class's records
    # had the all-zero one-hot label of an index past them.
    src = open_source(str(late_class))
    assert src.classes == tuple(f"class_{i}" for i in range(6))  # the shards name none
    assert src.classes_from == "counted from every record; the shards name none"
    # Beyond the size read whole (or remote): the first records of each shard, said so.
    monkeypatch.setattr(reader, "MAX_CLASS_SCAN_BYTES", 0)
    src = open_source(str(late_class))
    assert src.classes == tuple(f"class_{i}" for i in range(5))
    assert src.classes_from == (
        "counted from the first 32 records of each shard; the shards name none"
    )


def test_codelab_classes_may_be_given_as_a_comma_separated_string(make_records):
    # It was split into characters (a class per letter), as convert's --classes is not.
    folder = make_records("codelab", counts={"all": [4, 4]}, codelab=True)
    names = "daisy, dandelion,roses,sunflowers,tulips"
    assert open_source(str(folder), classes=names).classes == CODELAB_CLASSES


def test_codelab_classes_given_must_cover_the_class_indices_read(make_records, late_class):
    # Fewer names than classes: the records of the others had no class of their own.
    folder = make_records("codelab", counts={"all": [4, 4]}, codelab=True)
    names = ["daisy", "dandelion", "roses", "sunflowers", "tulips"]
    assert open_source(str(folder), classes=[*names, "f"]).num_classes == 6  # more: fine
    with pytest.raises(PetalError, match=r"^classes names 5 classes but the shards at .*late "
                       r"hold class index 5 \(read in every record\): list every class in "
                       r"index order, 6 at least\. Received: classes=daisy,dandelion,"):
        open_source(str(late_class), classes=names)
    with pytest.raises(PetalError, match=r"classes names 2 classes .* class index 4"):
        open_source(str(folder), classes=["a", "b"])


def test_a_records_folders_classes_are_its_manifests(make_records):
    # classes= was ignored without a word for a records folder: its manifest's were read.
    folder = make_records(counts={"train": [4, 4], "validation": [2, 2]},
                          classes=("daisy", "dandelion"))
    assert open_source(str(folder), classes="daisy,dandelion").classes == ("daisy", "dandelion")
    with pytest.raises(PetalError, match=r"^.*records is a records folder of classes "
                       r"daisy,dandelion \(its manifest\); classes cannot choose or reorder "
                       r"them: drop classes \(--classes\), or convert again with --classes "
                       r"to keep other ones\. Received: classes=dandelion,daisy$"):
        open_source(str(folder), classes=["dandelion", "daisy"])


def test_a_records_folders_split_is_its_manifests(make_records):
    """val_fraction was ignored without a word for a records folder (its photos were split
    when converted), as classes= was."""
    folder = make_records(counts={"train": [4, 4], "validation": [2]})
    assert open_source(str(folder), val_fraction=0.19).count("validation") == 2
    assert open_source(str(folder), val_fraction=np.float32(0.19)).count("validation") == 2
    with pytest.raises(PetalError, match=r"^.*records is a records folder, whose split its "
                       r"manifest gives \(val_fraction 0\.19\); val_fraction cannot split it "
                       r"again: drop it, or convert again with --val-fraction\. Received: "
                       r"val_fraction=0\.5$"):  # fmt: skip
        open_source(str(folder), val_fraction=0.5)


def test_a_manifest_whose_image_size_or_format_is_not_the_records_is_refused(
    make_records,
):
    """A manifest edited, or another conversion's, giving another image size or format: the
    folder opened, then every record failed to decode, named corrupt (its fix, skip_corrupt,
    skipped them all: 0 images scored)."""
    jpeg = make_records("jpeg", fmt="jpeg", size=(16, 16))
    raw = make_records("raw", fmt="raw", size=(16, 16))
    for folder, edit, problem in (
        (jpeg, {"image_size": [24, 24]}, "holds a 16x16 image, but the manifest's image_size "
                                         "is 24x24"),
        (jpeg, {"format": "raw"}, "holds an encoded image, but the manifest's format is 'raw'"),
        (raw, {"format": "jpeg"}, "holds raw pixels, but the manifest's format is 'jpeg'"),
    ):  # fmt: skip
        good = json.loads((folder / "manifest.json").read_text())
        (folder / "manifest.json").write_text(json.dumps({**good, **edit}))
        shard = good["splits"]["train"]["shards"][0]["file"]
        with pytest.raises(PetalError, match=(
            rf"^Shard {folder}/{shard} does not belong to {folder}/manifest\.json: its record 0 "
            rf"{problem} \(the manifest edited, or another conversion's\); convert the images "
            r"again with petal convert\.$")):  # fmt: skip
            open_source(str(folder))
        (folder / "manifest.json").write_text(json.dumps(good))
        assert open_source(str(folder)).format == good["format"]


def test_one_unreadable_shard_does_not_end_the_label_check_of_the_others(make_records,
                                                                        monkeypatch):
    """The check stops at a failed request over http (a stalled store waited on each
    shard); a local or gs:// shard that cannot be read is passed over, the others checked."""
    import tensorflow as tf

    from petal.data import folders, reader

    folder = make_records(fmt="jpeg", size=(16, 16))
    good = json.loads((folder / "manifest.json").read_text())
    (folder / "manifest.json").write_text(json.dumps({**good, "classes": good["classes"][::-1]}))
    first = good["splits"]["train"]["shards"][0]["file"]
    read_bytes = reader._GFileFS.read_bytes

    def refused(self, path, *args, **kwargs):
        if path.endswith(first):
            raise folders.gfile_error(path, tf.errors.PermissionDeniedError(None, None, "no"))
        return read_bytes(self, path, *args, **kwargs)

    monkeypatch.setattr(reader._GFileFS, "read_bytes", refused)
    with pytest.raises(PetalError, match=r"^Shard .* does not belong to .*manifest\.json: its "
                       r"record 0 is labelled"):
        open_source(str(folder))


def test_a_val_fraction_that_is_no_number_is_named(make_records):
    # float('abc') raised a bare ValueError.
    folder = make_records("codelab", counts={"all": [4, 4]}, codelab=True)
    with pytest.raises(PetalError, match=r"val_fraction must be in \[0, 1\)\. Received: "
                       r"val_fraction=abc"):
        open_source(str(folder), val_fraction="abc")


def test_a_source_takes_split_names_in_any_case(make_records):
    # As normalization and label_mode are.
    src = open_source(str(make_records(counts={"train": [7, 6], "validation": [5]})))
    assert src.count("Train") == 13 and src.files("ALL") == src.files("all")
    with pytest.raises(PetalError, match=r"Unknown split 'test'"):
        src.count("test")


@pytest.mark.slow  # 31 s in a loaded suite run (session 40): `pytest -m slow` runs it
def test_codelab_classes_given_must_agree_with_the_names_the_records_hold(
    make_records, monkeypatch
):
    """Codelab-named shards whose records carry their class names (``label``): classes= in
    another order was taken silently, and a run trained with --classes called every daisy
    "tulips". Compared where the names are known: a peek knows those of its records only."""
    from conftest import CLASSES, keep_only

    folder = make_records("late", counts={"all": [40] * 6}, codelab=True, fmt="jpeg")
    # Records 34-39 of each shard: a sixth class, named "sixth", past the first 32 read.
    for shard in sorted(folder.glob("*.tfrec")):
        examples = [tf.train.Example.FromString(r.numpy())
                    for r in tf.data.TFRecordDataset(str(shard))]  # fmt: skip
        with tf.io.TFRecordWriter(str(shard)) as writer:
            for k, example in enumerate(examples):
                if k >= 34:
                    feature = example.features.feature
                    feature["class"].int64_list.value[:] = [5]
                    feature["label"].bytes_list.value[:] = [b"sixth"]
                writer.write(example.SerializeToString())
    assert open_source(str(folder)).classes == (*CLASSES, "sixth")
    named = [*CLASSES, "sixth"]
    assert open_source(str(folder), classes=named).classes == tuple(named)
    with pytest.raises(PetalError, match=(
        rf"^classes names class index 0 'tulips' but the shards at {folder} name it 'daisy' "
        r"\(their label field, read in every record\): leave classes \(--classes\) out, the "
        r"records name their classes, or give them in the records' order \(daisy,dandelion,"
        r"roses,sunflowers,tulips,sixth\)\. Received: classes=tulips,sunflowers,roses,"
        r"dandelion,daisy,sixth$"
    )):
        open_source(str(folder), classes=[*CLASSES[::-1], "sixth"])
    with pytest.raises(PetalError, match=r"class index 5 'lilies' but .* name it 'sixth'"):
        open_source(str(folder), classes=[*CLASSES, "lilies"])
    # Peeked (too large to read whole, or remote): index 5's name is not known, so not compared;
    # the five read still are.
    monkeypatch.setattr(reader, "MAX_CLASS_SCAN_BYTES", 0)
    assert open_source(str(folder), classes=[*CLASSES, "lilies"]).classes[5] == "lilies"
    with pytest.raises(PetalError, match=r"class index 2 'sunflowers' but .* name it 'roses' "
                       r"\(their label field, read in the first 32 records of each shard\)"):
        open_source(str(folder), classes=["daisy", "dandelion", "sunflowers", "roses", "tulips"])
    # Records with class ids alone: classes names them, in any words.
    keep_only(folder)
    assert open_source(str(folder), classes="a,b,c,d,e,f").classes == tuple("abcdef")


def test_a_list_of_folders_is_no_data_source(make_records):
    """["records"] was read as a glob: "No files match the pattern ['records']"."""
    import re

    folder = make_records()
    assert open_source(folder).count("all") == open_source(str(folder)).count("all")
    for data in ([str(folder)], [str(folder), str(folder)], b"records"):
        message = (
            r"^The data source must be one folder, glob or URL \(a str or os\.PathLike\)\. "
            rf"Received: path={re.escape(repr(data))}$"
        )
        with pytest.raises(PetalError, match=message):
            open_source(data)
        with pytest.raises(PetalError, match=message):
            train_dataset(data, batch_size=4)


def test_codelab_shards_that_name_no_classes_get_neutral_names_and_a_warning(make_records):
    """Shards of class ids alone (Kaggle-style) were given the codelab's flower names, padded
    with class_N (7 classes: daisy, ..., tulips, class_5, class_6), without a word."""
    from conftest import keep_only

    names = ("cat", "dog", "fox", "owl", "bee", "ant", "elk")
    folder = make_records("seven", counts={"all": [7] * 6}, codelab=True, classes=names)
    src = open_source(str(folder))
    assert src.classes == names and src.notes == ()  # their label field names them
    keep_only(folder)
    src = open_source(str(folder))
    assert src.classes == tuple(f"class_{i}" for i in range(7))
    assert src.notes == (
        f"the shards at {folder} name no classes (no label in their records, no "
        "manifest.json): their 7 classes are called class_0 ... class_6, by index; pass "
        "--classes NAMES (comma-separated, in index order) to name them",
    )
    given = open_source(str(folder), classes=",".join(names))
    assert given.classes == names and given.notes == ()


def test_raw_pixel_shards_without_their_manifest_are_refused_naming_the_fix(make_records):
    """Raw-pixel records in the codelab's layout (no manifest.json) were read as JPEG: every
    record "Corrupt input ... Unknown image file format", with --skip-corrupt advice that
    would have skipped them all."""
    folder = make_records("raw", counts={"all": [5] * 3}, codelab=True, fmt="raw")
    message = (
        rf"^Shard {folder}/flowers00-5\.tfrec holds raw pixels \(petal convert --format raw\), "
        r"which petal reads only with their records folder's manifest\.json: "
    )
    with pytest.raises(PetalError, match=message):
        open_source(str(folder))
    with pytest.raises(PetalError, match=message):
        train_dataset(str(folder), batch_size=4)
    # The same records with their manifest read as raw.
    records = make_records("with-manifest", fmt="raw")
    assert open_source(str(records)).format == "raw"


def test_codelab_shards_whose_records_have_no_class_are_refused_naming_the_shard(make_records):
    """Records of image and label alone opened as 0 classes "called , by index" (they have
    labels), then failed on num_classes, or with --classes blamed undecodable images."""
    from conftest import keep_only

    folder = keep_only(make_records("nocls", counts={"all": [6] * 4}, codelab=True),
                       keys=("image", "label"))  # fmt: skip
    message = (
        rf"^Codelab shard {folder}/flowers00-6\.tfrec holds records without a 'class' feature "
        r"\(the int64 class index the codelab's schema needs; they carry image, label\): write "
        r"the records again with their class index in 'class', or convert the original "
        r"images with petal convert\.$"
    )
    for classes in (None, ",".join(CODELAB_CLASSES)):
        with pytest.raises(PetalError, match=message):
            open_source(str(folder), classes=classes)
    with pytest.raises(PetalError, match=message):
        train_dataset(str(folder), batch_size=4)


def test_a_manifest_that_lists_a_shard_twice_or_under_the_other_split_is_refused(make_records):
    """Such a manifest passed inspect --verify, and training validated on records it trained
    on (the codelab's "same dataset" bug)."""
    folder = make_records()
    good = json.loads((folder / "manifest.json").read_text())
    train, val = good["splits"]["train"], good["splits"]["validation"]
    first = train["shards"][0]
    damaged = (
        (  # the first training shard listed under validation too
            {"train": train, "validation": {"count": first["count"], "shards": [first]}},
            f"shard {first['file']} is listed twice \\(in splits 'train' and 'validation'\\)",
        ),
        (  # ... twice in one split
            {"train": {"count": 2 * first["count"], "shards": [first, first]}},
            f"shard {first['file']} is listed twice \\(in split 'train'\\)",
        ),
        (  # the splits swapped
            {"train": val, "validation": train},
            f"shard {val['shards'][0]['file']} is listed in split 'train', but its name says "
            "'validation'",
        ),
    )
    for splits, match in damaged:
        (folder / "manifest.json").write_text(json.dumps({**good, "splits": splits}))
        message = f"^Manifest {folder}/manifest.json is damaged: {match}; convert the images"
        with pytest.raises(PetalError, match=message):
            open_source(str(folder))
        with pytest.raises(PetalError, match=message):
            inspect_records(str(folder), verify=True, progress=False)


def test_a_manifest_whose_classes_are_not_the_records_labels_is_refused(make_records, monkeypatch):
    """Classes swapped or renamed in the manifest: petal train trained to the end, calling
    every daisy "dandelion" (only inspect --verify read the labels)."""
    from petal.data import remote

    folder = make_records()
    good = json.loads((folder / "manifest.json").read_text())
    assert open_source(str(folder)).classes == tuple(good["classes"])
    shard = good["splits"]["train"]["shards"][0]["file"]
    for classes, found in (
        (["dandelion", "daisy", *good["classes"][2:]], "dandelion"),  # swapped
        (["marguerite", *good["classes"][1:]], "marguerite"),  # renamed
    ):
        (folder / "manifest.json").write_text(json.dumps({**good, "classes": classes}))
        message = (
            rf"^Shard {folder}/{shard} does not belong to {folder}/manifest\.json: its record "
            rf"0 is labelled 'daisy', but class 0 is '{found}' in the manifest \(classes swapped "
            r"or renamed, or another conversion's manifest\); convert the images again with "
            r"petal convert\.$"
        )
        with pytest.raises(PetalError, match=message):
            open_source(str(folder))
        with monkeypatch.context() as patch:  # a first record larger than the bytes read
            patch.setattr(reader, "LABEL_CHECK_BYTES", 16)
            with pytest.raises(PetalError, match=message):
                open_source(str(folder))
    with (
        remote.ObjectServer({"records": folder}) as server,
        pytest.raises(PetalError, match=r"record 0 is labelled 'daisy', but class 0 is"),
    ):
        open_source(server.url("records"))


def test_an_error_on_records_with_unreadable_ones_claims_no_more_than_was_read(make_records):
    """The scan behind "Every record reads and decodes" reads past CRC failures: with
    --skip-corrupt having skipped records, the message said every record read."""
    import tensorflow as tf

    from conftest import corrupt_record
    from petal.data.reader import corrupt_input_error

    records = make_records(counts={"train": [4], "validation": [10]}, size=(32, 32))
    corrupt_record(next(records.glob("validation-*")), 7)
    err = tf.errors.InvalidArgumentError(None, None, "Inputs to operation AddN must match.")
    message = str(corrupt_input_error(err, str(records), "train", split="validation"))
    assert message == (
        f"train stopped on {records}: Inputs to operation AddN must match. Every record of the "
        "validation split that reads decodes (checked just now; 3 cannot be read: CRC failure "
        "or truncation), so the records may not be to blame; `petal inspect --verify` checks "
        "their other fields."
    )


def test_a_record_whose_label_fails_its_crc_is_named_corrupt_not_another_manifests(make_records):
    # The manifest check read the first records' labels without their CRCs: a flipped byte in
    # a label ("dandel\xffon") read as a shard of another conversion ("convert again"), not a
    # corrupt record; corrupt_record's byte 40 lands there by chance (the suite failed so).
    folder = make_records(counts={"train": [7, 6], "validation": [5]})
    shard = folder / "validation-00000-of-00001-5.tfrec"
    data = bytearray(shard.read_bytes())
    first = bytes(data[12 : 12 + int.from_bytes(data[:8], "little")])

    def label(record):
        return tf.train.Example.FromString(record).features.feature["label"].bytes_list.value

    name = label(first)[0]
    for at in (i for i in range(len(first)) if first.startswith(name, i)):  # the filename too
        flipped = bytearray(first)
        flipped[at + len(name) // 2] ^= 0xFF
        if label(bytes(flipped))[0] != name:  # inside record 0's label: its CRC fails
            data[12 + at + len(name) // 2] ^= 0xFF
            break
    shard.write_bytes(bytes(data))
    src = open_source(str(folder))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"5\.tfrec: record 0 "):
        list(eval_dataset(src, batch_size=2))


def test_a_skipped_shard_is_warned_about_once_per_command(caplog):
    # Each replica's pipeline reads every validation shard: on 3 replicas the warning about
    # one corrupt shard came three times, reading as 15 records skipped where 5 were.
    import logging

    import tensorflow as tf

    from petal.data import reader

    def skip():
        reader._report_skip(tf.constant("/no/such/v.tfrec"), tf.constant(3), tf.constant(8))

    events = len(reader.SKIPPED.events)
    with caplog.at_level(logging.WARNING, logger="petal"):
        for _ in range(2):  # two commands (train, then evaluate) in one process
            with reader.SKIPPED.stopping_on_miscounts():
                skip()
                with reader.SKIPPED.stopping_on_miscounts():
                    skip()
                skip()
    said = ("petal: skipped 5 record(s) of /no/such/v.tfrec: record 3 is corrupt (CRC failure "
            "or truncation) and the reader cannot resume inside a shard")
    assert [r.getMessage() for r in caplog.records] == [said, said]
    assert len(reader.SKIPPED.events) == events + 6  # each read counted, as before
    with caplog.at_level(logging.WARNING, logger="petal"):  # outside a command: each read
        skip()
        skip()
    assert [r.getMessage() for r in caplog.records] == [said] * 4
