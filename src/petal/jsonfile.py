"""The one place petal writes its JSON files (``config.json``, ``state.json``, ``metrics.json``).

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
    path = Path(path)
    tmp = path.with_name(f".tmp-{path.name}")
    try:
        tmp.write_text(json_text(data))
        os.replace(tmp, path)
    except OSError as err:
        with contextlib.suppress(OSError):  # a full disk: leave no temporary file
            tmp.unlink(missing_ok=True)
        if err.filename is None:  # a write's error names no file
            err.filename = str(path)
        raise
