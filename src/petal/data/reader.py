"""Open a data source and read its records: the first stage of every pipeline.

Three kinds of source, told apart by what the path holds:

- ``records``: a petal records folder (``manifest.json`` plus shards). Everything comes
  from the manifest, and the shards are checked against it (present, count, bytes, and
  the labels of their first records against its classes).
- ``codelab``: the Keras-on-TPU codelab's own shards (``flowers00-230.tfrec`` ...), a
  folder or a glob, without a manifest. Counts come from the file names; classes from the
  records' ``class``/``label`` fields (every record of local shards of up to
  ``MAX_CLASS_SCAN_BYTES``, else the first ``PEEK_RECORDS`` of each shard), else the
  codelab's list. The split is **by file**,
  as the squeezenet notebook does it: the first ``int(n_files * 0.19)`` files (in sorted
  order) are the validation set, the rest the training set. Shards that petal convert
  named (``train-00000-of-00013-230.tfrec``) are never opened this way: without their
  manifest the split is unknown, and they are refused.
- ``folder``: a plain folder of class sub-folders of images: the slow per-file path, kept
  for comparison and quick experiments. A file validates when the hash of its relative
  path falls below the validation fraction, so its side never depends on which other files
  exist, except that a class keeps one file on each side (its lowest and highest hashes)
  and byte-identical copies in a local folder all go to the side of the copy whose path
  sorts first (for folders of up to ``MAX_COPY_SCAN`` files).

Paths are local or anything ``tf.io.gfile`` reads (``gs://``); ``http://`` URLs go through
:mod:`petal.data.remote`.
"""

from __future__ import annotations

import codecs
import contextlib
import hashlib
import json
import logging
import math
import os
import posixpath
import stat
import threading
import urllib.parse
from collections import Counter
from dataclasses import dataclass, field

from petal.data import folders, schema, tfdata
from petal.errors import PetalError, some_files

log = logging.getLogger(__name__)

CODELAB_CLASSES = ("daisy", "dandelion", "roses", "sunflowers", "tulips")
# The squeezenet notebook's VALIDATION_SPLIT: the first int(n * 0.19) files are validation.
CODELAB_VAL_FRACTION = 0.19
FOLDER_VAL_FRACTION = 0.19
SPLITS = (*schema.SPLITS, "all")
# Records read from the start of each codelab shard to learn class names and image size.
PEEK_RECORDS = 32
# Local codelab shards of up to this many bytes in all have every record's class read when
# opened (a read of the shards at disk speed: about 0.3 s for 70 MB, 5 s for 1 GB, cached
# in the page cache); larger or remote ones are known by the first PEEK_RECORDS of each.
MAX_CLASS_SCAN_BYTES = 1_000_000_000
# Records per block when counting what a shard yields (see guarded_records).
GUARD_BLOCK = 256


@dataclass
class Source:
    """An opened data source. Build it with :func:`open_source`.

    Attributes:
        path: what was opened (folder, glob or URL), without a trailing slash.
        kind: ``"records"``, ``"codelab"`` or ``"folder"``.
        classes: class names in index order.
        image_size: ``(height, width)`` of the stored images, or None when they vary
            (records written with resize mode ``none``, or an image folder).
        format: ``"jpeg"`` or ``"raw"`` for records, ``"files"`` for an image folder.
        manifest: the records folder's manifest, or None.
        notes: warnings about what is read: for an image folder, lines naming the files it
            holds that are not read; for codelab shards that name no classes, that their
            names are assumed (:func:`unnamed_classes_note`).
        size_recorded: False for codelab shards whose records carry no ``size`` feature
            (``image_size`` is None then, though they may all have one size).
        classes_from: how the classes were found, for messages (codelab shards).
        classes_named: False for codelab shards whose records name no classes (called
            ``class_0``, ... or as ``classes=`` names them).
        kept_in_train: an image folder's files (relative paths) that train against the
            split's rule by name (a class's only file, or one in a class whose every file
            would validate by it), or as ``train_names`` asked: a run records them (see
            :func:`open_source`).
    """

    path: str
    kind: str
    classes: tuple[str, ...]
    image_size: tuple[int, int] | None
    format: str
    manifest: dict | None = None
    notes: tuple[str, ...] = ()
    size_recorded: bool = True
    classes_from: str = ""
    classes_named: bool = True
    kept_in_train: tuple[str, ...] = ()
    _files: dict[str, list[str]] = field(default_factory=dict, repr=False)
    _counts: dict[str, list[int]] = field(default_factory=dict, repr=False)
    _labels: dict[str, list[int]] = field(default_factory=dict, repr=False)
    _bytes: dict[str, int] = field(default_factory=dict, repr=False)

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def remote(self) -> bool:
        """True for ``http(s)://`` sources, read through :mod:`petal.data.remote`."""
        return folders.is_http(self.path)

    def files(self, split: str = "train") -> list[str]:
        """Shard files (records, codelab) or image files (folder) of a split, in a fixed order."""
        split = check_split(split)
        if split == "all":
            return self._files["train"] + self._files["validation"]
        return list(self._files[split])

    def counts(self, split: str = "train") -> list[int]:
        """Number of images in each of :meth:`files` (1 per file for an image folder)."""
        split = check_split(split)
        if split == "all":
            return self._counts["train"] + self._counts["validation"]
        return list(self._counts[split])

    def file_bytes(self) -> dict[str, int]:
        """Size of each shard whose size was known at open (a records folder's manifest, or
        an http store's listing): a remote read checks each download against it."""
        return dict(self._bytes)

    def count(self, split: str = "train") -> int:
        """Number of images in a split."""
        return sum(self.counts(split))

    def labels(self, split: str = "train") -> list[int]:
        """Class index of each file of an image folder (empty for records)."""
        split = check_split(split)
        if split == "all":
            return self._labels.get("train", []) + self._labels.get("validation", [])
        return list(self._labels.get(split, []))

    def decoded_bytes(self, split: str = "train", image_size=None) -> int | None:
        """Bytes the split takes decoded as uint8 (what an in-memory cache holds), if known."""
        size = image_size or self.image_size
        if size is None:
            return None
        return self.count(split) * int(size[0]) * int(size[1]) * 3

    def describe(self) -> str:
        size = "x".join(map(str, self.image_size)) if self.image_size else "varying"
        return (
            f"{self.kind} source {self.path}: {len(self.classes)} classes, images {size}, "
            f"format {self.format}, train {self.count('train')} in {len(self.files('train'))} "
            f"files, validation {self.count('validation')} in {len(self.files('validation'))}"
        )


# --- opening ---------------------------------------------------------------------------------


def open_source(
    path: str,
    *,
    classes: list[str] | tuple[str, ...] | None = None,
    val_fraction: float | None = None,
    verify: bool = True,
    min_classes: int = 2,
    train_names: tuple[str, ...] | list[str] = (),
) -> Source:
    """Open a records folder, codelab shards or an image folder.

    Args:
        path: a petal records folder, a folder or glob of the codelab's shards, a folder of
            class sub-folders of images; local, ``gs://`` (anything ``tf.io.gfile`` reads) or
            ``http://`` (see :mod:`petal.data.remote`).
        classes: class names in index order (a list, or a comma-separated string), for
            codelab shards (at least one per class index their records hold, and the names
            their records' ``label`` gives, where it gives them) and image
            folders (the class folders to read, in this order); a records folder's are its
            manifest's (others are refused).
        val_fraction: validation fraction for codelab shards (by file, default 0.19) and
            image folders (by image, default 0.19).
        verify: check a records folder's shards against its manifest (exist, count, bytes,
            the labels of a few first records).
        min_classes: an image folder with fewer classes is refused (2 to train; 1 to score
            new photos of one of a model's classes).
        train_names: an image folder's files (relative paths) kept in the train split: the
            ones a run's split kept there (its ``kept_in_train``), which photos added to a
            class since would otherwise move into validation.

    Raises:
        PetalError: missing, unreachable or empty source (or a scheme that cannot be read),
            or a manifest that disagrees with the shards.
    """
    if isinstance(path, Source):
        return path
    if not isinstance(path, str | os.PathLike):
        # A list of folders was read as a glob: "No files match the pattern ['records']".
        raise PetalError(
            "The data source must be one folder, glob or URL (a str or os.PathLike). "
            f"Received: path={path!r}"
        )
    path = str(folders.expand_home(path))
    if not path:
        raise PetalError("Data source path is empty. Received: path=''")
    if val_fraction is not None and not 0.0 <= _fraction(val_fraction) < 1.0:
        raise PetalError(f"val_fraction must be in [0, 1). Received: val_fraction={val_fraction}")
    if classes is not None:
        classes = folders.parse_classes(classes)  # "a,b,c" as petal convert takes it
    fs = _fs_for(path)
    is_glob = is_pattern(path)
    root = path if is_glob else path.rstrip("/")
    if is_glob:
        matches = _matching(fs, root)
        if not matches:
            raise PetalError(f"No files match the pattern {path}.")
        _refuse_split_shards(fs, path, matches)
        return _listed_sizes(_open_codelab(root, matches, classes, val_fraction), fs)
    if not fs.exists(root):
        raise PetalError(
            f"Data source not found: {root}. Pass a records folder (petal convert "
            "writes one), codelab shards or a folder of class sub-folders."
        )
    if posixpath.basename(root) == schema.MANIFEST_NAME and not fs.isdir(root):
        root = posixpath.dirname(root) or "."  # a records folder's manifest: that folder
    if fs.exists(_join(root, schema.MANIFEST_NAME)):
        return _records_as_given(_open_records(root, verify=verify), classes, val_fraction)
    if not fs.isdir(root):
        raise _file_given(root)
    names = sorted(fs.listdir(root))
    shards = [_join(root, n) for n in names if schema.is_shard_file(n)]
    if shards:
        _refuse_split_shards(fs, root, shards)
        return _listed_sizes(_open_codelab(root, shards, classes, val_fraction), fs)
    if any(fs.isdir(_join(root, n)) for n in names):
        # (A stray temporary file beside class sub-folders is not read.)
        return _open_folder(root, classes, val_fraction, min_classes, train_names)
    if any(n.startswith(schema.TEMP_PREFIX) for n in names):
        raise PetalError(
            f"{root} holds only the temporary files of a petal convert that did not finish "
            f"({schema.TEMP_PREFIX}*); run the conversion again (petal convert SRC {root})."
        )
    if others := [n for n in names if n.lower().endswith(OTHER_RECORD_SUFFIXES)]:
        raise _not_a_shard(root, _join(root, others[0]))
    if flat := folders.flat_folder_error(root, names, "Data source "):
        raise flat
    raise PetalError(
        f"Data source {root} is empty: no manifest.json, no *{schema.SHARD_SUFFIX} shards and no "
        "class sub-folders. Convert images with `petal convert SRC DST` first."
    )


def _fraction(value) -> float:
    """``value`` as a float, NaN when it is none (refused as out of range)."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return float("nan")


def is_pattern(path: str) -> bool:
    """Whether ``path`` is a glob of shards: it holds ``*``, ``?`` or ``[`` and names no
    file or folder that exists (a folder may be called ``photos [2024]``)."""
    return any(ch in path for ch in "*?[") and not _fs_for(path).exists(path)


def _file_given(path: str) -> PetalError:
    """The error for a data source that is a single file, with the fix for its kind."""
    if path.lower().endswith(folders.IMAGE_EXTENSIONS):
        fix = (
            "training and evaluation need labelled images: pass a folder of class sub-folders "
            "(or records from petal convert); to classify this one image, use "
            "`petal predict RUN IMAGE`"
        )
    elif path.endswith(schema.SHARD_SUFFIX):
        folder = posixpath.dirname(path) or "."
        fix = f"pass the folder that holds the shards ({folder})"
        if not _fs_for(folder).exists(posixpath.join(folder, schema.MANIFEST_NAME)):
            # Codelab shards (no manifest) may also be given as a glob; petal's may not.
            fix += f" or a glob such as {folder}/*{schema.SHARD_SUFFIX}"
    else:
        fix = (
            "pass a records folder (petal convert writes one), codelab shards or a folder of "
            f"class sub-folders{folders.archive_hint(path)}"
        )
    return PetalError(f"Data source is a file, not a folder: {path}; {fix}.")


class ShardsWithoutManifest(PetalError):
    """Shards petal convert named, in a folder without their manifest."""


def codelab_split_files(path: str, split: str = "train") -> list[str] | None:
    """The shards of ``split`` that the codelab shards at ``path`` (a folder or glob, opened
    as training opens them: validation = the first ``int(n * 0.19)`` files in name order)
    give now, listed without reading them, each as :func:`shard_identity` has it; None where
    ``path`` is not codelab shards or cannot be listed (gone, unreachable)."""
    split = check_split(split)
    try:
        path = str(folders.expand_home(path))
        fs = _fs_for(path)
        if is_pattern(path):
            shards = _matching(fs, path)
        elif fs.isdir(path) and not fs.exists(_join(path, schema.MANIFEST_NAME)):
            root = path.rstrip("/")
            shards = [_join(root, n) for n in sorted(fs.listdir(root)) if schema.is_shard_file(n)]
        else:
            return None
    except (PetalError, OSError, ValueError):
        return None
    if not shards or any(schema.is_split_shard(posixpath.basename(s)) for s in shards):
        return None  # nothing, or a petal conversion's shards (read with their manifest)
    n_val = _codelab_validation(len(shards))
    chosen = {"validation": shards[:n_val], "train": shards[n_val:], "all": shards}[split]
    return [shard_identity(s) for s in chosen]


def _matching(fs, pattern: str) -> list[str]:
    """The files ``pattern`` matches, sorted, without a conversion's temporary files."""
    return sorted(
        m for m in fs.glob(pattern) if not posixpath.basename(m).startswith(schema.TEMP_PREFIX)
    )


def _codelab_validation(shards: int, val_fraction=None) -> int:
    """How many of ``shards`` codelab shards (in name order) validate: as in the squeezenet
    notebook, the first ``int(n * 0.19)`` files, by file."""
    fraction = CODELAB_VAL_FRACTION if val_fraction is None else float(val_fraction)
    return int(shards * fraction)


def shard_identity(path: str) -> str:
    """A shard's file as two listings of it compare: its real path (a local file reached
    through another glob, folder or link), or its URL."""
    return path if folders.is_remote(path) else os.path.realpath(path)


def _refuse_split_shards(fs, path: str, shards: list[str]) -> None:
    """Shards that petal convert named are read through their folder's manifest only.

    Without it they would open as codelab shards, split by file position: the validation
    shards would join the training set, and the shards of an unfinished conversion would
    pass for a complete set.
    """
    named = [s for s in shards if schema.is_split_shard(posixpath.basename(s))]
    if not named:
        return
    folder = posixpath.dirname(named[0]) or "."
    if path != folder and fs.exists(_join(folder, schema.MANIFEST_NAME)):
        raise PetalError(
            f"{path} matches shards of the records folder {folder}: pass the folder itself, "
            "whose manifest.json says which shards are training and which validation."
        )
    raise ShardsWithoutManifest(
        f"{folder} holds shards written by petal convert ({posixpath.basename(named[0])}"
        f"{', ...' if len(named) > 1 else ''}) but no {schema.MANIFEST_NAME}: the conversion "
        "did not finish, or the manifest was not copied with the shards. Copy manifest.json "
        "beside them, or convert again (petal convert SRC DST)."
    )


def _open_records(root: str, *, verify: bool) -> Source:
    fs = _fs_for(root)
    manifest_path = _join(root, schema.MANIFEST_NAME)
    data = fs.read_bytes(manifest_path)  # outside the try: its PetalError is a ValueError
    try:
        manifest = json.loads(data.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        raise PetalError(f"Manifest is not valid JSON: {manifest_path} ({err}).") from err
    schema.check_manifest(manifest, manifest_path)
    fmt = manifest["format"]
    size = manifest.get("image_size")
    source = Source(
        path=root,
        kind="records",
        classes=tuple(manifest["classes"]),
        image_size=(int(size[0]), int(size[1])) if size else None,
        format=fmt,
        manifest=manifest,
    )
    listed = set()
    for split in schema.SPLITS:
        info = manifest["splits"].get(split, {"count": 0, "shards": []})
        files, counts = [], []
        for shard in info.get("shards", []):
            files.append(_join(root, shard["file"]))
            counts.append(int(shard["count"]))
            listed.add(shard["file"])
            if "bytes" in shard:
                source._bytes[files[-1]] = int(shard["bytes"])
        source._files[split], source._counts[split] = files, counts
    if not listed:
        raise PetalError(
            f"Records folder {root} lists no shards in its manifest; it holds no images."
        )
    if verify:
        _verify_shards(root, manifest, listed, fs)
        _check_labels(source, fs)
    return _listed_sizes(source, fs)


# Shards whose first records are checked against the manifest's classes when a records
# folder is opened, and the bytes read from the start of each: a few small reads, remote too.
LABEL_CHECK_SHARDS = 4
LABEL_CHECK_BYTES = 1 << 18


def _check_labels(source: Source, fs) -> None:
    """The records' ``label`` must be the manifest's name for their ``class``: with the
    manifest of other shards (or classes swapped or renamed in it) a run would train and
    score every record under another class's name. Their images must be of the manifest's
    ``image_size`` and ``format`` too (:func:`_check_image`). Checked: the records within the
    first :data:`LABEL_CHECK_BYTES` (or the first record, up to 64 times that) of up to
    :data:`LABEL_CHECK_SHARDS` shards, taken from each split in turn; records without a label
    are not checked."""
    import itertools

    import tensorflow as tf
    from google.protobuf.message import DecodeError

    pairs = itertools.zip_longest(
        *(zip(source.files(s), source.counts(s), strict=True) for s in schema.SPLITS)
    )
    shards = [f for f, n in filter(None, itertools.chain(*pairs)) if n][:LABEL_CHECK_SHARDS]
    for shard in shards:
        try:
            head = fs.read_bytes(shard, LABEL_CHECK_BYTES)
            records = _head_records(head)
            if not records:  # a first record larger than that: read it whole
                length = int.from_bytes(head[:8], "little") if len(head) >= 12 else 0
                if 0 < length <= 64 * LABEL_CHECK_BYTES:  # else damaged: reading it names it
                    records = _head_records(fs.read_bytes(shard, 16 + length))
        except (PetalError, OSError):
            if folders.is_http(shard):
                # A failed request to the store: the read that follows names it. Each
                # shard's request after it waited as long (a stalled store: 5 minutes).
                break
            continue  # unreadable (gone, no permission): reading names it
        for index, record in enumerate(records):
            try:
                feature = tf.train.Example.FromString(record).features.feature
            except DecodeError:
                continue  # damaged: reading it names the record
            _check_image(source, shard, index, feature)
            cls = feature[schema.CLASS].int64_list.value if schema.CLASS in feature else []
            label = feature[schema.LABEL].bytes_list.value if schema.LABEL in feature else []
            if not (cls and label and 0 <= cls[0] < source.num_classes):
                continue
            name = label[0].decode("utf-8", "replace")
            if name != source.classes[cls[0]]:
                raise PetalError(
                    f"Shard {shard} does not belong to {_join(source.path, schema.MANIFEST_NAME)}"
                    f": its record {index} is labelled {name!r}, but class {cls[0]} is "
                    f"{source.classes[cls[0]]!r} in the manifest (classes swapped or renamed, "
                    "or another conversion's manifest); convert the images again with petal "
                    "convert."
                )


# How the encoded images petal convert stores begin (resize "none" keeps the photo's own
# bytes): JPEG, PNG, GIF, BMP and WebP.
_IMAGE_MAGIC = (b"\xff\xd8\xff", b"\x89PNG", b"GIF8", b"BM", b"RIFF")


def _check_image(source: Source, shard: str, index: int, feature) -> None:
    """A record's image must be what the manifest says: of its ``image_size`` (the record's
    ``size``) and its ``format``. A manifest edited or copied from another conversion was
    read as its records: every record then failed to decode, named corrupt, and
    ``--skip-corrupt`` skipped them all."""
    size = _recorded_size(feature)
    said = f"{source.image_size[0]}x{source.image_size[1]}" if source.image_size else None
    held = f"{size[0]}x{size[1]}" if len(size) == 2 else None
    # (Bytes that are neither, a damaged image, are left to decoding, which names them
    # undecodable and --skip-corrupt skips.)
    encoded, pixels = _stored_as(feature, source.image_size)  # (a record without its size)
    problem = None
    if said and held and held != said:
        problem = f"holds a {held} image, but the manifest's image_size is {said}"
    elif source.format == "raw" and encoded and not pixels:
        problem = "holds an encoded image, but the manifest's format is 'raw'"
    elif source.format == "jpeg" and pixels and not encoded:
        problem = "holds raw pixels, but the manifest's format is 'jpeg'"
    if problem:
        raise PetalError(
            f"Shard {shard} does not belong to {_join(source.path, schema.MANIFEST_NAME)}: "
            f"its record {index} {problem} (the manifest edited, or another conversion's); "
            "convert the images again with petal convert."
        )


def _recorded_size(feature) -> list[int]:
    return list(feature[schema.SIZE].int64_list.value) if schema.SIZE in feature else []


def _stored_as(feature, dims: tuple[int, int] | None = None) -> tuple[bool, bool]:
    """Whether a record's image begins as an encoded image does, and whether its length is
    that of raw pixels of the record's ``size`` (else of ``dims``)."""
    image = feature[schema.IMAGE].bytes_list.value if schema.IMAGE in feature else []
    size = _recorded_size(feature)
    dims = size if len(size) == 2 else dims
    encoded = bool(image) and image[0].startswith(_IMAGE_MAGIC)
    pixels = bool(image) and dims is not None and len(image[0]) == dims[0] * dims[1] * 3
    return encoded, pixels


def _head_records(data: bytes) -> list[bytes]:
    """The records whose frames lie whole in ``data``, the first bytes of a shard (a TFRecord
    frame: length as 8 bytes little-endian, its CRC in 4, the record, its CRC in 4), up to
    the first whose record fails its CRC (reading names it: its bytes, a label among them,
    are not to be judged)."""
    from petal.data.writer import _masked_crc

    records, at = [], 0
    while at + 12 <= len(data):
        length = int.from_bytes(data[at : at + 8], "little")
        if at + 16 + length > len(data):
            break
        record = data[at + 12 : at + 12 + length]
        if _masked_crc(record) != data[at + 12 + length : at + 16 + length]:
            break
        records.append(record)
        at += 16 + length
    return records


def _listed_sizes(source: Source, fs) -> Source:
    """``source`` knowing the size of each of its http shards whose size the store listed
    (when opening it) and no manifest gives: downloads are checked against it."""
    listed_size = getattr(fs, "listed_size", None)  # remote.HttpFS: nothing else downloads
    if listed_size is not None:
        for file in source.files("all"):
            if file not in source._bytes and (size := listed_size(file)) is not None:
                source._bytes[file] = size
    return source


def _verify_shards(root: str, manifest: dict, listed: set[str], fs=None) -> None:
    """The manifest is the index; refuse shards that disagree with it before reading."""
    fs = fs or _fs_for(root)
    sizes = fs.sizes(root)
    for split in schema.SPLITS:
        for shard in manifest["splits"].get(split, {}).get("shards", []):
            name = shard["file"]
            if name not in sizes:
                raise PetalError(
                    f"Manifest lists shard {name} but it is missing from {root}; "
                    "the records folder is incomplete: convert again with --overwrite."
                )
            # (A count that differs from the one in the file name: check_manifest.)
            if "bytes" in shard and int(shard["bytes"]) != sizes[name]:
                # petal inspect reads local and gs:// records, not http.
                on = " on a local copy" if folders.is_http(root) else ""
                raise PetalError(
                    f"Manifest disagrees with shard {_join(root, name)}: manifest says "
                    f"{shard['bytes']} bytes, the file has {sizes[name]}; it was changed or "
                    f"truncated after conversion (petal inspect --verify{on} names the record)."
                )
    extra = sorted(n for n in sizes if schema.is_shard_file(n) and n not in listed)
    if extra:
        raise PetalError(
            f"Records folder {root} holds shards its manifest does not list: {', '.join(extra[:3])}"
            f"{' ...' if len(extra) > 3 else ''}; two conversions were mixed: convert again "
            "into an empty folder."
        )


def _records_as_given(src: Source, classes: list[str] | None, val_fraction=None) -> Source:
    """A records folder's classes are its manifest's, in its order: ``classes`` naming
    others is refused, not ignored (the class indices are written in the records); so is a
    ``val_fraction`` other than the one its photos were split by (it was ignored)."""
    split_by = (src.manifest or {}).get("val_fraction")
    same = isinstance(split_by, int | float) and math.isclose(
        _fraction(val_fraction), split_by, abs_tol=1e-6
    )
    if val_fraction is not None and not same:
        how = f"val_fraction {split_by}" if split_by is not None else "its shards by split"
        raise PetalError(
            f"{src.path} is a records folder, whose split its manifest gives ({how}); "
            "val_fraction cannot split it again: drop it, or convert again with "
            f"--val-fraction. Received: val_fraction={val_fraction}"
        )
    if classes is None or list(classes) == list(src.classes):
        return src
    raise PetalError(
        f"{src.path} is a records folder of classes {','.join(src.classes)} (its manifest); "
        "classes cannot choose or reorder them: drop classes (--classes), or convert again "
        f"with --classes to keep other ones. Received: classes={','.join(classes)}"
    )


def _open_codelab(root: str, shards: list[str], classes, val_fraction) -> Source:
    counts = []
    for shard in shards:
        try:
            counts.append(schema.count_from_name(shard))
        except ValueError as err:
            if not shard.endswith(schema.SHARD_SUFFIX):  # a glob's: a .tfrecord, a README
                raise _not_a_shard(root, shard) from err
            # petal convert reads images, not shards: renaming is the fix for shards alone.
            stem = posixpath.basename(shard)[: -len(schema.SHARD_SUFFIX)]
            raise PetalError(
                f"Codelab shard {shard} carries no record count in its name (expected "
                "'...-<count>.tfrec') and there is no manifest.json: rename each shard to "
                f"NAME-<count>{schema.SHARD_SUFFIX}, <count> its number of records (this one "
                f"{stem}-<count>{schema.SHARD_SUFFIX}), or convert the original images with "
                "petal convert."
            ) from err
    n_val = _codelab_validation(len(shards), val_fraction)
    names, sizes, seen, classless = _peek_codelab(shards)
    if classless is not None:
        shard, keys = classless
        raise PetalError(
            f"Codelab shard {shard} holds records without a '{schema.CLASS}' feature (the "
            "int64 class index the codelab's schema needs; they carry "
            f"{', '.join(keys) or 'no feature'}): write the records again with their class "
            "index in 'class', or convert the original images with petal convert."
        )
    read = f"the first {PEEK_RECORDS} records of each shard"
    if _scan_classes_at_open(shards):
        names, seen = _scan_codelab(shards, names, seen)
        read = "every record"
    names, disagree = _names_by_vote(root, names, read)
    if classes is not None:
        if len(classes) < seen:
            raise PetalError(
                f"classes names {len(classes)} classes but the shards at {root} hold class "
                f"index {seen - 1} (read in {read}): list every class in index order, "
                f"{seen} at least. Received: classes={','.join(classes)}"
            )
        _check_named_classes(root, names, classes, read)
        found = tuple(classes)
        how = "as classes= lists them"
    else:
        found = _codelab_classes(names, seen)
        unnamed = "" if names else "; the shards name none"
        how = f"counted from {read}{unnamed}"
    source = Source(
        path=root.rstrip("/"),
        kind="codelab",
        classes=found,
        image_size=next(iter(sizes)) if len(sizes) == 1 else None,
        format=schema.FORMAT_JPEG,
        size_recorded=bool(sizes),
        classes_from=how,
        classes_named=bool(names),
        notes=(() if classes is not None or names else (unnamed_classes_note(root, found),))
        + ((disagree,) if disagree else ()),
    )
    source._files["validation"], source._counts["validation"] = shards[:n_val], counts[:n_val]
    source._files["train"], source._counts["train"] = shards[n_val:], counts[n_val:]
    return source


# TFRecord files as other tools name them: the codelab's reader takes ".tfrec" alone.
OTHER_RECORD_SUFFIXES = (".tfrecord", ".tfrecords", ".tfr", ".record", ".records")


def _not_a_shard(root: str, file: str) -> PetalError:
    """For a glob ``root`` matching ``file``, which is not named as a codelab shard."""
    name = posixpath.basename(file)
    stem, dot, suffix = name.rpartition(".")
    if dot and f".{suffix.lower()}" in OTHER_RECORD_SUFFIXES:
        counted = bool(schema._COUNT_RE.search(stem + schema.SHARD_SUFFIX))
        to = f"{stem}{schema.SHARD_SUFFIX}" if counted else f"{stem}-<count>{schema.SHARD_SUFFIX}"
        return PetalError(
            f"{file} is named .{suffix}, and codelab shards (no manifest.json) are read by the "
            f"name NAME-<count>{schema.SHARD_SUFFIX}, <count> their number of records: rename "
            f"each (this one {to})."
        )
    # The glob narrowed to shards, keeping what it names of them (train* stays train*).
    head, base = posixpath.split(root)
    if schema.SHARD_SUFFIX in base:  # *.tfrec* matched a.tfrec.bak: cut after the suffix
        alone = posixpath.join(head, base[: base.index(schema.SHARD_SUFFIX)] + schema.SHARD_SUFFIX)
    elif base.endswith("*") and "." not in base:
        alone = root + schema.SHARD_SUFFIX
    else:
        alone = posixpath.join(head, "*" + schema.SHARD_SUFFIX)
    return PetalError(
        f"{root} matches {file}, which is not a codelab shard (NAME-<count>"
        f"{schema.SHARD_SUFFIX}): pass a glob of the shards alone (such as {alone})."
    )


def _names_by_vote(
    root: str, votes: dict[int, Counter], read: str
) -> tuple[dict[int, str], str | None]:
    """Each class index's name: the label most of its records read give (one record
    labelled wrongly, first in its shard, named its whole class after another); with a
    note on the first index whose records disagree, or None.

    Raises:
        PetalError: two indices are named alike (a class would be two of the model's
            outputs).
    """
    names = {i: votes[i].most_common(1)[0][0] for i in sorted(votes) if votes[i]}
    by_name: dict[str, int] = {}
    for i, name in names.items():
        if (j := by_name.setdefault(name, i)) != i:
            raise PetalError(
                f"The records of the shards at {root} name class indices {j} and {i} both "
                f"{name!r} (their label field, read in {read}; petal inspect --verify names the "
                "records whose label disagrees with their class): write them again with one "
                "name per class index."
            )
    mixed = [i for i in names if len(votes[i]) > 1]
    if not mixed:
        return names, None
    (top, n), *rest = votes[mixed[0]].most_common()
    others = ", ".join(f"{label!r} by {k}" for label, k in rest[:2])
    more = f"; the records of {len(mixed) - 1} other class(es) disagree too" if mixed[1:] else ""
    return names, (
        f"the records of class index {mixed[0]} in the shards at {root.rstrip('/')} do not agree "
        f"on its name ({read}): {top!r} by {n}, {others}{', ...' if len(rest) > 2 else ''}; "
        f"it is called {top!r}{more}. petal inspect --verify names the records whose label "
        "disagrees with their class"
    )


def _check_named_classes(root: str, names: dict[int, str], classes, read: str) -> None:
    """``classes`` given for codelab shards whose records name their classes (``names``: by
    index, those read) must agree with them: else every record of a class would be called by
    another's name (a run trained on it mislabels every prediction). Shards that name none
    take ``classes`` as given: naming them is what it is for."""
    wrong = [i for i in sorted(names) if i < len(classes) and classes[i] != names[i]]
    if not wrong:
        return
    i = wrong[0]
    order = ",".join(names.get(k, "?") for k in range(max(names) + 1))
    raise PetalError(
        f"classes names class index {i} {classes[i]!r} but the shards at {root} name it "
        f"{names[i]!r} (their label field, read in {read}): leave classes (--classes) out, "
        f"the records name their classes, or give them in the records' order ({order}). "
        f"Received: classes={','.join(classes)}"
    )


def _peek_codelab(
    shards: list[str],
) -> tuple[dict[int, Counter], set[tuple[int, int]], int, tuple[str, list[str]] | None]:
    """Class names by index (each label read, counted), the image sizes recorded, the
    number of classes seen (the highest index + 1, or a one-hot's length), and the first
    shard whose first record has no ``class`` (with that record's features; else None), from
    the first records of each shard (one small read each)."""
    import tensorflow as tf
    from google.protobuf.message import DecodeError

    spec = {
        schema.CLASS: tf.io.FixedLenFeature([], tf.int64, default_value=-1),
        schema.LABEL: tf.io.FixedLenFeature([], tf.string, default_value=""),
        schema.SIZE: tf.io.FixedLenFeature([2], tf.int64, default_value=[0, 0]),
        schema.ONE_HOT: tf.io.VarLenFeature(tf.float32),
    }
    names: dict[int, Counter] = {}  # each index's labels, counted
    num_classes, sizes = 0, set()
    classless = None
    # A few records from the start of each shard, until every class index has a name.
    for shard in shards:
        # A damaged shard (CRC, truncation, a record that does not parse) is passed over
        # here; reading it names the record later.
        mark = _store_mark(shard)
        try:
            peeked = list(_record_dataset([shard]).take(PEEK_RECORDS))
        except tf.errors.DataLossError:
            continue
        except tf.errors.OpError:
            # A request to the store that failed (HTTP 500, a connection closed): its one
            # line, not TensorFlow's traceback of the generator that made the request.
            if mark is not None:
                from petal.data.remote import store_error

                if (error := store_error(mark, "open the shards")) is not None:
                    raise error from None
            raise
        if peeked:
            with contextlib.suppress(DecodeError):  # (a record that does not parse: below)
                feature = tf.train.Example.FromString(peeked[0].numpy()).features.feature
                # Parsed with a default, a record without a class would read as "no class
                # index".
                if classless is None and schema.CLASS not in feature:
                    classless = (shard, sorted(feature))
                _refuse_raw_pixels(shard, feature)
        for raw in peeked:
            try:
                ex = tf.io.parse_single_example(raw, spec)
            except tf.errors.InvalidArgumentError:
                continue
            index, label = (
                int(ex[schema.CLASS]),
                ex[schema.LABEL].numpy().decode("utf-8", "replace"),
            )
            if index >= 0 and label:
                names.setdefault(index, Counter())[label] += 1
            num_classes = max(num_classes, int(ex[schema.ONE_HOT].dense_shape[0]), index + 1)
            h, w = (int(v) for v in ex[schema.SIZE].numpy())
            if h > 0 and w > 0:
                sizes.add((h, w))
        if num_classes and len(names) >= num_classes and len(sizes) > 1:
            break
    return names, sizes, num_classes, classless


def _refuse_raw_pixels(shard: str, feature) -> None:
    """Refuses a codelab shard whose record holds raw pixels (petal convert --format raw):
    without a manifest saying so, every record failed to decode as "Corrupt input", and
    ``--skip-corrupt`` would have skipped them all."""
    encoded, pixels = _stored_as(feature)
    if pixels and not encoded and min(_recorded_size(feature)) > 0:
        raise PetalError(
            f"Shard {shard} holds raw pixels (petal convert --format raw), which petal reads "
            f"only with their records folder's {schema.MANIFEST_NAME}: pass the folder that "
            "holds it (put it back beside the shards if it was lost), or convert the images "
            "again with --format jpeg for shards that read without one."
        )


def _codelab_classes(names: dict[int, str], seen: int) -> tuple[str, ...]:
    """Class names for ``seen`` class indices: the records' own; an index they do not name
    takes the codelab's name where the names read are the codelab's, else ``class_<i>``.
    Records that name no classes get ``class_0`` ... (any other names would be made up:
    Kaggle-style shards of other photos were called daisy, dandelion, ...)."""
    codelab = bool(names) and all(
        i < len(CODELAB_CLASSES) and CODELAB_CLASSES[i] == name for i, name in names.items()
    )
    defaults = dict(enumerate(CODELAB_CLASSES)) if codelab else {}
    return tuple(names.get(i, defaults.get(i, f"class_{i}")) for i in range(seen))


def unnamed_classes_note(root: str, classes: tuple[str, ...], to: str = "") -> str:
    """The warning for codelab shards at ``root`` that name no classes: ``classes`` (their
    ``class_<i>``) are assumed names; ``to``: the commands that take ``--classes``, where
    the one warning takes none."""
    n = len(classes)
    called = ", ".join(classes) if n <= 3 else f"{classes[0]} ... {classes[-1]}"
    return (
        f"the shards at {root.rstrip('/')} name no classes (no label in their records, no "
        f"manifest.json): their {n} classes are called {called}, by index; pass --classes "
        f"NAMES (comma-separated, in index order){f' to {to}' if to else ''} to name them"
    )


def _scan_classes_at_open(shards: list[str]) -> bool:
    """Whether every record's class of these codelab shards is read when they are opened:
    local shards of up to :data:`MAX_CLASS_SCAN_BYTES` in all."""
    if any(folders.is_remote(s) for s in shards):
        return False
    total = 0
    for shard in shards:
        with contextlib.suppress(OSError):
            total += os.path.getsize(shard)
    return total <= MAX_CLASS_SCAN_BYTES


# (shard, size, mtime) of each shard -> (names, classes seen): a source opened again (its
# error paths open it once more) is not read again while its shards are unchanged.
_SCANNED: dict[tuple, tuple[dict[int, Counter], int]] = {}


def _scan_codelab(
    shards: list[str], names: dict[int, Counter], seen: int
) -> tuple[dict[int, Counter], int]:
    """:func:`_peek_codelab`'s names (labels counted) and classes seen, from every record's
    ``class`` and ``label`` (one vectorised parse per block of records; images are read
    from disk but not decoded). A class whose first records come late in a shard (a rare
    class, shards sorted by class) is counted: with the peek alone its records had a class
    index past the last class. A shard that stops on a damaged record counts what it
    read (reading it names the record later)."""
    import tensorflow as tf

    stamp = []
    for shard in shards:
        with contextlib.suppress(OSError):
            info = os.stat(shard)
            stamp.append((shard, info.st_size, info.st_mtime_ns))
    key = tuple(stamp)
    if key not in _SCANNED:
        spec = {
            schema.CLASS: tf.io.FixedLenFeature([], tf.int64, default_value=-1),
            schema.LABEL: tf.io.FixedLenFeature([], tf.string, default_value=""),
        }
        pairs: Counter = Counter()  # (index, label) of every record that names its class
        top = 0
        for shard in shards:
            blocks = tfdata.untuned(tf.data.TFRecordDataset(shard, buffer_size=1 << 20))
            blocks = blocks.batch(1024)
            try:
                for block in blocks.map(lambda r: tf.io.parse_example(r, spec)):
                    ids = block[schema.CLASS].numpy()
                    top = max(top, int(ids.max(initial=-1)) + 1)
                    labels = block[schema.LABEL].numpy()
                    named = (ids >= 0) & (labels != b"")
                    pairs.update(zip(ids[named].tolist(), labels[named].tolist(), strict=True))
            except tf.errors.OpError:
                continue
        found: dict[int, Counter] = {}
        for (i, label), n in sorted(pairs.items()):
            found.setdefault(i, Counter())[label.decode("utf-8", "replace")] += n
        _SCANNED[key] = (found, top)
    found, top = _SCANNED[key]
    # Every record counted: its counts replace the peek's (the same records among them).
    return {**names, **found}, max(seen, top)


def _open_folder(
    root: str, classes, val_fraction, min_classes: int = 2, train_names=()
) -> Source:
    notes: tuple[str, ...] = ()
    if folders.is_http(root):
        pairs, names, note = _list_http_folder(root, classes)
        notes = (note,) if note else ()
    else:
        found = folders.find_images(root, classes, min_classes=min_classes)
        # TensorFlow takes a path as UTF-8 text: a name that is not cannot be read.
        readable, not_utf8 = found.by_utf8()
        notes = tuple(note for note in [found.unread_note()] if note)
        if not_utf8:
            notes += (
                f"{len(not_utf8)} file(s) whose names are not valid UTF-8 are not read "
                f"({folders.some_names([f.relpath for f in not_utf8])}): rename them to "
                "read them",
            )
        names = list(found.classes)
        pairs = _regular_files(root, [(f.path, f.relpath, f.label) for f in readable])
    fraction = FOLDER_VAL_FRACTION if val_fraction is None else float(val_fraction)
    by_class: dict[int, list[tuple[str, str, int]]] = {}
    for item in pairs:
        by_class.setdefault(item[2], []).append(item)
    val: set[str] = set()
    kept: list[str] = []
    keep = set(train_names)
    for items in by_class.values():
        chosen, forced = _validation_files([it[1] for it in items], fraction, keep)
        val.update(chosen)
        kept += forced
    if not folders.is_remote(root) and (across := _keep_copies_together(pairs, val, set(kept))):
        groups = folders.some_names([" = ".join(g) for g in across])
        notes += (
            f"{len(across)} image(s) are byte-identical copies filed under more than one "
            f"class ({groups}): each copy is read with its own class, so the labels "
            "contradict each other; keep each photo in one class",
        )
    source = Source(
        path=root,
        kind="folder",
        classes=tuple(names),
        image_size=None,
        format="files",
        notes=notes,
        kept_in_train=tuple(sorted(kept)),
    )
    for split in schema.SPLITS:
        chosen = [it for it in pairs if (it[1] in val) == (split == "validation")]
        source._files[split] = [it[0] for it in chosen]
        source._counts[split] = [1] * len(chosen)
        source._labels[split] = [it[2] for it in chosen]
    return source


# How _validation_files splits an image folder, kept in a run's config.json: earlier builds
# ranked a class's hashes instead, an order that photos added later could change.
FOLDER_SPLIT = "by-name"


def _validation_files(
    relpaths: list[str], fraction: float, keep: set[str] = frozenset()
) -> tuple[list[str], list[str]]:
    """The files of one class that validate, and those kept in training against the rule:
    files whose name hashes below ``fraction`` validate, so a file's side depends on its
    own name only, and photos added to the folder later never move a training image into
    validation (a run's held-out score stays held out). A class of two or more files keeps
    one file on each side (unless ``keep`` holds them all): the lowest hash validates, the
    highest trains. That one is returned as kept, as is a class's only file: a photo added
    later would move it into validation, so a run records the kept files and passes them
    back in ``keep`` (files that never validate; returned as kept too)."""
    if len(relpaths) < 2:  # one file trains: kept, as one added later would validate it
        return [], list(relpaths)
    hashed = sorted((_name_hash(rel), rel) for rel in relpaths)
    ranked = [rel for _, rel in hashed]
    chosen = [rel for h, rel in hashed if h < fraction and rel not in keep]
    if fraction > 0 and not chosen:
        chosen = [rel for rel in ranked if rel not in keep][:1]
    kept = [rel for rel in ranked if rel in keep]
    if len(chosen) == len(ranked):
        chosen, kept = chosen[:-1], chosen[-1:]
    return chosen, kept


def _name_hash(relpath: str) -> float:
    """A relative path's SHA-1 as a fraction in [0, 1)."""
    return int(hashlib.sha1(relpath.encode("utf-8")).hexdigest()[:13], 16) / 16**13


def _regular_files(root: str, pairs: list[tuple[str, str, int]]) -> list[tuple[str, str, int]]:
    """``pairs`` without FIFOs and devices named like images (reading one may never end),
    which are named in a warning; ``petal convert`` lists them as skipped."""
    kept, left_out = [], []
    for item in pairs:
        try:
            regular = stat.S_ISREG(os.stat(item[0]).st_mode)
        except OSError:
            regular = True  # unreadable: the pipeline names it when it reads it
        (kept if regular else left_out).append(item)
    if left_out:
        log.warning(
            "petal: %s: left out %d entries that are not regular files (a FIFO, a device): %s",
            root,
            len(left_out),
            ", ".join(rel for _, rel, _ in left_out),
        )
    return kept


# Local image folders of up to this many files are checked for byte-identical copies when
# opened (only files of equal size and equal last bytes are read whole).
MAX_COPY_SCAN = 50_000
_TAIL_BYTES = 4096


def _keep_copies_together(
    pairs: list[tuple[str, str, int]], val: set[str], kept: set[str] = frozenset()
) -> list[list[str]]:
    """Moves byte-identical files in ``val`` (relative paths) to one side, the side of the
    copy whose path sorts first, or training where one is in ``kept`` (files kept there): a
    photo filed twice is never both trained on and validated. Returns the groups of copies
    (relative paths, sorted) filed under more than one class.

    Folders of more than :data:`MAX_COPY_SCAN` files are not checked (petal convert keeps
    copies together at any size). Files that cannot be read are left where they are; the
    pipeline names them when it reads them.
    """
    if len(pairs) > MAX_COPY_SCAN:
        return []
    label = {rel: i for _, rel, i in pairs}
    across: list[list[str]] = []

    def grouped(items, key) -> list[list[tuple[str, str]]]:
        """``items`` in groups of two or more with the same ``key(path)`` (unreadable: none)."""
        groups: dict = {}
        for path, rel in items:
            with contextlib.suppress(OSError):
                groups.setdefault(key(path), []).append((path, rel))
        return [group for group in groups.values() if len(group) > 1]

    def read(path: str, tail: bool = False) -> bytes:
        with open(path, "rb") as f:
            if tail and os.fstat(f.fileno()).st_size > _TAIL_BYTES:
                f.seek(-_TAIL_BYTES, os.SEEK_END)
            return f.read()

    # Equal size, then equal last bytes (a JPEG's last entropy-coded data), then equal bytes.
    for same_size in grouped([(p, rel) for p, rel, _ in pairs], os.path.getsize):
        for same_tail in grouped(same_size, lambda p: read(p, tail=True)):
            for copies in grouped(same_tail, lambda p: hashlib.sha256(read(p)).digest()):
                validated = min(rel for _, rel in copies) in val and not any(
                    rel in kept for _, rel in copies
                )
                for _, rel in copies:
                    (val.add if validated else val.discard)(rel)
                if len({label[rel] for _, rel in copies}) > 1:
                    across.append(sorted(rel for _, rel in copies))
    return sorted(across)


def http_images(root: str, objects: dict[str, int] | None = None) -> dict[str, int]:
    """``{relative key: bytes}`` of the image files under an http folder (one listing
    request, unless its ``objects`` are given). Hidden entries are not read, as in a local
    folder (:func:`folders.is_hidden`)."""
    from petal.data import remote

    return {
        k: size
        for k, size in (remote.list_objects(root) if objects is None else objects).items()
        if k.lower().endswith(folders.IMAGE_EXTENSIONS)
        and not any(map(folders.is_hidden, k.split("/")))
    }


def _http_unread_note(root: str, objects: dict[str, int], classes) -> str:
    """:meth:`folders.ImageFolder.unread_note` for an http folder's listing: the objects
    that are not read, named as a local folder's files are (an object store has no empty
    folders)."""
    ignored = set()
    for key in objects:
        parts = key.split("/")
        hidden = next((i for i, part in enumerate(parts) if folders.is_hidden(part)), None)
        if hidden is not None:  # a hidden folder as "a/.folder/", a hidden file as itself
            ignored.add("/".join(parts[: hidden + 1]) + ("/" if hidden < len(parts) - 1 else ""))
        elif len(parts) == 1 or not key.lower().endswith(folders.IMAGE_EXTENSIONS):
            ignored.add(key)
    left_out = {k.split("/", 1)[0] for k in objects if "/" in k} - set(classes)
    found = folders.ImageFolder(
        root=root,
        classes=tuple(classes),
        files=(),
        ignored=tuple(sorted(ignored)),
        left_out=tuple(sorted(left_out)),
    )
    return found.unread_note()


def _list_http_folder(
    root: str, classes
) -> tuple[list[tuple[str, str, int]], list[str], str]:
    """(url, relpath, label) of every image under an http folder, the class names, and the
    line naming the objects not read ("" when none). Hidden entries are not read, as in a
    local folder (:func:`folders.is_hidden`)."""
    from petal.data import remote

    objects = remote.list_objects(root)
    keys = sorted(http_images(root, objects))
    by_class: dict[str, list[str]] = {}
    for key in keys:
        if "/" in key:
            by_class.setdefault(key.split("/", 1)[0], []).append(key)
    names = sorted(by_class) if classes is None else list(classes)
    unknown = [c for c in names if c not in by_class]
    if unknown or not names:
        raise PetalError(
            f"No images for class(es) {', '.join(unknown) or '(none)'} under {root} "
            f"(extensions {', '.join(folders.IMAGE_EXTENSIONS)}; "
            f"found: {', '.join(sorted(by_class))})."
        )
    pairs = [
        (remote.key_url(root, key), key, i) for i, c in enumerate(names) for key in by_class[c]
    ]
    return pairs, names, _http_unread_note(root, objects, names)


def check_split(split: str) -> str:
    """``split`` as its name in :data:`SPLITS` (in any case, as choices elsewhere are)."""
    if isinstance(split, str) and split.lower() in SPLITS:
        return split.lower()
    raise PetalError(
        f"Unknown split {split!r} (known: {', '.join(SPLITS)}). Received: split={split!r}"
    )


# --- reading records -------------------------------------------------------------------------


class SkipCounter:
    """Counts records skipped as corrupt (``skip_corrupt=True``), shared across pipelines."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.skipped = 0
        self.events: list[str] = []
        self.shards: list[tuple[str, int]] = []  # (shard, records lost), per event
        # Sound shards that hold another count than they should: not skipped, an error
        # (see miscount_since).
        self.miscounted: list[str] = []
        self._stopping = 0  # callers inside stopping_on_miscounts()
        # Warnings logged since the outermost stopping_on_miscounts() began (a command's
        # run): each replica's pipeline reads every validation shard, and logged its skip.
        self._logged: set[str] = set()

    @contextlib.contextmanager
    def stopping_on_miscounts(self):
        """While inside, a sound shard of another count met with ``skip_corrupt`` is kept
        for :meth:`miscount_since`, not logged: the caller stops with that line (petal
        train and evaluate printed it twice, as a warning and as their error)."""
        with self._lock:
            if not self._stopping:
                self._logged.clear()
            self._stopping += 1
        try:
            yield
        finally:
            with self._lock:
                self._stopping -= 1

    @property
    def callers_stop_on_miscounts(self) -> bool:
        return self._stopping > 0

    def first(self, message: str) -> bool:
        """Whether to log ``message``: once per command (see ``_logged``); each time
        outside one (a notebook's datasets)."""
        with self._lock:
            if not self._stopping:
                return True
            new = message not in self._logged
            self._logged.add(message)
            return new

    def add(self, n: int, message: str, shard: str = "") -> None:
        with self._lock:
            self.skipped += n
            self.events.append(message)
            self.shards.append((shard, n))

    def add_miscount(self, line: str) -> None:
        with self._lock:
            self.miscounted.append(line)

    def miscount_since(self, mark: int) -> PetalError | None:
        """The error for the first sound shard of another count read with
        ``skip_corrupt`` since ``mark`` (``len(miscounted)`` taken before), or None: read
        with ``skip_corrupt`` its count is only logged, the caller stops on it."""
        with self._lock:
            found = self.miscounted[mark:mark + 1]
        return PetalError(found[0]) if found else None

    def lost_since(self, mark: int) -> dict[str, int]:
        """Records lost per shard in the events after the first ``mark`` (``len(shards)``
        taken before): each shard once, however many epochs read it."""
        lost: dict[str, int] = {}
        for shard, n in self.shards[mark:]:
            lost[shard] = max(lost.get(shard, 0), n)
        return lost


SKIPPED = SkipCounter()


def _store_mark(path: str) -> int | None:
    """:meth:`petal.data.remote.StoreErrors.mark` before reading ``path`` over http, else
    None."""
    if not folders.is_http(path):
        return None
    from petal.data.remote import STORE_ERRORS

    return STORE_ERRORS.mark()


def _record_dataset(files: list[str], buffer_size: int = 1 << 20):
    """Plain TFRecord reader for local/gfile paths, or the remote one for http URLs."""
    import tensorflow as tf

    if files and folders.is_http(files[0]):
        from petal.data import remote

        return remote.records_dataset(files)  # untuned already
    return tfdata.untuned(tf.data.TFRecordDataset(files, buffer_size=buffer_size))


def guarded_records(path, expected, *, skip_corrupt: bool = False, name=None):
    """Records of one shard, checked: a short read (CRC failure, truncation) is reported.

    TensorFlow's reader stops a shard at its first corrupt record and names only a byte
    offset. We read the shard with errors ignored, count what came out, and at the end
    compare with the count the manifest (or the file name) promises: the message then
    names the shard and the first record that could not be read. With ``skip_corrupt``
    the rest of that shard is skipped with a warning and counted in :data:`SKIPPED`.

    A shard whose every record reads and whose file ends after its last record, but that
    holds another count (a renamed codelab shard), is not corrupt, and skipping cannot
    mend it: it stops the pipeline with :func:`miscount_error`'s line, which names the
    count it holds and the fix; with ``skip_corrupt`` that line is logged and kept in
    :data:`SKIPPED` instead (:meth:`SkipCounter.miscount_since`) for the caller to stop on
    (an error raised would be dropped with the records that do not decode).

    Args:
        path: scalar string tensor, the shard.
        expected: scalar int64 tensor, the records it must hold.
        skip_corrupt: warn and count instead of failing.
        name: what to call the shard in messages (default ``path``; remote shards pass
            their URL).
    """
    import tensorflow as tf

    name = path if name is None else name
    graph = tf.autograph.experimental.do_not_convert  # no Python control flow on tensors

    def opened(shard):
        # Its first byte, read: a shard that cannot be opened (deleted since it was listed,
        # a staged copy of a remote one removed at exit) fails here, once. ignore_errors()
        # below would retry the open forever (TFRecordDataset does not move past a file it
        # cannot open): the pipeline hung, spinning.
        probe = tfdata.untuned(tf.data.FixedLengthRecordDataset(shard, 1, buffer_size=1))
        probe = probe.take(1)
        with tf.control_dependencies([probe.reduce(tf.constant(0, tf.int64), _plus_one)]):
            return tf.identity(shard)

    def records(shard):
        # Counted in blocks: a scan step per record would cost more than reading it.
        return tf.data.TFRecordDataset(shard, buffer_size=1 << 20).ignore_errors().batch(
            GUARD_BLOCK
        )

    blocks = tf.data.Dataset.from_tensors(path).map(graph(opened)).flat_map(graph(records))
    blocks = blocks.map(graph(lambda b: (b, tf.constant(False))))
    end = tf.data.Dataset.from_tensors((tf.zeros([0], tf.string), tf.constant(True)))

    def count(state, item):
        # Records, and the bytes they take in the file (each framed by 16: length, CRCs).
        block, last = item
        n = state[0] + tf.cast(tf.size(block), tf.int64)
        lengths = tf.cast(tf.strings.length(block), tf.int64) + 16
        size = state[1] + tf.reduce_sum(lengths)
        return (n, size), (block, last, n, size)

    def miscounted(last, n, size):
        # At its end, a shard that holds another count than it should: not corrupt when
        # every record read and the file ends after the last (see _miscount_line).
        def line():
            said = tf.py_function(_miscount_line, [path, name, n, size, expected], tf.string)
            return tf.ensure_shape(said, [])

        wrong = tf.logical_and(last, tf.not_equal(n, expected))
        return tf.cond(wrong, line, lambda: tf.constant(""))

    def check(block, last, n, size):
        # A sound shard of another count is no corrupt record: skip_corrupt does not skip it.
        said = miscounted(last, n, size)
        if skip_corrupt:
            # Reported, not asserted: the decoder's ignore_errors() downstream would drop the
            # assertion's error as it drops a record that does not decode.
            def report():
                return tf.cond(
                    tf.equal(said, ""),
                    lambda: tf.py_function(_report_skip, [name, n, expected], tf.bool),
                    lambda: tf.py_function(_report_miscount, [said], tf.bool),
                )

            ok = tf.logical_or(tf.logical_not(last), tf.equal(n, expected))
            warn = tf.cond(ok, lambda: tf.constant(True), report)
            return tf.logical_and(tf.logical_not(last), warn)
        sound = tf.debugging.Assert(tf.equal(said, ""), [said], summarize=1)
        with tf.control_dependencies([sound]):
            last = tf.identity(last)
        # tf.strings.join, not format: format would quote the path.
        message = tf.strings.join(
            [
                "petal: corrupt or truncated shard ",
                name,
                ": record ",
                tf.strings.as_string(n),
                " (0-based) could not be read (CRC failure or short file; ",
                tf.strings.as_string(n),
                " of ",
                tf.strings.as_string(expected),
                " records read). Run `petal inspect "
                "--verify`, convert again, or pass skip_corrupt=True "
                "(petal train/evaluate: --skip-corrupt).",
            ]
        )
        with tf.control_dependencies(
            [tf.debugging.Assert(tf.logical_or(tf.logical_not(last), n >= expected), [message],
                                 summarize=1)]
        ):
            return tf.logical_not(last)

    zero = tf.constant(0, tf.int64)
    return (
        blocks.concatenate(end)
        .scan((zero, zero), graph(count))
        .filter(graph(check))
        .map(graph(lambda block, last, n, size: block))
        .unbatch()
    )


def _plus_one(n, _):
    return n + 1


# Opens the message of a shard that holds another count than it should, though sound
# (see guarded_records and _miscount_line).
MISCOUNT = "petal: miscounted shard: "


def _miscount_line(path, name, n, size, expected) -> bytes:
    """:data:`MISCOUNT`'s message for shard ``path`` (called ``name``), of which ``n``
    records, ``size`` bytes in all with their frames, were read where ``expected`` were due;
    b"" when it is corrupt instead (a record that could not be read ended it before its
    end, or it is empty): the caller's corruption message then stands."""
    import tensorflow as tf

    path = path.numpy().decode("utf-8", "replace")
    name = name.numpy().decode("utf-8", "replace")
    n, size, expected = int(n), int(size), int(expected)
    try:
        whole = n > 0 and tf.io.gfile.stat(path).length == size
    except tf.errors.OpError:  # gone since: not known to be sound
        whole = False
    if not whole and n < expected:
        return b""
    return f"{MISCOUNT}{miscount_message(name, n, expected, whole)}".encode()


def miscount_message(shard: str, held: int, said: int, whole: bool = True) -> str:
    """The one-line error for ``shard``, which holds ``held`` sound records where its name
    (or manifest) says ``said``; ``whole``: it ends after them, else a record after them
    could not be read (``held`` > ``said`` only)."""
    local = not folders.is_http(shard)
    base = posixpath.basename(shard if local else urllib.parse.urlsplit(shard).path)
    if schema.is_split_shard(base):  # petal convert's: its manifest says the count too
        what, told = "Shard", "manifest and file name say"
        fix = "its shards were changed after petal convert wrote them: convert again"
    else:
        what, told = "Codelab shard", "file name says"
        fix = f"rename it to {base.rsplit('-', 1)[0]}-{held}{schema.SHARD_SUFFIX}"
        if held < said:
            fix += " (or copy it again, if it lost records)"
    if not whole:
        return (
            f"{what} {shard} holds more records than the {said} its {told} ({held} read), and "
            f"record {held} (0-based) cannot be read (CRC failure or short file): copy or "
            "convert it again."
        )
    return (
        f"{what} {shard} holds {held} records, not the {said} its {told}: it is not corrupt "
        f"(every record reads, and the file ends after the last); {fix}."
    )


def miscount_error(err) -> PetalError | None:
    """The one-line error of :func:`guarded_records`' check that a sound shard holds the
    count it should (:data:`MISCOUNT`) that stopped a run, else None."""
    line = _asserted(err, MISCOUNT)
    return None if line is None else PetalError(line)


# Opens the message of the pipeline's check of every label (see class_range_message).
CLASS_RANGE = "petal: class index out of range: "
# Starts the message of a training pass that skip_corrupt left with less than one batch
# (petal.data.pipeline._short_pass_guard).
SHORT_PASS = "petal: short pass: "


def class_range_message(src: Source) -> tuple[str, str, str]:
    """The error for a record of ``src`` whose class index is not one of its classes, as
    the text before the index, the text after an index past the classes and the text after
    a negative one: the pipeline checks every label, so that no run trains on the all-zero
    one-hot label of such a class (``tf.one_hot``). :func:`class_range_error` names the
    record where it can."""
    n = src.num_classes
    if src.kind == "codelab" and src.classes_from.startswith("as classes="):
        fix = f"{src.classes_from}): pass classes listing every class in index order"
    elif src.kind == "codelab":
        fix = (
            f"{src.classes_from}): pass --classes NAME,NAME,... (classes=[...] in Python) "
            "listing every class in index order (the class of every record is counted only "
            f"in local shards of up to {MAX_CLASS_SCAN_BYTES / 1e9:g} GB in all)"
        )
    elif src.kind == "records":
        fix = "its manifest lists them): its shards were changed after petal convert wrote "
        fix += "them; convert again"
    else:
        fix = "one per class folder)"
    # No list of classes makes a negative index one: the record is wrong.
    if src.kind == "records":
        mend = "its shards were changed after petal convert wrote them; convert again"
    else:
        mend = (
            "the record is wrong (no --classes names a negative index): write it again with "
            "its class index, or convert the original images with petal convert"
        )
    negative = f" but class indices run from 0 to {n - 1} ({n} classes): {mend}."
    return (
        f"{CLASS_RANGE}{src.path} holds class index ",
        f" but the source has {n} classes ({fix}.",
        negative,
    )


def class_range_error(err, data=None, split: str = "all") -> PetalError | None:
    """The one-line error of the pipeline's label check (:func:`class_range_message`)
    that stopped a run, else None; it names the first record of ``split`` of ``data`` that
    holds the index, where :func:`_records_of_class` finds it."""
    import re

    line = _asserted(err, CLASS_RANGE)
    if line is None:
        return None
    index = re.search(r" holds class index (-?\d+)", line)
    if data is not None and index and (at := _records_of_class(data, split, int(index[1]))):
        line = f"{line[: index.end()]} ({at}){line[index.end() :]}"
    return PetalError(line)


def _records_of_class(data, split: str, index: int) -> str | None:
    """Where ``split`` of records ``data`` holds class index ``index`` (as the pipeline
    reads it, an int32), ``"SHARD: record I"`` of the first such record (``"in N records,
    the first SHARD: record I"`` for several); None when none does, or when not checked:
    an image folder, shards not on a local disk or of more than
    :data:`MAX_CLASS_SCAN_BYTES` in all, or a source that no longer opens."""
    import numpy as np
    import tensorflow as tf

    try:
        src = data if isinstance(data, Source) else open_source(str(data), verify=False)
        files = src.files(split)
    except PetalError:
        return None
    if src.kind == "folder" or not files or not _scan_classes_at_open(files):
        return None
    # A record without a class reads as another index; one that does not parse is passed
    # over, its number kept (enumerated first).
    other = index + 1 if index < np.iinfo(np.int32).max else index - 1
    spec = {schema.CLASS: tf.io.FixedLenFeature([], tf.int64, default_value=other)}

    graph = tf.autograph.experimental.do_not_convert

    def holds(i, record):
        cls = tf.cast(tf.io.parse_single_example(record, spec)[schema.CLASS], tf.int32)
        return i, tf.equal(cls, index)

    first, found = None, 0
    for path in files:
        records = tfdata.untuned(tf.data.TFRecordDataset(path, buffer_size=1 << 20))
        records = records.ignore_errors()
        matched = (
            records.enumerate()
            .map(graph(holds), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
            .ignore_errors()
            .filter(graph(lambda i, hit: hit))
            .map(graph(lambda i, hit: i))
            .batch(4096)
        )
        at = np.concatenate([np.zeros([0], np.int64), *(b.numpy() for b in matched)])
        if at.size and first is None:
            first = f"{path}: record {int(at[0])}"
        found += at.size
    if first is None:
        return None
    return first if found == 1 else f"in {found} records, the first {first}"


def short_pass_error(err, data) -> PetalError | None:
    """The one-line error of the pipeline's check that a training pass over ``data`` read
    at least one batch (:data:`SHORT_PASS`), naming the shards skip_corrupt cut short;
    else None."""
    line = _asserted(err, SHORT_PASS)
    if line is None:
        return None
    root = str(data).rstrip("/") + "/"
    shards = sorted({shard for shard, _ in SKIPPED.shards if shard.startswith(root)})
    if shards:
        line = f"{line} Cut short: {folders.some_names(shards)}."
    return PetalError(line)


def _asserted(err, prefix: str) -> str | None:
    """The text after ``prefix`` of a pipeline assertion's message in ``err``, else None."""
    text = getattr(err, "message", None) or str(err)
    start = text.find(prefix)
    if start < 0:
        return None
    # Up to the end of the message: "...]" closes the assertion's data, whose text
    # TensorFlow escaped as C does (a quote as \', a non-ASCII byte as octal).
    line = text[start + len(prefix) :].splitlines()[0]
    line = line[: line.rindex("]")] if "]" in line else line
    raw = codecs.escape_decode(line.encode("utf-8", "backslashreplace"))[0]
    return raw.decode("utf-8", "replace")


def corrupt_input_error(err, data, action: str, split: str = "all") -> PetalError:
    """A one-line error for a corrupt record or image that stopped ``action`` on ``data``.

    ``err`` is the ``DataLossError`` or ``InvalidArgumentError`` TensorFlow raised; when it
    carries the reader's own message (see :func:`guarded_records`) the shard and record it
    names are kept and TensorFlow's stack of op names is dropped.
    """
    import re

    folder = _as_folder(data)
    if folder is not None:
        return _folder_decode_error(folder, data, action)
    text = getattr(err, "message", None) or str(err)
    ours = re.search(r"\[petal: ([^\]]*?)(?: Run `petal inspect[^\]]*)?\]", text)
    # TensorFlow's own reason, without its function names and stack of ops ("[[node]]"), and,
    # for an error from a Keras step, without the heading and the stack of the node it names
    # ("Graph execution error:", "Detected at node ... defined at", indented frames).
    lines = [
        re.sub(r"\{\{function_node [^}]*\}\}\s*", "", ln).strip()
        for ln in text.splitlines()
        if ln.strip()
        and not ln.strip().startswith("[[")
        and not ln.startswith((" ", "\t", "Detected at node "))
        and ln.strip() not in ("Graph execution error:", "<stack traces unavailable>")
    ]
    lines = [ln for ln in lines if ln]
    reason = ours.group(1) if ours else (lines or ["unknown error"])[0]
    # "Error in user-defined function passed to ParallelMapDatasetV2:3 transformation with
    # iterator: Iterator::Root::...: jpeg::Uncompress failed." -> the last part.
    reason = re.sub(r"^Error in user-defined function passed to .*? with iterator: \S+: ", "",
                    reason)
    bad = None if ours else _undecodable_records(data, split)
    if bad and (lacking := _lacking_records(bad)):
        # No image to blame: a record written without a feature the pipeline reads.
        shown = some_files(lacking, f"{action} with --skip-corrupt lists each")
        others = len(bad) - len(lacking)
        also = f" ({others} more record(s) whose image cannot be decoded)" if others else ""
        return PetalError(
            f"{len(lacking)} record(s) of {data} lack a feature the pipeline reads: {shown}"
            f"{also}. Write them again with it (codelab shards: image and class), or convert "
            f"the original images with petal convert; or {action} with --skip-corrupt to skip "
            "and count them."
        )
    if bad:
        # A record whose frame is sound but whose image does not decode: TensorFlow's
        # error names neither its shard nor the record.
        shown = some_files(bad, f"{action} with --skip-corrupt lists each")
        reason = f"{len(bad)} record(s) whose image cannot be decoded: {shown}."
    elif not ours:
        if bad is not None:  # every record checked and found sound
            scope = "" if split == "all" else f" of the {split} split"
            # The check reads past CRC failures (--skip-corrupt skipped those records).
            claim = "reads and decodes (checked just now)"
            if lost := unread_records(data, split):
                claim = (f"that reads decodes (checked just now; {lost} cannot be read: CRC "
                         "failure or truncation)")
            return PetalError(
                f"{action} stopped on {data}: {reason.rstrip('.')}. Every record{scope} "
                f"{claim}, so the records may not be to blame; "
                "`petal inspect --verify` checks their other fields."
            )
        from petal.data.pipeline import MAX_DECODE_SCAN

        reason = (
            f"{reason.rstrip('.')} (the record is not named: petal searches local records only, "
            f"up to {MAX_DECODE_SCAN:,})."
        )
    # petal inspect reads local and gs:// records, not http.
    on = "a local copy" if folders.is_http(str(getattr(data, "path", data))) else "it"
    return PetalError(
        f"Corrupt input in {data}: {reason} Run `petal inspect --verify` on {on}, reconvert, "
        f"or {action} with --skip-corrupt to skip and count bad records."
    )


def input_error(
    err, data, action: str, store_mark: int | None = None, split: str = "all"
) -> PetalError | None:
    """:func:`corrupt_input_error` for a TensorFlow error that stopped ``action``, or None
    when the input is not to blame (the caller re-raises).

    ``store_mark`` (:meth:`petal.data.remote.StoreErrors.mark`, taken before ``action``
    read anything): a request to the store that failed since is the cause, not the data.

    A record whose class index is past the source's classes stops the pipeline with
    :func:`class_range_error`'s message (no corrupt data: that error, as it is). A corrupt
    record or image raises ``DataLossError`` or ``InvalidArgumentError``; an image folder's
    file that cannot be read at all (a looping link, no permission, removed while
    training) raises others, and is to blame when the folder holds such a file.
    """
    import tensorflow as tf

    if (error := class_range_error(err, data, split)) is not None:
        return error
    if (error := miscount_error(err)) is not None:
        return error
    if store_mark is not None:
        from petal.data.remote import store_error

        # A failed request ends the stream early too: before a pass's check that says so.
        if (error := store_error(store_mark, action)) is not None:
            return error
    if (error := short_pass_error(err, data)) is not None:
        return error
    if isinstance(err, (tf.errors.DataLossError, tf.errors.InvalidArgumentError)):
        return corrupt_input_error(err, data, action, split)
    unreadable = (tf.errors.UnknownError, tf.errors.PermissionDeniedError, tf.errors.NotFoundError)
    folder = _as_folder(data) if isinstance(err, unreadable) else None
    if folder is None:
        gone = _unopenable_shards(data) if isinstance(err, unreadable) else []
        if gone:
            names = folders.some_names([f"{posixpath.basename(f)}: {why}" for f, why in gone])
            return PetalError(
                f"petal {action} stopped: {len(gone)} shard(s) of {data} cannot be opened "
                f"({names}). Restore them (removed while it ran? convert again) or make them "
                "readable, then run it again."
            )
        return None
    from petal.data.pipeline import undecodable_files

    bad = undecodable_files(folder)
    return _folder_decode_error(folder, data, action, bad) if bad else None


def _undecodable_records(data, split: str = "all") -> list[tuple[str, str]] | None:
    """:func:`petal.data.pipeline.undecodable_records` of ``split`` of ``data`` (None when it
    is not checked: not on a local disk, too many, or it does not open)."""
    from petal.data.pipeline import undecodable_records

    try:
        return undecodable_records(data, split)
    except PetalError:
        return None


def _lacking_records(bad: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Those of :func:`_undecodable_records`' records that lack a feature (not an image)."""
    from petal.data.pipeline import lacks_feature

    return [(where, reason) for where, reason in bad if lacks_feature(reason)]


def unread_records(data, split: str = "all") -> int:
    """How many records of ``split`` of local records ``data`` cannot be read: those from a
    shard's first CRC failure (or truncation) on."""
    import tensorflow as tf

    src = data if isinstance(data, Source) else open_source(str(data), verify=False)
    lost = 0
    for path, expected in zip(src.files(split), src.counts(split), strict=True):
        records = tfdata.untuned(tf.data.TFRecordDataset(path, buffer_size=1 << 20))
        read = records.ignore_errors().batch(4096).reduce(
            tf.constant(0, tf.int64), lambda n, block: n + tf.size(block, out_type=tf.int64)
        )
        lost += max(expected - int(read), 0)
    return lost


def _unopenable_shards(data) -> list[tuple[str, str]]:
    """``(shard, why)`` for each shard of records ``data`` that does not exist (local or
    ``gs://``) or that this process may not read (local)."""
    import tensorflow as tf

    try:
        src = data if isinstance(data, Source) else open_source(str(data), verify=False)
        if src.kind == "folder" or src.remote:
            return []
        return [(f, why) for f in src.files("all") if (why := _unopenable(f))]
    except (PetalError, tf.errors.OpError):
        return []


def _unopenable(shard: str) -> str | None:
    """Why the shard at ``shard`` (local or ``gs://``) cannot be opened: ``"not found"``,
    ``"permission denied"`` (local); None when it can, or may (``http``: read staged)."""
    import tensorflow as tf

    if folders.is_http(shard):
        return None
    if not tf.io.gfile.exists(shard):
        return "not found"
    if not folders.is_remote(shard) and not os.access(shard, os.R_OK):
        return "permission denied"
    return None


def _as_folder(data) -> Source | None:
    """``data`` opened, if it is an image folder (None for records or what does not open)."""
    try:
        src = data if isinstance(data, Source) else open_source(str(data), min_classes=1)
    except PetalError:
        return None
    return src if src.kind == "folder" else None


def _folder_decode_error(src: Source, data, action: str, bad=None) -> PetalError:
    """Names the files of an image folder that the pipeline cannot decode (``bad``, when
    already known)."""
    from petal.data.pipeline import undecodable_files

    bad = undecodable_files(src) if bad is None else bad
    # Photos over the pixel limit are no damage: the converter reads them when asked to.
    big = any(reason.startswith("too many pixels") for _, reason in bad)
    # petal convert reads local and gs:// folders, not http.
    where = " on the store, convert a local copy" if src.remote else ", convert the folder"
    fix = (
        f"Remove or replace them{where} with `petal convert` (it skips and "
        "lists unreadable files in manifest.json"
        + ("; its --max-pixels N converts larger photos" if big else "")
        + f"), or {action} with --skip-corrupt."
    )
    if not bad:
        return PetalError(f"An image in {data} could not be decoded. {fix}")
    shown = some_files(bad, f"{action} with --skip-corrupt lists each")
    return PetalError(f"{len(bad)} image(s) in {data} cannot be decoded: {shown}. {fix}")


def _report_miscount(line) -> bool:
    """Logs and keeps (:attr:`SkipCounter.miscounted`) a :data:`MISCOUNT` line met with
    ``skip_corrupt``."""
    line = line.numpy().decode("utf-8", "replace")[len(MISCOUNT):]
    if not SKIPPED.callers_stop_on_miscounts:
        log.warning("petal: %s", line)
    SKIPPED.add_miscount(line)
    return False


def _report_skip(path, n, expected) -> bool:
    path = path.numpy().decode("utf-8", "replace")
    n, expected = int(n), int(expected)
    lost = max(expected - n, 0)
    message = (
        f"skipped {lost} record(s) of {path}: record {n} is corrupt (CRC failure or "
        "truncation) and the reader cannot resume inside a shard"
    )
    if n == 0 and (why := _unopenable(path)):
        # Not corruption: the shard went (or became unreadable) after it was listed.
        message = (
            f"skipped {lost} record(s) of {path}: the shard cannot be opened ({why}; removed "
            "while this ran? Restore it or convert again)"
        )
    if SKIPPED.first(message):
        log.warning("petal: %s", message)
    SKIPPED.add(lost, message, path)
    return False


# --- file systems ----------------------------------------------------------------------------


def _join(*parts: str) -> str:
    """``parts`` joined as a path; over http, the names after the first (a listing's, a
    manifest's) percent-encoded: a ``#``, ``?`` or ``%`` in a name was sent as the URL's
    structure, and the request asked for another object."""
    if folders.is_http(parts[0]):
        from petal.data.remote import key_url

        return key_url(parts[0], "/".join(p.strip("/") for p in parts[1:] if p))
    return _gfile_join(*parts)


def _gfile_join(*parts: str) -> str:
    import os

    if "://" in parts[0]:
        return "/".join([parts[0].rstrip("/"), *(p.strip("/") for p in parts[1:])])
    return os.path.join(*parts)


class _GFileFS:
    """The few file-system calls the reader needs, through tf.io.gfile (local, gs://, ...).

    A store that cannot be reached, or a scheme tf.io.gfile does not know (``s3://``),
    raises a one-line PetalError naming the path instead of TensorFlow's error.
    """

    @staticmethod
    def _call(path, fn):
        import tensorflow as tf

        try:
            return fn(tf.io.gfile)
        except tf.errors.OpError as err:
            raise folders.gfile_error(path, err, also=("http://", "https://")) from None

    # tf.io.gfile takes and returns names as UTF-8 text: a local folder holding a name that
    # is not (a class folder "ros\xe9") is listed by the os module, whose names keep such
    # bytes, so that the image-folder reader can refuse the class naming it.
    @staticmethod
    def _not_utf8(path) -> bool:
        return not folders.is_remote(path) and not folders.is_utf8(path)

    def exists(self, path):
        if self._not_utf8(path):
            return os.path.exists(path)
        return self._call(path, lambda g: g.exists(path))

    def isdir(self, path):
        if self._not_utf8(path):
            return os.path.isdir(path)
        return self._call(path, lambda g: g.isdir(path))

    def listdir(self, path):
        try:
            names = self._call(path, lambda g: g.listdir(path))
        except UnicodeDecodeError:
            if folders.is_remote(path):
                raise PetalError(
                    f"{path} holds a name that is not valid UTF-8, which petal cannot read "
                    "there; rename it."
                ) from None
            return sorted(os.listdir(path))
        return [n.rstrip("/") for n in names]

    def glob(self, pattern):
        return self._call(pattern, lambda g: g.glob(pattern))

    def read_bytes(self, path, size: int = -1):
        """The bytes of ``path``; with ``size``, its first ``size`` bytes at most."""

        def read(gfile):
            with gfile.GFile(path, "rb") as f:
                return f.read(size)

        return self._call(path, read)

    def sizes(self, folder):
        def sizes(gfile):
            out = {}
            for name in gfile.listdir(folder):
                name = name.rstrip("/")
                full = _gfile_join(folder, name)
                if not gfile.isdir(full):
                    out[name] = gfile.stat(full).length
            return out

        return self._call(folder, sizes)


def _fs_for(path: str):
    if folders.is_http(path):
        from petal.data import remote

        parts = urllib.parse.urlsplit(path)
        if parts.username is not None or parts.password is not None:
            # urllib sends no userinfo (it read "user:password@host" as the host name),
            # and the URL would be printed in messages and saved in config.json.
            shown = parts._replace(netloc=f"***@{parts.hostname or ''}" + (
                f":{parts.port}" if parts.port else "")).geturl()
            raise PetalError(
                f"{shown} carries credentials in the URL, which petal neither sends nor "
                "keeps secret; serve the data without them (e.g. a local proxy that adds them)."
            )
        if parts.query or parts.fragment:
            # "?" would be taken for a glob, and the listing request put after the query.
            raise PetalError(
                f"{path}: petal reads http folders by their path alone (a query or fragment, "
                "as in a signed URL, is not supported); pass the folder's URL without it (a "
                "'?' or '#' in a folder's name is written %3F or %23)."
            )
        return remote.HttpFS()
    return _GFileFS()
