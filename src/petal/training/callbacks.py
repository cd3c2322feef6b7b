"""Keras callbacks of the training loop: one metrics sink, a NaN guard and checkpoints.

* :class:`MetricsWriter` adds ``lr``, ``images_per_sec`` and ``epoch_seconds`` to the
  epoch logs (so TensorBoard, placed after it, records them too), appends one row per
  epoch to ``history.csv`` and prints one concise line per epoch.
* :class:`NanGuard` stops training on the first non-finite loss and remembers where.
* :class:`ScalarLogger` writes the epoch scalars as TensorBoard event files.
* :class:`Checkpointer` writes ``best.weights.h5`` when validation accuracy improves and
  ``last.keras`` (model + optimizer state) plus ``state.json`` after every epoch, each
  through a temporary file so an interruption never leaves a half-written checkpoint, with
  Ctrl-C and SIGTERM held until all of them are written.
"""

from __future__ import annotations

import csv
import io
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import keras

from petal.jsonfile import failed_write, save_atomically, temporary_name, write_json
from petal.running import signals_held

HISTORY_FIELDS = (
    "epoch",
    "loss",
    "accuracy",
    "val_loss",
    "val_accuracy",
    "lr",
    "lr_end",
    "lr_max",
    "lr_max_at",
    "images_per_sec",
    "epoch_seconds",
)


def current_lr(optimizer) -> float:
    """The optimizer's learning rate at its current step (schedules are evaluated)."""
    lr = optimizer.learning_rate
    try:
        return float(keras.ops.convert_to_numpy(lr))
    except (TypeError, ValueError):
        return float("nan")


def _schedule_and_steps(optimizer):
    """``(schedule, steps taken)`` of ``optimizer`` (a loss-scale wrapper's inner one);
    ``schedule`` is None for a fixed rate."""
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    schedule = getattr(inner, "_learning_rate", None)
    if not isinstance(schedule, keras.optimizers.schedules.LearningRateSchedule):
        schedule = None
    return schedule, int(keras.ops.convert_to_numpy(inner.iterations))


def last_step_lr(optimizer) -> float:
    """The rate the optimizer's last step used (:func:`current_lr` gives the next step's).

    They differ for a schedule: after an epoch, the schedule at ``iterations`` is already
    the next epoch's first rate.
    """
    schedule, steps = _schedule_and_steps(optimizer)
    if schedule is not None and steps >= 1:
        return float(keras.ops.convert_to_numpy(schedule(steps - 1)))
    return current_lr(optimizer)


def highest_lr(optimizer, first_step: int) -> tuple[float, float]:
    """The highest rate the schedule gave the steps from ``first_step`` to the optimizer's
    last, and where: its step's offset from ``first_step`` over their number (0 the first
    step, 0.5 halfway). NaNs without a schedule, or for one that takes no array of steps.

    A warm-up that ends inside an epoch peaks between its first and last steps' rates.
    """
    import numpy as np

    schedule, taken = _schedule_and_steps(optimizer)
    if schedule is None or taken <= first_step:
        return math.nan, math.nan
    steps = np.arange(first_step, taken, dtype=np.int64)
    try:
        rates = np.asarray(keras.ops.convert_to_numpy(schedule(steps)), dtype=np.float64)
    except Exception:  # a user's schedule written for one step at a time
        return math.nan, math.nan
    if rates.shape != steps.shape:
        return math.nan, math.nan
    top = int(np.argmax(rates))
    return float(rates[top]), top / len(steps)


def read_history(path: str | Path, cut_short_last_row: str = "raise") -> list[dict]:
    """Rows of ``history.csv`` with numeric values (empty cells become NaN).

    Args:
        path: the file; a missing one has no rows.
        cut_short_last_row: ``"raise"`` or ``"drop"`` a last row with fewer cells than the
            header, which is what a run killed while writing it leaves.

    Raises:
        ValueError: a row with fewer or more cells than the header (naming its line), or a
            cell that is not a number.
    """
    path = Path(path)
    if not path.is_file():
        return []
    rows = []
    with path.open(newline="") as f:
        lines = list(csv.DictReader(f))
    for i, row in enumerate(lines):
        if None in row.values() or None in row:  # fewer cells, or more, than the header
            if cut_short_last_row == "drop" and i == len(lines) - 1 and None in row.values():
                break
            raise ValueError(f"line {i + 2} does not have one cell per column")
        rows.append(
            {
                k: (int(v) if k == "epoch" else float(v) if v != "" else math.nan)
                for k, v in row.items()
            }
        )
    return rows


def truncate_history(path: str | Path, epochs: int) -> None:
    """Keep the first ``epochs`` rows (resume drops rows of an unfinished epoch, and a last
    row cut short by the interruption)."""
    rows = [r for r in read_history(path, "drop") if r["epoch"] <= epochs]
    _write_rows(Path(path), rows)


def _write_rows(path: Path, rows: list[dict]) -> None:
    """``rows`` as the whole of ``path``, through a temporary file: a rewrite stopped (a
    second Ctrl-C, a full disk) leaves the rows there were, not a file cut short."""

    def save(tmp: str) -> None:
        with open(tmp, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=HISTORY_FIELDS, extrasaction="ignore")
            writer.writeheader()
            for row in rows:
                writer.writerow({k: _fmt(row.get(k)) for k in HISTORY_FIELDS})

    save_atomically(path, save)


def _fmt(value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, float):
        return f"{value:.8g}"
    return str(value)


class MetricsWriter(keras.callbacks.Callback):
    """One row per epoch in ``history.csv`` and one line per epoch on the console.

    ``lr`` is the rate at the epoch's first step and ``lr_end`` at its last, ``lr_max`` a
    higher rate between them and ``lr_max_at`` where (0.5: halfway; empty when there is none,
    as after a warm-up that ends on an epoch's boundary); the console line shows the first
    two when a per-step schedule changed the rate within the epoch (``lr 0.00e+00 ->
    2.87e-03`` in a warm-up epoch). Images/s counts training images only: the
    clock runs from the start of the epoch to the start of validation, so the first epoch
    includes tracing and compilation.

    Args:
        path: the ``history.csv`` file (appended to; created with a header).
        images_per_step: global batch size.
        steps_per_epoch: training steps per epoch.
        epochs: total epochs, for the ``epoch 3/35`` display.
        log: where lines go (``print`` to stdout by default).
        defer: keep each epoch's line for :meth:`announce` to print (the checkpoint's, once
            the epoch is saved, so a line on the console means its epoch is saved).
    """

    def __init__(
        self,
        path: str | Path,
        images_per_step: int,
        steps_per_epoch: int,
        epochs: int,
        log: Callable[[str], None] | None = None,
        defer: bool = False,
    ):
        super().__init__()
        self.defer = defer
        self._pending: str | None = None
        self.path = Path(path)
        self.images_per_epoch = images_per_step * steps_per_epoch
        self.epochs = epochs
        self.log = log or (lambda line: print(line, flush=True))
        self.train_seconds = 0.0
        self._epoch_start = 0.0
        self._train_end: float | None = None
        if not self.path.exists():
            _write_rows(self.path, [])

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_start = time.perf_counter()
        self._train_end = None
        # The rate at the epoch's first step (the codelab's per-epoch value).
        self._lr = current_lr(self.model.optimizer)
        self._first_step = _schedule_and_steps(self.model.optimizer)[1]

    def on_test_begin(self, logs=None):
        # Validation inside fit(): stop the training clock here.
        if self._train_end is None:
            self._train_end = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        logs = logs if logs is not None else {}
        now = time.perf_counter()
        train_seconds = (self._train_end or now) - self._epoch_start
        self.train_seconds += train_seconds
        logs["lr"] = self._lr
        logs["images_per_sec"] = self.images_per_epoch / max(train_seconds, 1e-9)
        logs["epoch_seconds"] = now - self._epoch_start
        row = {k: _as_float(logs.get(k)) for k in HISTORY_FIELDS}
        row["epoch"] = epoch + 1
        # Not in the epoch logs (TensorBoard's lr stays the epoch's first rate).
        row["lr_end"] = last_step_lr(self.model.optimizer)
        # A peak between them (a warm-up ending inside the epoch), for the lr plot.
        peak, at = highest_lr(self.model.optimizer, self._first_step)
        # (Above them by more than float rounding: a long cosine's peak is under 1% above.)
        if peak > (1 + 1e-4) * max(row["lr"], row["lr_end"]):  # False for NaN
            row["lr_max"], row["lr_max_at"] = peak, at
        try:
            with self.path.open("a", newline="") as f:
                csv.DictWriter(f, fieldnames=HISTORY_FIELDS, extrasaction="ignore").writerow(
                    {k: _fmt(row[k]) for k in HISTORY_FIELDS}
                )
        except OSError as err:
            if err.filename is not None:
                raise
            # A write's error (a full disk) names no file: the message said none.
            raise OSError(err.errno, err.strerror, str(self.path)) from err
        line = format_epoch_line(row, self.epochs)
        if self.defer:
            self._pending = line
        else:
            self.log(line)

    def announce(self) -> None:
        """Print the kept epoch line (see ``defer``), if one is kept."""
        line, self._pending = self._pending, None
        if line is not None:
            self.log(line)


def _as_float(value) -> float:
    if value is None:
        return math.nan
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def format_epoch_line(row: dict, epochs: int) -> str:
    """``epoch  3/35  loss 1.234  acc 0.456  val_loss 1.101  val_acc 0.552  lr 1.0e-03  ...``.

    ``row["lr_end"]`` (the epoch's last rate), when given and more than 1% away from
    ``row["lr"]``, is shown as ``lr FIRST -> LAST``.
    """
    width = len(str(epochs))
    parts = [f"epoch {row['epoch']:>{width}}/{epochs}"]
    for key, label in (
        ("loss", "loss"),
        ("accuracy", "acc"),
        ("val_loss", "val_loss"),
        ("val_accuracy", "val_acc"),
    ):
        value = row.get(key, math.nan)
        if not math.isnan(value):
            parts.append(f"{label} {value:.4f}")
    lr, lr_end = row["lr"], row.get("lr_end", math.nan)
    moved = abs(lr_end - lr) > 0.01 * max(abs(lr), abs(lr_end))  # False for NaN
    parts.append(f"lr {lr:.2e} -> {lr_end:.2e}" if moved else f"lr {lr:.2e}")
    parts.append(f"{per_second(row['images_per_sec'])} img/s")
    parts.append(f"{row['epoch_seconds']:.1f} s")
    return "  ".join(parts)


def per_second(rate: float) -> str:
    """A rate for a log line: whole numbers, halves rounded up (the closing line's stored
    112.5 shows as its epoch line's 112.536 did), but two figures below 10 (0.4, not 0)."""
    if not math.isfinite(rate):
        return f"{rate:.0f}"
    return f"{math.floor(rate + 0.5)}" if rate >= 9.95 else f"{rate:.2g}"


class NanGuard(keras.callbacks.Callback):
    """Stops training at the first non-finite training loss, or validation loss (weights that
    blew up in an epoch's last step: the step's loss was computed before it); ``nan_epoch``
    says where (1-based), ``nan_what`` which loss."""

    def __init__(self):
        super().__init__()
        self.nan_epoch: int | None = None
        self.nan_step: int | None = None
        self.nan_what = "loss"
        self._epoch = 0

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        loss = (logs or {}).get("loss")
        if loss is None or self.nan_epoch is not None:
            return
        if not math.isfinite(float(loss)):
            self.nan_epoch = self._epoch + 1
            self.nan_step = batch + 1
            self.model.stop_training = True

    def on_epoch_end(self, epoch, logs=None):
        logs = logs or {}
        for key, what in (("loss", "loss"), ("val_loss", "validation loss")):
            value = logs.get(key)
            if self.nan_epoch is None and value is not None and not math.isfinite(float(value)):
                self.nan_epoch, self.nan_what = epoch + 1, what
                self.model.stop_training = True


class Checkpointer(keras.callbacks.Callback):
    """Best weights by validation accuracy, and the last full model + ``state.json`` each epoch.

    Args:
        workdir: the run's work directory.
        state: the dict saved as ``state.json``; updated in place (``epoch``,
            ``best_epoch``, ``best_val_accuracy``, ``wall_seconds``) and saved after
            ``last.keras``, so the state never points at a checkpoint not yet written.
        clock: returns the wall-clock seconds of the run so far (for ``wall_seconds``).
        nan_guard: epochs with a non-finite loss are not checkpointed.
        saved: called once an epoch is saved (to print its line), before a Ctrl-C or
            SIGTERM that came meanwhile stops training.
        before_state: called before each ``state.json`` is written (a resume's
            ``config.json``, with its first saved epoch).
    """

    def __init__(
        self,
        workdir: str | Path,
        state: dict,
        clock: Callable[[], float] | None = None,
        nan_guard: NanGuard | None = None,
        saved: Callable[[], None] | None = None,
        before_state: Callable[[], None] | None = None,
    ):
        super().__init__()
        self.workdir = Path(workdir)
        self.state = state
        self.clock = clock
        self.nan_guard = nan_guard
        self.saved = saved
        self.before_state = before_state

    def on_epoch_end(self, epoch, logs=None):
        logs = logs or {}
        if self.nan_guard is not None and self.nan_guard.nan_epoch is not None:
            return
        # Ctrl-C and SIGTERM wait for the epoch's files: Keras swallowed a signal raised
        # while it opened a weight store (training went on), and a signal between two files
        # left a best.weights.h5 of an epoch that state.json did not name.
        with signals_held():
            self._save(epoch, logs)
            if self.saved is not None:
                self.saved()

    def _save(self, epoch: int, logs: dict) -> None:
        best = self.workdir / "best.weights.h5"
        state = {**self.state, "epoch": epoch + 1}  # ``self.state`` once it is written
        val_acc = logs.get("val_accuracy")
        improved = val_acc is not None and float(val_acc) > state.get("best_val_accuracy", -1.0)
        if improved:
            try:
                save_weights(self.model, temporary_name(best))
            except BaseException as err:
                failed_write(err, best, temporary_name(best))
                raise
            state["best_val_accuracy"] = float(val_acc)
            state["best_epoch"] = epoch + 1
        if self.clock is not None:
            state["wall_seconds"] = round(self.clock(), 2)
        try:
            save_atomically(self.workdir / "last.keras", self.model.save)
            if self.before_state is not None:
                self.before_state()
            write_json(self.workdir / "state.json", state)
        except BaseException as err:
            # The epoch is not saved: its best weights are not kept either.
            tmp = temporary_name(best) if improved else None
            failed_write(err, self.workdir / "state.json", tmp)
            raise
        self.state.update(state)
        if improved:
            # Only once state.json names its epoch: a resume keeps the state's best.
            os.replace(temporary_name(best), best)


class _WeightsBuffer(io.BytesIO):
    """An in-memory file Keras writes a ``.weights.h5`` into: it checks the file's name (its
    suffix picks the format) through ``str()``, and writes into an ``io.BytesIO`` as it does
    inside a ``.keras`` archive. A Keras (or a test's stand-in) that takes it for the path it
    names writes that file instead."""

    def __init__(self, path: Path):
        super().__init__()
        self.path = path

    def __str__(self) -> str:
        return str(self.path)

    def __fspath__(self) -> str:
        return str(self.path)


def save_weights(model, path: Path) -> None:
    """``model.save_weights(path)`` through memory.

    HDF5 writing the file itself on a full disk left it open, failing to flush at each close:
    Python's exit then printed h5py's errors and crashed (a segmentation fault). Written here,
    a failed write is a plain OSError and its file is closed.
    """
    try:  # Keras copies a file it writes to a path it counts as remote (/gcs/: a GCS mount)
        from keras.src.utils.file_utils import is_remote_path
    except ImportError:  # another Keras: its own way
        is_remote_path = None
    if is_remote_path is None or is_remote_path(str(path)):
        model.save_weights(str(path))
        return
    buffer = _WeightsBuffer(path)
    model.save_weights(buffer)
    if not buffer.getbuffer().nbytes:  # a Keras that took the name only wrote the file
        return
    with open(path, "wb") as f:
        f.write(buffer.getbuffer())


class ErrorGuard(keras.callbacks.Callback):
    """Stops training with the error ``error_since()`` returns once it returns one: what
    the input pipeline meets without raising, with ``skip_corrupt`` (a failed request to a
    remote store, which ends the stream quietly: :func:`petal.data.remote.store_error`; a
    sound shard of another count, which the reader only logs:
    :meth:`petal.data.reader.SkipCounter.miscount_since`), so that training does not go on
    with what was read before."""

    def __init__(self, error_since: Callable[[], Exception | None]):
        super().__init__()
        self.error_since = error_since

    def _check(self, *_, **__):
        if (error := self.error_since()) is not None:
            raise error

    on_train_batch_end = on_test_batch_end = on_epoch_end = _check


class StepProgress(keras.callbacks.Callback):
    """A tqdm bar over the steps of each epoch, only when stderr is a terminal.

    The bar is cleared when validation begins (and at the end of an epoch without it), so
    the epoch's line, printed once the epoch is saved, starts on a clean line.
    """

    def __init__(self, steps_per_epoch: int):
        super().__init__()
        self.steps = steps_per_epoch
        self.enabled = sys.stderr.isatty()
        self._bar = None
        self._begin = 0  # the step the execution in progress began at
        self._per_execution = 1

    def on_epoch_begin(self, epoch, logs=None):
        if self.enabled:
            from tqdm import tqdm

            self._bar = tqdm(total=self.steps, desc=f"epoch {epoch + 1}", leave=False, unit="step")
            try:
                self._per_execution = max(1, int(getattr(self.model, "steps_per_execution", 1)))
            except (TypeError, ValueError):
                self._per_execution = 1

    def on_train_batch_begin(self, batch, logs=None):
        self._begin = batch

    def on_train_batch_end(self, batch, logs=None):
        # Keras calls these once per execution: with steps_per_execution 4 the bar counted
        # a quarter of the epoch, its rate and time left four times off. Recent Keras
        # passes the execution's last step here, older versions its first: either way the
        # execution ran from its first step for steps_per_execution steps.
        if self._bar is None:
            return
        done = min(self.steps, max(batch + 1, self._begin + self._per_execution))
        if done > self._bar.n:
            self._bar.update(done - self._bar.n)

    def on_test_begin(self, logs=None):
        self._close()

    def on_epoch_end(self, epoch, logs=None):
        self._close()

    def _close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


class ScalarLogger(keras.callbacks.Callback):
    """Epoch scalars as TensorBoard event files, in ``train/`` and ``validation/`` runs.

    Keras' own TensorBoard callback needs the ``tensorboard`` package for
    ``tf.summary.scalar``; the core op ``tf.summary.write`` with the scalars plugin's
    metadata writes the same records without it, so logs exist even where TensorBoard is
    not installed (view them wherever it is: ``tensorboard --logdir WORKDIR/tensorboard``).
    Place it after :class:`MetricsWriter` so ``lr`` and ``images_per_sec`` are included.

    An epoch a non-finite loss stopped gets no scalars (it is not saved, and a resume trains
    it again). Each session's event files start with TensorBoard's restart marker (a
    ``SessionLog.START`` event at its first epoch), on which TensorBoard drops what earlier
    files hold for that epoch and later ones: an epoch written but not saved (a failed
    checkpoint, a kill in between) is shown once, as trained again.

    Args:
        log_dir: the ``tensorboard/`` folder.
        nan_guard: epochs it stopped get no scalars.
    """

    def __init__(self, log_dir: str | Path, nan_guard: NanGuard | None = None):
        super().__init__()
        self.log_dir = Path(log_dir)
        self.nan_guard = nan_guard
        self._writers: dict = {}
        self._first_step: int | None = None

    def _writer(self, run: str):
        import tensorflow as tf

        if run not in self._writers:
            writer = tf.summary.create_file_writer(str(self.log_dir / run))
            start = tf.compat.v1.Event(
                step=self._first_step, wall_time=time.time(),
                session_log=tf.compat.v1.SessionLog(status=tf.compat.v1.SessionLog.START),
            )
            try:  # tf.summary writes no other event publicly: TensorFlow's own module
                from tensorflow.python.ops import summary_ops_v2

                import_event = summary_ops_v2.import_event
            except (ImportError, AttributeError):  # another TensorFlow: no marker, scalars still
                import_event = None
            if import_event is not None:
                with writer.as_default():
                    import_event(tf.constant(start.SerializeToString()))
            self._writers[run] = writer
        return self._writers[run]

    def on_epoch_begin(self, epoch, logs=None):
        if self._first_step is None:
            self._first_step = epoch + 1

    def on_epoch_end(self, epoch, logs=None):
        import tensorflow as tf
        from tensorflow.core.framework import summary_pb2

        if self.nan_guard is not None and self.nan_guard.nan_epoch is not None:
            return
        metadata = summary_pb2.SummaryMetadata()
        metadata.plugin_data.plugin_name = "scalars"
        blob = metadata.SerializeToString()
        for key, value in (logs or {}).items():
            value = _as_float(value)
            if math.isnan(value):
                continue
            run, tag = ("validation", key[4:]) if key.startswith("val_") else ("train", key)
            with self._writer(run).as_default():
                tf.summary.write(
                    f"epoch_{tag}", tf.constant(value, tf.float32), step=epoch + 1, metadata=blob
                )
        for writer in self._writers.values():
            writer.flush()

    def on_train_end(self, logs=None):
        for writer in self._writers.values():
            writer.close()
        self._writers.clear()
