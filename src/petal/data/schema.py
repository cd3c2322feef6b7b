"""The one record schema shared by the writer and every reader.

A petal record is a ``tf.train.Example`` whose features are a superset of the
Keras-on-TPU codelab's, so the codelab's own parser reads petal shards unchanged:

| key             | type              | meaning                                          |
|-----------------|-------------------|--------------------------------------------------|
| image           | bytes [1]         | encoded JPEG, or raw uint8 pixels (HxWx3)        |
| class           | int64 [1]         | class index in the manifest's class order        |
| label           | bytes [1]         | class name, UTF-8                                |
| size            | int64 [2]         | stored image [height, width]                     |
| one_hot_class   | float [num cls]   | one-hot class vector (codelab reads it VarLen)   |
| filename        | bytes [1]         | source path relative to the source root, UTF-8   |
| original_size   | int64 [2]         | source image [height, width] before resizing     |

Shard files carry their record count in their name,
``{split}-{index:05d}-of-{total:05d}-{count}.tfrec``, so counting needs no scan,
and ``manifest.json`` (written last) describes the whole folder.
"""

from __future__ import annotations

import re

IMAGE = "image"
CLASS = "class"
LABEL = "label"
SIZE = "size"
ONE_HOT = "one_hot_class"
FILENAME = "filename"
ORIGINAL_SIZE = "original_size"

MANIFEST_NAME = "manifest.json"
SHARD_SUFFIX = ".tfrec"
# Files of a conversion still being written (hidden, renamed when complete): never shards of
# the folder's manifest, and removed by the next conversion.
TEMP_PREFIX = ".petal-tmp-"
FORMAT_JPEG = "jpeg"
FORMAT_RAW = "raw"
FORMATS = (FORMAT_JPEG, FORMAT_RAW)
SPLITS = ("train", "validation")

# The codelab parses the count back with this pattern; so do we, for any shard
# name that ends in "-<count>.tfrec" (the codelab's own "flowers00-230.tfrec" too).
_COUNT_RE = re.compile(r"-(\d+)\.tfrec$")


def is_shard_file(name: str) -> bool:
    """A record shard's file name; not a temporary of a conversion still being written."""
    return name.endswith(SHARD_SUFFIX) and not name.startswith(TEMP_PREFIX)


def check_manifest(manifest, path: str) -> dict:
    """Returns ``manifest`` if it has the shape every reader relies on, else raises.

    Checked: a JSON object with ``classes`` (distinct non-empty names), a known ``format``,
    ``image_size`` (``[height, width]`` or null) and ``splits``, whose ``train`` and
    ``validation`` (either may be absent) list shards with a ``file`` name, a ``count`` and
    optionally their size in ``bytes``;
    a split's ``count`` and its ``per_class`` counts (where given) add up to its shards';
    a shard's count is the one in its file name (``-<count>.tfrec``), where it has one;
    no shard is listed twice, nor in the split other than the one its petal name gives.

    Raises:
        PetalError: naming ``path``, the first field that is wrong, and the fix.
    """
    from petal.errors import PetalError

    def wrong(what: str) -> PetalError:
        return PetalError(
            f"Manifest {path} is damaged: {what}; convert the images again with petal convert."
        )

    def is_count(value) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value >= 0

    if not isinstance(manifest, dict):
        raise wrong(f"it holds a JSON {type(manifest).__name__}, not an object")
    for key in ("classes", "splits", "format"):
        if key not in manifest:
            raise wrong(f"it has no '{key}'")
    classes = manifest["classes"]
    if (
        not isinstance(classes, list)
        or not classes
        or not all(isinstance(c, str) and c for c in classes)
    ):
        raise wrong(f"'classes' must be a list of class names, not {classes!r}")
    if len(set(classes)) != len(classes):
        raise wrong(f"'classes' names a class twice: {classes!r}")
    if manifest["format"] not in FORMATS:
        raise wrong(f"unknown format {manifest['format']!r} (known: {', '.join(FORMATS)})")
    size = manifest.get("image_size")
    if size is not None and not (
        isinstance(size, list) and len(size) == 2 and all(is_count(n) and n > 0 for n in size)
    ):
        raise wrong(f"'image_size' must be [height, width] or null, not {size!r}")
    splits = manifest["splits"]
    if not isinstance(splits, dict):
        raise wrong(f"'splits' must be an object with {' and '.join(SPLITS)}")
    listed: dict[str, str] = {}  # file -> the split that lists it
    for split in SPLITS:
        info = splits.get(split, {})
        if not isinstance(info, dict) or not isinstance(info.get("shards", []), list):
            raise wrong(f"split {split!r} must be an object with a list of 'shards'")
        if "count" in info and not is_count(info["count"]):
            raise wrong(f"split {split!r} has count {info['count']!r}")
        for i, shard in enumerate(info.get("shards", [])):
            if not isinstance(shard, dict):
                raise wrong(f"shard {i} of split {split!r} is {shard!r}, not an object")
            file, count, size = shard.get("file"), shard.get("count"), shard.get("bytes", 0)
            if not isinstance(file, str) or not is_count(count) or not is_count(size):
                raise wrong(
                    f"shard {i} of split {split!r} needs a 'file' name, a record 'count' and, "
                    f"if it gives one, a size in 'bytes'; it has file={file!r}, count={count!r}, "
                    f"bytes={shard.get('bytes')!r}"
                )
            # A shard listed twice, or under the split its name contradicts, would be both
            # trained on and validated on.
            if file in listed:
                where = (
                    f"in split {split!r}" if listed[file] == split
                    else f"in splits {listed[file]!r} and {split!r}"
                )  # fmt: skip
                raise wrong(f"shard {file} is listed twice ({where})")
            listed[file] = split
            named = _SPLIT_SHARD_RE.match(file)
            if named and named.group(1) != split:
                raise wrong(
                    f"shard {file} is listed in split {split!r}, but its name says "
                    f"{named.group(1)!r}"
                )
            named = _COUNT_RE.search(file)
            if named and int(named.group(1)) != count:
                raise wrong(
                    f"shard {file} of split {split!r} has count {count}, but its file name "
                    f"says {named.group(1)}"
                )
        total = sum(shard["count"] for shard in info.get("shards", []))
        if info.get("count", total) != total:
            raise wrong(f"split {split!r} has count {info['count']} but its shards hold {total}")
        per_class = info.get("per_class", {})
        if not isinstance(per_class, dict) or not all(map(is_count, per_class.values())):
            raise wrong(f"split {split!r} has per_class {per_class!r}")
        if unknown := sorted(set(per_class) - set(classes)):
            raise wrong(f"split {split!r} counts class {unknown[0]!r}, which 'classes' lacks")
        if per_class and sum(per_class.values()) != total:
            raise wrong(
                f"the per_class counts of split {split!r} add up to "
                f"{sum(per_class.values())}, but its shards hold {total}"
            )
    skipped = manifest.get("skipped", [])
    if not isinstance(skipped, list) or not all(
        isinstance(item, dict) and "file" in item and "reason" in item for item in skipped
    ):
        raise wrong("'skipped' must be a list of {file, reason}")
    return manifest


def shard_name(split: str, index: int, total: int, count: int) -> str:
    """File name of one shard, e.g. ``train-00003-of-00013-230.tfrec``."""
    return f"{split}-{index:05d}-of-{total:05d}-{count}{SHARD_SUFFIX}"


_SPLIT_SHARD_RE = re.compile(
    rf"^({'|'.join(SPLITS)})-\d{{5,}}-of-\d{{5,}}-\d+{re.escape(SHARD_SUFFIX)}$"
)


def is_split_shard(name: str) -> bool:
    """A file name that :func:`shard_name` writes: the split is in the name, and only the
    folder's manifest says the shards form a complete set."""
    return _SPLIT_SHARD_RE.match(name) is not None


def count_from_name(path: str) -> int:
    """Record count embedded in a shard's file name.

    Raises:
        ValueError: if the name carries no count.
    """
    match = _COUNT_RE.search(str(path))
    if match is None:
        raise ValueError(
            f"Shard name carries no record count (expected '...-<count>.tfrec'). Received: {path}"
        )
    return int(match.group(1))


def feature_spec(num_classes: int | None = None, codelab: bool = False) -> dict:
    """The parsing spec for ``tf.io.parse_single_example`` / ``parse_example``.

    Args:
        num_classes: length of ``one_hot_class``; when given it is parsed as a
            fixed-length feature, otherwise as a VarLen (sparse) one, as the codelab does.
        codelab: only the codelab's five keys (for the codelab's published shards).
    """
    import tensorflow as tf

    spec = {
        IMAGE: tf.io.FixedLenFeature([], tf.string),
        CLASS: tf.io.FixedLenFeature([], tf.int64),
        LABEL: tf.io.FixedLenFeature([], tf.string),
        SIZE: tf.io.FixedLenFeature([2], tf.int64),
        ONE_HOT: (
            tf.io.FixedLenFeature([num_classes], tf.float32)
            if num_classes
            else tf.io.VarLenFeature(tf.float32)
        ),
    }
    if not codelab:
        spec[FILENAME] = tf.io.FixedLenFeature([], tf.string)
        spec[ORIGINAL_SIZE] = tf.io.FixedLenFeature([2], tf.int64)
    return spec
