"""Classification metrics as pure NumPy functions of labels and probabilities.

Conventions: ``y_true`` holds integer class indices; ``probs`` is ``[N, num_classes]``;
a confusion matrix is indexed ``[true, predicted]``. A ratio with a zero denominator
(a class never predicted, or absent from the data) is reported as 0.0, as scikit-learn
does with ``zero_division=0``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from petal.errors import PetalError, is_int_at_least


def _labels(y_true, num_classes: int | None = None, name: str = "y_true") -> np.ndarray:
    """``y_true`` as an array of class indices, each below ``num_classes`` when given;
    ``name`` names it in the messages."""
    y = np.asarray(y_true)
    if y.ndim != 1 or not np.issubdtype(y.dtype, np.integer):
        raise PetalError(
            f"{name} must be a 1-D array of class indices. Received: shape={y.shape}, "
            f"dtype={y.dtype}"
        )
    if num_classes is not None and y.size and (y.min() < 0 or y.max() >= num_classes):
        # The last check: the labels (a record's class index) and the model's head disagree,
        # e.g. records whose class index is beyond their own list of classes.
        n = num_classes
        bad = int(y.min()) if y.min() < 0 else int(y.max())
        if name == "y_true":
            what = f"The data's labels ({name}, the records' class index) hold"
            fix = (
                "find the records with a bad class index (petal inspect DATA --verify) and "
                "convert the images again (petal convert), or evaluate data of the model's classes"
            )
        else:
            what, fix = f"{name} holds", f"pass predicted class indices in 0..{n - 1}"
        raise PetalError(
            f"{what} class index {bad}, outside the model's {n} classes (0..{n - 1}); "
            f"{fix}. Received: {name} min={y.min()}, max={y.max()}"
        )
    return y


def _check_k(k) -> int:
    """``k`` of a top-k: an integer of at least 1 (a NumPy integer is one)."""
    k = int(k) if isinstance(k, np.integer) else k
    if not is_int_at_least(k, 1):
        raise PetalError(f"k must be an integer >= 1 (the k of a top-k). Received: k={k!r}")
    return k


def confusion_matrix(y_true, y_pred, num_classes: int) -> np.ndarray:
    """Counts ``[num_classes, num_classes]``: row = true class, column = predicted class."""
    t = _labels(y_true, num_classes)
    p = _labels(y_pred, num_classes, "y_pred")
    _same_length(t, p.size)
    cm = np.zeros((num_classes, num_classes), dtype=np.int64)
    np.add.at(cm, (t, p), 1)
    return cm


def accuracy(y_true, y_pred) -> float:
    t, p = _labels(y_true), _labels(y_pred, name="y_pred")
    _same_length(t, p.size)
    return float(np.mean(t == p)) if t.size else 0.0


def _same_length(t: np.ndarray, n: int, what: str = "y_pred") -> None:
    """NumPy broadcast labels of one sample over many: an accuracy of other numbers."""
    if t.size != n:
        raise PetalError(f"y_true and {what} differ in length. Received: {t.size} and {n}")


def top_k_accuracy(y_true, probs, k: int) -> float:
    """Fraction of samples whose true class is among the ``k`` highest probabilities.

    Ties are broken toward the lower class index, so the result does not depend on
    the sort's stability. A ``k`` above the number of classes counts them all (1.0).

    Raises:
        PetalError: ``k`` is not an integer >= 1, or a label is not one of the classes.
    """
    k = _check_k(k)
    probs = np.asarray(probs, dtype=np.float64)
    t = _labels(y_true, probs.shape[1])
    _same_length(t, probs.shape[0], "probs")
    k = min(k, probs.shape[1])
    top = np.argsort(-probs, axis=1, kind="stable")[:, :k]
    return float(np.mean(np.any(top == t[:, None], axis=1))) if t.size else 0.0


def top_k(probs, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices and probabilities of the ``k`` most likely classes, best first, per row
    (all of them, for a ``k`` above the number of classes)."""
    k = _check_k(k)
    probs = np.asarray(probs)
    k = min(k, probs.shape[-1])
    idx = np.argsort(-probs, axis=-1, kind="stable")[..., :k]
    return idx, np.take_along_axis(probs, idx, axis=-1)


def _safe_div(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    num = np.asarray(num, dtype=np.float64)
    den = np.asarray(den, dtype=np.float64)
    return np.divide(num, den, out=np.zeros_like(num), where=den > 0)


def per_class_metrics(cm: np.ndarray, classes: Sequence[str]) -> dict:
    """Precision, recall, F1 and support per class, plus macro and weighted averages.

    The macro averages are over the classes present in the data (support > 0): a class
    with no images has no recall to average (data may hold only some of a model's
    classes), though it still has a row, and its precision counts the images predicted as it.

    Returns:
        ``{"per_class": {name: {"precision", "recall", "f1", "support"}},
        "macro": {...}, "weighted": {...}}``.

    Raises:
        PetalError: ``cm`` is not ``[C, C]`` for the ``C`` names of ``classes``.
    """
    cm = np.asarray(cm)
    if cm.shape != (len(classes), len(classes)):
        # Fewer names dropped classes from per_class while the averages kept them; more
        # raised an IndexError.
        raise PetalError(
            f"cm must be [{len(classes)}, {len(classes)}] for {len(classes)} classes. "
            f"Received: shape={cm.shape}"
        )
    tp = np.diag(cm).astype(np.float64)
    support = cm.sum(axis=1)
    predicted = cm.sum(axis=0)
    precision = _safe_div(tp, predicted)
    recall = _safe_div(tp, support)
    f1 = _safe_div(2 * precision * recall, precision + recall)
    per_class = {
        name: {
            "precision": float(precision[i]),
            "recall": float(recall[i]),
            "f1": float(f1[i]),
            "support": int(support[i]),
        }
        for i, name in enumerate(classes)
    }
    total = support.sum()
    weights = support / total if total else np.zeros_like(precision)
    present = support > 0 if total else np.ones_like(support, dtype=bool)
    return {
        "per_class": per_class,
        "macro": {
            "precision": float(precision[present].mean()),
            "recall": float(recall[present].mean()),
            "f1": float(f1[present].mean()),
            "support": int(total),
        },
        "weighted": {
            "precision": float((precision * weights).sum()),
            "recall": float((recall * weights).sum()),
            "f1": float((f1 * weights).sum()),
            "support": int(total),
        },
    }


def classification_report(
    y_true, probs, classes: Sequence[str], ks: Sequence[int] = (1, 3)
) -> dict:
    """Everything ``petal evaluate`` reports, as a JSON-ready dict.

    Args:
        y_true: true class indices, ``[N]``.
        probs: predicted probabilities, ``[N, num_classes]``.
        classes: class names in index order.
        ks: the k of each top-k accuracy reported (``top_1`` is plain accuracy). A k above
            the number of classes is reported as the top-k of all of them (``top_3`` for 3
            classes, which is 1.0), as ``petal evaluate --top-k`` reduces it.
    """
    probs = np.asarray(probs)
    if probs.ndim != 2 or probs.shape[1] != len(classes):
        raise PetalError(
            f"probs must be [N, {len(classes)}] for {len(classes)} classes. "
            f"Received: shape={probs.shape}"
        )
    t = _labels(y_true, len(classes))
    # Named for the k counted: top_5 of 3 classes would claim a measure it is not.
    ks = sorted({min(_check_k(k), len(classes)) for k in ks})
    pred = np.argmax(probs, axis=1)
    cm = confusion_matrix(t, pred, len(classes))
    report = {
        "count": int(t.size),
        "accuracy": accuracy(t, pred),
        "top_k_accuracy": {f"top_{k}": top_k_accuracy(t, probs, k) for k in ks},
        "classes": list(classes),
        "confusion_matrix": cm.tolist(),
    }
    report.update(per_class_metrics(cm, classes))
    return report
