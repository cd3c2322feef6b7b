"""``petal inspect``: what a records folder holds, and whether every record is intact.

The summary comes from the manifest alone (no scan). Shards without a manifest (the
codelab's own, a folder or a glob) are summarised as training reads them: counts from the
file names, classes from the records (``class_0``, ... when they name none), split by file;
their per-class counts take one read of every record's class. ``verify`` reads every record with
its CRC checked, parses it with the full feature spec, decodes the image and checks the
fields against the manifest, naming the shard and record index of the first problem in
each shard. ``grid`` draws a labelled grid of sample images (headless, Agg) from the
records that read, and names those that do not (in shards no other problem names).
"""

from __future__ import annotations

import hashlib
import itertools
import os
import posixpath
import sys
from dataclasses import dataclass, field
from pathlib import Path

from petal.data import folders, schema, tfdata
from petal.data.writer import read_manifest
from petal.display import can_draw, columns, fit_text, literal, ljust, plot_labels
from petal.errors import (
    PetalError,
    is_int_at_least,
    need_bool,
    need_bool_or_none,
    printable,
    tf_message,
)
from petal.jsonfile import save_atomically

_MB = 1_000_000
_LIST_SHARDS = 12  # shards listed one per line; more are summarised
_LIST_SKIPPED = 10
_LIST_PROBLEMS = 20
_COUNT_BATCH = 1024  # records parsed at once when counting the classes of codelab shards
_IMAGE_FORMATS = ("png", "jpg", "jpeg", "webp", "pdf", "svg")
# The manifest's lists of what convert did not read, as the summary counts them.
_UNREAD = (
    ("unclassified_images", "images in no class not read"),
    ("other_files", "other-type files not read"),
    ("hidden_entries", "hidden entries not read"),
    ("empty_folders", "empty folders"),
    ("folder_loops", "folder loops not followed"),
    ("broken_links", "broken links not followed"),
)


@dataclass
class InspectReport:
    """The result of ``inspect_records``; ``str()`` is the text ``petal inspect`` prints.

    Attributes:
        path: the records folder (for a glob of shards: their folder, or the folder that
            holds theirs; the manifest's shard names are relative to it).
        manifest: its manifest; for shards without one, the same fields built from them
            (``"origin": "codelab"``).
        verified: records read and checked by ``verify``, or None when not verifying.
        problems: one line per problem found (shard, record index, what): by ``verify``, or
            else by comparing the shard files with the manifest (present, size, listed); and
            records the grid could not read or draw.
        grid: path of the sample grid written, if any.
        uncounted: splits with records whose per-class counts the manifest does not give
            (hand-written or another tool's); ``verify`` counts them (``manifest`` then
            holds the counts read, and this names the splits counted).
    """

    path: str
    manifest: dict
    verified: int | None = None
    problems: list[str] = field(default_factory=list)
    grid: str | None = None
    uncounted: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def __str__(self) -> str:
        return "\n".join(_format(self))


def inspect_records(
    path: str | os.PathLike,
    *,
    verify: bool = False,
    grid: str | os.PathLike | None = None,
    grid_per_class: int = 4,
    progress: bool | None = None,
) -> InspectReport:
    """Summarises a records folder, optionally verifying every record and drawing a grid.

    Args:
        path: records folder written by ``petal convert``, or its manifest file (any
            ``*.json`` path; the shards are the ones beside it), or shards without a
            manifest (the codelab's: a folder or a glob).
        verify: read every record (CRC, parse, decode, field checks).
        grid: write a PNG grid of sample images (rows are classes) to this path.
        grid_per_class: images per class in the grid.
        progress: show a progress bar on stderr while counting or verifying (default: only
            when it is a terminal).

    Raises:
        PetalError: no manifest (not a records folder or an unfinished conversion), a
            folder of images, or a grid path whose extension is not an image format.
    """
    manifest_path = path = str(folders.expand_home(path))
    verify = need_bool(verify, "verify")
    progress = need_bool_or_none(progress, "progress")
    if progress is None:
        progress = sys.stderr.isatty()
    if folders.is_http(path):
        from petal.data.reader import _fs_for

        _fs_for(path)  # a URL with a password is refused without showing it, as training does
        # Its reads are tf.io.gfile's: "paths starting with http:// are not supported".
        raise PetalError(
            f"inspect reads records on a local disk or gs://; {path} is read over http: "
            "pass a local copy."
        )
    given_manifest = path.rstrip("/").endswith(".json")  # a file, as read_manifest takes it
    if given_manifest:
        path = os.path.dirname(path.rstrip("/")) or "."  # its shards lie beside it
    grid = image_path(str(folders.expand_home(grid))) if grid is not None else None
    counted: list[str] = []
    uncounted: list[str] = []
    source = None if given_manifest else _codelab_source(path)
    if source is not None:
        path, manifest, counted = _codelab_manifest(source, progress)
    else:
        given = read_manifest(manifest_path)
        manifest = _complete(given)
        # No per-class counts (check_manifest accepts that): a table of zeros would be false.
        uncounted = [
            split for split in schema.SPLITS
            if manifest["splits"][split]["count"]
            and "per_class" not in given["splits"].get(split, {})
        ]  # fmt: skip
    report = InspectReport(path=path, manifest=manifest, uncounted=uncounted)
    # convert's totals, from the manifest alone: they must agree with its splits.
    name = os.path.basename(manifest_path.rstrip("/")) if given_manifest else schema.MANIFEST_NAME
    totals = _check_totals(manifest, name)
    if verify:
        report.verified, report.problems, read = _verify(path, manifest, progress)
        report.problems = totals + report.problems
        for split in uncounted:  # the classes of the records read, as for codelab shards
            manifest["splits"][split]["per_class"] = read[split]
    else:
        report.problems = totals + counted + _check_files(path, manifest)
    if source is None:  # a glob of shards may leave others beside them out on purpose
        report.problems += _unlisted(path, manifest)
    if grid is not None:
        report.grid, unread = _draw_grid(path, manifest, grid, grid_per_class, report.problems)
        report.problems += unread
    return report


def _codelab_source(path: str):
    """The shards at ``path`` opened as training opens them when it holds no manifest
    (the codelab's: a folder or a glob), else None.

    Raises:
        PetalError: ``path`` is a folder of images.
    """
    from petal.data.reader import (
        OTHER_RECORD_SUFFIXES,
        ShardsWithoutManifest,
        is_pattern,
        open_source,
    )

    pattern = is_pattern(path)
    if not pattern and folders.exists(folders.join(path, schema.MANIFEST_NAME)):
        return None
    try:
        source = open_source(path, verify=False)
    except ShardsWithoutManifest:
        raise  # said as training says it
    except PetalError:
        # What inspect reads, not what training reads (a folder of class sub-folders too).
        what = (
            "pass a records folder (petal convert writes one) or codelab shards (their "
            f"folder, or a glob such as DIR/*{schema.SHARD_SUFFIX})"
        )
        if pattern:  # no shard matches: said as training says it
            raise
        if not folders.exists(path):
            raise PetalError(f"Records not found: {path}; {what}.") from None
        if path.endswith(schema.SHARD_SUFFIX):  # one shard: its folder is named
            raise
        if not folders.isdir(path):
            raise PetalError(f"{path} is a file, not a records folder; {what}.") from None
        if any(
            schema.is_shard_file(name) or name.lower().endswith(OTHER_RECORD_SUFFIXES)
            for name in _names(path)
        ):
            raise  # shards that training cannot read either: its reason is the precise one
        if folders.holds_run_config(path):  # not "no readable manifest.json"
            raise PetalError(
                f"{path} is the work directory of a `petal train` run, not records; {what}."
            ) from None
        return None  # read_manifest says what is missing
    if source.kind == "folder":
        raise PetalError(
            f"{path} is a folder of images; inspect reads records: convert it first "
            f"(`petal convert {path} RECORDS`), then inspect RECORDS."
        )
    return source if source.kind == "codelab" else None


def _codelab_manifest(source, progress: bool) -> tuple[str, dict, list[str]]:
    """(the shards' folder, a manifest of what training reads, problems met counting).

    The folder is the one that holds every shard (a glob may match several folders); the
    manifest names each shard by its path from there, so each is read where it lies.
    Per-class counts need every record's class: one read of all the shards.
    """
    import numpy as np
    import tensorflow as tf
    from tqdm.auto import tqdm

    classes = list(source.classes)
    spec = {schema.CLASS: tf.io.FixedLenFeature([], tf.int64)}
    problems: list[str] = []
    splits = {}
    folder = _common_folder(source.files("all"))
    with tqdm(total=source.count("all"), desc="count", unit="rec", disable=not progress) as bar:
        for split in schema.SPLITS:
            counts = np.zeros(len(classes), np.int64)
            shards = []
            known = len(problems)  # a shard of this split with a problem explains its shortfall
            for file, count in zip(source.files(split), source.counts(split), strict=True):
                name = file[len(folder) :].lstrip("/") if folder else file
                shards.append({"file": name, "count": count, "bytes": folders.file_size(file)})
                batches, read, problem = _read_classes(file, spec, bar)
                for ids in batches:
                    ids = ids[(ids >= 0) & (ids < len(classes))]
                    counts += np.bincount(ids, minlength=len(classes))
                if problem is not None:
                    problems.append(f"{name}: {problem} (--verify names the record)")
                elif read != count:  # as --verify says it; a split's total may hide it
                    problems.append(f"{name}: {_records(read)} read, file name says {count}")
            total = sum(s["count"] for s in shards)
            per_class = {c: int(n) for c, n in zip(classes, counts, strict=True) if n}
            if len(problems) == known and sum(per_class.values()) != total:
                problems.append(
                    f"{split}: the file names count {total} records, their classes "
                    f"{sum(per_class.values())} (--verify names the records)"
                )
            splits[split] = {"shards": shards, "count": total, "per_class": per_class}
    manifest = {
        "classes": classes,
        "format": schema.FORMAT_JPEG,
        "image_size": list(source.image_size) if source.image_size else None,
        "splits": splits,
        "origin": "codelab",
    }
    if not source.size_recorded:
        manifest["sizes_unrecorded"] = True
    if not source.classes_named:  # class_0, ... are assumed names
        manifest["unnamed_classes"] = True
    elif source.notes:  # records that disagree on a class's name
        manifest["class_notes"] = list(source.notes)
    return folder or ".", _complete(manifest), problems


def _read_classes(file: str, spec: dict, bar) -> tuple[list, int, str | None]:
    """(the classes of the records of ``file`` that read, as arrays of class ids; how many
    records were read; the first problem met, or None).

    Records are parsed a batch at a time (fast on big shards); a batch that fails is read
    again record by record, so that the records before a bad frame count, as for
    ``verify``: a bad frame ends the file (the records after it cannot be located), a
    record that does not parse is passed over.
    """
    import tensorflow as tf

    records = tfdata.untuned(tf.data.TFRecordDataset(file))
    found = []
    read = 0
    problem = None
    while True:
        try:
            batches = records.skip(read).batch(_COUNT_BATCH)
            for ids in batches.map(lambda r: tf.io.parse_example(r, spec)[schema.CLASS]):
                found.append(ids.numpy())
                read += len(ids)
                bar.update(len(ids))
            break
        except tf.errors.OpError:
            pass  # in the batch from ``read`` on: read again record by record below
        start = read
        rest = iter(records.skip(read).take(_COUNT_BATCH))
        while True:
            try:
                raw = next(rest)
            except StopIteration:
                break
            except tf.errors.OpError as err:  # a bad frame, or no file: the file ends here
                return found, read, problem or tf_message(err).splitlines()[0]
            try:
                found.append(tf.io.parse_single_example(raw, spec)[schema.CLASS].numpy()[None])
            except tf.errors.OpError as err:  # an intact frame that does not parse
                problem = problem or tf_message(err).splitlines()[0]
            read += 1
            bar.update()
        if read == start:  # (nothing left to read)
            break
    return found, read, problem


def _common_folder(files: list[str]) -> str:
    """The deepest folder that holds every one of ``files`` ("" for relative paths under
    different top folders); ``/``-separated, as globs and remote paths are."""
    common = posixpath.dirname(files[0]).split("/")
    for file in files[1:]:
        parts = posixpath.dirname(file).split("/")
        n = 0
        while n < min(len(common), len(parts)) and common[n] == parts[n]:
            n += 1
        common = common[:n]
    return "/".join(common) or ("/" if files[0].startswith("/") else "")


def _complete(manifest: dict) -> dict:
    """A copy with the fields convert always writes filled in where a manifest lacks them
    (written by hand or by another tool): both splits, their counts and per-class counts."""
    m = dict(manifest)
    m["splits"] = {}
    for split in schema.SPLITS:
        info = dict(manifest["splits"].get(split, {}))
        info.setdefault("shards", [])
        info.setdefault("count", sum(s["count"] for s in info["shards"]))
        info.setdefault("per_class", {})
        m["splits"][split] = info
    m.setdefault("skipped", [])
    m.setdefault("written", sum(m["splits"][s]["count"] for s in schema.SPLITS))
    m.setdefault("images_found", m["written"] + len(m["skipped"]))
    m.setdefault("resize", "?")
    m.setdefault("seed", "?")
    return m


# --- text ---------------------------------------------------------------------------------------


def _size(n: int) -> str:
    return f"{n / _MB:.1f} MB" if n >= 100_000 else f"{n / 1000:.1f} kB"


def _format(report: InspectReport) -> list[str]:
    m = report.manifest
    # Names as they appear on one line each: a newline or a terminal escape in a class or
    # file name is written as its Python escape.
    classes = [printable(c) for c in m["classes"]]
    splits = {
        split: {**info, "per_class": {printable(c): n for c, n in info["per_class"].items()}}
        for split, info in m["splits"].items()
    }
    size = "x".join(map(str, m["image_size"])) if m.get("image_size") else "original sizes"
    if not m.get("image_size") and m.get("origin") == "codelab":  # not known to be theirs
        size = "sizes not recorded" if m.get("sizes_unrecorded") else "mixed sizes"
    quality = f", quality {m['quality']}" if m.get("quality") is not None else ""
    if m.get("origin") == "codelab":
        unnamed = m.get("unnamed_classes")
        lines = [
            f"{printable(report.path)}: {_records(m['written'])}, {m['format']} {size}, "
            f"{len(classes)} classes",
            "no manifest.json (the codelab's shards): counts from the file names, classes "
            f"{'by index (names assumed)' if unnamed else 'from the records'}, split by file as "
            "petal train reads them",
        ]
        if unnamed:
            from petal.data.reader import unnamed_classes_note

            note = unnamed_classes_note(
                printable(report.path), tuple(classes), "petal train and evaluate"
            )
            lines.append(f"warning: {note}")
        lines += [f"warning: {note}" for note in m.get("class_notes", ())]
        lines.append("")
    else:
        lines = _conversion_lines(printable(report.path), m, size, quality)
    if report.uncounted and report.verified is None:
        lines += [
            f"classes: the manifest gives no per-class counts for "
            f"{' and '.join(report.uncounted)} (--verify reads every record and counts them)",
            "",
        ]
    else:
        if report.uncounted:
            lines.append(
                f"(per-class counts of {' and '.join(report.uncounted)}: not in the manifest; "
                "the classes of the records read)"
            )
        counter = "the file names" if m.get("origin") == "codelab" else "the manifest's shards"
        lines += _class_table(classes, splits, counter)
    for split in schema.SPLITS:
        shards = splits[split]["shards"]
        lines.append(
            f"{split}: {len(shards)} shard{'s' if len(shards) != 1 else ''}, "
            f"{_records(splits[split]['count'])}, {_sizes(shards)}"
        )
        for shard in shards[:_LIST_SHARDS]:
            lines.append(
                f"  {printable(shard['file'])}  {_records(shard['count'])}"
                + (f"  {_size(shard['bytes'])}" if "bytes" in shard else "")
            )
        if len(shards) > _LIST_SHARDS:
            lines.append(f"  ... and {len(shards) - _LIST_SHARDS} more")
    if m["skipped"]:
        lines += ["", f"skipped ({len(m['skipped'])}):"]
        lines += [f"  {printable(s['file'])}: {printable(s['reason'])}"
                  for s in m["skipped"][:_LIST_SKIPPED]]  # fmt: skip
        if len(m["skipped"]) > _LIST_SKIPPED:
            lines.append(f"  ... and {len(m['skipped']) - _LIST_SKIPPED} more (see manifest.json)")
    if report.verified is None and not report.ok:
        # (The grid reads records until it has its images.)
        checked = "shard files and the records read for the grid" if report.grid else (
            "the manifest's totals and its shard files"
        )
        lines += [
            "",
            f"check: {len(report.problems)} problem{'s' if len(report.problems) != 1 else ''}"
            f" ({checked}; --verify reads every record):",
        ]
        lines += _listed(report.problems)
    if report.verified is not None:
        n_shards = sum(len(splits[s]["shards"]) for s in schema.SPLITS)
        lines.append("")
        if report.ok:
            shards = f"{n_shards} shard{'s' * (n_shards != 1)}"
            lines.append(
                f"verify: OK, {_records(report.verified)} in {shards} read (CRC, parse, decode, "
                "fields)"
            )
        else:
            lines.append(
                f"verify: {len(report.problems)} problem{'s' if len(report.problems) != 1 else ''}"
                f" ({_records(report.verified)} read; a shard's first record is record 0):"
            )
            lines += _listed(report.problems)
    if report.grid:
        lines.append(f"grid: {printable(report.grid)}")
    return lines


def _class_table(classes: list[str], splits: dict, counter: str) -> list[str]:
    """Records per class and split, their shares, and the balance line; ``counter`` says
    what counts the records of a split (the file names, the manifest)."""
    width = max([10, *(columns(c) for c in classes)])
    lines = [f"{'class':<{width}} {'train':>8} {'validation':>11} {'total':>8} {'share':>7}"]
    totals = {c: sum(splits[s]["per_class"].get(c, 0) for s in schema.SPLITS) for c in classes}
    grand = max(1, sum(totals.values()))
    for c in classes:
        lines.append(
            f"{ljust(c, width)} {splits['train']['per_class'].get(c, 0):>8} "
            f"{splits['validation']['per_class'].get(c, 0):>11} {totals[c]:>8} "
            f"{100 * totals[c] / grand:>6.1f}%"
        )
    read = {s: sum(splits[s]["per_class"].get(c, 0) for c in classes) for s in schema.SPLITS}
    lines.append(
        f"{'all':<{width}} {read['train']:>8} {read['validation']:>11} "
        f"{sum(totals.values()):>8} {100.0:>6.1f}%"
    )
    short = [f"{s} {read[s]} of {splits[s]['count']}" for s in schema.SPLITS
             if read[s] != splits[s]["count"]]  # fmt: skip
    if short:
        lines.append(
            f"(classes of the records read: {', '.join(short)} that {counter} count; "
            "see the problems below)"
        )
    lines += [_balance(classes, totals), ""]
    return lines


def _balance(classes: list[str], totals: dict[str, int]) -> str:
    """The balance line: largest over smallest class, among the classes with images; a
    class without any is named (the ratio was ``inf``, naming one of them only)."""
    empty = [c for c in classes if not totals[c]]
    held = [c for c in classes if totals[c]]
    if not empty:
        line = "balance: "
    else:
        line = f"balance: no images of {folders.some_names(empty)}"
        if len(held) < 2:
            return line
        line += "; "
    big = max(held, key=lambda c: totals[c])
    small = min(held, key=lambda c: totals[c])
    if totals[big] == totals[small]:
        other = "other " if empty else ""
        return f"{line}every {other}class {totals[big]} image{'s' * (totals[big] != 1)}"
    ratio = totals[big] / totals[small]
    return (f"{line}largest/smallest class {ratio:.2f} ({big} {totals[big]} / {small} "
            f"{totals[small]})")


def _sizes(shards: list[dict]) -> str:
    """The size of a split's shards, and their range; a manifest may leave them out."""
    if not all("bytes" in s for s in shards):
        return "sizes not in the manifest"
    sizes = [s["bytes"] for s in shards]
    spread = f" (shards {_size(min(sizes))} to {_size(max(sizes))})" if len(sizes) > 1 else ""
    return _size(sum(sizes)) + spread


def _conversion_lines(path: str, m: dict, size: str, quality: str) -> list[str]:
    """The header of a records folder petal convert wrote: options, origin, counts."""
    return [
        f"{path}: {_records(sum(m['splits'][s]['count'] for s in schema.SPLITS))}, "
        f"{m['format']} {size} "
        f"(resize {m['resize']}{quality}), {len(m['classes'])} classes, seed {m['seed']}",
        f"created {m.get('created', '?')} by petal {m.get('petal_version', '?')} "
        f"(TensorFlow {m.get('tensorflow_version', '?')}) from {printable(m.get('source', '?'))}",
        f"found {m['images_found']}, written {m['written']}, skipped {len(m['skipped'])}"
        + (f", byte-identical duplicates {m['duplicates']}" if m.get("duplicates") else "")
        + (
            f" ({len(across)} photo(s) with copies under more than one class)"
            if (across := m.get("duplicates_across_classes"))
            else ""
        )
        + (
            f", images stored from more than one file {len(same)} (split apart or under two "
            "classes: manifest.json's identical_images)"
            if (same := m.get("identical_images"))
            else ""
        )
        + "".join(f", {what} {len(m[key])}" for key, what in _UNREAD if m.get(key)),
        "",
    ]


def _records(n: int) -> str:
    return f"{n} record{'' if n == 1 else 's'}"


def _listed(problems: list[str]) -> list[str]:
    """The first problems, indented, then how many more (every one is in
    ``InspectReport.problems``): a manifest that does not fit its shards fails every record."""
    shown = [f"  {printable(p)}" for p in problems[:_LIST_PROBLEMS]]
    if len(problems) > _LIST_PROBLEMS:
        shown.append(f"  ... and {len(problems) - _LIST_PROBLEMS} more")
    return shown


# --- manifest and shard files ------------------------------------------------------------------


def _check_totals(manifest: dict, name: str) -> list[str]:
    """The manifest's ``written`` and ``images_found`` against the records its splits hold
    (every file found is either written or skipped), one line each where they differ."""
    held = sum(manifest["splits"][s]["count"] for s in schema.SPLITS)
    parts = " + ".join(f"{s} {manifest['splits'][s]['count']}" for s in schema.SPLITS)
    problems = []
    if manifest["written"] != held:
        problems.append(
            f"{name}: written {manifest['written']}, but its splits hold {held} records ({parts})"
        )
    skipped = len(manifest["skipped"])
    if manifest["images_found"] != held + skipped:
        problems.append(
            f"{name}: images_found {manifest['images_found']}, but its splits hold {held} "
            f"records and it lists {skipped} skipped ({held + skipped})"
        )
    return problems



def _check_files(path: str, manifest: dict) -> list[str]:
    """Every shard of the manifest is there with its size (a stat each, no read)."""
    problems = []
    for split in schema.SPLITS:
        for shard in manifest["splits"][split]["shards"]:
            name = shard["file"]
            size, problem = _shard_size(folders.join(path, name), name)
            if problem is None and "bytes" in shard and size != shard["bytes"]:
                problem = f"{name}: {size} bytes, the manifest says {shard['bytes']}"
            if problem is not None:
                problems.append(problem)
    return problems


def _shard_size(file: str, name: str) -> tuple[int | None, str | None]:
    """(size, None) of a shard file, or (None, the problem) where there is no file to read."""
    try:
        return folders.file_size(file), None
    except FileNotFoundError:
        return None, f"{name}: missing"
    except OSError as err:
        return None, f"{name}: unreadable ({err.strerror or err})"


def _unlisted(path: str, manifest: dict) -> list[str]:
    """Shards in the folder that the manifest does not list (two conversions mixed)."""
    listed = {shard["file"] for s in schema.SPLITS for shard in manifest["splits"][s]["shards"]}
    return [
        f"{name}: not listed in the manifest (another conversion's shard?)"
        for name in sorted(_names(path))
        if schema.is_shard_file(name) and name not in listed
    ]


def _names(path: str) -> list[str]:
    """The names in folder ``path`` (local or remote)."""
    if folders.is_remote(path):
        import tensorflow as tf

        return [n.rstrip("/") for n in tf.io.gfile.listdir(path)]
    return os.listdir(path)


# --- verify --------------------------------------------------------------------------------------


def _spec(codelab: bool) -> dict:
    """The parsing spec: petal's records need every key; shards without a manifest need
    only ``image`` and ``class``, as training reads them (label, size and one_hot_class come
    out empty when absent: Kaggle's copy of the flowers has image and class alone)."""
    import tensorflow as tf

    spec = schema.feature_spec(codelab=codelab)
    if codelab:
        spec[schema.LABEL] = tf.io.FixedLenFeature([], tf.string, default_value="")
        spec[schema.SIZE] = tf.io.FixedLenFeature([2], tf.int64, default_value=[0, 0])
    return spec


def _checker(format: str, codelab: bool = False):
    import tensorflow as tf

    # one_hot_class at whatever length it has, then compared; the codelab's five keys only
    # for its shards, of which image and class are needed.
    spec = _spec(codelab)

    def check(raw):
        ex = tf.io.parse_single_example(raw, spec)
        one_hot = ex[schema.ONE_HOT].values
        if format == schema.FORMAT_RAW:
            stored = tf.strings.length(ex[schema.IMAGE], unit="BYTE")
            stored = tf.stack([tf.cast(stored, tf.int64), tf.constant(-1, tf.int64)])
            jpeg = tf.constant(b"")
        else:
            decoded = tf.io.decode_jpeg(ex[schema.IMAGE], channels=3)
            stored = tf.cast(tf.shape(decoded)[:2], tf.int64)
            jpeg = ex[schema.IMAGE]  # checked again: see _cut_short
        return (
            ex[schema.CLASS],
            ex[schema.LABEL],
            tf.size(one_hot),
            tf.argmax(tf.concat([one_hot, [0.0]], 0)),  # 0 for an empty list, not an error
            tf.reduce_sum(one_hot),
            ex[schema.SIZE],
            stored,
            jpeg,
        )

    return check


def _file_digest(path: str) -> tuple[int, str]:
    import tensorflow as tf

    digest = hashlib.sha256()
    size = 0
    with tf.io.gfile.GFile(path, "rb") as f:
        while chunk := f.read(8 * _MB):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


def _verify(
    path: str, manifest: dict, progress: bool
) -> tuple[int, list[str], dict[str, dict[str, int]]]:
    """(records read, problems, per split the classes of the records that read whole)."""
    import tensorflow as tf
    from tqdm.auto import tqdm

    classes = manifest["classes"]
    image_size = manifest.get("image_size")
    check = _checker(manifest["format"], codelab=manifest.get("origin") == "codelab")
    problems: list[str] = []
    read = 0
    read_per_class: dict[str, dict[str, int]] = {}
    total = sum(manifest["splits"][s]["count"] for s in schema.SPLITS)
    with tqdm(total=total, desc="verify", unit="rec", disable=not progress) as bar:
        for split in schema.SPLITS:
            per_class = [0] * len(classes)  # of the records read
            known = len(problems)
            for shard in manifest["splits"][split]["shards"]:
                name = shard["file"]
                file = folders.join(path, name)
                _, problem = _shard_size(file, name)  # a folder is there, but no shard
                if problem is None:
                    try:
                        size, digest = _file_digest(file)
                    except tf.errors.OpError as err:
                        problem = f"{name}: unreadable ({tf_message(err)})"
                if problem is not None:
                    problems.append(problem)
                    continue
                if "bytes" in shard and size != shard["bytes"]:
                    problems.append(f"{name}: {size} bytes, the manifest says {shard['bytes']}")
                elif "sha256" in shard and digest != shard["sha256"]:
                    problems.append(f"{name}: sha256 differs from the manifest")
                # Sequential and unbatched, so the number of elements read so far is the
                # index of the record that failed.
                records = tfdata.untuned(tf.data.TFRecordDataset(file)).map(check)
                index = 0
                damaged = False
                iterator = iter(records)
                while True:
                    try:
                        fields = next(iterator)
                        cls, label, hot_len, hot, hot_sum, stored_size, stored, jpeg = fields
                    except StopIteration:
                        break
                    except tf.errors.DataLossError as err:
                        # A bad frame (CRC, length) ends the shard: the records after it
                        # cannot be located.
                        problems.append(f"{name}: record {index}: {tf_message(err)}")
                        damaged = True
                        break
                    except tf.errors.OpError as err:
                        # The frame was intact but the record does not parse or decode; the
                        # iterator moves on to the next record.
                        problems.append(f"{name}: record {index}: {tf_message(err)}")
                        index += 1
                        bar.update()
                        continue
                    issue = _field_issue(
                        int(cls),
                        label.numpy().decode("utf-8", "replace"),
                        int(hot_len),
                        int(hot),
                        float(hot_sum),
                        stored_size.numpy().tolist(),
                        stored.numpy().tolist(),
                        classes,
                        image_size,
                        manifest["format"],
                        optional=manifest.get("origin") == "codelab",
                    ) or _cut_short(jpeg.numpy())
                    if issue:
                        problems.append(f"{name}: record {index}: {issue}")
                    else:
                        per_class[int(cls)] += 1
                    index += 1
                    bar.update()
                read += index
                try:
                    expected = schema.count_from_name(name)
                except ValueError:  # no count in the name: the manifest's alone counts, as
                    expected = None  # for check_manifest and petal train
                if not damaged and (index != shard["count"] or expected not in (None, index)):
                    said = (
                        f"file name says {expected}"  # the only count of a codelab shard
                        if manifest.get("origin") == "codelab"
                        else f"manifest says {shard['count']}"
                        + (f", file name says {expected}" if expected is not None else "")
                    )
                    problems.append(f"{name}: {_records(index)} read, {said}")
            # Where every record of the split read, the table's counts must be theirs (a
            # manifest may give none; a shard with a problem explains any shortfall).
            said = manifest["splits"][split]["per_class"]
            if said and len(problems) == known:
                problems += [
                    f"{split}: class {c!r}: {n} records read, the manifest's per_class says "
                    f"{said.get(c, 0)}"
                    for c, n in zip(classes, per_class, strict=True)
                    if n != said.get(c, 0)
                ]
            read_per_class[split] = {c: n for c, n in zip(classes, per_class, strict=True) if n}
    return read, problems, read_per_class


def _cut_short(jpeg: bytes) -> str | None:
    """Why the JPEG bytes ``jpeg`` decode part grey, or None: a scan cut off by a marker,
    which TensorFlow's decoder (and training) takes with a line on stderr that names no
    record. petal convert refuses such photos; older records or others' shards may hold one."""
    if not jpeg:
        return None
    import simplejpeg

    from petal.data.images import jpeg_cut_short

    try:
        simplejpeg.decode_jpeg(jpeg, colorspace="RGB")  # strict: warnings raise
    except ValueError as err:
        if jpeg_cut_short(err):
            return f"its JPEG data end early ({err}): it decodes part grey"
    return None


def _field_issue(
    cls: int,
    label: str,
    hot_len: int,
    hot: int,
    hot_sum: float,
    size: list[int],
    stored: list[int],
    classes: list[str],
    image_size: list[int] | None,
    format: str,
    optional: bool = False,
) -> str | None:
    """What is wrong with one parsed record, or None; with ``optional`` (shards without a
    manifest), a label, one_hot_class or size the record does not hold is not checked."""
    if optional and not label:
        label = classes[cls] if 0 <= cls < len(classes) else label
    if optional and hot_len == 0:
        hot_len, hot, hot_sum = len(classes), cls, 1.0
    if optional and size == [0, 0]:  # (such shards hold JPEG)
        size = list(image_size) if image_size is not None else stored
    if hot_len != len(classes):
        return (
            f"one_hot_class has {hot_len} values but the manifest lists {len(classes)} classes "
            "(the manifest does not belong to these shards)"
        )
    if not 0 <= cls < len(classes):
        return f"class {cls} is out of range for {len(classes)} classes"
    if label != classes[cls]:
        return f"label {label!r} does not match class {cls} ({classes[cls]!r})"
    if hot != cls or hot_sum != 1.0:
        return f"one_hot_class does not encode class {cls}"
    if image_size is not None and size != list(image_size):
        return f"size {size} differs from the manifest's image_size {image_size}"
    if format == schema.FORMAT_RAW:
        return _raw_issue(stored[0], size)
    if stored != size:
        return f"decoded image is {stored[0]}x{stored[1]}, size says {size[0]}x{size[1]}"
    return None


def _raw_issue(stored: int, size: list[int]) -> str | None:
    """What is wrong with a raw image of ``stored`` bytes and ``size`` [height, width], or None."""
    if stored != size[0] * size[1] * 3:
        return f"raw image holds {stored} bytes, size {size} needs {size[0] * size[1] * 3}"
    return None


# --- grid -----------------------------------------------------------------------------------------


def _samples(
    path: str, manifest: dict, per_class: int, known: list[str]
) -> tuple[dict[int, list], list[str]]:
    """Up to ``per_class`` decoded images per class, in record order (train first), from
    the records that read; and a problem line for each record read that did not, in the
    shards that no line of ``known`` names (those are reported already)."""
    import tensorflow as tf

    wanted = len(manifest["classes"]) * per_class
    found: dict[int, list] = {i: [] for i in range(len(manifest["classes"]))}
    # Any one_hot_class length: the grid needs only the class. No file name in codelab shards.
    spec = _spec(codelab=manifest.get("origin") == "codelab")
    problems: list[str] = []
    count = 0
    for split in schema.SPLITS:
        for shard in manifest["splits"][split]["shards"]:
            name = shard["file"]
            quiet = any(p.startswith(f"{name}: ") for p in known)
            records = iter(tfdata.untuned(tf.data.TFRecordDataset(folders.join(path, name))))
            for index in itertools.count():
                try:
                    raw = next(records)
                except StopIteration:
                    break
                except tf.errors.OpError as err:  # missing, or a bad frame: the shard ends
                    where = f"record {index}: " if isinstance(err, tf.errors.DataLossError) else ""
                    if not quiet:
                        problems.append(f"{name}: {where}{tf_message(err)}")
                    break
                try:
                    ex = tf.io.parse_single_example(raw, spec)
                    cls = int(ex[schema.CLASS])
                    if cls not in found or len(found[cls]) >= per_class:
                        continue
                    image, issue = _image(ex, manifest["format"])
                except tf.errors.OpError as err:  # an intact frame that does not parse or decode
                    image, issue = None, tf_message(err)
                if issue is not None:
                    if not quiet:
                        problems.append(f"{name}: record {index}: {issue}")
                    continue
                file = ex[schema.FILENAME].numpy().decode("utf-8") if schema.FILENAME in ex else ""
                found[cls].append((image, file))
                count += 1
                if count == wanted:
                    return found, problems
    return found, problems


def _image(ex: dict, format: str):
    """(the image of a parsed record as an array, None), or (None, what is wrong with it).

    Raises:
        tf.errors.OpError: a JPEG that does not decode.
    """
    import numpy as np
    import tensorflow as tf

    if format == schema.FORMAT_RAW:
        data = ex[schema.IMAGE].numpy()
        size = ex[schema.SIZE].numpy().tolist()
        if issue := _raw_issue(len(data), size):
            return None, issue
        return np.frombuffer(data, np.uint8).reshape(*size, 3), None
    return tf.io.decode_jpeg(ex[schema.IMAGE], channels=3).numpy(), None


def image_path(out: str, option: str = "--grid") -> str:
    """Where a plot named ``out`` is written: ``.png`` added when it has no extension (an
    existing folder is refused).

    One rule for every plot a user names (``inspect --grid``, ``bench input --png``).

    Raises:
        PetalError: an extension that is not an image format matplotlib writes, naming
            ``option``.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    if not out.strip() or out.endswith(("/", os.sep)):
        raise PetalError(
            f"{option} needs a file name, such as grid.png. Received: {option} {out!r}"
        )
    if os.path.isdir(out):  # not out + ".png" beside it: --json refuses a folder too
        example = os.path.join(out, "grid.png" if option == "--grid" else "chart.png")
        raise PetalError(
            f"{option} {out} is a folder; pass a file name, such as {example}."
        )
    ext = os.path.splitext(out)[1].lower()
    if not ext:
        return out + ".png"
    # Image formats only: matplotlib also writes raw buffers and LaTeX (.raw, .rgba, .pgf).
    written = FigureCanvasAgg.get_supported_filetypes()
    supported = [f".{e}" for e in _IMAGE_FORMATS if e in written]
    if ext not in supported:
        raise PetalError(
            f"{option} must name an image file ({', '.join(supported)}). Received: {option} {out}"
        )
    return out


def _draw_grid(
    path: str, manifest: dict, out: str, per_class: int, known: list[str]
) -> tuple[str, list[str]]:
    """(``out``, the problems met reading samples in shards no line of ``known`` names)."""
    # The Figure/Agg canvas API draws without touching pyplot's global backend.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if not is_int_at_least(per_class, 1):
        raise PetalError(f"grid_per_class must be an integer >= 1. Received: {per_class!r}")
    classes = manifest["classes"]
    samples, problems = _samples(path, manifest, per_class, known)
    labels = plot_labels(classes)  # falls back to installed fonts, or to "class N"
    # As many columns as the fullest class fills: a large per_class asked for a figure
    # wider than matplotlib draws.
    rows, cols = len(classes), max(1, min(per_class, max(map(len, samples.values()), default=1)))
    height = 2.0 * rows + 0.5
    fig = Figure(figsize=(1.9 * cols + 0.4, height))
    renderer = FigureCanvasAgg(fig).get_renderer()
    width = 0.9 * 1.9 * fig.dpi  # a title's room: long names are shortened in the middle
    axes = fig.subplots(rows, cols, squeeze=False)
    for r, name in enumerate(labels):
        for c in range(cols):
            ax = axes[r][c]
            ax.set_xticks([])
            ax.set_yticks([])
            for spine in ax.spines.values():
                spine.set_visible(False)
            if c == 0 and not samples[r]:  # a class without images: its row says so
                text = ax.set_title("", fontsize=7)
                text.set_text(fit_text(text, name, width, renderer, chars=30))
                ax.text(0.5, 0.5, "no images", ha="center", va="center", fontsize=8,
                        color="#777777", transform=ax.transAxes)  # fmt: skip
            if c < len(samples[r]):
                image, filename = samples[r][c]
                ax.imshow(image)
                base = os.path.basename(filename)
                base = literal(base) if can_draw(base) else ""
                text = ax.set_title("", fontsize=7)
                lines = [fit_text(text, s, width, renderer, chars=30) for s in (name, base)]
                text.set_text("\n".join(lines))
    size = "x".join(map(str, manifest["image_size"])) if manifest.get("image_size") else "orig."
    shown = path if can_draw(path) else os.path.basename(path.rstrip("/"))
    shown = literal(shown) if can_draw(shown) else ""  # drawn as written, "$" included
    # Placed in inches from the top: at a fraction of a tall figure's height (30 classes),
    # it was drawn over the first row. A long path is shortened to the figure's width.
    text = fig.suptitle("", fontsize=9, y=1 - 0.1 / height)
    after = f" ({manifest['format']} {size})"
    fit_text(text, shown, 0.95 * fig.bbox.width, renderer, chars=max(len(shown), 3), after=after)
    fig.tight_layout()
    if folders.is_remote(out):
        # matplotlib writes local files only: draw into memory, write through tf.io.gfile.
        import io

        import tensorflow as tf

        buffer = io.BytesIO()
        fig.savefig(buffer, dpi=100, format=os.path.splitext(out)[1][1:].lower())
        try:
            with tf.io.gfile.GFile(out, "wb") as f:
                f.write(buffer.getvalue())
        except tf.errors.OpError as err:
            raise folders.gfile_error(out, err) from None
        return out, problems
    parent = os.path.dirname(out)
    if parent:
        os.makedirs(parent, exist_ok=True)
    # Through a temporary file: Ctrl-C or a full disk left a PNG cut short (an earlier
    # grid too, which it had begun to overwrite), or an empty one.
    save_atomically(Path(out), lambda tmp: fig.savefig(tmp, dpi=100))
    return out, problems
