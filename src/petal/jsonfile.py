"""The one place petal writes its JSON files (``config.json``, ``state.json``, ``metrics.json``),
and how it writes any file atomically (:func:`save_atomically`).

Python's ``json`` writes a non-finite float as ``NaN`` or ``Infinity``, which is not JSON: strict
parsers (``jq``, JavaScript, Go) refuse the whole file. A loss that became NaN is written as
``null`` instead, as a value that is not known.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from pathlib import Path


def finite(value):
    """``value`` with every non-finite float inside it (dicts, lists, tuples) made ``None``."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(item) for item in value]
    return value


def json_text(data) -> str:
    """``data`` as indented, strict JSON (non-finite floats as ``null``), ending in a newline."""
    return json.dumps(finite(data), indent=2, allow_nan=False) + "\n"


def write_json(path: str | Path, data) -> None:
    """Write :func:`json_text` through a temporary file and an atomic rename."""
    save_atomically(Path(path), lambda tmp: Path(tmp).write_text(json_text(data)))


def temporary_name(path: Path) -> Path:
    """The temporary file ``path`` is written as before its rename (``.tmp-NAME``: Keras
    picks a model's format from the suffix, so the name keeps it)."""
    return path.with_name(f".tmp-{path.name}")


def save_atomically(path: Path, save) -> None:
    """``save(FILE)`` into a temporary file renamed to ``path`` once it is whole, so
    ``path`` is never a file cut short (by a kill, a full disk).

    A link is written through (the file it names is replaced, the link stays), and a path
    that is no regular file (``/dev/stdout``, a named pipe) is written as it is: renamed
    over, the link or the device was replaced by a file.

    Raises:
        what ``save`` raised, once its temporary file is removed (a full disk kept it, and
        filled up again at the next try); an OSError naming no file names ``path``.
    """
    path = Path(path)
    if path.is_symlink() or path.exists():
        real = Path(os.path.realpath(path))
        if real.exists() and not real.is_file():
            save(str(path))
            return
        path = real
    tmp = temporary_name(path)
    try:
        save(str(tmp))
        os.replace(tmp, path)
    except BaseException as err:
        failed_write(err, path, tmp)
        raise


def failed_write(err: BaseException, path: Path, tmp: Path | None = None) -> None:
    """After ``err`` writing ``path``: remove its temporary file ``tmp``, and name ``path``
    in an OSError that names no file (a write's, Keras' and h5py's on a full disk do not) or
    names ``tmp``."""
    if tmp is not None:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
    if not isinstance(err, OSError) or err.filename2 is not None:  # a rename's: both named
        return
    if err.filename is None or str(err.filename) == str(tmp):
        err.filename = str(path)  # the file meant, not its temporary name
