"""PNG plots drawn from a run's saved files, headless, so they can be redrawn at any time.

Inputs are the files the training loop and ``petal evaluate`` write: ``history.csv``
(curves and learning rate), ``eval.json`` (confusion matrix) and ``*.npz`` image samples
(misclassified images and sample predictions: ``images`` uint8 ``[N, H, W, 3]``,
``true``, ``pred``, ``prob`` and ``classes``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: no display needed, same output everywhere

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from petal.display import fit_text, plot_labels, shorten  # noqa: E402
from petal.jsonfile import save_atomically  # noqa: E402
from petal.training.callbacks import read_history  # noqa: E402

_DPI = 110


def _save(fig, out: str | Path) -> Path:
    out = Path(out)
    if not out.suffix:  # as matplotlib names it (it added .png to the temporary name)
        out = out.with_name(out.name + ".png")
    try:  # closed however it ends: a notebook's failed plots kept their figures open
        out.parent.mkdir(parents=True, exist_ok=True)
        # Through a temporary file: Ctrl-C during `petal report` left a plot cut short.
        save_atomically(out, lambda tmp: fig.savefig(tmp, dpi=_DPI, bbox_inches="tight"))
    finally:
        plt.close(fig)
    return out


def _column(rows: list[dict], key: str) -> np.ndarray:
    return np.array([r.get(key, math.nan) for r in rows], dtype=np.float64)


def _epoch_axis(ax) -> None:
    """An x axis of whole epochs: one epoch's points once read 0.96 ... 1.04."""
    from matplotlib.ticker import MaxNLocator

    ax.set_xlabel("epoch")
    # One tick is enough: with two asked for, one epoch's range gets fractional ones again.
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
    ax.grid(alpha=0.3)


def _rows(history) -> list[dict]:
    """Rows of ``history.csv``: read from a path, or rows already read (a list)."""
    return history if isinstance(history, list) else read_history(history)


def plot_history(history_csv: str | Path | list[dict], out: str | Path) -> Path:
    """Accuracy and loss per epoch, training and validation, side by side.

    ``history_csv``: the file, or its rows from :func:`petal.training.callbacks.read_history`.
    """
    rows = _rows(history_csv)
    epochs = _column(rows, "epoch")
    fig, (ax_acc, ax_loss) = plt.subplots(1, 2, figsize=(10, 3.8))
    for ax, key, title in ((ax_acc, "accuracy", "Accuracy"), (ax_loss, "loss", "Loss")):
        train, val = _column(rows, key), _column(rows, f"val_{key}")
        ax.plot(epochs, train, marker=".", label="train")
        if np.isfinite(val).any():
            ax.plot(epochs, val, marker=".", label="validation")
        ax.set_title(title)
        _epoch_axis(ax)
        ax.legend()
    val_acc = _column(rows, "val_accuracy")
    if np.isfinite(val_acc).any():
        best = int(np.nanargmax(val_acc))
        ax_acc.annotate(
            f"best {val_acc[best]:.3f}",
            (epochs[best], val_acc[best]),
            textcoords="offset points",
            xytext=(0, 8),
            # Beside the frame at the first or last epoch: centred, it was drawn over the
            # axis's tick labels.
            ha="left" if best == 0 < len(epochs) - 1 else
            "right" if best == len(epochs) - 1 > 0 else "center",  # fmt: skip
            fontsize=8,
        )
        ax_acc.set_ylim(0, 1.02)
    return _save(fig, out)


def lr_points(
    rows: list[dict], batches: list[dict] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The learning rates ``history.csv`` records, placed on the epochs trained so far.

    Epoch ``e``'s first step is at ``e - 1`` and its last at ``e - 1/steps`` (the next
    epoch's first is one step later), ``steps`` its steps per epoch from ``batches``: the
    run's ``{from_epoch, steps_per_epoch}`` entries (metrics.json, state.json). Without
    them the last step is placed at ``e`` (where its accuracies are drawn). A higher rate
    between them (``lr_max``: a warm-up that ends inside the epoch) is placed where it was
    used, ``lr_max_at`` of the epoch after its first step. Histories written before
    ``lr_end`` was recorded give the first steps only.
    """
    x, y = [], []
    for row in rows:
        x.append(row["epoch"] - 1)
        y.append(row.get("lr", math.nan))
        peak, at = row.get("lr_max", math.nan), row.get("lr_max_at", math.nan)
        if math.isfinite(peak) and math.isfinite(at) and 0 < at < 1:
            x.append(row["epoch"] - 1 + at)
            y.append(peak)
        steps = _steps_in(row["epoch"], batches or [])
        if math.isfinite(row.get("lr_end", math.nan)) and steps != 1:
            x.append(row["epoch"] - (1 / steps if steps else 0))
            y.append(row["lr_end"])
    return np.array(x, dtype=np.float64), np.array(y, dtype=np.float64)


def _steps_in(epoch: int, batches: list[dict]) -> int | None:
    """The steps per epoch of ``epoch`` in ``batches`` (each session's from its first
    epoch on), None when they do not say."""
    steps = None
    for batch in batches:
        if not isinstance(batch, dict):
            return None
        start, count = batch.get("from_epoch"), batch.get("steps_per_epoch")
        if isinstance(start, int) and start <= epoch:
            steps = count
    valid = isinstance(steps, int) and not isinstance(steps, bool) and steps >= 1
    return steps if valid else None


def plot_lr(
    history_csv: str | Path | list[dict], out: str | Path, batches: list[dict] | None = None
) -> Path:
    """Learning rate at the first and last step of each epoch, and at a peak between them
    (see :func:`lr_points`, which places them by ``batches``, on an axis of epochs trained);
    the schedule runs per step, so a warm-up epoch is a line from 0 to its peak.

    ``history_csv``: the file, or its rows (as :func:`plot_history`).
    """
    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.plot(*lr_points(_rows(history_csv), batches), marker=".")
    ax.set_title("Learning rate")
    _epoch_axis(ax)
    # Not curves.png's "epoch" (epoch e drawn at e): x is the epochs trained when the step
    # ran, so epoch e's first rate is at e - 1.
    ax.set_xlabel("epochs trained")
    ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
    return _save(fig, out)


def plot_confusion_matrix(cm, classes: Sequence[str], out: str | Path, title: str = "") -> Path:
    """Counts with row-normalised colour (recall per true class), labelled with class names."""
    cm = np.asarray(cm)
    rows = cm.sum(axis=1, keepdims=True)
    norm = np.divide(cm, rows, out=np.zeros(cm.shape, dtype=np.float64), where=rows > 0)
    n = len(classes)
    # Shortened in the middle as the grids' titles are: names of 70 characters, drawn in
    # full on both axes, left the matrix half of the figure.
    classes = [shorten(label, 24) for label in plot_labels(classes)]
    size = max(4.0, 0.6 * n + 2)
    fig, ax = plt.subplots(figsize=(size, size * 0.85))
    im = ax.imshow(norm, cmap="Blues", vmin=0, vmax=1)
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label="fraction of true class")
    ax.set_xticks(range(n), classes, rotation=45, ha="right")
    ax.set_yticks(range(n), classes)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    if n <= 30:
        for i in range(n):
            for j in range(n):
                ax.text(
                    j,
                    i,
                    str(cm[i, j]),
                    ha="center",
                    va="center",
                    fontsize=8,
                    color="white" if norm[i, j] > 0.5 else "black",
                )
    ax.set_title(title or "Confusion matrix")
    return _save(fig, out)


def plot_confusion_from_json(eval_json: str | Path, out: str | Path) -> Path:
    data = json.loads(Path(eval_json).read_text())
    acc = data.get("accuracy")
    # The split it scored: a copy of the picture said nothing of evaluate --split train.
    split = f": {data['split']}" if data.get("split") in ("train", "validation", "all") else ""
    title = f"Confusion matrix{split} (accuracy {acc:.3f})" if acc is not None else ""
    return plot_confusion_matrix(data["confusion_matrix"], data["classes"], out, title)


SAMPLE_KEYS = ("images", "true", "pred", "prob", "classes")


def read_samples(samples_npz: str | Path) -> dict[str, np.ndarray]:
    """The arrays of an image samples file (:data:`SAMPLE_KEYS`), read so that a damaged
    file fails here, not half-way through a drawing.

    Raises:
        ValueError, KeyError, EOFError, zipfile.BadZipFile: not such a file (numpy's errors),
            or its arrays do not hold one entry per image (ValueError).
    """
    with np.load(samples_npz, allow_pickle=False) as data:
        samples = {key: data[key] for key in SAMPLE_KEYS}
    if any(len(samples[key]) != len(samples["images"]) for key in ("true", "pred", "prob")):
        raise ValueError("its arrays do not hold one entry per image")
    return samples


def misclassified_title(wrong: int, count: int, shown: int) -> str:
    """The misclassified grid's title: ``Misclassified (29 of 30)``, and which of them it
    shows when fewer (evaluate keeps the first ``max_misclassified``)."""
    more = f"; first {shown} shown" if shown < wrong else ""
    return f"Misclassified ({wrong} of {count}{more})"


def plot_image_grid(
    samples_npz: str | Path | dict, out: str | Path, title: str = "", cols: int = 6
) -> Path | None:
    """A grid of images titled ``predicted (p)`` over ``correct`` or ``true: class``.

    ``samples_npz``: the file, or its arrays from :func:`read_samples`. ``title`` is
    petal's text, drawn with matplotlib's markup (class names are drawn as written).

    Returns:
        The PNG path, or ``None`` when the file holds no images (nothing to draw).
    """
    data = samples_npz if isinstance(samples_npz, dict) else read_samples(samples_npz)
    images = data["images"]
    if len(images) == 0:
        return None
    classes = plot_labels([str(c) for c in data["classes"]])
    n = len(images)
    cols = min(cols, n)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(1.9 * cols, 2.4 * rows), squeeze=False)
    renderer = fig.canvas.get_renderer()
    # Each title fits its column: long names are shortened in the middle.
    width = 0.9 * fig.get_figwidth() * fig.dpi / cols
    for ax in axes.flat:
        ax.axis("off")
    for i, ax in enumerate(axes.flat[:n]):
        t, p, prob = int(data["true"][i]), int(data["pred"][i]), float(data["prob"][i])
        ax.imshow(images[i])
        ok = t == p
        text = ax.set_title("", fontsize=8, color="darkgreen" if ok else "firebrick")
        pred = fit_text(text, classes[p], width, renderer, after=f" ({prob:.2f})")
        true = "correct" if ok else fit_text(text, classes[t], width, renderer, before="true: ")
        # Always two lines, so every row needs the same room and titles never overlap.
        text.set_text(f"{pred}\n{true}")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return _save(fig, out)
