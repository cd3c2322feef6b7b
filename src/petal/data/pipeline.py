"""tf.data pipelines for training and evaluation, one function each, in a fixed order.

Training (:func:`train_dataset`)::

    read (parallel interleave over shards, file order reshuffled each epoch)
      -> [decode] -> cache (decoded uint8 images, RAM or local disk) -> shuffle -> repeat
      -> [decode]                                      (when not cached: decode after shuffle)
      -> batch (drop_remainder: static shapes) -> labels -> augment (per batch) -> normalise
      -> prefetch

Evaluation (:func:`eval_dataset`)::

    read (files in order; several input pipelines: every n-th record each) -> decode
      -> batch (keep the last, partial batch) -> labels -> normalise -> prefetch

so every validation image is seen exactly once.

Why this shape:

- Decoding happens **before** the cache when caching, so later epochs skip JPEG decoding
  entirely (the expensive step). Without a cache, records are shuffled while still
  encoded (a shuffle buffer of 2,048 JPEGs is a few tens of MB; of decoded images, a few
  hundred) and decoded after, in a parallel map. Records already at the requested size
  are batched first and decoded a whole batch per map call (see :func:`_batch_decoder`):
  tf.data's per-element overhead was a third of the JPEG pipeline's CPU time.
- Augmentation runs on whole batches: one vectorised op per batch instead of one small
  op per image, with a per-image random draw inside (see :mod:`petal.data.augment`).
- Images stay uint8 until the batch is built: caches, shuffle buffers and batching move
  four times fewer bytes. The cast to float32 and normalisation come last.
- Augmentation is stateless, keyed by the pipeline's seed and the batch index (which
  counts across epochs). A seeded pipeline is therefore reproducible when
  ``deterministic`` is on (the default when a seed is given); unseeded pipelines draw a
  fresh seed and let tf.data reorder elements for speed (``deterministic=False``).
- A deterministic pipeline reads pass after pass over the data, each pass a pipeline of its
  own whose file order and shuffle are keyed by the seed and the pass (see :func:`_passes`),
  so one started at a later step (``start_step``: a resumed run) yields exactly the batches
  the same pipeline reaches there, whatever the global seed (``tf.random.set_seed``). Other
  pipelines, and data read over http, keep tf.data's one reshuffling stream, where epoch
  ``k``'s order is the ``k``-th reshuffle.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import glob
import hashlib
import logging
import math
import os
import re
import secrets
import socket
import tempfile
import threading

import numpy as np
import tensorflow as tf

from petal.data import augment as augment_lib
from petal.data import folders, reader, schema, tfdata
from petal.data import images as image_io
from petal.data.reader import Source, open_source
from petal.errors import (
    MAX_COUNT,
    PetalError,
    cannot_write,
    first_line,
    is_int_at_least,
    need_bool,
    printable,
    some_files,
    tf_message,
)

log = logging.getLogger(__name__)

AUTOTUNE = tf.data.AUTOTUNE
# Functions handed to tf.data here have no Python control flow on tensors: skip AutoGraph
# (faster tracing, and no conversion warnings for lambdas).
_graph = tf.autograph.experimental.do_not_convert
NORMALIZATIONS = ("unit", "symmetric", "imagenet", "raw")
LABEL_MODES = ("one_hot", "sparse")
DTYPES = ("float32", "uint8")
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
# Use at most this fraction of the memory available now for an in-RAM cache of decoded images.
RAM_CACHE_FRACTION = 0.4
# Shards read at once; enough to hide per-file latency, few enough to keep buffers small.
MAX_PARALLEL_READS = 16
# libjpeg's accurate integer DCT. TensorFlow's default ("") is the fast one, which is a few
# percent faster and differs from PIL, simplejpeg and the accurate DCT by up to ~15 levels
# per pixel on q95 flowers; training data gets the accurate pixels from either decoder.
DCT_METHOD = "INTEGER_ACCURATE"
# Compile the per-batch pixel work (augmentation + normalisation) with XLA: one fused pass
# instead of one per op (several times faster on CPU). PETAL_XLA=0 turns it off.
USE_XLA = os.environ.get("PETAL_XLA", "1") != "0"
DECODERS = ("tf", "simplejpeg")
# How image-folder files are fitted to the size (petal convert's --resize, but "none").
FOLDER_RESIZE_MODES = tuple(mode for mode in image_io.RESIZE_MODES if mode != "none")

__all__ = [
    "train_dataset",
    "eval_dataset",
    "distributed_dataset",
    "open_source",
    "normalize",
    "load_image",
    "fit_image",
    "per_replica_batch",
    "steps_per_epoch",
]


# --- public API ------------------------------------------------------------------------------


def train_dataset(
    source,
    *,
    batch_size: int,
    image_size=None,
    augment="codelab",
    cache="auto",
    shuffle_buffer: int = 2048,
    seed: int | None = None,
    deterministic: bool | None = None,
    label_mode: str = "one_hot",
    normalization: str = "unit",
    split: str = "train",
    input_context: tf.distribute.InputContext | None = None,
    skip_corrupt: bool = False,
    decoder: str = "tf",
    dtype: str = "float32",
    resize: str = "fill",
    start_step: int = 0,
) -> tf.data.Dataset:
    """The training dataset: infinite, shuffled, augmented batches of static shape.

    Args:
        source: a records folder, codelab shards (folder or glob), an image folder, or a
            :class:`~petal.data.reader.Source` from :func:`open_source`.
        batch_size: the **global** batch size; with ``input_context`` each replica gets
            ``batch_size / replicas`` and it must divide evenly.
        image_size: ``(height, width)`` or an int; default: the records' size (required for
            image folders and for records of varying size). Other sizes are resized with
            the codelab's "fill" (scale to cover, centre crop).
        augment: ``"codelab"`` (flip + saturation), ``"none"``/None, another preset or a
            ``+``-joined list of ops (see :func:`petal.data.augment.build`), or a function
            ``fn(images, seed)`` of a batch that returns the batch (its contract is
            :func:`petal.data.augment.build`'s).
        cache: ``"auto"`` (RAM when the decoded split fits, else a local disk file),
            ``"ram"``, ``"disk"`` (a temporary file, deleted when the process exits), a folder
            path (kept and reused by later runs on the same data and input pipelines,
            whatever their seed; not with ``skip_corrupt``; a bare name close to a mode,
            as ``"rams"``, is refused as misspelt: ``"./rams"``), or ``"off"``/None.
        shuffle_buffer: elements in the shuffle buffer. (Uncached data read over http is an
            endless stream: a pass no larger than the buffer is shuffled whole instead.)
        seed: makes shuffling and augmentation reproducible; None draws one. Every cache
            (RAM, disk, a folder) gives the same batches; ``cache="off"`` others where the
            data are in several shards (it shuffles their order too, as it reads them).
        deterministic: keep element order fixed; default True when ``seed`` is given.
        label_mode: ``"one_hot"`` (float32 ``[B, C]``) or ``"sparse"`` (int32 ``[B]``).
        normalization: ``"unit"`` (0..1), ``"symmetric"`` (-1..1), ``"imagenet"`` (mean/std)
            or ``"raw"`` (0..255), matched to the model.
        split: ``"train"``, ``"validation"`` or ``"all"``.
        input_context: from ``distribute_datasets_from_function`` (see
            :func:`distributed_dataset`): shards the input and sizes the per-replica batch.
        skip_corrupt: warn about and count corrupt records instead of failing.
        decoder: JPEG decoder of the uncached batch path: ``"tf"`` (``tf.io.decode_jpeg``,
            one op per image: a pure graph, which tf.data service and TPU hosts need) or
            ``"simplejpeg"`` (libjpeg-turbo's own API, one ``numpy_function`` call per batch
            with the GIL released). Same pixels; on this project's CPUs simplejpeg measured
            0.92-1.10x TensorFlow's op inside the pipeline (benchmarks/README.md): no
            consistent gain, so ``"tf"`` is the default.
        dtype: ``"float32"``, or ``"uint8"``: batches of 0..255 pixels (augmented ones
            rounded back) for a model that normalises on the accelerator, e.g. behind a
            ``keras.layers.Rescaling``; a quarter of the bytes to move to the device, and no
            float pass over the pixels on the host. Needs ``normalization="raw"``.
        resize: how the files of an image folder are fitted to ``image_size``: ``"fill"``
            (the codelab's: cover, then crop the centre), ``"pad"`` or ``"stretch"``, as
            ``petal convert --resize`` fits them. Records are read as stored.
        start_step: the first step to yield (a resumed run: the steps it already trained;
            under a strategy, a step is a batch for each replica the pipeline feeds, and a
            pass over the data ends with whole steps).
            A deterministic pipeline then yields exactly the batches the same pipeline from
            step 0 yields from there on: each pass over the data has its own order, a
            function of ``seed`` and the pass, and each batch its augmentation, a function
            of ``seed`` and the batch's step; whole passes are skipped without reading them
            and the rest of a pass before decoding. (Not exact for records or files that
            ``skip_corrupt`` drops, which shorten their passes, nor for data read over
            http.) Other pipelines start their shuffles and draws afresh.

    Returns:
        ``tf.data.Dataset`` of ``(images [B, H, W, 3] of dtype, labels)``.

    Raises:
        PetalError: (when called) an argument is invalid, or ``source`` cannot be opened.
        tf.errors.OpError: (while iterating) a corrupt record or a file that does not decode,
            as TensorFlow words it. :func:`petal.data.reader.input_error` (the error, the
            source, and what you were doing) turns it into a one-line
            :class:`~petal.errors.PetalError` naming the shard and record or the file, as
            petal's commands say it; ``skip_corrupt`` skips such input instead.
    """
    src = _open(source)
    _check_context(input_context, skip_corrupt)
    decoder = _check_choice("decoder", decoder, DECODERS)
    resize = _check_choice("resize", resize, FOLDER_RESIZE_MODES)
    label_mode = _check_choice("label_mode", label_mode, LABEL_MODES)
    normalization = _check_choice("normalization", normalization, NORMALIZATIONS)
    dtype = _check_dtype(dtype, normalization)
    size = _resolve_size(src, image_size)
    per_replica = _per_replica_batch(batch_size, input_context)
    if not is_int_at_least(_plain_int(shuffle_buffer), 0):
        raise PetalError(
            f"shuffle_buffer must be an int >= 0. Received: shuffle_buffer={shuffle_buffer!r}"
        )
    if not is_int_at_least(_plain_int(start_step), 0):
        raise PetalError(f"start_step must be an int >= 0. Received: start_step={start_step!r}")
    seed = _resolve_seed(seed, input_context)
    if deterministic not in (None, True, False):
        raise PetalError(
            f"deterministic must be True, False or None. Received: deterministic={deterministic!r}"
        )
    deterministic = seed.given if deterministic is None else bool(deterministic)
    aug = augment_lib.build(augment)
    if aug is not None and getattr(aug, "mixes_labels", False) and label_mode != "one_hot":
        raise PetalError(
            f"mixup/cutmix mix labels and need label_mode='one_hot'. "
            f"Received: label_mode={label_mode!r}, augment={augment!r}"
        )
    split = _check_split(src, split)
    count = _pipeline_count(src, split, input_context)
    if count < per_replica:
        pipelines = input_context.num_input_pipelines if input_context is not None else 1
        raise _fewer_than_a_batch(src, split, count, per_replica, batch_size, pipelines)
    _warn_of_uneven_shares(src, split, input_context)
    cache_to = _resolve_cache(cache, src, split, size, input_context, resize, skip_corrupt)

    decode = _decoder(src, size, resize, skip_corrupt=skip_corrupt)
    # Batches of records at the requested size are decoded a batch per map call.
    group_decode = None
    if cache_to is None and not skip_corrupt:
        group_decode = _batch_decoder(src, size, per_replica, decoder)
    stages = dict(
        seed=seed.value,
        input_context=input_context,
        skip_corrupt=skip_corrupt,
        cache_to=cache_to,
        decode=decode,
        group_decode=group_decode,
        # No larger than the split: tf.data sets a larger buffer's room aside (a buffer of
        # 1e9 images ran the machine out of memory; 1e12 crashed the process).
        shuffle_buffer=min(int(shuffle_buffer), src.count(split)),
        per_replica=per_replica,
    )
    # A step takes a batch from this pipeline for each replica it feeds (a strategy's one
    # pipeline feeds them all): a resumed run's steps were that many of its batches (the
    # steps alone replayed half an epoch on two replicas), and a pass holds whole steps
    # (passes of one replica's batches drifted across epochs: images seen twice in one).
    feeds = _replicas_fed(input_context)
    first_batch = int(start_step) * feeds
    per_pass = count // per_replica
    per_pass = per_pass // feeds * feeds or per_pass
    first_pass, skip = divmod(first_batch, per_pass)
    if deterministic and not src.remote:
        # 1-4. Pass after pass, each one's order a function of the seed and the pass.
        ds = _passes(src, split, first_pass=first_pass, skip=skip, count=count,
                     per_pass=per_pass, **stages)  # fmt: skip
    else:
        if start_step:
            # Another order than the first passes': a resumed run does not replay them.
            stages["seed"] = (seed.value + 104729 * int(start_step)) % SEED_SPACE
        ds = _endless(src, split, deterministic=deterministic, count=count, **stages)
    # 5. Labels, augmentation (per batch, keyed by seed and batch index), normalisation.
    ds = ds.enumerate(start=first_batch)
    ds = ds.map(
        _finish_fn(src.num_classes, label_mode, normalization, aug, seed.value, dtype, src),
        num_parallel_calls=AUTOTUNE,
        deterministic=deterministic,
    )
    # 6. Prefetch: overlap the input pipeline with the training step.
    ds = ds.prefetch(AUTOTUNE)
    return ds.with_options(_options(deterministic, input_context))


def eval_dataset(
    source,
    *,
    batch_size: int,
    image_size=None,
    label_mode: str = "one_hot",
    normalization: str = "unit",
    split: str = "validation",
    input_context: tf.distribute.InputContext | None = None,
    skip_corrupt: bool = False,
    cache=None,
    dtype: str = "float32",
    resize: str = "fill",
    fit_size=None,
) -> tf.data.Dataset:
    """The evaluation dataset: each image of ``split`` exactly once, in the same order on
    every call (a few shards read in turn, their records interleaved; an image folder's
    files in order).

    No shuffle, no repeat, no augmentation; the last batch may be smaller. Arguments are
    those of :func:`train_dataset`; ``cache`` (default off) may be ``"ram"``/``"auto"`` to
    keep decoded images across repeated evaluations. ``fit_size``, for an image folder:
    fit each file to this size first (a model's records size, as ``petal convert`` did),
    then resize it to ``image_size`` as records are, so new photos get the pixels the
    model's own records (and ``petal predict``) give it; records are read as stored, as
    with ``resize`` (a run's fitting applies to whatever data it is evaluated on).
    ``resize`` may also be ``"none"`` here, with no ``fit_size`` (refused with one): files
    are resized as records of ``--resize none`` are (see :func:`fit_image`). With several
    input pipelines (``input_context``) each keeps every n-th record or file, whatever the
    shards: the shares differ by one image at most.

    Returns:
        finite ``tf.data.Dataset`` of ``(images [b, H, W, 3] of dtype, labels)``.

    Raises:
        PetalError: (when called) an argument is invalid, or ``source`` cannot be opened.
        tf.errors.OpError: (while iterating) as :func:`train_dataset`'s.
    """
    src = _open(source)
    _check_context(input_context, skip_corrupt)
    resize = _check_choice("resize", resize, image_io.RESIZE_MODES)
    label_mode = _check_choice("label_mode", label_mode, LABEL_MODES)
    normalization = _check_choice("normalization", normalization, NORMALIZATIONS)
    dtype = _check_dtype(dtype, normalization)
    size = _resolve_size(src, image_size)
    fit = _as_size(fit_size, "fit_size") if fit_size is not None else None
    if fit is not None and resize == "none":
        # Records of --resize none keep each photo's size: there is no size to fit to.
        raise PetalError(
            "fit_size fits files as petal convert --resize fill, pad or stretch did; with "
            "resize='none' they keep their own size: pass fit_size=None, or that resize. "
            f"Received: fit_size={fit_size!r}, resize='none'"
        )
    per_replica = _per_replica_batch(batch_size, input_context)
    split = _check_split(src, split)
    how = f"{resize}|{fit}"  # parsed: 192 and "192x192" fit the same pixels
    if input_context is not None and input_context.num_input_pipelines > 1:
        how += "|by-record"  # a kept cache of an earlier build's share of whole files differs
    cache_to = _resolve_cache(cache, src, split, size, input_context, how, skip_corrupt)
    # Read in a fixed order (shards interleaved), decode, batch without dropping anything.
    ds = _read(
        src,
        split,
        training=False,
        seed=0,
        deterministic=True,
        input_context=input_context,
        skip_corrupt=skip_corrupt,
    )
    decode = _decoder(src, size, resize, fit, skip_corrupt=skip_corrupt)
    ds = ds.map(decode, num_parallel_calls=AUTOTUNE, deterministic=True)
    ds = _ignore_decode_errors(ds, skip_corrupt, src)
    if cache_to is not None:
        ds = ds.cache(cache_to)
    ds = ds.batch(
        per_replica, drop_remainder=False, num_parallel_calls=AUTOTUNE, deterministic=True
    )
    ds = ds.enumerate().map(
        _finish_fn(src.num_classes, label_mode, normalization, None, 0, dtype, src),
        num_parallel_calls=AUTOTUNE,
        deterministic=True,
    )
    ds = _store_checked(ds, src, skip_corrupt).prefetch(AUTOTUNE)
    return ds.with_options(_options(True, input_context))


def _store_checked(ds, src: Source, skip_corrupt: bool) -> tf.data.Dataset:
    """``ds``, ending with an error when a request to the store failed since it was built.

    Over http, a request that fails (a connection closed part-way, a store gone) ends its
    file's stream; ``skip_corrupt`` then dropped the rest as corrupt data, and an evaluation
    counted fewer images (none, for a store that answers nothing) without a word. petal's
    commands check :data:`petal.data.remote.STORE_ERRORS` themselves; this does it for any
    caller, at the end of the data."""
    if not (skip_corrupt and src.remote):
        return ds
    from petal.data.remote import STORE_ERRORS, store_error

    mark = STORE_ERRORS.mark()

    def failed() -> bytes:
        error = store_error(mark, "read it")
        return b"" if error is None else f"[petal: {error}]".encode()

    def check(_):
        message = tf.numpy_function(failed, [], tf.string)
        ok = tf.equal(tf.strings.length(message), 0)
        with tf.control_dependencies([tf.debugging.Assert(ok, [message], summarize=1)]):
            return tf.nest.map_structure(
                lambda s: tf.zeros([0, *(d or 0 for d in s.shape[1:])], s.dtype),
                ds.element_spec,
            )

    end = tf.data.Dataset.from_tensors(0).map(_graph(check))
    return ds.concatenate(end.filter(_graph(lambda *element: False)))


def _open(source) -> Source:
    """:func:`open_source`, warning (on this module's logger) about the files an image folder
    given by its path leaves out. A :class:`Source` passed in is not warned about again: its
    opener shows its ``notes`` (``petal train`` and ``petal evaluate`` print them)."""
    src = open_source(source)
    if not isinstance(source, Source):
        for note in src.notes:
            log.warning("%s", note)
    return src


def distributed_dataset(strategy: tf.distribute.Strategy, fn, options=None):
    """Per-replica input under ``strategy``: ``fn(input_context) -> tf.data.Dataset``.

    ``fn`` is typically
    ``lambda ctx: train_dataset(src, batch_size=GLOBAL, input_context=ctx)``: each input
    pipeline reads its own share (by file when there are at least as many files as input
    pipelines, else by record; :func:`eval_dataset` always by record, so the shares differ
    by one image at most) and batches ``GLOBAL / replicas``.

    Raises:
        PetalError: ``strategy`` is not a ``tf.distribute.Strategy`` or ``fn`` is not
            callable (a records path passed for it), or ``fn`` asks for a global batch that
            does not divide across replicas.
    """
    if not isinstance(strategy, tf.distribute.Strategy):
        pair = isinstance(strategy, tuple) and strategy and isinstance(
            strategy[0], tf.distribute.Strategy
        )  # get_strategy's (strategy, info): it named get_strategy as the fix
        raise PetalError(
            "distributed_dataset needs strategy as a tf.distribute.Strategy (the first of "
            "the pair petal.training.strategy.get_strategy returns"
            + ("; this is the pair)." if pair else f"). Received: strategy={strategy!r}")
        )
    if not callable(fn):
        raise PetalError(
            "distributed_dataset needs fn as a function of a tf.distribute.InputContext that "
            f"returns a tf.data.Dataset. Received: fn={fn!r}"
        )
    return strategy.distribute_datasets_from_function(fn, options=options)


def steps_per_epoch(source, batch_size: int, split: str = "train") -> int:
    """Full batches per pass over ``split`` (what training with drop_remainder sees).

    Raises:
        PetalError: the split holds fewer images than one batch (0 steps: Keras' fit would
            train nothing), as :func:`train_dataset` refuses it.
    """
    src = open_source(source)
    batch_size = _check_batch(batch_size)
    split = _check_split(src, split)
    if src.count(split) < batch_size:
        raise _fewer_than_a_batch(src, split, src.count(split), batch_size, batch_size, 1)
    return src.count(split) // batch_size


def _fewer_than_a_batch(src, split, count, per_replica, batch_size, pipelines) -> PetalError:
    fix = "Use a smaller batch_size"
    if per_replica == 1:
        # No smaller batch helps: this pipeline's share of the images is empty.
        fix = f"Add images to the split or read it with fewer than {pipelines} input pipelines"
    return PetalError(
        f"Split {split!r} of {src.path} has {count} images per input pipeline, fewer than "
        f"one batch of {per_replica}; training drops incomplete batches, so it would yield "
        f"nothing. {fix}. Received: batch_size={batch_size}"
    )


def _warn_of_uneven_shares(src: Source, split: str, input_context) -> None:
    """Training's input pipelines read whole shards of their own when there are enough
    (:func:`_read`): shares that differ by a shard, while every pipeline gives a batch per
    step, so the images of a smaller share are seen more often. Said (by the first
    pipeline) when one share is over a quarter larger than another, with the fix."""
    if input_context is None or input_context.input_pipeline_id != 0 or src.kind == "folder":
        return
    n, counts = input_context.num_input_pipelines, src.counts(split)
    if n <= 1 or len(counts) < n:
        return  # one pipeline, or every pipeline reads every shard (by record)
    shares = [sum(counts[i::n]) for i in range(n)]
    if min(shares) and max(shares) > 1.25 * min(shares):  # (an empty share is refused)
        log.warning(
            "Split %r of %s: its %d shards give its %d input pipelines %d to %d images "
            "each (whole shards), and each pipeline gives a batch per step, so the images "
            "of the smallest share are seen %.1fx as often as those of the largest; convert "
            "with --shards a multiple of %d for equal shares.",
            split, src.path, len(counts), n, min(shares), max(shares),
            max(shares) / min(shares), n,
        )  # fmt: skip


def normalize(images, normalization: str = "unit") -> tf.Tensor:
    """uint8 or float 0..255 images -> float32 in the model's expected range."""
    normalization = _check_choice("normalization", normalization, NORMALIZATIONS)
    images = tf.cast(images, tf.float32)
    if normalization == "unit":
        return images / 255.0
    if normalization == "symmetric":
        # Centred first: x / 127.5 - 1 becomes one fused multiply-add under XLA, which
        # gives 1.0000001 for 255, outside the range.
        return (images - 127.5) / 127.5
    if normalization == "imagenet":
        mean = tf.constant(IMAGENET_MEAN) * 255.0
        std = tf.constant(IMAGENET_STD) * 255.0
        return (images - mean) / std
    return images


def load_image(path: str | os.PathLike, image_size=None, resize: str = "fill") -> tf.Tensor:
    """One image file -> uint8 ``[H, W, 3]``, fitted with ``resize`` when ``image_size`` is
    given.

    Decoded as ``petal convert`` and ``petal predict`` decode (see :func:`fit_image`).

    Raises:
        PetalError: (eagerly) the file cannot be read or decoded; the message names it.
    """
    if isinstance(path, bytes | os.PathLike):
        path = os.fsdecode(path)  # a pathlib.Path, as convert and train_dataset take one
    path = folders.expand_home(path)
    if not tf.executing_eagerly():  # inside tf.data or a tf.function: the op's own error
        return _load_image(path, image_size, resize)
    if not isinstance(path, str | tf.Tensor):
        raise PetalError(f"path must be an image file's path. Received: path={path!r}")
    try:
        return _load_image(path, image_size, resize)
    except PetalError:
        raise  # a bad argument, named
    except tf.errors.OpError as err:
        # ReadFile names the path again: "PATH; No such file or directory".
        reason = _op_reason(err).removeprefix(f"{os.fspath(path)}; ")
        raise PetalError(f"Cannot load the image {os.fspath(path)}: {reason}.") from None


def _load_image(path, image_size, resize) -> tf.Tensor:
    data = tf.io.read_file(path)
    if image_size is None:
        return tf.ensure_shape(_decode_op(_decode_file, data), [None, None, 3])
    return fit_image(data, _as_size(image_size), resize)


def fit_image(data: tf.Tensor, size, resize: str = "fill", name=None) -> tf.Tensor:
    """Encoded image bytes (scalar string) -> uint8 ``[size[0], size[1], 3]``; ``size`` is
    ``(height, width)``, an int or ``"HxW"``, as :func:`load_image` takes it.

    The image-folder path decodes and fits each file exactly as ``petal convert`` does
    before it encodes the record, and as ``petal predict`` does (:mod:`petal.data.images`:
    EXIF orientation applied, alpha composited on white, CMYK and palette images to RGB,
    the first frame of an animation, the pixel limit, then ``resize``: "fill", "pad" or
    "stretch"; or "none": decoded at its own size and resized by :func:`resize_fill`, as
    this pipeline resizes records of ``petal convert --resize none``, which keep the photos'
    sizes). So a run trained on a folder or on records, ``petal evaluate`` on a folder of
    new photos and ``petal predict`` on the same files see the same pixels; TensorFlow's decoders
    ignore EXIF orientation and drop alpha. One ``numpy_function`` per file (PIL releases
    the GIL while it decodes): on the flowers folder as fast as ``decode_image`` +
    :func:`resize_fill` were, but not a pure graph: the input pipeline must run in this
    Python process (CPU, GPU and TPU VM hosts do; tf.data service and the retired TPU Nodes,
    whose pipelines ran on a remote host, cannot; records work everywhere).

    An undecodable file raises ``InvalidArgumentError`` with the reason
    :func:`undecodable_files` gives, after ``name`` (the file's path, a string tensor) when
    given.
    """
    size = _as_size(size, "size")  # (0, 64) made a (0, 64, 3) image; 64 a TypeError
    resize = _check_choice("resize", resize, image_io.RESIZE_MODES)
    if resize == "none":
        image = _decode_op(_decode_file, data, name)
        return resize_fill(tf.ensure_shape(image, [None, None, 3]), size)
    fit = functools.partial(_fit_file, size=tuple(size), mode=resize)
    return tf.ensure_shape(_decode_op(fit, data, name), [size[0], size[1], 3])


def _decode_op(fn, data, name=None) -> tf.Tensor:
    """``fn`` (a decoder of :func:`_decode_file`'s) on ``data`` in a ``numpy_function``,
    raising ``InvalidArgumentError`` for an undecodable file eagerly as in a graph: eagerly,
    ``numpy_function`` calls ``fn`` itself, and its ``ValueError`` came out bare. With
    ``name``, the file's path starts the reason (an image folder's dataset did not say which
    of its files failed)."""
    inputs = [data]
    if name is not None:
        inputs.append(name)
        fn = functools.partial(_named_decode, fn)
    if not tf.executing_eagerly():
        return tf.numpy_function(fn, inputs, tf.uint8, stateful=False)
    try:
        return tf.numpy_function(fn, inputs, tf.uint8, stateful=False)
    except ValueError as err:
        raise tf.errors.InvalidArgumentError(None, None, str(err)) from None


def _named_decode(fn, data, name) -> np.ndarray:
    try:
        return fn(data)
    except ValueError as err:
        name = name.item() if isinstance(name, np.ndarray) else name
        path = name.decode("utf-8", "replace") if isinstance(name, bytes) else str(name)
        raise ValueError(f"{printable(path)}: {err}") from None


def _decode_file(data) -> np.ndarray:
    if isinstance(data, np.ndarray):  # eagerly, a 0-d object array holding the bytes
        data = data.item()
    try:
        return image_io.decode_rgb(data)[0]
    except image_io.ImageError as err:
        raise ValueError(str(err)) from None  # InvalidArgumentError in the graph


def _fit_file(data: bytes, size: tuple[int, int], mode: str) -> np.ndarray:
    return image_io.resize(_decode_file(data), size, mode)


def resize_fill(image: tf.Tensor, size: tuple[int, int]) -> tf.Tensor:
    """The codelab's "fill": scale to cover ``size`` keeping the aspect ratio, centre crop.

    Returns uint8 ``[size[0], size[1], 3]`` with a static shape. The cover size is
    :func:`petal.data.images.fill_geometry`'s, convert's, in integers: in float32,
    ``ceil(312 * (40 / 312))`` is 41, which stretched a 312-row photo to 41 rows, cut its
    last one and moved the crop off centre (a square 331 photo at 224 came out shifted).
    """
    th, tw = size
    # At least 1: tf.where computes both branches, and an empty image divided by zero.
    h = tf.maximum(tf.cast(tf.shape(image)[0], tf.int64), 1)
    w = tf.maximum(tf.cast(tf.shape(image)[1], tf.int64), 1)
    th64, tw64 = tf.cast(th, tf.int64), tf.cast(tw, tf.int64)
    height_decides = h * tw64 < w * th64  # relatively wider than the target
    new_h = tf.where(height_decides, th64, tf.maximum(th64, h * tw64 // w))
    new_w = tf.where(height_decides, tf.maximum(tw64, w * th64 // h), tw64)
    top = (new_h - th64) // 2
    left = (new_w - tw64) // 2
    h, w = tf.cast(h, tf.float32), tf.cast(w, tf.float32)
    # tf.image.resize's antialiased kernel (ScaleAndTranslate) computing only the centre
    # window: resizing the whole cover size first made a 1x40000 strip a 192x7680000 image.
    scale = tf.stack([tf.cast(new_h, tf.float32) / h, tf.cast(new_w, tf.float32) / w])
    cropped = tf.raw_ops.ScaleAndTranslate(
        # uint8 as it comes: the kernel computes in float32 alike, and the whole photo
        # is never held 4 bytes a channel (the SavedModel's input may be a large one).
        images=image[None],
        size=tf.constant([th, tw], tf.int32),
        scale=scale,
        translation=-tf.cast(tf.stack([top, left]), tf.float32),
        kernel_type="triangle",
        antialias=True,
    )[0]
    out = tf.cast(tf.clip_by_value(tf.round(cropped), 0, 255), tf.uint8)
    return tf.ensure_shape(out, [th, tw, 3])


# --- stages ----------------------------------------------------------------------------------


def _read(
    src: Source,
    split,
    *,
    training,
    seed,
    deterministic,
    input_context,
    skip_corrupt,
    endless=False,
    reshuffle=False,
):
    """Records (scalar string) or ``(bytes, label)`` for image folders, for this pipeline.

    ``endless``: the caller repeats anyway and needs no epoch end (no cache); remote reads
    then keep their requests running across epoch boundaries. ``reshuffle``: remote reads
    repeated by the caller take a new file order each pass.
    """
    files, counts = src.files(split), src.counts(split)
    if not files:
        raise PetalError(f"Split {split!r} of {src.path} holds no files.")
    labels = src.labels(split) if src.kind == "folder" else None
    by_record = None
    if input_context is not None and input_context.num_input_pipelines > 1:
        n, index = input_context.num_input_pipelines, input_context.input_pipeline_id
        if src.kind != "folder" and len(files) >= n and training:
            # Enough shards for every input pipeline: each reads whole files of its own.
            files, counts = files[index::n], counts[index::n]
        elif src.kind == "folder":
            files, labels = files[index::n], labels[index::n]
        else:
            # Fewer shards than pipelines (the codelab's 3 validation files on a pod), or
            # evaluation (shares of whole files differ by a shard's size, and a replica whose
            # share ran out got empty batches): every pipeline reads everything and keeps
            # every n-th record, so the shares differ by one image at most.
            by_record = (n, index)

    if src.kind == "folder":
        if src.remote:
            from petal.data import remote

            # One request per file, a fixed number in flight, a new order every epoch;
            # the URL too, to name a file that does not decode.
            return remote.files_dataset(
                files,
                labels,
                shuffle_seed=seed if training else None,
                repeat=endless,
                reshuffle_each_iteration=reshuffle,
                with_urls=True,
            )
        # Typed: a pipeline whose share of fewer files than pipelines is none reads nothing.
        ds = tf.data.Dataset.from_tensor_slices(
            (tf.constant(files, tf.string), tf.constant(labels, tf.int32))
        )
        if training:
            # File names are cheap to shuffle: shuffle them all, then read in parallel.
            ds = ds.shuffle(max(1, len(files)), seed=seed, reshuffle_each_iteration=True)
        if skip_corrupt:
            return ds  # paths: the decoder reads each file, and names one it skips
        # The path too: a file that does not decode is named in the error.
        return ds.map(
            _graph(lambda p, y: (tf.io.read_file(p), y, p)),
            num_parallel_calls=AUTOTUNE,
            deterministic=deterministic,
        )

    if src.remote:
        from petal.data import remote

        shuffle = training and by_record is None
        ds = remote.records_dataset(
            files,
            counts,
            sizes=src.file_bytes(),
            shuffle_seed=seed if shuffle else None,
            deterministic=deterministic or by_record is not None,
            skip_corrupt=skip_corrupt,
            repeat=endless,
            reshuffle_each_iteration=reshuffle,
        )
    else:
        ds = tf.data.Dataset.from_tensor_slices((files, tf.constant(counts, tf.int64)))
        if training and len(files) > 1 and by_record is None:
            ds = ds.shuffle(len(files), seed=seed, reshuffle_each_iteration=True)
        ds = ds.interleave(
            _graph(lambda f, c: reader.guarded_records(f, c, skip_corrupt=skip_corrupt)),
            cycle_length=max(1, min(len(files), MAX_PARALLEL_READS)),
            block_length=1,
            num_parallel_calls=AUTOTUNE,
            # Sharding by record needs every pipeline to read the same order.
            deterministic=deterministic or by_record is not None,
        )
    if by_record is not None:
        ds = ds.shard(*by_record)
    return ds


def _endless(
    src, split, *, seed, deterministic, input_context, skip_corrupt, cache_to, decode,
    group_decode, shuffle_buffer, per_replica, count,
):
    """Batches of ``(uint8 images, class ids)`` from one reshuffling, repeating stream.

    The fast way, for pipelines whose order is not reproducible anyway: tf.data reshuffles
    each epoch (and fuses shuffle and repeat: a buffer that runs across epoch boundaries).
    """
    # A remote stream runs on across passes (its requests too), except with skip_corrupt:
    # a pass it left empty would never end (the shards were read again and again, for ever),
    # so that reads pass by pass, as locally, and repeat() stops after an empty pass.
    streaming = src.remote and cache_to is None and not skip_corrupt
    if cache_to is not None:
        # 1-2. Read, decode once, cache decoded uint8 images: later epochs skip the decode.
        ds = _cached(src, split, input_context, skip_corrupt, decode, cache_to)
    else:
        # 1. Read: records (still encoded) or file paths, sharded for this input pipeline.
        ds = _read(
            src,
            split,
            training=True,
            seed=seed,
            deterministic=deterministic,
            input_context=input_context,
            skip_corrupt=skip_corrupt,
            endless=streaming,
            reshuffle=not streaming,
        )
    # 3. Shuffle (encoded records when not cached: a much smaller buffer), reshuffled each
    #    epoch; then repeat forever (training runs for a number of steps).
    if shuffle_buffer and streaming and count <= shuffle_buffer:
        # The remote stream never ends (its requests run on across passes): a buffer
        # larger than a pass would fill with many passes and mix them into one "epoch".
        # A pass fits the buffer: shuffle each pass on its own, as tf.data does locally.
        # (Shards read side by side overlap at the end of a pass: a few shards' records of
        # the next pass come in before the last ones of this pass.)
        ds = _shuffled_passes(ds, count, seed + 1)
    elif shuffle_buffer:
        ds = ds.shuffle(shuffle_buffer, seed=seed + 1, reshuffle_each_iteration=True)
    if cache_to is None and group_decode is None:
        # Per image (a corrupt image must drop alone when skip_corrupt is on), before
        # repeat(): a pass whose every image fails to decode is then empty and ends the
        # stream (after repeat(), such passes followed one another for ever).
        ds = ds.map(decode, num_parallel_calls=AUTOTUNE, deterministic=deterministic)
        ds = _ignore_decode_errors(ds, skip_corrupt, src)
    ds = ds.repeat()
    if group_decode is not None:
        # 4. Batch the encoded records (drop_remainder: static shapes), then decode a whole
        #    batch in one map call: tf.data's per-element cost is paid once per batch, and
        #    the batch's decodes still run in parallel. The same records form the same
        #    batches as decoding first would, so seeded pipelines give identical output.
        ds = ds.batch(per_replica, drop_remainder=True)
        return ds.map(group_decode, num_parallel_calls=AUTOTUNE, deterministic=deterministic)
    # 4. Batch with drop_remainder: every batch has the same static shape (TPUs need it).
    ds = ds.batch(
        per_replica, drop_remainder=True, num_parallel_calls=AUTOTUNE, deterministic=deterministic
    )
    if skip_corrupt:
        # repeat() ends only after a pass that read nothing: say so, rather than end the
        # training early with Keras' warning.
        head, tail = _short_pass_message(src, split, per_replica, count)
        ds = ds.concatenate(_failing(ds.element_spec, tf.strings.join([head, "0", tail])))
    return ds


def _shuffled_passes(ds: tf.data.Dataset, count: int, seed: int) -> tf.data.Dataset:
    """An endless stream cut into passes of ``count`` elements, each one in its own order
    (a function of ``seed`` and the pass)."""

    def shuffle(index, elements):
        n = tf.shape(tf.nest.flatten(elements)[0])[0]
        order = tf.random.experimental.stateless_shuffle(
            tf.range(n), seed=tf.stack([tf.constant(seed, tf.int64), index])
        )
        return tf.nest.map_structure(lambda t: tf.gather(t, order), elements)

    return ds.batch(count).enumerate().map(_graph(shuffle)).unbatch()


def _passes(
    src, split, *, first_pass, skip, seed, input_context, skip_corrupt, cache_to, decode,
    group_decode, shuffle_buffer, per_replica, count, per_pass,
):
    """Batches of ``(uint8 images, class ids)``, pass after pass over the data from pass
    ``first_pass``, ``skip`` batches into it: the same batches wherever a run starts.
    A pass ends after ``per_pass`` batches (whole steps of the replicas the pipeline feeds).

    Each pass is a pipeline of its own, its file order and shuffle seeded by a stateless
    draw from ``(seed, pass)``, and ends in its own batches (``drop_remainder``: the last
    few images of a pass wait for the next pass's order), so pass ``k`` never depends on
    the passes before it, as tf.data's reshuffling of one stream does (its epoch ``k`` is
    the ``k``-th reshuffle). A cache is filled once, on the first pass a run reads, in the
    one order of :func:`_cached`, whatever the seed: every pass only reshuffles it. Nothing
    here hangs on the global seed (``tf.random.set_seed``): a run that set it before reads
    what one that did not does.
    """
    read = _ordered_reader(src, split, input_context, skip_corrupt)

    def pass_seeds(index):
        """Seeds of pass ``index``'s file order and shuffle, in a tf.data function."""
        # Seeded ops take the global seed too when one is set; not in this graph (the
        # function's own, not the caller's). Its seeds are tensors: stateless draws.
        tf.compat.v1.get_default_graph().seed = None
        key = tf.stack([tf.constant(seed, tf.int64), index])
        return tf.unstack(tf.random.stateless_uniform([2], key, None, None, tf.int64))

    cached = None
    if cache_to is not None:
        # 1-2. Read in the cache's order, decode once, cache decoded uint8 images.
        cached = _cached(src, split, input_context, skip_corrupt, decode, cache_to)

    def one_pass(index):
        file_seed, order_seed = pass_seeds(index)
        ds = read(seed=file_seed) if cached is None else cached
        # 3. Shuffle (encoded records when not cached: a much smaller buffer).
        if shuffle_buffer:
            ds = ds.shuffle(shuffle_buffer, seed=order_seed)
        # A run resumed inside this pass: its first batches were trained on (still encoded
        # when not cached: skipping them costs a read, no decode).
        ds = ds.skip(tf.where(index == first_pass, tf.constant(skip * per_replica, tf.int64), 0))
        if cached is None and group_decode is None:
            ds = ds.map(decode, num_parallel_calls=AUTOTUNE, deterministic=True)
            ds = _ignore_decode_errors(ds, skip_corrupt, src)
        # 4. Batch with drop_remainder: static shapes (TPUs need them); encoded records
        #    are decoded a batch per map call below (see _endless). Skipping corrupt
        #    records, the last, partial batch is kept for _short_pass_guard.
        # Whole steps: the batches short of one for every replica wait for the next pass.
        whole = tf.where(index == first_pass, tf.constant(per_pass - skip, tf.int64), per_pass)
        if group_decode is not None:
            return ds.batch(per_replica, drop_remainder=True).take(whole)
        ds = ds.batch(
            per_replica,
            drop_remainder=not skip_corrupt,
            num_parallel_calls=AUTOTUNE,
            deterministic=True,
        )
        ds = ds.take(whole)  # (skipping corrupt records: a short pass ends sooner anyway)
        if skip_corrupt:
            ds = _end_of_pass(ds, checked=tf.logical_or(index != first_pass, skip == 0))
        return ds

    ds = tf.data.Dataset.counter(first_pass).flat_map(_graph(one_pass))
    if skip_corrupt:
        ds = _short_pass_guard(ds, src, split, per_replica, count)
    if group_decode is not None:
        ds = ds.map(group_decode, num_parallel_calls=AUTOTUNE, deterministic=True)
    return ds


# Starts the message of a pass that skip_corrupt left with less than one batch (see
# reader.short_pass_error).
SHORT_PASS = reader.SHORT_PASS


def _end_of_pass(batches: tf.data.Dataset, checked) -> tf.data.Dataset:
    """``(checked, batch)`` of each batch of one pass, then an empty batch: the pass's end
    (a batch is never empty). ``checked``: whether a pass this short is an error (not the
    rest of a pass a resumed run started inside)."""
    spec = tf.nest.flatten(batches.element_spec)
    empty = [tf.zeros([0, *(d or 0 for d in s.shape[1:])], s.dtype) for s in spec]
    end = tf.data.Dataset.from_tensors((checked, tuple(empty)))
    return batches.map(_graph(lambda *b: (checked, tuple(tf.nest.flatten(b))))).concatenate(end)


def _short_pass_message(src: Source, split, per_replica: int, count: int) -> tuple[str, str]:
    """The error of a pass that read too few images for a batch, as the text before the
    number it read and the text after it."""
    head = f"{SHORT_PASS}Split {split!r} of {src.path}: a pass over it read "
    tail = (
        f" of the {count} images of an input pipeline, fewer than one batch of {per_replica}: "
        "skip_corrupt dropped the rest (after a corrupt record, the rest of its shard), and "
        "training drops incomplete batches, so it would yield nothing. Use a smaller batch "
        "size (--batch-size), or restore the data it skipped or convert the photos again."
    )
    return head, tail


def _failing(spec, message) -> tf.data.Dataset:
    """One element of ``spec`` (a batch of static shape) that stops the pipeline with
    ``message`` instead."""

    def fail(_):
        with tf.control_dependencies([tf.debugging.Assert(False, [message], summarize=1)]):
            return tf.nest.map_structure(lambda s: tf.zeros(s.shape, s.dtype), spec)

    return tf.data.Dataset.from_tensors(tf.constant(0)).map(_graph(fail))


def _short_pass_guard(ds, src: Source, split, per_replica: int, count: int) -> tf.data.Dataset:
    """The full batches of :func:`_end_of_pass`'s passes; stops with an error at the end of
    a pass that held less than one batch. Corrupt records that ``skip_corrupt`` drops can
    leave a pass too few to batch: without this, pass after pass would yield nothing, for
    ever (the run hung). The check counts what was read, so it needs no scan up front."""
    head, tail = _short_pass_message(src, split, per_replica, count)

    def scan(read, element):
        checked, batch = element
        n = tf.cast(tf.shape(batch[0])[0], tf.int64)
        end = tf.equal(n, 0)
        ok = tf.logical_or(tf.logical_not(tf.logical_and(end, checked)), read >= per_replica)
        message = tf.strings.join([head, tf.strings.as_string(read), tail])
        with tf.control_dependencies([tf.debugging.Assert(ok, [message], summarize=1)]):
            full = tf.equal(n, per_replica)
        return tf.where(end, tf.constant(0, tf.int64), read + n), (full, batch)

    def batch_of(full, batch):
        # Static shapes again (TPUs need them): the batches left are full.
        return tuple(tf.ensure_shape(t, [per_replica, *t.shape[1:]]) for t in batch)

    ds = ds.scan(tf.constant(0, tf.int64), _graph(scan))
    return ds.filter(_graph(lambda full, batch: full)).map(_graph(batch_of))


def _ordered_reader(src, split, input_context, skip_corrupt):
    """:func:`_read` of a training split in the order its ``seed`` gives (a function of
    ``seed``)."""
    return functools.partial(
        _read,
        src,
        split,
        training=True,
        deterministic=True,
        input_context=input_context,
        skip_corrupt=skip_corrupt,
    )


# Seed of the one file order a cache is filled in (see _cached).
CACHE_ORDER_SEED = 0


def _cached(src, split, input_context, skip_corrupt, decode, cache_to):
    """Decoded uint8 images of ``split`` through a cache (``cache_to``: "" for RAM, else a
    file prefix), filled in one order whatever the run's seed: files shuffled once by
    :data:`CACHE_ORDER_SEED`, read and decoded deterministically.

    A cache folder outlives its run (see :func:`_cache_key`): filled by one seed in that
    seed's order, it gave a run of another seed other batches than that run gets filling
    it itself. Filled in one order, it serves runs of every seed, each reshuffling it by
    its own seed (the file order is then the same in every pass, as it was within a run).
    """
    read = _ordered_reader(src, split, input_context, skip_corrupt)
    if src.remote:
        ds = read(seed=CACHE_ORDER_SEED)  # a Python seed: its own order, no global seed
    else:

        def fill(_):
            # A function graph of its own: its shuffle does not take the global seed.
            tf.compat.v1.get_default_graph().seed = None
            return read(seed=tf.constant(CACHE_ORDER_SEED, tf.int64))

        ds = tf.data.Dataset.from_tensors(tf.constant(0, tf.int64)).flat_map(_graph(fill))
    ds = ds.map(decode, num_parallel_calls=AUTOTUNE, deterministic=True)
    return _ignore_decode_errors(ds, skip_corrupt, src).cache(cache_to)


def _decoder(
    src: Source, size: tuple[int, int], resize: str = "fill", fit=None, skip_corrupt=False
):
    """``element -> (uint8 image [H, W, 3], int32 class)`` for this source; image-folder
    files are fitted to ``size`` with ``resize`` (to ``fit`` first, then resized to
    ``size`` as records are, when ``fit`` is another size). An image folder's with
    ``skip_corrupt``: ``-> (image, class, decoded)``, see :func:`_skipping_file_decoder`."""
    stored = src.image_size
    h, w = size
    if src.kind == "folder" and skip_corrupt:
        return _skipping_file_decoder(src, size, resize, fit)
    if src.kind == "folder":

        def decode_file(data, label, path):  # path: the file's, or URL (see _read)
            if fit is not None and tuple(fit) != tuple(size):
                return resize_fill(fit_image(data, fit, resize, path), size), label
            return fit_image(data, size, resize, path), label

        return _graph(decode_file)

    spec = {
        schema.IMAGE: tf.io.FixedLenFeature([], tf.string),
        schema.CLASS: tf.io.FixedLenFeature([], tf.int64),
    }
    raw = src.format == schema.FORMAT_RAW
    if stored is None and raw:
        # Raw pixels of varying size need their shape; JPEG bytes carry it (shards written
        # with only image and class, as Kaggle's flowers are, have no size feature).
        spec[schema.SIZE] = tf.io.FixedLenFeature([2], tf.int64)

    def decode_record(record):
        return decode_parsed(tf.io.parse_single_example(record, spec))

    def decode_parsed(ex):
        label = tf.cast(ex[schema.CLASS], tf.int32)
        if stored is not None:
            sh, sw = stored
            if raw:
                image = tf.reshape(tf.io.decode_raw(ex[schema.IMAGE], tf.uint8), [sh, sw, 3])
            else:
                image = tf.io.decode_jpeg(ex[schema.IMAGE], channels=3, dct_method=DCT_METHOD)
                image = tf.reshape(image, [sh, sw, 3])
            if (sh, sw) != (h, w):
                image = resize_fill(image, size)
            return image, label
        # Images of varying size: use the stored size, then resize to the requested one.
        if raw:
            hw = tf.cast(ex[schema.SIZE], tf.int32)
            image = tf.reshape(
                tf.io.decode_raw(ex[schema.IMAGE], tf.uint8), tf.concat([hw, [3]], axis=0)
            )
        else:
            data = ex[schema.IMAGE]
            # JPEG with the accurate DCT, as records of one size (and PIL, for predict) are.
            image = tf.cond(
                tf.io.is_jpeg(data),
                lambda: tf.io.decode_jpeg(data, channels=3, dct_method=DCT_METHOD),
                lambda: tf.io.decode_image(data, channels=3, expand_animations=False),
            )
        return resize_fill(image, size), label

    decode_record.parse_spec = spec
    decode_record.decode_parsed = decode_parsed
    return _graph(decode_record)


# Batches up to this size are decoded in one map call with one unrolled decode per image
# (a bigger graph costs tracing time and memory, for no further gain).
MAX_GROUP_DECODE = 256


def _batch_decoder(src: Source, size: tuple[int, int], batch: int, decoder: str = "tf"):
    """``records [batch] -> (uint8 images [batch, H, W, 3], int32 classes [batch])``, or None.

    One vectorised parse of the batch; raw pixels then become the batch in one
    ``decode_raw``, and JPEGs are decoded in one call to
    simplejpeg (see :func:`_simplejpeg_batch`) or, with ``decoder="tf"``, one
    ``decode_jpeg`` per image written out in the graph (not ``tf.map_fn``, whose loop runs
    the decodes one after another): the decodes are independent ops and run in parallel.
    None (keep the per-image map) for image folders, records that need resizing (a batch of
    unrolled resizes takes seconds to trace; the resize costs more than the per-element
    overhead saved) and very large batches of JPEGs.
    """
    raw = src.format == schema.FORMAT_RAW
    if src.kind == "folder" or src.image_size != tuple(size):
        return None
    if batch > MAX_GROUP_DECODE and not raw:
        return None
    single = _decoder(src, size)
    spec, decode_parsed = single.parse_spec, single.decode_parsed
    h, w = size
    jpeg_batch = None
    if not raw and decoder == "simplejpeg":
        jpeg_batch = _simplejpeg_batch(h, w)

    def decode_batch(records):
        ex = tf.io.parse_example(records, spec)
        if raw:
            # One op for the batch: the records' pixels land in one tensor, no stacking copy
            # (records of another length fail here, as each image's reshape would).
            images = tf.reshape(tf.io.decode_raw(ex[schema.IMAGE], tf.uint8), [batch, h, w, 3])
            return images, tf.cast(ex[schema.CLASS], tf.int32)
        if jpeg_batch is not None:
            images = tf.numpy_function(jpeg_batch, [ex[schema.IMAGE]], tf.uint8, stateful=False)
            images = tf.ensure_shape(images, [batch, h, w, 3])
            return images, tf.cast(ex[schema.CLASS], tf.int32)
        images, labels = [], []
        for i in range(batch):
            image, label = decode_parsed({key: value[i] for key, value in ex.items()})
            images.append(tf.ensure_shape(image, [h, w, 3]))
            labels.append(label)
        return tf.stack(images), tf.stack(labels)

    return _graph(decode_batch)


def _simplejpeg_batch(h: int, w: int):
    """A numpy function: JPEG bytes ``[n]`` -> uint8 ``[n, h, w, 3]``.

    simplejpeg wraps libjpeg-turbo's TurboJPEG API (the decode ceiling of
    ``petal bench input`` uses it too) and releases the GIL while decoding, so tf.data's
    parallel map calls decode on every core; each image is decoded straight into its slot
    of the batch. Same pixels as ``tf.io.decode_jpeg`` with ``DCT_METHOD`` (accurate integer
    DCT, fancy upsampling).
    """
    try:
        import simplejpeg
    except ImportError:
        raise PetalError(
            "decoder='simplejpeg' needs the simplejpeg package: pip install simplejpeg "
            "(or pass decoder='tf')."
        ) from None

    def decode(blobs):
        n = len(blobs)
        out = _aligned_empty((n, h, w, 3))
        for i, blob in enumerate(blobs):
            try:
                got = simplejpeg.decode_jpeg(blob, colorspace="RGB", buffer=out[i]).shape[:2]
            except ValueError:
                # A larger image does not fit its slot; a corrupt one fails the header too.
                got = simplejpeg.decode_jpeg_header(blob)[:2]
                if got == (h, w):
                    raise
            if got != (h, w):
                raise ValueError(
                    f"image {i} of the batch is {got[0]}x{got[1]}, the records say {h}x{w}"
                )
        return out

    return decode


# TensorFlow takes a numpy result without copying it only when its data is aligned to this
# (Eigen's alignment with AVX-512); numpy's own large arrays start 16 bytes past a page.
_TF_ALIGN = 64


def _aligned_empty(shape) -> np.ndarray:
    """An uninitialised uint8 array whose data starts on a ``_TF_ALIGN`` boundary."""
    size = math.prod(shape)
    raw = np.empty(size + _TF_ALIGN, np.uint8)
    start = -raw.ctypes.data % _TF_ALIGN
    return raw[start : start + size].reshape(shape)


# Scanning more files than this for the one that failed would take minutes: name none.
MAX_DECODE_SCAN = 50_000


def undecodable_files(source, split: str = "all") -> list[tuple[str, str]]:
    """``(path, reason)`` of each image-folder file the pipeline's decoder rejects, in order.

    Decodes every file of ``split`` as the pipeline does (:func:`fit_image`, one at a time):
    what a failed training or evaluation on a folder calls to name the culprit. The reasons
    are those ``petal convert`` lists in a manifest's ``skipped``. Empty for records and for
    folders of more than :data:`MAX_DECODE_SCAN` files.
    """
    src = open_source(source)
    files = src.files(split) if src.kind == "folder" else []
    if len(files) > MAX_DECODE_SCAN:
        return []
    bad = []
    for path in files:
        try:
            if src.remote:
                from petal.data import remote

                data = remote.get_bytes(path)
            else:
                data = tf.io.read_file(path).numpy()
        except (OSError, PetalError) as err:  # over http: the request failed
            bad.append((path, f"unreadable: {first_line(err)}"))
            continue
        except tf.errors.OpError as err:
            # ReadFile names the path again: "{{function_node ...}} PATH; No such file ..."
            reason = _op_reason(err)
            bad.append((path, f"unreadable: {reason.removeprefix(f'{path}; ')}"))
            continue
        try:
            image_io.decode_rgb(data)
        except image_io.ImageError as err:
            bad.append((path, str(err)))
    return bad


def _op_reason(err) -> str:
    """The first line of a TensorFlow error's message (:func:`petal.errors.tf_message`)."""
    lines = [ln.strip() for ln in tf_message(err).splitlines() if ln.strip()]
    return (lines[0].rstrip(".") if lines else "") or type(err).__name__


def _ignore_decode_errors(ds, skip_corrupt: bool, src: Source):
    # A record whose CRC is fine but whose image does not decode: drop it when asked to,
    # with TensorFlow's warning naming the error. An image folder's file that does not
    # decode was named by its decoder (_skipping_file_decoder), which flags it to drop here.
    if not skip_corrupt:
        return ds
    if src.kind == "folder":
        ds = ds.filter(_graph(lambda image, label, decoded: decoded))
        ds = ds.map(_graph(lambda image, label, decoded: (image, label)))
        # (Anything else that fails, as a request over http: dropped, as before.)
        return ds.ignore_errors(log_warning=False)
    return ds.ignore_errors(log_warning=True)


# Files that the caller named up front as undecodable (decode_skips): not named again.
_NAMED_UP_FRONT: set[str] = set()


class _FileSkips:
    """The files of one image-folder pipeline that ``skip_corrupt`` drops: each named in a
    warning the first time it fails, with the number skipped so far (later epochs fail on
    the same files quietly)."""

    def __init__(self, src: Source):
        self.src = src
        self.seen: set = set()
        self.lock = threading.Lock()

    def skip(self, path: str, reason: str) -> None:
        with self.lock:
            if path in self.seen:
                return
            self.seen.add(path)
            n = len(self.seen)
        if path in _NAMED_UP_FRONT:
            return
        log.warning(
            "petal: skipped %s of %s: it cannot be decoded (%s); %d file(s) skipped so far",
            path, self.src.path, reason, n,
        )


def _skipping_file_decoder(src: Source, size, resize: str, fit):
    """``(path or bytes, label) -> (uint8 image, label, decoded)`` for an image folder read
    with ``skip_corrupt``: a file that cannot be read or decoded is named in a warning (see
    :class:`_FileSkips`) and comes out as a blank image with ``decoded`` False, which
    :func:`_ignore_decode_errors` drops. Its error is caught here, in Python: raised
    inside the pipeline, TensorFlow printed its traceback (naming no file) every epoch.
    Local files come as paths (:func:`_read`), read here; over http, as their bytes and
    URL."""
    skips = _FileSkips(src)
    target = tuple(fit or size)
    shape = (1, 1, 3) if resize == "none" else (*target, 3)

    def load(element, url=None) -> tuple[np.ndarray, bool]:
        element = element.item() if isinstance(element, np.ndarray) else element
        url = url.item() if isinstance(url, np.ndarray) else url
        remote = url is not None
        path = (url if remote else element).decode("utf-8")
        data = element if remote else b""
        try:
            if not remote:
                with tf.io.gfile.GFile(path, "rb") as f:  # local or gs://
                    data = f.read()
            if resize == "none":
                return _decode_file(data), True
            return _fit_file(data, target, resize), True
        except (OSError, tf.errors.OpError) as err:
            reason = f"unreadable: {first_line(err)}"
        except ValueError as err:  # _decode_file's, for an image_io.ImageError
            reason = str(err)
        skips.skip(path, reason)
        return np.zeros(shape, np.uint8), False

    def decode_file(element, label, url=None):
        inputs = [element] if url is None else [element, url]
        image, decoded = tf.numpy_function(load, inputs, [tf.uint8, tf.bool], stateful=True)
        image = tf.ensure_shape(image, [None, None, 3] if resize == "none" else [*target, 3])
        if resize == "none" or target != tuple(size):
            image = resize_fill(image, size)
        return image, label, tf.ensure_shape(decoded, [])

    return _graph(decode_file)


def undecodable_records(source, split: str = "all") -> list[tuple[str, str]] | None:
    """``("SHARD: record I", reason)`` of each record whose frame is sound (its CRC checks)
    but whose image the pipeline's decoder rejects, in shard and record order; a record
    that lacks a feature the decoder parses (``class``) has a reason that says so
    (:func:`lacks_feature`), not the parser's "is required but could not be found".

    The reader counts CRC failures as it meets them (:func:`reader.guarded_records`); these
    records are dropped one by one inside tf.data with nothing counted, so a run with
    ``skip_corrupt`` names them up front. Reads and decodes every record of ``split`` once,
    in parallel; records after a CRC failure are not reached (the reader never reads them).
    None, not checked, for image folders, records not on a local disk, and more than
    :data:`MAX_DECODE_SCAN` records.
    """
    src = open_source(source)
    if src.kind == "folder" or folders.is_remote(src.path) or src.count(split) > MAX_DECODE_SCAN:
        return None
    # Any size will do: a record that decodes at one size decodes at every size.
    decode = _decoder(src, tuple(src.image_size or (32, 32)))
    # The smallest output that needs every pixel: an unused image would be pruned away.
    check = _graph(lambda i, record: (i, tf.reduce_max(decode(record)[0])))
    bad = []
    for path in src.files(split):
        records = tfdata.untuned(tf.data.TFRecordDataset(path, buffer_size=1 << 20))
        records = records.ignore_errors()
        read = int(records.batch(4096).reduce(tf.constant(0, tf.int64), _graph(
            lambda n, block: n + tf.size(block, out_type=tf.int64))))
        decoded = (
            records.enumerate()
            .map(check, num_parallel_calls=AUTOTUNE, deterministic=False)
            .ignore_errors()
            .map(_graph(lambda i, _: i))
            .batch(4096)
        )
        ok = np.concatenate([np.zeros([0], np.int64), *(b.numpy() for b in decoded)])
        missing = np.setdiff1d(np.arange(read), ok)
        if not missing.size:
            continue
        for i, record in records.enumerate().filter(_graph(functools.partial(_among, missing))):
            try:
                decode(record)
                reason = "does not decode in the pipeline"  # not seen: it failed there
            except tf.errors.OpError as err:
                reason = _lacking(record.numpy(), decode.parse_spec) or _op_reason(err)
            bad.append((f"{path}: record {int(i)}", reason))
    return bad


# Opens the reason undecodable_records gives a record that lacks a feature the pipeline
# parses: no image that does not decode, a record written without it (lacks_feature).
LACKS = "the record has no '"


def _lacking(record: bytes, spec: dict) -> str | None:
    """Which feature of ``spec`` (the pipeline's parse) the example ``record`` lacks, as
    a reason that starts with :data:`LACKS`; None when it holds them all (or is no
    example)."""
    from google.protobuf.message import DecodeError

    try:
        feature = tf.train.Example.FromString(record).features.feature
    except DecodeError:
        return None
    missing = [key for key in spec if key not in feature]
    if not missing:
        return None
    what = "the int64 class index" if missing[0] == schema.CLASS else "which the pipeline reads"
    return (
        f"{LACKS}{missing[0]}' feature ({what}; it carries "
        f"{', '.join(sorted(feature)) or 'no feature'})"
    )


def lacks_feature(reason: str) -> bool:
    """Whether :func:`undecodable_records`' ``reason`` is a record's missing feature."""
    return reason.startswith(LACKS)


def _bad_records_line(bad: list[tuple[str, str]], total: int, names: str) -> str:
    """``"N of TOTAL records ... and are skipped: NAMES"`` for :func:`undecodable_records`'
    ``bad``: records whose image cannot be decoded, that lack a feature, or both."""
    lacking = sum(lacks_feature(reason) for _, reason in bad)
    if not lacking:
        return f"{len(bad)} of {total} records cannot be decoded and are skipped: {names}"
    if lacking == len(bad):
        return (
            f"{len(bad)} of {total} records lack a feature the pipeline reads and are "
            f"skipped: {names}"
        )
    return (
        f"{len(bad)} of {total} records are skipped ({lacking} lack a feature the pipeline "
        f"reads, {len(bad) - lacking} cannot be decoded): {names}"
    )


def _among(wanted: np.ndarray, i, _record):
    return tf.reduce_any(tf.equal(i, wanted))


def skip_list_key(src: Source) -> str:
    """The JSON key (metrics.json, eval.json) that lists what ``skip_corrupt`` dropped as
    undecodable: files of an image folder, records otherwise."""
    return "skipped_corrupt_files" if src.kind == "folder" else "skipped_undecodable_records"


def decode_skips(
    source, split: str = "all", listed_in: str = "the output's JSON", counted: bool = False
) -> tuple[list[tuple[str, str]] | None, str]:
    """For a source read with ``skip_corrupt``: what the pipeline will drop as undecodable,
    and a line naming it ("" when nothing).

    An image folder's files (:func:`undecodable_files`), or records whose image does not
    decode (:func:`undecodable_records`). ``(None, line)`` when not checked (too many, or
    records not on a local disk); the line then says so, and whether the caller still
    counts what is dropped (``counted``). ``listed_in`` names the file that will list every
    one (the line names the first ten).
    """
    src = open_source(source)
    folder = src.kind == "folder"
    what = "files" if folder else "records"
    total = src.count(split)
    if not folder:
        bad = undecodable_records(src, split)
    elif total > MAX_DECODE_SCAN or src.remote:
        bad = None  # over http the check would fetch every file once more, one request each
    else:
        bad = undecodable_files(src, split)
    if bad is None:
        where = (
            f"{total} {what} are too many to check" if total > MAX_DECODE_SCAN
            else f"{what} not on a local disk are not checked"
        )
        dropped = "undecodable ones" if folder else "records whose image does not decode"
        not_named = "counted but not named" if counted else "dropped without a count"
        return None, f"{where} up front; {dropped} are {not_named}"
    if not bad:
        return bad, ""
    if folder:
        _NAMED_UP_FRONT.update(path for path, _ in bad)  # the pipeline need not name them
    names = some_files(bad, f"each listed in {listed_in} as {skip_list_key(src)}")
    if not folder:
        return bad, _bad_records_line(bad, total, names)
    return bad, f"{len(bad)} of {total} {what} cannot be decoded and are skipped: {names}"


def _finish_fn(num_classes, label_mode, normalization, aug, seed, dtype="float32", src=None):
    """``(batch index, (uint8 images, class ids)) -> (images of dtype, labels)``.

    With ``src``, a class id outside ``[0, num_classes)`` stops the pipeline with the error
    of :func:`reader.class_range_message` (one-hot, it would be a label of zeros: a run
    trained on it silently; sparse, a loss that fails naming no record).

    The per-image random parameters are drawn first (stateless, keyed by seed and batch
    index); everything that touches pixels (augmentation, cast, normalisation, mixing)
    then runs as one XLA-compiled function, which fuses it into a single pass over the
    batch instead of one pass per op. uint8 output without augmentation skips that pass.
    """

    def to_dtype(images):
        if dtype == "uint8" and images.dtype == tf.uint8:
            return images  # augmentations that keep the dtype (a flip)
        if dtype == "uint8":
            return tf.cast(tf.clip_by_value(tf.round(images), 0.0, 255.0), tf.uint8)
        return normalize(images, normalization)

    def transform(images, labels, params):
        if aug is not None:
            images = aug.apply_images(images, params)
        if aug is not None and aug.mix_ops:
            # Mixing commutes with the (affine) normalisation: mix, then normalise.
            images, labels = aug.apply_mix(tf.cast(images, tf.float32), labels, params)
        return to_dtype(images), labels

    compiled = transform
    if USE_XLA and (aug is None or aug.xla):
        compiled = tf.function(transform, jit_compile=True, reduce_retracing=True)

    head, tail, negative = reader.class_range_message(src) if src is not None else ("",) * 3

    def checked(labels):
        bad = tf.logical_or(labels < 0, labels >= num_classes)
        first = tf.gather(labels, tf.argmax(tf.cast(bad, tf.int32)))
        after = tf.where(first < 0, negative, tail)
        message = tf.strings.join([head, tf.strings.as_string(first), after])
        ok = tf.logical_not(tf.reduce_any(bad))
        with tf.control_dependencies([tf.debugging.Assert(ok, [message], summarize=1)]):
            return tf.identity(labels)

    def finish(index, batch):
        images, labels = batch
        if src is not None:
            labels = checked(labels)
        if label_mode == "one_hot":
            labels = tf.one_hot(labels, num_classes, dtype=tf.float32)
        if aug is None:
            if dtype == "uint8":
                return images, labels  # already uint8: no pass over the pixels
            return compiled(images, labels, {})
        # The batch index counts across epochs: every batch of every epoch differs.
        key = tf.stack([tf.constant(seed, tf.int64), tf.cast(index, tf.int64)])
        if isinstance(aug, augment_lib.Augment) and type(aug) is augment_lib.Augment:
            return compiled(images, labels, aug.draw(tf.shape(images)[0], key))
        images, labels = aug(images, labels, key)  # a user function: run as given
        return to_dtype(tf.cast(images, tf.float32)), labels

    return _graph(finish)


def _options(deterministic: bool, input_context) -> tf.data.Options:
    options = tfdata.options()  # no autotune thread: see petal.data.tfdata
    options.deterministic = bool(deterministic)
    options.experimental_optimization.map_parallelization = True
    options.experimental_optimization.parallel_batch = True
    if input_context is not None:
        # We shard ourselves (by file or by record); tf.distribute must not shard again.
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return options


# --- checks and settings ---------------------------------------------------------------------


class _Seed:
    def __init__(self, value: int, given: bool):
        self.value, self.given = value, given


# Seeds are taken modulo this; the ops take int64 seeds, and the stages add small offsets.
# (Modulo 2**31 - 1024, seed 2**31 - 1024 gave seed 0's batches, and a run's seed may be any
# 32-bit number.) The seeded mode's draws take it whole; the default mode's shuffle takes
# TensorFlow's seed modulo 2**31 - 1 (its order is not reproducible anyway), its
# augmentation the whole seed.
SEED_SPACE = 2**62


def _resolve_seed(seed, input_context) -> _Seed:
    if seed is None:
        return _Seed(secrets.randbelow(2**31 - 1024), False)
    seed = _plain_int(seed)  # np.int64(1) as 1, as batch_size is taken
    if not is_int_at_least(seed, 0):
        raise PetalError(f"seed must be a non-negative int or None. Received: seed={seed!r}")
    value = int(seed) % SEED_SPACE
    if input_context is not None:
        # Each input pipeline draws its own augmentation and shuffle order.
        value = (value + 7919 * input_context.input_pipeline_id) % SEED_SPACE
    return _Seed(value, True)


def _check_choice(name, value, choices):
    if isinstance(value, str) and value.lower() in choices:
        return value.lower()  # as augment names: "Unit" is "unit"
    if value not in choices:
        raise PetalError(f"{name} must be one of {', '.join(choices)}. Received: {name}={value!r}")
    return value


def _check_split(src: Source, split) -> str:
    """``split`` by its name (in any case), refused when it holds no images, naming the
    splits that do."""
    split = reader.check_split(split)
    if src.count(split) == 0:
        others = [f"{s} ({src.count(s)} images)" for s in reader.SPLITS if src.count(s)]
        fix = f"; choose a split that does: {', '.join(others)}" if others else ""
        raise PetalError(f"Split {split!r} of {src.path} holds no images{fix}.")
    return split


def _check_dtype(dtype, normalization) -> str:
    dtype = _check_choice("dtype", dtype, DTYPES)
    if dtype == "uint8" and normalization != "raw":
        raise PetalError(
            "dtype='uint8' batches hold raw 0..255 pixels: pass normalization='raw' and "
            f"normalise in the model. Received: normalization={normalization!r}"
        )
    return dtype


def _plain_int(value):
    """A numpy integer as an int (``np.int64(8)`` counts as 8); anything else as it is."""
    return int(value) if isinstance(value, np.integer) else value


def _check_batch(batch_size) -> int:
    batch_size = _plain_int(batch_size)
    if not is_int_at_least(batch_size, 1):
        raise PetalError(f"batch_size must be a positive int. Received: batch_size={batch_size!r}")
    if batch_size > MAX_COUNT:  # tf.data's batch took it for a tensor, and failed to
        raise PetalError(f"batch_size must be at most {MAX_COUNT}. Received: {batch_size}")
    return batch_size


def _check_context(input_context, skip_corrupt) -> None:
    if input_context is not None and not isinstance(input_context, tf.distribute.InputContext):
        raise PetalError(
            "input_context must be a tf.distribute.InputContext or None. "
            f"Received: input_context={input_context!r}"
        )
    skip_corrupt = need_bool(skip_corrupt, "skip_corrupt")


def _replicas_fed(input_context) -> int:
    """The replicas one input pipeline feeds: a batch each per training step."""
    if input_context is None:
        return 1
    return max(1, input_context.num_replicas_in_sync // input_context.num_input_pipelines)


def _per_replica_batch(batch_size, input_context) -> int:
    if input_context is None:
        return _check_batch(batch_size)
    return per_replica_batch(batch_size, input_context.num_replicas_in_sync)


def per_replica_batch(batch_size: int, replicas: int, name: str = "batch_size") -> int:
    """The per-replica share of a global batch (``name``: the setting it came from).

    Raises:
        PetalError: ``batch_size`` is not a positive multiple of ``replicas``; the message
            names the nearest valid sizes.
    """
    batch_size = _check_batch(batch_size)
    replicas = _plain_int(replicas)  # np.int64(2) as 2, as batch_size is taken
    if not is_int_at_least(replicas, 1):
        raise PetalError(f"replicas must be at least 1. Received: replicas={replicas!r}")
    if batch_size % replicas:
        lower = (batch_size // replicas) * replicas
        upper = lower + replicas
        nearest = f"{lower} or {upper}" if lower else f"{upper}"
        raise PetalError(
            f"Global batch size {batch_size} does not divide across {replicas} replicas; "
            f"nearest valid sizes: {nearest} (multiples of {replicas}). "
            f"Received: {name}={batch_size}"
        )
    return batch_size // replicas


def _pipeline_count(src: Source, split: str, input_context) -> int:
    """Images one input pipeline sees per epoch."""
    total = src.count(split)
    if input_context is None or input_context.num_input_pipelines <= 1:
        return total
    n, index = input_context.num_input_pipelines, input_context.input_pipeline_id
    files = src.files(split)
    if src.kind == "folder" or len(files) < n:
        return len(range(index, total, n))  # every n-th file or record, from the index-th
    return sum(src.counts(split)[index::n])


def _as_size(image_size, name: str = "image_size") -> tuple[int, int]:
    if isinstance(image_size, str):
        parts = image_size.lower().split("x")
        try:
            values = [int(p) for p in parts]
        except ValueError:
            values = []
        if len(values) == 1:
            values *= 2
    elif isinstance(_plain_int(image_size), int) and not isinstance(image_size, bool):
        values = [int(image_size)] * 2
    else:
        try:
            values = [_plain_int(v) for v in image_size]
        except TypeError:
            values = []
        # Whole numbers only: True is no size, and 32.9 is not 32.
        if not all(is_int_at_least(v, 1) for v in values):
            values = []
    if len(values) != 2 or min(values) <= 0:
        raise PetalError(
            f"{name} must be a positive int, (height, width) or 'HxW'. "
            f"Received: {name}={image_size!r}"
        )
    return values[0], values[1]


def _resolve_size(src: Source, image_size) -> tuple[int, int]:
    if image_size is not None:
        return _as_size(image_size)
    if src.image_size is not None:
        return src.image_size
    if src.kind == "folder":
        raise PetalError(
            f"Reading the image folder {src.path} needs an image_size to resize "
            "to (e.g. image_size=192). Received: image_size=None"
        )
    if not src.size_recorded:
        raise PetalError(
            f"The shards in {src.path} record no image size (no 'size' feature); pass "
            "image_size, the size of their images (e.g. image_size=192). "
            "Received: image_size=None"
        )
    raise PetalError(
        f"Records in {src.path} have mixed image sizes"
        + (" (converted with resize mode 'none')" if src.kind == "records" else "")
        + "; "
        "pass image_size to resize them to one size (e.g. image_size=192). "
        "Received: image_size=None"
    )


def upscale_warning(src: Source, size) -> str | None:
    """A warning when ``src``'s records are smaller than ``size``, the size they are read
    at (upscaling adds no detail; a model scores lower on them), else None."""
    stored, (h, w) = src.image_size, _as_size(size)
    if stored is None or (stored[0] >= h and stored[1] >= w):
        return None
    return (
        f"the records are {stored[0]}x{stored[1]} and are upscaled to {h}x{w}; for full "
        f"detail convert at that size (petal convert SRC DST --image-size {h}x{w})"
    )


def _available_memory() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0


def _cache_key(src: Source, split, size, input_context, how: str) -> str:
    """What the cached pixels depend on: the data (a conversion's time; the local files'
    paths, sizes and modification times: edited photos and rewritten shards, codelab ones
    too, are read again), the split, the size, how images are fitted (``how``) and the
    input pipeline (which share of the data it reads: its index and how many there are)."""
    created = (src.manifest or {}).get("created", "")
    if not folders.is_remote(src.path):
        stamp = hashlib.sha1(created.encode())
        for path in src.files(split):
            with contextlib.suppress(OSError):
                info = os.stat(path)
                stamp.update(f"{path}|{info.st_size}|{info.st_mtime_ns}\n".encode())
        created = stamp.hexdigest()
    pipe = (
        f"{input_context.input_pipeline_id}/{input_context.num_input_pipelines}"
        if input_context is not None
        else "0/1"
    )
    # "order": caches filled in a seed's order (earlier builds) are not reused.
    text = f"{src.path}|{created}|{split}|{size}|{how}|{pipe}|{src.count(split)}|order"
    return hashlib.sha1(text.encode()).hexdigest()[:16]


CACHE_MODES = ("auto", "off", "none", "no", "ram", "memory", "disk")


class NoRoomToCache(PetalError):
    """A disk cache of ``needed`` bytes where ``folder`` has ``free``: ``space`` says so, for
    callers whose users choose the cache another way (petal train's config) to add theirs."""

    def __init__(self, folder: str, needed: int, free: int, cache) -> None:
        self.space = (
            f"Caching {needed / 1e9:.1f} GB of decoded images needs more free space than "
            f"{folder} has ({free / 1e9:.1f} GB)"
        )
        super().__init__(
            f"{self.space}; pass cache='off' or a folder with room (cache='/path'). "
            f"Received: cache={cache!r}"
        )


def _cache_bytes(src: Source, split, size, input_context=None) -> int:
    """The bytes of ``split``'s decoded images at ``size`` that one input pipeline caches."""
    needed = src.count(split) * size[0] * size[1] * 3
    if input_context is not None and input_context.num_input_pipelines > 1:
        needed //= input_context.num_input_pipelines
    return needed


def _fits_in_ram(needed: int, available: int) -> bool:
    """cache="auto"'s rule: ``needed`` bytes are cached in RAM when they take at most
    ``RAM_CACHE_FRACTION`` of the ``available`` memory, else on local disk."""
    return needed <= RAM_CACHE_FRACTION * available


_WARNED_IN_MEMORY: set[str] = set()  # temporary folders said to be in memory


def _temporary_cache_folder() -> str:
    return os.path.join(tempfile.gettempdir(), "petal-cache")


def auto_cache_choice(src: Source, split, size) -> str:
    """Where ``cache="auto"`` keeps ``split``'s decoded images at ``size`` and why, for a log
    line: in RAM when they take at most ``RAM_CACHE_FRACTION`` of the memory available now,
    else in a temporary file on local disk (the rule :func:`train_dataset` follows)."""
    needed, available = _cache_bytes(src, split, size), _available_memory()
    share = f"{RAM_CACHE_FRACTION:.0%} of the {available / 1e9:.1f} GB of memory available"
    if _fits_in_ram(needed, available):
        return f"in RAM ({needed / 1e9:.1f} GB decoded, within {share})"
    folder = _temporary_cache_folder()
    if kind := _memory_file_system(folder):
        return (
            f"nowhere: {needed / 1e9:.1f} GB decoded is over {share}, and the temporary "
            f"folder {folder} is in memory too ({kind}); they are decoded again each epoch "
            "(TMPDIR=a folder on disk caches them there)"
        )
    return (
        f"on local disk in {folder} ({needed / 1e9:.1f} GB decoded, over "
        f"{share}; --set cache=false decodes them again each epoch instead)"
    )


def _memory_file_system(folder: str, mounts: str = "/proc/mounts") -> str | None:
    """The type of the file system ``folder`` is on (or would be made on) when it keeps its
    files in memory (tmpfs, ramfs: /tmp on many Linux systems), else None (on disk, or not
    known: no /proc/mounts)."""
    path = os.path.realpath(folder)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    best, kind = "", None
    try:
        with open(mounts, encoding="utf-8", errors="replace") as table:
            for line in table:
                fields = line.split()
                if len(fields) < 3:
                    continue
                # The kernel writes a space, tab, newline or backslash as \ooo (octal).
                point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), fields[1])
                inside = path == point or path.startswith(point.rstrip("/") + "/")
                if inside and len(point) >= len(best):
                    best, kind = point, fields[2]
    except OSError:
        return None
    return kind if kind in ("tmpfs", "ramfs") else None


def _resolve_cache(
    cache, src: Source, split, size, input_context, how: str = "", skip_corrupt: bool = False
) -> str | None:
    """None (no cache), "" (RAM) or a file prefix on local disk."""
    given = cache
    if isinstance(cache, str) and cache.lower() in CACHE_MODES:
        cache = cache.lower()  # "RAM" and "Disk" are no folder names
    if cache in (None, False, "off", "none", "no"):
        return None
    if cache in (True, "ram", "memory"):
        return ""
    needed = _cache_bytes(src, split, size, input_context)
    auto = cache == "auto"
    if auto:
        if _fits_in_ram(needed, _available_memory()):
            return ""
        cache = "disk"
    temporary = cache == "disk"
    if temporary:
        folder = _temporary_cache_folder()
        kind = _memory_file_system(folder)
        if kind and auto:
            return None  # a "disk" cache in memory takes the memory that was found short
        if kind and folder not in _WARNED_IN_MEMORY:
            # Once: each phase and input pipeline comes here.
            _WARNED_IN_MEMORY.add(folder)
            log.warning(
                "cache='disk': the temporary folder %s is in memory (%s), so this cache "
                "takes memory, not disk; set TMPDIR to a folder on disk, or use cache='off'.",
                folder, kind,
            )  # fmt: skip
        # A fresh name per dataset: two runs never share (or half-read) one cache file. The
        # name says whose it is, so that a later run removes it once its owner was killed
        # outright (SIGKILL, the OOM killer: no exit to remove it).
        key = (f"{_cache_key(src, split, size, input_context, how)}-{_owner_mark()}-"
               f"{secrets.token_hex(4)}")  # fmt: skip
    elif isinstance(cache, str | os.PathLike):
        _refuse_misspelt_mode(cache)
        folder = os.fspath(folders.expand_home(cache))
        key = _cache_key(src, split, size, input_context, how)
        if skip_corrupt:
            # The skipped records are counted as they are read, and a kept cache is not read
            # again from the records.
            raise PetalError(
                f"skip_corrupt=True with the cache folder {folder}: records skipped while it "
                "is written would not be counted by the runs that read it again; pass "
                "cache='ram', 'disk' or 'off' (kept for one run), or repair the records "
                "(petal inspect --verify names them)."
            )
    else:
        raise PetalError(
            f"cache must be 'auto', 'ram', 'disk', 'off' or a folder path. "
            f"Received: cache={cache!r}"
        )
    _make_cache_folder(folder)
    if temporary:
        _remove_orphaned_caches(folder)
    free = _disk_free(folder)
    if free and needed > 0.9 * free:
        raise NoRoomToCache(folder, needed, free, given)
    prefix = os.path.join(folder, f"{split}-{key}")
    if temporary:
        atexit.register(_remove_cache_files, prefix)
    elif not os.path.exists(f"{prefix}.index") and (
        locks := sorted(glob.glob(glob.escape(prefix) + "_*.lockfile"))
    ):
        # TensorFlow's lock of a cache being written: a run filling it now, or one killed
        # while it did (the lock stays, and every later run failed with a traceback).
        raise PetalError(
            f"The cache folder {folder} holds the lock of an unfinished cache of this data "
            f"({locks[0]}): another run is filling it, or one was stopped while it did. If "
            f"none is running, delete {prefix}_* and run again, or pass cache='off'."
        )
    return prefix


def _refuse_misspelt_mode(cache) -> None:
    """A bare name close to a cache mode ("rams") that names no folder is a misspelt mode,
    not a folder to create where the program runs; a folder is given as a path ("./rams")."""
    import difflib

    if not isinstance(cache, str) or os.sep in cache or "/" in cache or os.path.isdir(cache):
        return
    close = difflib.get_close_matches(cache.lower(), CACHE_MODES, n=1, cutoff=0.75)
    if close:
        mode = {"memory": "ram", "none": "off", "no": "off"}.get(close[0], close[0])
        raise PetalError(
            f"cache={cache!r} is no cache mode (auto, ram, disk, off) nor an existing folder: "
            f"did you mean {mode!r}? a cache folder is given as a path, e.g. ./{cache}. "
            f"Received: cache={cache!r}"
        )


def _make_cache_folder(folder: str) -> None:
    """Creates ``folder``, or says in one line why it cannot hold a cache."""
    reason = cannot_write(folder, folder=True)
    if reason is None:
        try:
            os.makedirs(folder, exist_ok=True)
        except OSError as err:
            reason = err.strerror or str(err)
    if reason is not None:
        raise PetalError(
            f"The cache folder {folder} cannot be written: {reason}; pass another folder "
            "or cache='off'."
        )


def _owner_host() -> str:
    """``h<hash>``: this machine and process-number space (a hash of the host's name and of
    the PID namespace: a shared temporary folder holds the caches of other machines and
    containers, whose processes cannot be seen from here)."""
    try:
        space = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        space = 0
    return "h" + hashlib.sha256(f"{socket.gethostname()}:{space}".encode()).hexdigest()[:8]


def _owner_mark(pid: int | None = None) -> str:
    """``h<host>-p<pid>``: :func:`_owner_host` and the process."""
    return f"{_owner_host()}-p{os.getpid() if pid is None else pid}"


# A temporary cache's files: ``{split}-{key}-h{host}-p{pid}-{token}`` and TensorFlow's
# suffix (``.index``, ``.data-*``, ``_*.lockfile``).
_TEMPORARY_CACHE = re.compile(r"-(h[0-9a-f]{8})-p(\d+)-[0-9a-f]{8}[._]")


def _remove_orphaned_caches(folder: str) -> list[str]:
    """Removes the temporary caches in ``folder`` of this machine's processes that are gone
    (killed outright, their exit never ran :func:`_remove_cache_files`: each left a decoded
    copy of a split behind); returns the names removed. A process that is still running, or
    that cannot be told apart from one (its number taken again), keeps its cache."""
    removed = []
    host = _owner_host()
    try:
        names = os.listdir(folder)
    except OSError:
        return removed
    for name in names:
        found = _TEMPORARY_CACHE.search(name)
        if not found or found.group(1) != host or _running(int(found.group(2))):
            continue
        with contextlib.suppress(OSError):
            os.remove(os.path.join(folder, name))
            removed.append(name)
    return removed


def _running(pid: int) -> bool:
    if os.name != "posix":  # os.kill ends the process there: none is taken for gone
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's (PermissionError), or no way to tell: kept
        return True
    return True


def _remove_cache_files(prefix: str) -> None:
    """Delete a temporary disk cache (``prefix.index``, ``prefix.data-*``) at exit."""
    folder, name = os.path.split(prefix)
    try:
        for entry in os.listdir(folder):
            if entry.startswith(name + "."):
                os.remove(os.path.join(folder, entry))
    except OSError:
        pass


def _disk_free(folder: str) -> int:
    try:
        st = os.statvfs(folder)
        return st.f_bavail * st.f_frsize
    except (OSError, AttributeError):
        return 0
