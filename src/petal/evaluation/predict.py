"""``petal predict``: top-k labels with probabilities for image files, from a trained run.

New images go through the same steps as the training images: decoded and fitted to the
records' size exactly as the converter did (EXIF orientation, RGB, the run's resize mode),
resized to the model's input size when training used another size, then normalized.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from petal.data import images as image_io
from petal.errors import PetalError
from petal.evaluation.metrics import top_k
from petal.evaluation.workdir import RunInfo, load_model, open_run


def load_pixels(path: str | Path, run: RunInfo) -> np.ndarray:
    """One image file -> uint8 ``[H, W, 3]`` at the model's input size.

    Raises:
        PetalError: the file is missing or cannot be decoded (the message names it).
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise PetalError(f"Image not found: {path}") from None
    except (IsADirectoryError, PermissionError) as err:
        raise PetalError(f"Cannot read image {path}: {err.strerror}") from None
    try:
        pixels, _, _ = image_io.decode_rgb(data)
    except image_io.ImageError as err:
        raise PetalError(f"Cannot read image {path}: {err}") from None
    size = run.records_size or run.image_size
    pixels = image_io.resize(pixels, size, run.resize if run.resize != "none" else "fill")
    if tuple(pixels.shape[:2]) != run.image_size:
        # Records at another size than the model's: resize as the input pipeline does.
        from petal.data.pipeline import resize_fill

        pixels = resize_fill(pixels, run.image_size).numpy()
    return pixels


def expand_images(paths: Sequence[str | Path]) -> list[Path]:
    """Image files, with each folder among ``paths`` replaced by the images under it.

    A folder contributes every file below it (sub-folders included) whose extension is an
    image's (case-insensitive), sorted by path; files named directly are kept whatever their
    extension, in the order given.

    Raises:
        PetalError: a folder holds no image files.
    """
    from petal.data.folders import IMAGE_EXTENSIONS

    files: list[Path] = []
    for path in map(Path, paths):
        if not path.is_dir():
            files.append(path)
            continue
        found = sorted(
            p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS
        )
        if not found:
            raise PetalError(
                f"Folder {path} holds no image files ({', '.join(IMAGE_EXTENSIONS)}); pass "
                "image files or a folder of them."
            )
        files += found
    return files


def predict(
    workdir: str | Path,
    images: Sequence[str | Path],
    top_k_count: int = 3,
    batch_size: int = 32,
) -> list[dict]:
    """Classify image files with the run's final model.

    Args:
        workdir: a finished ``petal train`` work directory.
        images: image file paths (JPEG, PNG, GIF, BMP, WebP), or folders of them (every
            image below a folder, sorted; see :func:`expand_images`).
        top_k_count: how many labels to return per image, best first.
        batch_size: images per forward pass.

    Returns:
        One dict per image, in input order:
        ``{"file": str, "predictions": [{"label", "index", "probability"}, ...]}``.

    Raises:
        PetalError: no images, a missing or unreadable image, or a run without a model.
    """
    if not images:
        raise PetalError("No images given; pass one or more image files.")
    if top_k_count < 1:
        raise PetalError(f"top_k (--top-k) must be an integer >= 1. Received: {top_k_count!r}")
    from petal.data.pipeline import normalize

    run = open_run(workdir)
    images = expand_images(images)
    # Decode everything first, so an unreadable file fails before any model work.
    pixels = [load_pixels(p, run) for p in images]
    model = load_model(run)
    probs = []
    for start in range(0, len(pixels), batch_size):
        batch = normalize(np.stack(pixels[start : start + batch_size]), run.normalization)
        probs.append(np.asarray(model.predict_on_batch(batch), dtype=np.float64))
    probs = np.concatenate(probs)
    idx, p = top_k(probs, top_k_count)
    return [
        {
            "file": str(path),
            "predictions": [
                {"label": run.classes[int(i)], "index": int(i), "probability": float(q)}
                for i, q in zip(idx[n], p[n], strict=True)
            ],
        }
        for n, path in enumerate(images)
    ]


def format_predictions(results: list[dict]) -> str:
    """Human-readable lines: ``file: label 0.912, label 0.051, ...``."""
    lines = []
    for r in results:
        best = ", ".join(f"{q['label']} {q['probability']:.3f}" for q in r["predictions"])
        lines.append(f"{r['file']}: {best}")
    return "\n".join(lines)
