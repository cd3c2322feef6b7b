"""Discovery: a folder whose sub-folders are the classes -> a sorted list of labelled files.

Works on local paths and on anything ``tf.io.gfile`` reads (``gs://...``); TensorFlow is
imported only for paths with a scheme, so local discovery (and the conversion workers)
stay light. The order is deterministic: classes and files sorted by name, sub-folders of
a class walked recursively. Only files with an allowed extension are candidates; whether
a candidate really is a readable image is decided later, by the converter, which lists
every failure in the manifest. Hidden entries (names starting with ``.``, and macOS's
``__MACOSX`` folders: notebook checkpoints, AppleDouble ``._photo.jpg`` metadata) are never
read; they are listed among the ignored paths.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import json
import os
import re
import stat
import sys
import unicodedata
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from petal.errors import PetalError, first_line, printable
from petal.running import in_use_error, mark_running

IMAGE_EXTENSIONS = (".bmp", ".gif", ".jpeg", ".jpg", ".png", ".webp")
# Besides names starting with ".": the folder macOS's zip tool adds beside the files, full
# of ``._name`` metadata files with the photos' extensions.
_HIDDEN_NAMES = ("__MACOSX",)


@dataclass(frozen=True)
class ImageFile:
    """One candidate image.

    Attributes:
        path: full path (local, or with a scheme such as ``gs://``).
        relpath: path relative to the source root, ``/``-separated (``daisy/123.jpg``).
        label: index into the folder's class list.
    """

    path: str
    relpath: str
    label: int


@dataclass(frozen=True)
class ImageFolder:
    """The result of discovery.

    Attributes:
        root: the source folder as given, a leading ``~`` expanded.
        classes: class names in index order.
        files: candidate images, sorted by class then relative path.
        ignored: relative paths that are not candidates (other extensions, files directly
            in the root, classes left out by an explicit class list, hidden files, and
            hidden folders and links to a folder that holds them as ``class/link/``, or
            ``link/`` in the root).
        left_out: sub-folders an explicit class list left out.
        empty: sub-folders holding nothing (or only hidden files), so no class: a class
            whose photos are still to come would otherwise go unnoticed.
        broken: links (among ``ignored``) that lead nowhere, a missing or unmounted target:
            a class folder behind one would otherwise vanish unnoticed. Not in a sub-folder
            a class list left out.
    """

    root: str
    classes: tuple[str, ...]
    files: tuple[ImageFile, ...]
    ignored: tuple[str, ...]
    left_out: tuple[str, ...] = ()
    empty: tuple[str, ...] = ()
    broken: tuple[str, ...] = ()

    def by_utf8(self) -> tuple[list[ImageFile], list[ImageFile]]:
        """(files whose relative path is valid UTF-8, those whose is not): records and
        TensorFlow's paths hold UTF-8 text, so the others cannot be read or written."""
        good, bad = [], []
        for f in self.files:
            (good if is_utf8(f.relpath) else bad).append(f)
        return good, bad

    def unclassified_images(self) -> list[str]:
        """Image files lying directly in the root: they belong to no class."""
        return [
            n
            for n in self.ignored
            if "/" not in n and is_image_name(n) and n not in self.broken
        ]

    def other_files(self) -> list[str]:
        """Files in the sub-folders without an accepted extension (``a/photo.tiff``,
        ``a/IMG_0001`` saved without one): not read, so named rather than dropped unseen. A
        sub-folder holding only such files is no class: its files are named too. Hidden
        files (``.DS_Store``) and sub-folders a class list left out are not among them.
        """
        return [
            n
            for n in self.ignored
            if "/" in n
            and not n.endswith("/")
            and n.split("/", 1)[0] not in self.left_out
            and not is_hidden_entry(n)
            and n not in self.broken
        ]

    def loops(self) -> list[str]:
        """Links to a folder that holds them (``b/loop/ -> b``, ``b/up/ -> ../..``, and in
        the root ``again/ -> .``), not followed: that folder's images are read once, where it
        lies, and none from above the source. Not in a sub-folder a class list left out."""
        # The root's own ignored folders ending in "/" are the hidden ones and these.
        return [
            n
            for n in self.ignored
            if n.endswith("/")
            and n.split("/", 1)[0] not in self.left_out
            and not is_hidden_entry(n)
        ]

    def hidden(self) -> list[str]:
        """Hidden folders (``a/.ipynb_checkpoints/``) and hidden files with an image's
        extension (``a/._1.jpg``) that were not read: photos may hide in them. Not in a
        sub-folder a class list left out (renaming them there would convert nothing)."""
        return hidden_entries([n for n in self.ignored if n.split("/", 1)[0] not in self.left_out])

    def unread_note(self) -> str:
        """One line naming the files that are not read (images outside any class, other
        types, hidden entries, folder loops: the lists ``petal convert`` keeps in its
        manifest), or ""."""
        parts = []
        for what, names in (
            ("directly in the folder, in no class", self.unclassified_images()),
            ("not of a type petal reads", self.other_files()),
            ("hidden", self.hidden()),
            ("link(s) back to a folder holding them, not followed", self.loops()),
            ("sub-folder(s) empty, so no class", [f"{name}/" for name in self.empty]),
            ("link(s) leading nowhere (a missing or unmounted target)", self.broken),
        ):
            if names:
                parts.append(f"{len(names)} {what} ({some_names(names, 3)})")
        if not parts:
            return ""
        return (
            f"{self.root}: files not read: {'; '.join(parts)}. Images are read from class "
            f"sub-folders, with the extensions {', '.join(IMAGE_EXTENSIONS)}"
        )

    def per_class(self) -> dict[str, int]:
        """Number of candidate files per class, in class order."""
        counts = dict.fromkeys(self.classes, 0)
        for f in self.files:
            counts[self.classes[f.label]] += 1
        return counts


def some_names(names: Sequence[str], limit: int = 5) -> str:
    """Up to ``limit`` names, comma-separated (each :func:`~petal.errors.printable`, so a
    name holding a newline or an escape sequence stays on the line), and how many more."""
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(printable(utf8_name(n)) for n in names[:limit]) + more


def is_utf8(name: str) -> bool:
    """Whether a name read from the file system is valid UTF-8 (Python keeps each byte
    that is not as a lone surrogate, which no UTF-8 text can hold)."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def utf8_name(name: str) -> str:
    """``name`` unchanged when it is valid UTF-8, else with each byte that is not written
    as ``\\xNN``: text a manifest, a record or a terminal can hold."""
    if is_utf8(name):
        return name
    try:
        raw = name.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a surrogate that stands for no byte
        return name.encode("utf-8", "backslashreplace").decode("utf-8")
    return raw.decode("utf-8", "backslashreplace")


def is_remote(path: str) -> bool:
    """True for paths with a scheme (``gs://bucket/x``), which go through ``tf.io.gfile``."""
    return "://" in str(path)


# A scheme at the start: gs://, http(s)://, s3://, file://.
_URL_RE = re.compile(r"[a-z][a-z0-9+.-]*://", re.I)
# A URL of a scheme petal or tf.io.gfile knows, as pathlib.Path(url) leaves it: one slash.
_COLLAPSED_RE = re.compile(r"(gs|s3|https?|hdfs|viewfs|file|ram):(?:/(?!/)|$)", re.I)
# The copy command of the stores users name most, for the refusals of :func:`refuse_url`.
_COPY_TOOLS = {"gs": "gcloud storage cp{r} or gsutil cp{r}", "s3": "aws s3 cp{recursive}"}


def refuse_url(
    path,
    option: str,
    what: str,
    *,
    reads: bool = False,
    folder: bool = True,
    urls: bool = False,
) -> None:
    """Refuse a URL (``scheme://...``) where petal writes or reads on a local disk only: run
    folders, evaluations, exports, config and weights files. ``pathlib`` would otherwise turn
    ``gs://bucket/run`` into the local folder ``gs:/bucket/run`` and carry on: that form, of
    a scheme petal knows (``gs:/``, ``s3:/``, ``http:/``, ...), is refused as the URL it was.

    Args:
        path: the value given; None and local paths pass.
        option: what the caller calls it, for the message (``--workdir``, ``WORKDIR``).
        what: what petal keeps there, plural (``run folders``, ``weights files``).
        reads: petal reads it (copy it down first) rather than writes it (copy it up after).
        folder: it is a folder (the copy is recursive), not a file.
        urls: the caller takes URLs (``petal convert``): only one that ``pathlib`` made a
            local path is refused, with the fix of passing it as a string.

    Raises:
        PetalError: ``path`` is a URL, naming ``option``, the value and the fix.
    """
    if path is None:
        return
    given, path = path, str(path)
    # Where URLs are taken, a string is taken as given: ``file:/photos`` may be a local
    # folder named ``file:``; only a Path is known to have lost a slash.
    if (collapsed := _COLLAPSED_RE.match(path)) and not (urls and isinstance(given, str)):
        scheme = collapsed[1]
        # file:///tmp/x is file:/tmp/x as a Path: its third slash is the path's own.
        rest = path[len(scheme) + 1 :] if scheme.lower() == "file" else path[collapsed.end() :]
        url = f"{scheme}://{rest}"
        seen = f"{path} is a URL that lost a slash ({url}, as pathlib.Path makes it)"
        if urls:
            raise PetalError(f"{option} {seen}; pass the URL as a string, not a Path.")
    elif urls or not _URL_RE.match(path):
        return
    else:
        url, seen = path, f"{path} is a URL"
    copy = _COPY_TOOLS.get(url.split("://", 1)[0].lower())
    flags = {"r": " -r", "recursive": " --recursive"} if folder else {"r": "", "recursive": ""}
    tool = f" ({copy.format(**flags)})" if copy else ""
    if reads:
        raise PetalError(
            f"{option} {seen}: petal reads {what} from a local disk; copy it to a local "
            f"disk first{tool} and pass the local path."
        )
    raise PetalError(
        f"{option} {seen}: petal writes {what} on a local disk; pass a local path "
        f"and copy it to {url} afterwards{tool}."
    )


def expand_home(path):
    """``path`` with a leading ``~`` or ``~user`` expanded to that home folder, as a shell
    expands it; of the type given (str or Path); any other value unchanged.

    A shell leaves ``--workdir=~/runs`` as it is, and a config file's ``"data": "~/records"``
    comes as written: petal made a folder named ``~`` in the current one (which ``rm -rf ~``
    would then take for the home folder), and said a source was not found at a path nobody
    typed. A path with a scheme has none.
    """
    if not isinstance(path, str | os.PathLike):
        return path
    text = os.fspath(path)
    if not isinstance(text, str) or not text.startswith("~"):
        return path  # bytes paths as they are
    expanded = os.path.expanduser(text)
    return expanded if isinstance(path, str) else Path(expanded)


def absolute_data(data: str | None) -> str | None:
    """A local data path made absolute (``~`` expanded), so a run folder (and what it wrote)
    works from any directory.

    URLs (``gs://``, ``http(s)://``, anything with a scheme) are returned unchanged.
    """
    if not data or is_remote(data):
        return data
    return os.path.abspath(expand_home(data))


def is_http(path: str) -> bool:
    """True for ``http(s)://`` paths, which petal reads itself (not through ``tf.io.gfile``);
    the scheme in any case, as URLs allow (``HTTP://``)."""
    return str(path)[:8].lower().startswith(("http://", "https://"))


def is_within(path, folder) -> bool:
    """Whether local ``path`` is ``folder`` or lies below it (links resolved); False for
    remote paths and a ``folder`` that is not a local folder (a glob of shards)."""
    path, folder = str(path), str(folder)
    if is_remote(path) or is_remote(folder):
        return False
    if not os.path.isdir(folder):
        return False
    real, top = os.path.realpath(path), os.path.realpath(folder)
    return real == top or real.startswith(top.rstrip(os.sep) + os.sep)


def same_place(a, b) -> bool:
    """Whether two paths name the same file or folder: links resolved for local paths, the
    text without a trailing slash for remote ones (their scheme and host in any case)."""
    a, b = (local_path(str(x)) or str(x) for x in (a, b))
    if is_remote(a) or is_remote(b):
        return _url_key(a) == _url_key(b)
    return os.path.realpath(a) == os.path.realpath(b)


def local_path(path: str) -> str | None:
    """The local path of ``path``: itself, or the path of a ``file://`` URL (TensorFlow
    reads and writes it on the local disk, ignoring its host), else None (an object store)."""
    if not is_remote(path):
        return path
    scheme, _, rest = path.partition("://")
    return "/" + rest.partition("/")[2] if scheme.lower() == "file" else None


def _url_key(url: str) -> str:
    """``url`` without a trailing slash, its scheme and host (not its path) in lower case."""
    url = url.rstrip("/")
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    host, slash, path = rest.partition("/")
    return f"{scheme.lower()}://{host.lower()}{slash}{path}"


def join(root: str, *parts: str) -> str:
    """Join path parts with ``/`` for remote paths and ``os.path.join`` for local ones."""
    if is_remote(root):
        return "/".join([root.rstrip("/"), *(p.strip("/") for p in parts)])
    return os.path.join(root, *parts)


def gfile_error(path: str, err, also: Sequence[str] = ()) -> PetalError:
    """A one-line error for a ``tf.io.gfile`` call on ``path`` that failed.

    Args:
        path: the path the call was given.
        err: the ``tf.errors.OpError`` it raised.
        also: schemes the caller reads without ``tf.io.gfile`` (``http://``), to list as
            supported.
    """
    import tensorflow as tf

    if isinstance(err, tf.errors.UnimplementedError) and "scheme" in str(err.message):
        # Not ram:// (TensorFlow's in-memory file system): what it holds is gone when the
        # process ends, so no command reads or writes there (library callers still may).
        schemes = [f"{s}://" for s in tf.io.gfile.get_registered_schemes() if s and s != "ram"]
        supported = ", ".join(["local paths", *sorted(schemes), *also])
        scheme = str(path).split("://", 1)[0]
        return PetalError(
            f"Cannot open {path}: paths starting with {scheme}:// are not supported "
            f"(supported: {supported})."
        )
    if not is_remote(path):
        return PetalError(f"Cannot read {path} ({first_line(err)}).")
    return PetalError(
        f"Cannot reach {path} ({first_line(err)}); check the path, the network and the "
        "credentials."
    )


class StoreError(OSError):
    """An object store failed to serve a file (network, credentials, quota, server error):
    a failure of the store, not of the file, so the file must not be skipped as bad input."""


def _store_errors():
    import tensorflow as tf

    e = tf.errors
    return (
        e.UnavailableError,
        e.DeadlineExceededError,
        e.AbortedError,
        e.InternalError,
        e.UnknownError,
        e.ResourceExhaustedError,
        e.UnauthenticatedError,
    )


def exists(path: str) -> bool:
    """Whether ``path`` exists.

    Raises:
        PetalError: a remote path whose store cannot be reached or whose scheme is not
            supported (``tf.io.gfile`` raises instead of answering).
    """
    if is_remote(path):
        import tensorflow as tf

        try:
            return tf.io.gfile.exists(path)
        except tf.errors.OpError as err:
            raise gfile_error(path, err) from None
    return os.path.exists(path)


def isdir(path: str) -> bool:
    """Whether ``path`` is a folder. Raises as ``exists``."""
    if is_remote(path):
        import tensorflow as tf

        try:
            return tf.io.gfile.isdir(path)
        except tf.errors.OpError as err:
            raise gfile_error(path, err) from None
    return os.path.isdir(path)


def file_size(path: str) -> int:
    """Size in bytes of one file.

    Raises:
        OSError: missing (FileNotFoundError), or not a regular file (see ``read_bytes``);
            :class:`StoreError` when an object store fails.
    """
    if is_remote(path):
        import tensorflow as tf

        try:
            return tf.io.gfile.stat(path).length
        except tf.errors.NotFoundError as err:
            raise FileNotFoundError(first_line(err)) from err
        except _store_errors() as err:
            raise StoreError(first_line(err)) from err
        except tf.errors.OpError as err:
            raise OSError(first_line(err)) from err
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise OSError("not a regular file")
    return st.st_size


def read_bytes(path: str) -> bytes:
    """The bytes of one file.

    Raises:
        OSError: unreadable, missing, or not a regular file (a local FIFO or device would
            block or never end, so it is refused before opening); :class:`StoreError` when
            an object store fails.
    """
    if is_remote(path):
        import tensorflow as tf

        try:
            with tf.io.gfile.GFile(path, "rb") as f:
                return f.read()
        except tf.errors.NotFoundError as err:
            raise FileNotFoundError(first_line(err)) from err
        except _store_errors() as err:
            raise StoreError(first_line(err)) from err
        except tf.errors.OpError as err:
            raise OSError(first_line(err)) from err
    mode = os.stat(path).st_mode
    if not stat.S_ISREG(mode):
        raise OSError("not a regular file")
    with open(path, "rb") as f:
        return f.read()


_ARCHIVES = (".zip", ".tar", ".tgz", ".tar.gz", ".tar.bz2", ".tar.xz", ".7z", ".rar")


def archive_hint(path: str) -> str:
    """``"; it is an archive: extract it first ..."`` for an archive's name, else ``""``
    (the codelab's photos come as ``flower_photos.tgz``)."""
    if not str(path).lower().endswith(_ARCHIVES):
        return ""
    how = "unzip" if str(path).lower().endswith(".zip") else "tar xf"
    return f"; it is an archive: extract it first (e.g. `{how} {path}`) and pass the folder"


def is_hidden(name: str) -> bool:
    """Whether a file or folder name is one discovery never reads (see the module doc)."""
    return name.startswith(".") or name in _HIDDEN_NAMES


def is_hidden_entry(rel: str) -> bool:
    """Whether the last part of a relative path (a folder's ending in ``/``) is hidden."""
    return is_hidden(rel.rstrip("/").rsplit("/", 1)[-1])


def hidden_entries(ignored: Sequence[str]) -> list[str]:
    """The hidden folders (ending in ``/``) and hidden image-named files among ``ignored``
    relative paths; other hidden files (``.DS_Store``) are left out as noise."""
    return [
        n for n in ignored if is_hidden_entry(n) and (n.endswith("/") or _has_image_extension(n))
    ]


def _has_image_extension(name: str) -> bool:
    return name.lower().endswith(IMAGE_EXTENSIONS)


def is_image_name(name: str) -> bool:
    """Whether discovery reads a file of this name as an image: an accepted extension, and
    not hidden."""
    return _has_image_extension(name) and not is_hidden(name)


def _dangling(path: str) -> bool:
    """Whether ``path`` is a link whose target is missing (or cannot be reached)."""
    return os.path.islink(path) and not os.path.exists(path)


def missing_target_reason(path: str) -> str | None:
    """Why a local ``path`` that was not found cannot be read when it is a link (an
    unmounted disk, a moved folder): its name is right, its target is missing, named here
    (the end of a chain of links). None when it is no link."""
    if is_remote(path) or not os.path.islink(path):
        return None
    return f"a link whose target is missing ({os.path.realpath(path)}): mount or fix it"


def _list_local(path: str) -> list[tuple[str, bool]]:
    """(name, is_dir) for each entry, sorted by name; symlinks to folders count as folders.
    A link that cannot be followed (a loop: ``a.jpg -> a.jpg``) counts as a file, which
    reading then reports."""

    def is_dir(entry: os.DirEntry) -> bool:
        try:
            return entry.is_dir()
        except OSError:
            return False

    with os.scandir(path) as it:
        entries = [(e.name, is_dir(e)) for e in it]
    return sorted(entries)


def _list_remote(path: str) -> list[tuple[str, bool]]:
    import tensorflow as tf

    entries = []
    try:
        for name in tf.io.gfile.listdir(path):
            # Object stores report folders with a trailing slash.
            clean = name.rstrip("/")
            entries.append((clean, name.endswith("/") or tf.io.gfile.isdir(join(path, clean))))
    except tf.errors.OpError as err:
        raise OSError(first_line(err)) from err
    return sorted(set(entries))


def walk_tree(
    root: str, rel: str = "", listdir=None, ancestors: frozenset[str] = frozenset()
) -> tuple[list[str], list[str]]:
    """Candidate and ignored relative paths under ``root/rel``, recursively, sorted:
    candidates are entries with an image extension, ignored the other files.

    Symlinked folders are followed like real ones, so a class folder that links to another
    class's folder, or to a folder elsewhere, lists those images too (as a copy would). Only a
    link to a folder that holds it is not followed: its own (``roses/again -> roses``), the
    source or one above it (``roses/up -> ../..``, ``-> /``), whose walk would never end or
    would file every photo beside the source under the class; it is listed as ignored (a name
    ending in ``/``) instead of vanishing. Hidden entries (:func:`is_hidden`) are listed as
    ignored without being read, folders with a trailing ``/``.

    Args:
        ancestors: local folders that hold ``root/rel`` (the source, for a class folder):
            real paths, and the source's path as given, made absolute.
    """
    listdir = listdir or (_list_remote if is_remote(root) else _list_local)
    found: list[str] = []
    ignored: list[str] = []
    here = join(root, *rel.split("/")) if rel else root
    if not is_remote(root):
        real = os.path.realpath(here)
        if any(_holds(real, folder) for folder in ancestors):
            return found, [rel + "/"]
        ancestors = ancestors | {real} | ({os.path.abspath(here)} if not rel else set())
    for name, is_dir in listdir(here):
        child = f"{rel}/{name}" if rel else name
        if is_hidden(name):
            ignored.append(child + "/" if is_dir else child)
        elif is_dir:
            sub_found, sub_ignored = walk_tree(root, child, listdir, ancestors)
            found += sub_found
            ignored += sub_ignored
        elif _has_image_extension(name):
            # Any non-folder entry with an image extension is a candidate, even a dangling
            # link: the converter reports it as unreadable instead of dropping it silently.
            found.append(child)
        else:
            ignored.append(child)
    return found, ignored


def _holds(folder: str, path: str) -> bool:
    """Whether local ``path`` is ``folder`` or lies below it, by their text (both resolved or
    absolute already; :func:`is_within` resolves them)."""
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def first_missing(path: str | os.PathLike) -> Path | None:
    """The outermost folder of ``path`` that does not exist yet (what creating it creates),
    or None when it exists."""
    path, missing = Path(path).absolute(), None
    while not path.exists() and path != path.parent:
        missing, path = path, path.parent
    return missing


def remove_created(out: str | os.PathLike, created: Path | None) -> None:
    """Removes ``out`` and its parents up to ``created`` (:func:`first_missing` before
    ``out`` was made) where they are empty: a failed command leaves no empty folder."""
    if created is None:
        return
    folder = Path(out).absolute()
    while True:
        try:
            folder.rmdir()
        except OSError:
            return  # not empty (or gone): leave it and its parents
        if folder == created or folder == folder.parent:
            return
        folder = folder.parent


@contextlib.contextmanager
def held_output(
    out: str | os.PathLike, make: Callable[[], object], option: str, doing: str
) -> Iterator[Path]:
    """Holds the local output folder ``out`` while this process writes into it: ``make()``
    creates it, and :data:`~petal.running.RUNNING_FILE` stays in it meanwhile (``doing``
    says what for), so that a second process writing into it is refused, naming
    ``option`` to pass instead; the folders created are removed again where nothing is left
    in them (:func:`remove_created`). Yields ``out`` as a Path."""
    created = first_missing(out)
    make()
    unmark = None
    try:
        unmark = mark_running(
            Path(out), functools.partial(in_use_error, out, option=option), doing
        )
        yield Path(out)
    finally:
        if unmark is not None:
            unmark()
        remove_created(out, created)


def flat_folder_error(root: str, names: Sequence[str], what: str = "") -> PetalError | None:
    """The error for a folder whose images lie directly in it, not in class sub-folders;
    None when ``names`` (the folder's file names) hold no image. ``what`` precedes the
    folder's name ("Data source ")."""
    found = sorted(n for n in names if is_image_name(n))
    if not found:
        return None
    return PetalError(
        f"{what}{root} holds {len(found)} image file(s) directly but no class sub-folders; move "
        f"each class's images into a sub-folder named after the class (e.g. "
        f"{printable(join(root, 'CLASS', found[0]))})."
    )


# Files only a `petal train` run folder holds beside its config.json.
_RUN_FILES = frozenset({"state.json", "history.csv", "last.keras", "model.keras"})


def is_run_config(saved) -> bool:
    """Whether ``saved`` (a parsed config.json) is one petal train wrote: it always holds the
    run's classes under ``resolved``. Another program's settings file of that name does not."""
    resolved = saved.get("resolved") if isinstance(saved, dict) else None
    return isinstance(resolved, dict) and "classes" in resolved


def holds_run_config(root: str) -> bool:
    """Whether ``root``'s config.json is petal train's (:func:`is_run_config`), not a data
    set's own file of that name: ``root`` is a run's folder."""
    try:
        return is_run_config(json.loads(read_bytes(join(root, "config.json"))))
    except (OSError, ValueError):  # StoreError is an OSError; UnicodeDecodeError a ValueError
        return False


def find_images(
    root: str, classes: Sequence[str] | str | None = None, *, min_classes: int = 2
) -> ImageFolder:
    """Lists the labelled images under ``root``.

    Args:
        root: folder whose sub-folders are the classes (local or ``gs://``).
        classes: class names in the order that defines their indices (a list, or a
            comma-separated string); a name also matches the one sub-folder whose name
            only adds spaces around it or is in another Unicode form (NFD); default: every
            sub-folder that holds at least one candidate image, sorted by name. Hidden
            folders (``.name``, ``__MACOSX``) are never classes, and hidden entries inside
            classes are never read.
        min_classes: fewer classes are refused (2 to train; scoring new photos needs 1).

    Raises:
        PetalError: missing, unreachable or unlistable root, no candidate images, fewer
            than ``min_classes`` classes, or an explicit class that does not exist, holds
            no images or matches two folders.
    """
    root = str(expand_home(root))
    if not exists(root):
        raise PetalError(
            f"The source folder {root} does not exist; check the path (a folder with one "
            f"sub-folder of images per class). Received: source={root}"
        )
    if not isdir(root):
        raise PetalError(
            f"Source must be a folder of class sub-folders, not a file{archive_hint(root)}. "
            f"Received: source={root}"
        )
    listdir = _list_remote if is_remote(root) else _list_local
    # The source holds every class folder: a link in one back to it, or to a folder above it,
    # is a loop too (followed, it filed every class's photos, or the whole disk's, under that
    # class). Its path as given too: a link to a folder above a linked source's name.
    above = (
        frozenset()
        if is_remote(root)
        else frozenset({os.path.realpath(root), os.path.abspath(root)})
    )
    by_class: dict[str, list[str]] = {}
    ignored: list[str] = []
    try:
        for name, is_dir in listdir(root):
            if not is_dir:
                ignored.append(name)
            elif is_hidden(name):
                ignored.append(name + "/")
            else:
                found, skipped = walk_tree(root, name, listdir, above)
                by_class[name] = found
                ignored += skipped
    except OSError as err:
        where = getattr(err, "filename", None)
        if where and not is_remote(root) and not same_place(where, root):
            raise PetalError(
                f"Cannot list {printable(where)}, a folder in the source {root} "
                f"({err.strerror or err}); "
                "fix its permissions, or move it out of the source."
            ) from err
        raise PetalError(f"Cannot list the source folder ({err}). Received: source={root}") from err
    if "config.json" in ignored and _RUN_FILES & set(ignored) and holds_run_config(root):
        # Its eval/ and plots/ were read as classes of a few PNGs, and a model trained on them.
        raise PetalError(
            f"{root} is the work directory of a `petal train` run (config.json, "
            f"{sorted(_RUN_FILES & set(ignored))[0]}), not data; pass a folder of class "
            "sub-folders of images (or, to train or evaluate, a records folder)."
        )

    accepted = ", ".join(IMAGE_EXTENSIONS)
    if classes is None:
        chosen = [name for name in sorted(by_class) if by_class[name]]
    else:
        chosen = [_spaced_match(c, by_class, root) for c in parse_classes(classes)]
        present = sorted(name for name in by_class if by_class[name])
        found = f"Found classes: {_class_names(present) or '(none)'}."
        # A path (./daisy, ., ..) starts with '.' too: it is no hidden folder's name.
        paths = [c for c in chosen if c in (".", "..") or "/" in c or os.sep in c]
        if paths:
            base = paths[0].replace(os.sep, "/").rstrip("/").rsplit("/", 1)[-1]
            fix = (
                f"pass the folder's name ({base!r})"
                if base not in ("", ".", "..")
                else "pass the class folders' names"
            )
            raise PetalError(
                f"Class {paths[0]!r} in --classes is a path, not a class name: --classes takes "
                f"the names of sub-folders of {root}; {fix}. {found}"
            )
        hidden = [c for c in chosen if is_hidden(c)]
        if hidden:
            raise PetalError(
                f"Class {hidden[0]!r} in --classes is a hidden folder name (starting with '.', "
                f"or __MACOSX), which is never read as a class; rename the folder."
            )
        unknown = [c for c in chosen if c not in by_class]
        if unknown and not is_remote(root) and _dangling(join(root, unknown[0])):
            link = join(root, unknown[0])
            raise PetalError(
                f"Class {unknown[0]!r} in --classes is a link that leads nowhere "
                f"({printable(link)} -> {printable(os.readlink(link))}); mount or fix its "
                f"target and run again. {found}"
            )
        if unknown:
            commas = [name for name in present if "," in name]
            hint = (
                f" A class name holding a comma ({_class_names(commas[:3])}) cannot be given in "
                "--classes, where commas separate the names: rename the folder, or leave out "
                "--classes to read every class folder."
                if commas
                else ""
            )
            raise PetalError(
                f"Unknown class {unknown[0]!r} in --classes: no such sub-folder of {root}. "
                f"{found}{hint}"
            )
        empty = [c for c in chosen if not by_class[c]]
        if empty:
            raise PetalError(
                f"Class {empty[0]!r} holds no images ({accepted}) under "
                f"{printable(join(root, empty[0]))}."
            )
        for name in sorted(set(by_class) - set(chosen)):
            ignored += by_class[name]

    left_out = sorted(set(by_class) - set(chosen)) if classes is not None else []
    # A link to an unmounted disk or a moved folder lists as a file that is no image.
    broken = [] if is_remote(root) else [
        n
        for n in ignored
        if not n.endswith("/")
        and not is_hidden_entry(n)
        and n.split("/", 1)[0] not in left_out
        and _dangling(join(root, *n.split("/")))
    ]
    nowhere = (
        f"; {len(broken)} link(s) in the source lead nowhere ({some_names(broken)}): mount "
        "or fix their targets"
        if broken
        else ""
    )
    if not any(by_class.get(c) for c in chosen):
        top = [n for n in ignored if "/" not in n]  # the root's own files
        from petal.data.schema import is_shard_file

        shards = [n for n in top if is_shard_file(n)]  # as the readers take them
        if shards:
            # petal convert's own output (or codelab shards), given back to it.
            held = "manifest.json and " * ("manifest.json" in top) + f"{len(shards)} shard(s)"
            raise PetalError(
                f"{root} holds records ({held}), not images: it is converted already; train, "
                "evaluate or inspect it, or pass a folder of class sub-folders of images."
            )
        if not by_class and (flat := flat_folder_error(root, top)):
            raise flat
        # Photos all hidden (.ipynb_checkpoints/, ._x.jpg): the error named only extensions.
        hidden = hidden_entries(ignored)
        unread = (
            f"; {len(hidden)} hidden folder(s) or image file(s) are not read "
            f"({some_names(hidden)}): rename any that hold photos"
            if hidden
            else ""
        )
        raise PetalError(
            f"No images found under {root}: expected class sub-folders holding files with "
            f"extensions {accepted} (case-insensitive){nowhere}{unread}."
        )
    if len(chosen) < min_classes and classes is not None and len(present) > 1:
        raise PetalError(
            f"--classes picks one class ({chosen[0]!r}) of the {len(present)} under {root}, "
            "and a classifier needs at least two: name two or more in --classes, or leave it "
            f"out to read every class folder. {found}"
        )
    if len(chosen) < min_classes:
        # A folder one level too high (``data/`` holding ``flower_photos/CLASS/``).
        inner = {rel.split("/")[1] for rel in by_class[chosen[0]] if rel.count("/") > 1}
        hint = (
            f"; its images lie in {len(inner)} sub-folders of {printable(chosen[0])}: did you "
            f"mean source={printable(join(root, chosen[0]))}?"
            if len(inner) > 1 and classes is None
            else f"{nowhere}."
        )
        raise PetalError(
            f"Found only one class ({chosen[0]!r}) under {root}; a classifier needs at least "
            f"two class sub-folders (or two names in --classes){hint}"
        )

    if not is_remote(root):
        _refuse_names_the_locale_hides(root, [*chosen, *(r for c in chosen for r in by_class[c])])
    if bad := [c for c in chosen if not is_utf8(c)]:
        raise PetalError(
            f"The name of the class folder {printable(join(root, utf8_name(bad[0])))} is not "
            "valid UTF-8, and class names are stored as UTF-8 text: rename the folder (e.g. "
            "with convmv) and run again."
        )
    forms = collections.Counter(nfc(c) for c in chosen)
    twins = [c for c in chosen if forms[nfc(c)] > 1]
    if twins and classes is None:  # two classes whose names look the same
        raise PetalError(
            f"The class folders {', '.join(ascii(n) for n in twins)} of {root} differ only in "
            "their Unicode form, so they would be two classes whose names look the same: "
            "rename or merge them so that one holds the class."
        )
    files = [
        ImageFile(path=join(root, *rel.split("/")), relpath=rel, label=label)
        for label, name in enumerate(chosen)
        for rel in by_class[name]
    ]
    return ImageFolder(
        root=root,
        classes=tuple(chosen),
        files=tuple(files),
        ignored=tuple(sorted(ignored)),
        left_out=tuple(left_out),
        empty=tuple(
            name
            for name in sorted(by_class)
            if not by_class[name]
            and all(is_hidden_entry(n) for n in ignored if n.startswith(name + "/"))
        )
        if classes is None
        else (),
        broken=tuple(sorted(broken)),
    )


def _spaced_match(name: str, names, root: str) -> str:
    """``name`` when a class folder has it, else the one folder's name that it is once the
    spaces around it are stripped, as :func:`parse_classes` strips them (`` spaced `` for
    ``spaced``), or once both are in the same Unicode form (NFC: a folder unzipped on macOS
    holds ``e`` and a combining accent where a keyboard types ``é``); else ``name``.

    Raises:
        PetalError: two folders of ``root`` are ``name`` in the same Unicode form: they look
            the same, so which one is meant cannot be told.
    """
    same = [n for n in names if nfc(n) == nfc(name)]
    if len(same) > 1:
        raise PetalError(
            f"Class {name!r} in --classes matches {len(same)} sub-folders of {root} that differ "
            f"only in their Unicode form ({', '.join(ascii(n) for n in same)}): rename or "
            "merge them so that one holds the class."
        )
    if name in names:
        return name
    if same:
        return same[0]
    near = [n for n in names if nfc(n.strip()) == nfc(name)]
    return near[0] if len(near) == 1 else name


def nfc(name: str) -> str:
    """``name`` in Unicode's composed form (NFC), in which names that look the same are the
    same text."""
    return unicodedata.normalize("NFC", name)


def _refuse_names_the_locale_hides(root: str, names: Sequence[str]) -> None:
    """Refuses local file names other than ASCII where Python decodes names with another
    encoding than UTF-8 (``LANG=C`` with its UTF-8 mode off, a Latin-1 locale): ``rosé``
    read as ``rosÃ©`` became a class of that name, and TensorFlow could not open such
    files. Records and TensorFlow hold names as UTF-8 text."""
    encoding = sys.getfilesystemencoding()
    if encoding.lower().replace("-", "") == "utf8":
        return
    if other := next((n for n in names if not n.isascii()), None):
        raise PetalError(
            f"{printable(utf8_name(join(root, other)))}: file names other than ASCII are read "
            f"only under a UTF-8 locale, and Python decodes them as {encoding} here; run petal "
            "with PYTHONUTF8=1 (or LC_ALL=C.UTF-8)."
        )


def blurs_in_list(name: str) -> bool:
    """Whether a class name, unquoted in a comma-separated list, would blur where it ends:
    it holds a comma, starts or ends with a space, or starts with a quote."""
    return "," in name or name != name.strip() or name.startswith(('"', "'"))


def _class_names(names: Sequence[str]) -> str:
    """Class names, comma-separated; every one quoted when one would blur where it ends
    (:func:`blurs_in_list`), so that the names stay apart."""
    if any(map(blurs_in_list, names)):
        return ", ".join(repr(n) for n in names)
    return ", ".join(map(printable, names))


def parse_classes(classes: Sequence[str] | str) -> list[str]:
    """Class names in index order from a list or tuple, or a comma-separated string."""
    # Not a set: its order, so the class indices, would change from one run to the next.
    if not isinstance(classes, Sequence):
        raise PetalError(
            "classes must be a list or tuple of class names in index order, or a comma-"
            f"separated string (a set has no order). Received: classes={classes!r}"
        )
    names = classes.split(",") if isinstance(classes, str) else list(classes)
    if not all(isinstance(n, str) for n in names):
        raise PetalError(f"classes must hold names (strings). Received: classes={classes!r}")
    names = [n.strip() for n in names]
    if not names or any(not n for n in names):
        raise PetalError(f"--classes must be comma-separated non-empty names. Received: {classes}")
    # Names that look the same are one name, whatever their Unicode form.
    forms = [nfc(n) for n in names]
    duplicates = [n for n in names if forms.count(nfc(n)) > 1]
    if duplicates:
        raise PetalError(f"--classes names {duplicates[0]!r} twice. Received: {classes}")
    return names
