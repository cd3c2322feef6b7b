"""``petal export``: a SavedModel that takes encoded image bytes, and optionally TFLite.

The SavedModel's default signature ``serve(image_bytes)`` takes a batch of encoded images
(``tf.string [N]``: JPEG, PNG, GIF or BMP), decodes, fits them to the records' size the way
the converter did (``fill``: scale to cover and crop the centre), resizes to the model's
input, normalizes and returns ``probabilities [N, classes]``, ``label [N]`` (string) and
``score [N]``. A second signature, ``serve_pixels(images)``, takes float pixels in 0..255 at
the model's size; it is the one converted to TFLite, since TFLite has no image decoders.
Differences from ``petal predict``: TensorFlow's decoders ignore EXIF orientation, and drop
transparency where predict composites it on white.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from petal.errors import PetalError, first_line
from petal.evaluation.workdir import (
    RunInfo,
    check_not_in_the_way,
    load_model,
    make_output_folder,
    open_run,
)

EXPORT_DIR = "export"


def _fit_tf(image, size: tuple[int, int], mode: str):
    """Resize one float image to ``size`` with the converter's resize mode."""
    import tensorflow as tf

    th, tw = size
    if mode == "stretch":
        return tf.image.resize(image, size)
    if mode == "pad":
        return tf.image.resize_with_pad(image, th, tw)
    # fill: the limiting side becomes the target, the other the truncated exact quotient.
    hw = tf.shape(image, out_type=tf.int64)[:2]
    h, w = hw[0], hw[1]
    th64, tw64 = tf.constant(th, tf.int64), tf.constant(tw, tf.int64)
    wider = h * tw64 < w * th64
    new_h = tf.where(wider, th64, tf.maximum(th64, h * tw64 // w))
    new_w = tf.where(wider, tf.maximum(tw64, w * th64 // h), tw64)
    image = tf.image.resize(image, tf.cast(tf.stack([new_h, new_w]), tf.int32))
    return tf.image.resize_with_crop_or_pad(image, th, tw)


def make_preprocess(run: RunInfo):
    """``bytes -> float32 [H, W, 3]`` at the model's size and normalization (TensorFlow ops)."""
    import tensorflow as tf

    from petal.data.pipeline import normalize, resize_fill

    records = run.records_size or run.image_size
    mode = run.resize if run.resize != "none" else "fill"

    def preprocess(data):
        image = tf.io.decode_image(data, channels=3, expand_animations=False)
        image = _fit_tf(tf.cast(image, tf.float32), records, mode)
        # The converter stores uint8, truncated like its tf.cast.
        image = tf.cast(tf.clip_by_value(image, 0.0, 255.0), tf.uint8)
        if records != run.image_size:
            # Records at another size than the model's: resize as the input pipeline does.
            image = resize_fill(image, run.image_size)
        image = tf.ensure_shape(image, (*run.image_size, 3))
        return normalize(image, run.normalization)

    return preprocess


# What an export folder holds, and whether each is a folder.
_OUTPUTS = {"saved_model": True, "labels.txt": False, "model.tflite": False}


def export(workdir: str | Path, out: str | Path | None = None, tflite: bool = False) -> dict:
    """Write ``WORKDIR/export/saved_model`` (and ``model.tflite``) plus ``labels.txt``.

    Everything is written into a temporary folder inside ``out`` first and moved into place
    at the end, replacing an earlier export's files: a failure leaves ``out`` as it was,
    and an earlier ``saved_model`` is never mixed with the new one. An earlier
    ``model.tflite`` is removed when ``tflite`` is off (it would not match the rest).

    Args:
        workdir: a finished ``petal train`` work directory.
        out: output folder; default ``WORKDIR/export``.
        tflite: also convert the ``serve_pixels`` signature to ``model.tflite``.

    Returns:
        ``{"saved_model": path, "labels": path, "tflite": path or None,
        "removed": [paths of an earlier export's files removed]}``.

    Raises:
        PetalError: no finished run, a damaged model, or ``out`` (or one of the names
            above inside it) is in the way.
    """
    import keras
    import tensorflow as tf

    from petal.data.pipeline import normalize

    run = open_run(workdir)
    # The model first: a damaged one leaves no empty export folder behind.
    model = load_model(run, float32=True)
    out = make_output_folder(out if out is not None else run.workdir / EXPORT_DIR, "export")
    for name, is_dir in _OUTPUTS.items():
        elsewhere = "move it away or pass --out another folder."
        check_not_in_the_way(out / name, is_dir, f"the export writes its {name}", elsewhere)
    preprocess = make_preprocess(run)
    classes = list(run.classes)
    h, w = run.image_size

    def serve(image_bytes):
        images = tf.map_fn(
            preprocess,
            image_bytes,
            fn_output_signature=tf.TensorSpec((h, w, 3), tf.float32),
        )
        probs = model(images, training=False)
        best = tf.argmax(probs, axis=-1)
        return {
            "probabilities": probs,
            "label": tf.gather(tf.constant(classes), best),
            "score": tf.reduce_max(probs, axis=-1),
        }

    def serve_pixels(images):
        return {"probabilities": model(normalize(images, run.normalization), training=False)}

    archive = keras.export.ExportArchive()
    archive.track(model)
    # The first endpoint also becomes "serving_default".
    archive.add_endpoint(
        name="serve",
        fn=serve,
        input_signature=[tf.TensorSpec([None], tf.string, name="image_bytes")],
    )
    archive.add_endpoint(
        name="serve_pixels",
        fn=serve_pixels,
        input_signature=[tf.TensorSpec([None, h, w, 3], tf.float32, name="images")],
    )
    staging = Path(tempfile.mkdtemp(prefix=".export-", dir=out))
    try:
        archive.write_out(str(staging / "saved_model"), verbose=False)
        (staging / "labels.txt").write_text("\n".join(classes) + "\n")
        if tflite:
            _to_tflite(staging / "saved_model", staging / "model.tflite", run.model_path)
        # Everything written: only now replace the earlier export.
        removed = []
        for name in _OUTPUTS:
            target = out / name
            if target.is_dir():
                shutil.rmtree(target)
            if (staging / name).exists():
                os.replace(staging / name, target)
            elif target.exists():
                target.unlink()
                removed.append(str(target))
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return {
        "saved_model": str(out / "saved_model"),
        "labels": str(out / "labels.txt"),
        "tflite": str(out / "model.tflite") if tflite else None,
        "removed": removed,
    }


def _to_tflite(saved: Path, path: Path, name: Path) -> Path:
    """Convert ``saved``'s pixel signature to ``path``; errors name ``name`` (the model)."""
    import tensorflow as tf

    converter = tf.lite.TFLiteConverter.from_saved_model(
        str(saved), signature_keys=["serve_pixels"]
    )
    try:
        data = converter.convert()
    except Exception as err:  # the converter raises ConverterError and plain Exceptions
        raise PetalError(
            f"TFLite conversion of {name} failed: {first_line(err)}"
        ) from err
    path.write_bytes(data)
    return path
