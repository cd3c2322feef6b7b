"""What a run's work directory says it saved, read without TensorFlow: the command line's
resume hints after Ctrl-C import this module only, so a hint never waits for TensorFlow's
import (10 s of CPU on a 2-core Zen 3) in a process that has not started it."""

from __future__ import annotations

import json
from pathlib import Path


def saved_epoch(workdir: str | Path) -> int:
    """The last epoch the run in ``workdir`` checkpointed (``state.json``); 0 if none or
    unreadable."""
    try:
        state = json.loads((Path(workdir) / "state.json").read_text())
    except (OSError, ValueError):
        return 0
    epoch = state.get("epoch") if isinstance(state, dict) else None
    return epoch if isinstance(epoch, int) else 0


def finished_epochs(workdir: str | Path) -> int:
    """The epochs of the run in ``workdir`` when it is complete (``model.keras``, and a
    ``metrics.json`` of the epoch ``state.json`` saved); 0 otherwise."""
    workdir = Path(workdir)
    epoch = saved_epoch(workdir)
    try:
        metrics = json.loads((workdir / "metrics.json").read_text())
    except (OSError, ValueError):
        return 0
    done = metrics.get("epochs_completed") if isinstance(metrics, dict) else None
    complete = epoch and done == epoch and "stopped" not in metrics
    return epoch if complete and (workdir / "model.keras").is_file() else 0


def configured_epochs(workdir: str | Path) -> int | None:
    """The epochs ``workdir``'s ``config.json`` names (what ``--resume`` alone goes on to),
    or None when it cannot be read."""
    try:
        saved = json.loads((Path(workdir) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    epochs = saved.get("epochs") if isinstance(saved, dict) else None
    return epochs if isinstance(epochs, int) and not isinstance(epochs, bool) else None


def run_restored(err: BaseException) -> bool:
    """Whether ``err`` stopped an --overwrite that saved no epoch, and the run it replaced
    is back in its folder: that run, not the one stopped, is the folder's now."""
    return getattr(err, "petal_run_restored", False) is True
