"""Errors petal raises for bad input; the CLI prints them as one line and exits non-zero."""

import errno
import os
import re
import tempfile
from pathlib import Path


class PetalError(ValueError):
    """Bad input or a refused operation. The message names the file or argument and the fix."""


def printable(name) -> str:
    """A file name for a line of output: control characters (a newline, an escape that would
    drive the terminal) written as Python escapes, so one file stays on one line."""
    text = str(name)
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


# The largest count taken (epochs, batches, steps, buffers, sizes): int32's largest, far
# above any split, and one TensorFlow converts (a larger batch failed in tf.data's batch
# with a traceback).
MAX_COUNT = 2**31 - 1


def is_int_at_least(value, minimum: int) -> bool:
    """Whether ``value`` is an ``int`` (not a ``bool``) of at least ``minimum``."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def need_bool(value, name: str) -> bool:
    """``value`` as a bool: True, False or numpy's bools, anything else refused ("no" and
    "false" are truthy, and once replaced a finished run)."""
    import numpy as np

    if not isinstance(value, bool | np.bool_):
        raise PetalError(f"{name} must be True or False. Received: {name}={value!r}")
    return bool(value)


def need_bool_or_none(value, name: str) -> bool | None:
    """:func:`need_bool`, or None (a default: ``progress=None`` draws on a terminal only)."""
    return None if value is None else need_bool(value, name)


def need_folder(value, name: str, what: str, empty: bool = True) -> None:
    """Refuse a ``value`` that is not a path (str or os.PathLike): ``Path()`` met None or a
    number with a bare TypeError. ``what`` says which folder is meant. ``empty=False``: an
    empty string is refused too (``Path("")`` is the current folder); callers that take
    one refuse it in their own words, after other checks."""
    if not isinstance(value, str | os.PathLike):
        raise PetalError(f"{name} must be a folder path ({what}). Received: {name}={value!r}")
    if not empty and str(value) == "":
        raise PetalError(f"{name} is empty; pass {what}.")


def cannot_write(path, folder: bool) -> str | None:
    """Why ``path`` (a folder when ``folder``, else a file) cannot be created or written,
    or None when it can.

    Probes the nearest existing folder on the way (``path`` itself when it is a folder
    already) by creating and removing a file there: permission bits alone say yes to root,
    and on a read-only mount or in ``/proc``.
    """
    place = Path(os.path.abspath(path))
    if not folder or not place.exists():  # (a folder path that is a file: said below)
        place = place.parent
    while not place.exists():
        place = place.parent
    if not place.is_dir():
        return f"{place} is a file, not a folder"
    try:
        fd, probe = tempfile.mkstemp(prefix=".petal-probe-", dir=place)
    except OSError as err:
        return f"nothing can be written in {place} ({err.strerror or err})"
    os.close(fd)
    os.unlink(probe)
    return None


def dangling_link(path) -> str | None:
    """Why ``path`` cannot be created as a folder when it, or a folder on the way to it, is a
    symbolic link to a missing place (creating it fails with "File exists"), or None."""
    for place in (Path(path), *Path(path).parents):
        if place.is_symlink() and not place.exists():
            return f"{place} is a link to {os.readlink(place)}, which does not exist"
        if place.exists():
            return None
    return None


def some_files(bad, rest: str, limit: int = 10) -> str:
    """``path: reason`` for the first ``limit`` of ``bad`` (pairs), ``; ``-separated, then
    ``(and N more: {rest})`` where ``rest`` says where every one of them is listed."""
    shown = "; ".join(f"{printable(path)}: {reason}" for path, reason in bad[:limit])
    return shown + (f" (and {len(bad) - limit} more: {rest})" if len(bad) > limit else "")


def first_line(err) -> str:
    """The first line of an exception's message (TensorFlow's ``.message`` where it has one),
    or the exception's type name when the message is empty."""
    lines = str(getattr(err, "message", err)).strip().splitlines()
    return lines[0].strip() if lines else type(err).__name__


def damage_reason(err) -> str:
    """What a damaged file's content lacks or gets wrong, from the error reading it raised:
    ``no 'key'`` for a missing key (KeyError's message is only the key), else its first line."""
    return f"no {err}" if isinstance(err, KeyError) else first_line(err)


def tf_message(err) -> str:
    """A TensorFlow error's message without the function-node, op and tf.data decorations
    (``{{function_node ...}}``, `` [Op:ReadFile] ...``, ``Error in user-defined function
    passed to MapDataset:2 transformation with iterator: Iterator::Root::Map: ``, ``[[...]]``),
    for messages petal passes on."""
    text = getattr(err, "message", None) or str(err)
    text = re.sub(r"\{\{[^}]*\}\}\s*", "", text)
    # tf.data's wrapping of an error raised inside a map function, and its node trace.
    text = re.sub(r"Error in user-defined function passed to .*? with iterator: \S+: ", "", text)
    text = re.sub(r"\s*\[\[[^\]]*\]\]", "", text)
    # The record reader's "truncated record at 625547' failed with Read less bytes ...".
    text = re.sub(r"truncated record at (\d+)' failed with ", r"truncated record at byte \1: ", text)
    return re.sub(r"\s*\[Op:[^\]]*\].*$", "", text, flags=re.S).strip()


def disk_full(err) -> bool:
    """Whether ``err`` (an ``OSError``, or a TensorFlow error such as ``SaveV2``'s
    ``ResourceExhaustedError``) says that the disk or the user's quota is full."""
    if getattr(err, "errno", None) in (errno.ENOSPC, errno.EDQUOT):
        return True
    text = str(getattr(err, "message", err))
    return "No space left on device" in text or "Disk quota exceeded" in text


def write_failed(folder, what: str, err) -> PetalError:
    """The one-line error of a command whose writing of ``what`` into ``folder`` (its
    ``--out``) failed with ``err``: a full disk says to free space or write elsewhere."""
    if disk_full(err):
        return PetalError(
            f"Cannot write the {what} in {folder}: no space left on its disk; free some space "
            "there or pass --out a folder on another disk."
        )
    reason = getattr(err, "strerror", None) or first_line(err)
    return PetalError(
        f"Cannot write the {what} in {folder} ({reason}); pass --out a folder you can write."
    )
