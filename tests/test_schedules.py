"""Learning-rate schedules: golden values, per-step use by the optimizer, serialisation."""

from __future__ import annotations

import math
import re

import keras
import numpy as np
import pytest

from petal.errors import PetalError
from petal.training.schedules import (
    StepSchedule,
    build_schedule,
    codelab_max_lr,
    codelab_ramp,
    constant,
    epochs_to_steps,
    per_epoch_values,
    scale_lr,
    warmup_cosine,
)

# The codelab Xception notebook's per-epoch rates on 8 replicas (epochs 0..11).
CODELAB_8_REPLICAS = [
    1e-5, 8.8e-5, 1.66e-4, 2.44e-4, 3.22e-4, 4e-4,
    3.22e-4, 2.596e-4, 2.097e-4, 1.697e-4, 1.378e-4, 1.122e-4,
]  # fmt: skip


def test_codelab_ramp_golden_values_at_epoch_boundaries():
    for interpolate in (False, True):
        fn = codelab_ramp(23, replicas=8, interpolate=interpolate)
        values = per_epoch_values(fn, 12, 23)
        # The golden values are printed to 4 significant digits.
        np.testing.assert_allclose(values, CODELAB_8_REPLICAS, rtol=5e-4)
    # Exact to float32 against the formula.
    fn = codelab_ramp(23, replicas=8)
    assert float(fn(11 * 23)) == pytest.approx(3.9e-4 * 0.8**6 + 1e-5, rel=1e-6)
    assert float(fn(5 * 23)) == pytest.approx(4e-4, rel=1e-6)


def test_codelab_ramp_per_step():
    stepped = codelab_ramp(10, replicas=8)
    smooth = codelab_ramp(10, replicas=8, interpolate=True)
    # Constant within an epoch (the codelab's per-epoch callback), ...
    assert float(stepped(10)) == float(stepped(19)) == pytest.approx(8.8e-5, rel=1e-6)
    # ... or linear inside the ramp, continuous through the decay.
    assert float(smooth(15)) == pytest.approx((8.8e-5 + 1.66e-4) / 2, rel=1e-6)
    assert 3.22e-4 > float(smooth(65)) > 2.596e-4


def test_codelab_ramp_replicas_and_sustain():
    assert codelab_max_lr(8) == pytest.approx(4e-4) and codelab_max_lr(1) == pytest.approx(2e-4)
    assert float(codelab_ramp(1)(5)) == pytest.approx(2e-4, rel=1e-6)
    fn = codelab_ramp(1, max_lr=1e-3, sustain_epochs=2)
    # As in the codelab's lrfn, the decay starts from the peak at epoch rampup + sustain.
    expected = [1e-3, 1e-3, 1e-3, (1e-3 - 1e-5) * 0.8 + 1e-5]
    assert [float(fn(e)) for e in (5, 6, 7, 8)] == pytest.approx(expected, rel=1e-6)


def test_warmup_cosine_and_constant():
    fn = warmup_cosine(10, peak_lr=1e-3, total_epochs=10, warmup_epochs=2, end_lr=1e-5)
    assert float(fn(0)) == 0.0
    assert float(fn(10)) == pytest.approx(5e-4, rel=1e-6)
    assert float(fn(20)) == pytest.approx(1e-3, rel=1e-6)
    assert float(fn(60)) == pytest.approx(1e-5 + 0.5 * (1e-3 - 1e-5), rel=1e-5)
    assert float(fn(100)) == pytest.approx(1e-5, rel=1e-5)
    assert float(fn(500)) == pytest.approx(1e-5, rel=1e-5)
    expected = 1e-5 + 0.5 * (1e-3 - 1e-5) * (1 + math.cos(math.pi * 10 / 80))
    assert float(fn(30)) == pytest.approx(expected, rel=1e-5)
    assert float(constant(lr=3e-4)(12345)) == pytest.approx(3e-4)


def test_scaling_and_durations():
    assert scale_lr(1e-3, 512, reference_batch=256) == pytest.approx(2e-3)
    assert scale_lr(1e-3, 64, reference_batch=256, rule="sqrt") == pytest.approx(5e-4)
    assert epochs_to_steps(2.5, 10) == 25
    with pytest.raises(PetalError, match="steps_per_epoch=0"):
        epochs_to_steps(1, 0)
    with pytest.raises(PetalError, match="rule='cubic'"):
        scale_lr(1e-3, 64, rule="cubic")
    with pytest.raises(PetalError, match="warmup_epochs"):
        warmup_cosine(10, peak_lr=1e-3, total_epochs=1, warmup_epochs=2)


def test_step_schedule_serialises_and_drives_the_optimizer_per_step():
    schedule = build_schedule("codelab_ramp", steps_per_epoch=2, replicas=8, interpolate=True)
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(schedule))
    assert isinstance(restored, StepSchedule)
    assert restored.get_config() == {
        "name": "codelab_ramp",
        "steps_per_epoch": 2,
        "replicas": 8,
        "interpolate": True,
    }

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, activation="softmax")])
    optimizer = keras.optimizers.Adam(learning_rate=schedule)
    model.compile(optimizer, "categorical_crossentropy")  # compiled (graph) train step
    x = np.ones((12, 3), "float32")
    y = np.eye(2, dtype="float32")[[0, 1] * 6]
    model.fit(x, y, batch_size=4, epochs=1, verbose=0)  # 3 optimizer steps
    assert int(optimizer.iterations.numpy()) == 3
    # 1.5 epochs in: halfway between the epoch-1 and epoch-2 codelab rates.
    assert float(optimizer.learning_rate) == pytest.approx((8.8e-5 + 1.66e-4) / 2, rel=1e-5)


def test_unknown_schedule():
    with pytest.raises(PetalError, match="Unknown learning-rate schedule 'step'.*codelab_ramp"):
        build_schedule("step")
    # Only options one may choose are offered: training sets the rate from learning_rate.
    with pytest.raises(PetalError, match=r"^Schedule 'constant' takes no option 'warmup_epochs'; "
                       r"it has no options besides its rate lr \(petal train sets it from "
                       r"learning_rate\)\. Received: warmup_epochs=1$"):  # fmt: skip
        build_schedule("constant", lr=1e-3, warmup_epochs=1)
    with pytest.raises(PetalError, match=r"'warmup_cosine' takes no option 'gamma'; its options "
                       r"are: total_epochs, warmup_epochs, start_lr, end_lr, besides its rate "
                       r"peak_lr \(petal train sets it from learning_rate\)\."):  # fmt: skip
        build_schedule("warmup_cosine", steps_per_epoch=2, peak_lr=1.0, total_epochs=2, gamma=1)
    with pytest.raises(PetalError, match=r"options are: start_lr, min_lr, rampup_epochs, "
                       r"sustain_epochs, decay, interpolate, besides its rate max_lr \(petal "
                       r"train sets it from learning_rate when that is set\) and replicas "
                       r"\(petal train sets them from its strategy\)"):  # fmt: skip
        build_schedule("codelab_ramp", steps_per_epoch=2, gamma=0.1)


@pytest.mark.parametrize(
    "options, message",
    [
        (
            {"warmup_epochs": "x"},
            "warmup_epochs must be a finite number. Received: warmup_epochs='x'",
        ),
        ({"peak_lr": float("nan")}, "peak_lr must be a finite number"),
        ({"end_lr": True}, "end_lr must be a finite number"),
        ({"start_lr": -1e-3}, "start_lr must be >= 0"),
    ],
)
def test_schedule_options_of_the_wrong_kind_are_one_line(options, message):
    kwargs = {"steps_per_epoch": 10, "peak_lr": 1e-3, "total_epochs": 5, **options}
    with pytest.raises(PetalError, match=re.escape(message)):
        build_schedule("warmup_cosine", **kwargs)
    with pytest.raises(PetalError, match="interpolate must be true or false"):
        build_schedule("codelab_ramp", steps_per_epoch=10, interpolate="yes")
    build_schedule("codelab_ramp", steps_per_epoch=10, max_lr=None, interpolate=True)  # valid


def test_epoch_line_shows_how_a_per_step_schedule_moved_within_the_epoch(tmp_path):
    from petal.training.callbacks import MetricsWriter, format_epoch_line, read_history

    # A one-epoch warm-up: its first step runs at 0, which alone would read "lr 0.00e+00".
    schedule = build_schedule(
        "warmup_cosine", steps_per_epoch=2, peak_lr=1e-2, total_epochs=2, warmup_epochs=1
    )
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, activation="softmax")])
    model.compile(keras.optimizers.SGD(learning_rate=schedule), "categorical_crossentropy")
    x, y = np.ones((8, 3), np.float32), np.eye(2, dtype=np.float32)[[0, 1] * 4]
    lines = []
    writer = MetricsWriter(tmp_path / "history.csv", 4, 2, 2, log=lines.append)
    model.fit(x, y, batch_size=4, epochs=2, callbacks=[writer], verbose=0)
    # Epoch 1's two steps ran at 0 and 5e-3; epoch 2's at the peak, then halfway down.
    assert "lr 0.00e+00 -> 5.00e-03" in lines[0], lines[0]
    assert "lr 1.00e-02 -> 5.00e-03" in lines[1], lines[1]
    # history.csv keeps the rates of each epoch's first and last steps (for the lr plot).
    rows = read_history(tmp_path / "history.csv")
    assert [r["lr"] for r in rows] == pytest.approx([0, 1e-2])
    assert [r["lr_end"] for r in rows] == pytest.approx([5e-3, 5e-3])
    # The codelab's schedule holds each epoch's rate for all its steps: shown once.
    model.compile(
        keras.optimizers.SGD(learning_rate=build_schedule("codelab_ramp", steps_per_epoch=2)),
        "categorical_crossentropy",
    )
    lines.clear()
    model.fit(x, y, batch_size=4, epochs=2, callbacks=[writer], verbose=0)
    assert "lr 1.00e-05  " in lines[0] and "->" not in lines[0], lines[0]
    assert "->" not in lines[1], lines[1]
    # A rate that did not move is shown once.
    row = {"epoch": 1, "lr": 1e-3, "lr_end": 1e-3, "images_per_sec": 10.0, "epoch_seconds": 1.0}
    assert "lr 1.00e-03  10 img/s" in format_epoch_line(row, 35)
    del row["lr_end"]
    assert "lr 1.00e-03  10 img/s" in format_epoch_line(row, 35)
    # A slow epoch (one that compiles, a large model on 2 cores) read "0 img/s".
    for rate, shown in ((0.4, "0.4"), (2.345, "2.3"), (9.96, "10"), (1234.5, "1235")):
        assert f"lr 1.00e-03  {shown} img/s" in format_epoch_line(
            {**row, "images_per_sec": rate}, 35
        )


def test_history_keeps_a_warm_up_peak_inside_an_epoch_for_the_lr_plot(tmp_path):
    """Half an epoch of warm-up (the quick preset's) peaks between the epoch's first and
    last steps: the lr plot drew a line from 0 to the last step's rate, below the peak."""
    from petal.evaluation import plots
    from petal.training.callbacks import MetricsWriter, read_history

    schedule = build_schedule(
        "warmup_cosine", steps_per_epoch=4, peak_lr=1e-2, total_epochs=2, warmup_epochs=0.5
    )
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, activation="softmax")])
    model.compile(keras.optimizers.SGD(learning_rate=schedule), "categorical_crossentropy")
    x, y = np.ones((8, 3), np.float32), np.eye(2, dtype=np.float32)[[0, 1] * 4]
    writer = MetricsWriter(tmp_path / "history.csv", 2, 4, 2, log=lambda line: None)
    model.fit(x, y, batch_size=2, epochs=2, callbacks=[writer], verbose=0)
    rows = read_history(tmp_path / "history.csv")
    # Epoch 1's steps ran at 0, 5e-3, 1e-2 (the peak, step 3 of 4) and 9.33e-3.
    last = 0.5e-2 * (1 + np.cos(np.pi / 6))
    assert [rows[0][k] for k in ("lr", "lr_max", "lr_max_at")] == pytest.approx([0, 1e-2, 0.5])
    assert rows[0]["lr_end"] == pytest.approx(last)
    # Epoch 2 only decays: no peak between its first and last steps.
    assert np.isnan(rows[1]["lr_max"]) and np.isnan(rows[1]["lr_max_at"])
    xs, ys = plots.lr_points(rows, [{"from_epoch": 1, "steps_per_epoch": 4}])
    assert xs.tolist() == [0, 0.5, 0.75, 1, 1.75]
    assert ys == pytest.approx([0, 1e-2, last, schedule(4), schedule(7)])
    assert max(ys) == pytest.approx(1e-2)
    # A peak under 1% above the epoch's last rate (a long cosine after it) was not kept: the
    # plot drew the warm-up running to the epoch's end.
    schedule = build_schedule(
        "warmup_cosine", steps_per_epoch=7, peak_lr=3e-3, total_epochs=8, warmup_epochs=0.5
    )
    model.compile(keras.optimizers.SGD(learning_rate=schedule), "categorical_crossentropy")
    writer = MetricsWriter(tmp_path / "long.csv", 1, 7, 2, log=lambda line: None)
    model.fit(np.ones((14, 3), np.float32), np.eye(2, dtype=np.float32)[[0, 1] * 7],
              batch_size=2, epochs=1, callbacks=[writer], verbose=0)  # fmt: skip
    row = read_history(tmp_path / "long.csv")[0]
    rates = [float(schedule(step)) for step in range(7)]
    assert max(rates) < 1.01 * rates[-1]
    assert (row["lr_max"], row["lr_max_at"]) == pytest.approx((max(rates), 4 / 7))


def test_history_keeps_accuracies_as_the_epoch_line_shows_them(tmp_path):
    """216 of 593 right: float32 0.36424958 reads "val_acc 0.3642" in the epoch line; kept
    to 6 digits (0.36425) it read "0.3643" in train's closing line and metrics.json."""
    from petal.training.callbacks import _write_rows, format_epoch_line, read_history

    acc = float(np.float32(216 / 593))
    row = {"epoch": 1, "val_accuracy": acc, "lr": 1e-3, "images_per_sec": 1.0,
           "epoch_seconds": 1.0}  # fmt: skip
    _write_rows(tmp_path / "history.csv", [row])
    kept = read_history(tmp_path / "history.csv")[0]["val_accuracy"]
    assert "val_acc 0.3642" in format_epoch_line(row, 1)
    assert f"{kept:.4f}" == "0.3642"


def test_resume_drops_a_history_row_cut_short_by_the_interruption(tmp_path):
    """A run killed while writing its history leaves half a row: resume drops it (it read as
    a TypeError traceback); anywhere else such a row is an error naming its line."""
    from petal.training.callbacks import HISTORY_FIELDS, read_history, truncate_history

    history = tmp_path / "history.csv"
    full = [",".join(["1"] + ["0.5"] * (len(HISTORY_FIELDS) - 1))]
    full.append(",".join(["2"] + ["0.25"] * (len(HISTORY_FIELDS) - 1)))
    history.write_text(",".join(HISTORY_FIELDS) + "\n" + "\n".join(full) + "\n3,0.1,0.2")
    with pytest.raises(ValueError, match="line 4 does not have one cell per column"):
        read_history(history)
    truncate_history(history, 3)
    assert [r["epoch"] for r in read_history(history)] == [1, 2]
    history.write_text(",".join(HISTORY_FIELDS) + "\n1,0.5\n" + full[1] + "\n")
    with pytest.raises(ValueError, match="line 2 does not"):  # not the last row: damaged
        truncate_history(history, 3)


def test_a_history_rewrite_stopped_part_way_leaves_the_rows_there_were(tmp_path, monkeypatch):
    """Truncating history.csv (a stopped run drops its unsaved rows) opened the file for
    writing in place: a second Ctrl-C or a full disk part-way left it empty or cut short."""
    import csv

    from petal.training.callbacks import HISTORY_FIELDS, read_history, truncate_history

    history = tmp_path / "history.csv"
    rows = [",".join([str(e)] + ["0.5"] * (len(HISTORY_FIELDS) - 1)) for e in (1, 2, 3)]
    history.write_text(",".join(HISTORY_FIELDS) + "\n" + "\n".join(rows) + "\n")
    before = history.read_text()

    def stop(self, row):
        raise KeyboardInterrupt

    monkeypatch.setattr(csv.DictWriter, "writerow", stop)
    with pytest.raises(KeyboardInterrupt):
        truncate_history(history, 2)
    assert history.read_text() == before and sorted(p.name for p in tmp_path.iterdir()) == [
        "history.csv"]
    monkeypatch.undo()
    truncate_history(history, 2)
    assert [r["epoch"] for r in read_history(history)] == [1, 2]


def test_a_history_row_that_cannot_be_written_names_its_file(tmp_path, monkeypatch):
    """A full disk while appending the epoch's row: "No space left on the device", naming no
    file (a write's OSError carries none)."""
    import csv
    import errno

    from petal.cli import _os_error_line
    from petal.training.callbacks import MetricsWriter

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, activation="softmax")])
    model.compile(keras.optimizers.SGD(learning_rate=0.1), "categorical_crossentropy")
    x, y = np.ones((8, 3), np.float32), np.eye(2, dtype=np.float32)[[0, 1] * 4]
    path = tmp_path / "history.csv"
    writer = MetricsWriter(path, 4, 2, 1, log=lambda line: None)

    def full(self, row):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(csv.DictWriter, "writerow", full)
    with pytest.raises(OSError) as caught:
        model.fit(x, y, batch_size=4, epochs=1, callbacks=[writer], verbose=0)
    assert caught.value.filename == str(path)
    assert _os_error_line(caught.value).startswith(f"No space left on the device writing {path}:")


def test_a_codelab_ramp_longer_than_a_phase_of_head_then_all_is_refused(tmp_path):
    """codelab_ramp's rampup_epochs was not checked against the phases of head_then_all, as
    warmup_cosine's warm-up is: a 5-epoch ramp in a 1-epoch head phase ran at 1e-5 while the
    log stated a peak it never reached."""
    from petal.training.config import get_preset
    from petal.training.loop import train

    base = get_preset("codelab-xception").replace(
        data=str(tmp_path / "no-records-here"), image_size=71, epochs=2, steps_per_epoch=1,
        weights=str(tmp_path / "xc_5.weights.h5"), fine_tune="head_then_all", head_epochs=1,
    )  # fmt: skip
    cases = [
        (base, r"^The learning-rate warm-up \(schedule_options\.rampup_epochs=5; codelab_ramp "
               r"reaches its peak the epoch after it\) does not fit in the head-only phase's 1 "
               r"epoch \(head_epochs=1; each phase of fine_tune='head_then_all' warms up "
               r"anew\): pass --set head_epochs=6 and --epochs 12 or more, or a shorter "
               r"warm-up \(--set schedule_options\.rampup_epochs=N\)\.$"),
        (base.replace(epochs=12, head_epochs=2), r"pass --set head_epochs=6 or more"),
        (base.replace(epochs=9, head_epochs=6),
         r"the epoch after it\) does not fit in the 3 epochs after the head-only phase "
         r"\(epochs 9 - head_epochs 6; .*\): pass --epochs 12 or more"),
        # codelab_ramp's own 5 epochs when schedule_options sets none.
        (base.replace(schedule_options={}), r"\(schedule_options\.rampup_epochs=5;"),
    ]
    for cfg, match in cases:
        with pytest.raises(PetalError, match=match):
            train(cfg, tmp_path / "run")
    assert not (tmp_path / "run").exists()
    # A ramp that fits each phase passes these checks (and fails on the missing data), as
    # does a whole run shorter than its ramp (the codelab's schedule cut short).
    fits = base.replace(epochs=4, head_epochs=2, schedule_options={"rampup_epochs": 1})
    for cfg in (fits, base.replace(fine_tune="all", head_epochs=0)):
        with pytest.raises(PetalError, match="no-records-here"):
            train(cfg, tmp_path / "run")


def test_numpy_scalars_are_numbers_and_strings_are_named():
    """np.int64(10) was no "finite number" (nor a positive int for epochs_to_steps), and a
    string given to a public helper failed as Python's "'<' not supported"."""
    schedule = build_schedule(
        "warmup_cosine", steps_per_epoch=np.int64(10), peak_lr=np.float32(1.0),
        total_epochs=np.int64(2),
    )  # fmt: skip
    plain = build_schedule("warmup_cosine", steps_per_epoch=10, peak_lr=1.0, total_epochs=2)
    assert float(schedule(5)) == float(plain(5))
    # Saved with the model as JSON: the NumPy scalars become Python numbers.
    assert schedule.get_config() == plain.get_config()
    assert epochs_to_steps(np.float64(1.5), np.int64(4)) == 6
    assert codelab_max_lr(np.int64(8)) == pytest.approx(4e-4)
    cases = [
        (lambda: epochs_to_steps("1", 10), "epochs must be a finite number. Received: epochs='1'"),
        (lambda: scale_lr(0.1, "512"), "batch_size must be a finite number. "
                                       "Received: batch_size='512'"),
        (lambda: codelab_max_lr("8"), "replicas must be a finite number. Received: replicas='8'"),
        (lambda: warmup_cosine(10, peak_lr=1.0, total_epochs="2"),
         "total_epochs must be a finite number. Received: total_epochs='2'"),
        (lambda: epochs_to_steps(1, True), "steps_per_epoch must be a positive int"),
    ]  # fmt: skip
    for call, message in cases:
        with pytest.raises(PetalError, match=f"^{re.escape(message)}"):
            call()


def test_codelab_ramp_refuses_a_decay_that_grows_the_rate():
    """decay=5.0 was taken, and its "decay" grew the rate to 625x the peak in 4 epochs."""
    for decay in (5.0, 1.01):
        with pytest.raises(PetalError, match=r"^Schedule option decay must be from 0 \(down to "
                           r"min_lr after the peak\) to 1 \(held at the peak\), a factor per "
                           rf"epoch\. Received: decay={decay}$"):  # fmt: skip
            build_schedule("codelab_ramp", steps_per_epoch=1, max_lr=1.0, decay=decay)
    with pytest.raises(PetalError, match=r"decay must be from 0 .*Received: decay='x'$"):
        codelab_ramp(1, decay="x")
    # The ends are schedules: down to min_lr the epoch after the peak, or held there.
    kw = {"steps_per_epoch": 1, "max_lr": 1.0, "min_lr": 0.0, "rampup_epochs": 1}
    assert per_epoch_values(codelab_ramp(**kw, decay=0), 4, 1) == pytest.approx([1e-5, 1, 0, 0])
    assert per_epoch_values(codelab_ramp(**kw, decay=1), 4, 1) == pytest.approx([1e-5, 1, 1, 1])


def test_a_growing_decay_is_one_line_on_the_command_line(tmp_path, capsys):
    from petal.cli import main

    code = main(["train", "--preset", "quick", "--data", str(tmp_path / "none"),
                 "--workdir", str(tmp_path / "run"), "--set", "schedule=codelab_ramp",
                 "--set", "schedule_options.decay=5"])  # fmt: skip
    assert code == 2
    assert capsys.readouterr().err == (
        "petal train: error: Schedule option decay must be from 0 (down to min_lr after the "
        "peak) to 1 (held at the peak), a factor per epoch. Received: decay=5\n"
    )
    assert not (tmp_path / "run").exists()


def test_codelab_xception_follows_the_codelabs_pod_recipe_on_more_than_8_replicas():
    # On 32 replicas (a TPU pod) it trained with batch 16 x 32 = 512 and peaked at 1.6e-3 at
    # epoch 5; the codelab's pod recipe is batch 8 x replicas, 2e-5 x replicas over 7 epochs.
    from petal.training.config import get_preset, load_config
    from petal.training.loop import _global_batch, _schedule
    from petal.training.schedules import per_epoch_values

    cfg = get_preset("codelab-xception")
    assert _global_batch(cfg, 32) == 256
    assert codelab_max_lr(32) == pytest.approx(6.4e-4)
    assert codelab_max_lr(9) == pytest.approx(1.8e-4)
    lrs = per_epoch_values(_schedule(cfg, None, 12, 10, 32), 12, 10)
    assert max(lrs) == pytest.approx(6.4e-4, rel=1e-6) and lrs.index(max(lrs)) == 7
    assert lrs[1] == pytest.approx(1e-5 + (6.4e-4 - 1e-5) / 7, rel=1e-6)
    # 8 replicas and one keep the codelab's values.
    assert _global_batch(cfg, 8) == 128 and _global_batch(cfg, 1) == 16
    lrs = per_epoch_values(_schedule(cfg, None, 12, 10, 8), 12, 10)
    assert lrs[5] == pytest.approx(4e-4, rel=1e-6) and lrs[11] == pytest.approx(1.122e-4, rel=1e-3)
    # What the user sets explicitly wins.
    mine = load_config("codelab-xception", overrides=[
        "batch_size=16", "schedule_options.rampup_epochs=5", "schedule_options.max_lr=1e-3"])
    assert _global_batch(mine, 32) == 512
    lrs = per_epoch_values(_schedule(mine, None, 12, 10, 32), 12, 10)
    assert max(lrs) == pytest.approx(1e-3, rel=1e-6) and lrs.index(max(lrs)) == 5
    from petal.training.schedules import codelab_rampup_epochs

    assert codelab_rampup_epochs(32) == 7 and codelab_rampup_epochs(8) == 5


def test_a_codelab_ramp_as_long_as_a_phase_of_head_then_all_is_refused(tmp_path):
    """codelab_ramp per epoch reaches its peak the epoch after its ramp, but a ramp as long as
    a phase was accepted: --set head_epochs=5 --epochs 10 with the 5-epoch ramp ran the head
    phase at 1e-5 .. 1.62e-4 (never its stated 2e-4) and the full phase never at 2e-5."""
    from petal.training.config import get_preset
    from petal.training.loop import train

    base = get_preset("codelab-xception").replace(
        data=str(tmp_path / "no-records-here"), image_size=71, epochs=10, steps_per_epoch=1,
        weights=str(tmp_path / "xc_5.weights.h5"), fine_tune="head_then_all", head_epochs=5,
    )  # fmt: skip
    with pytest.raises(PetalError, match=r"^The learning-rate warm-up \(schedule_options\."
                       r"rampup_epochs=5; codelab_ramp reaches its peak the epoch after it\) "
                       r"does not fit in the head-only phase's 5 epochs \(head_epochs=5; .*\): "
                       r"pass --set head_epochs=6 and --epochs 12 or more, or a shorter"):
        train(base, tmp_path / "run")
    with pytest.raises(PetalError, match=r"does not fit in the 5 epochs after the head-only "
                       r"phase \(epochs 11 - head_epochs 6; .*\): pass --epochs 12 or more"):
        train(base.replace(head_epochs=6, epochs=11), tmp_path / "run")
    assert not (tmp_path / "run").exists()
    # The peak's epoch fits in each phase; interpolated, the ramp's end is the peak.
    interpolated = {"decay": 0.8, "interpolate": True}
    for cfg in (base.replace(head_epochs=6, epochs=12),
                base.replace(schedule_options=interpolated)):  # fmt: skip
        with pytest.raises(PetalError, match="no-records-here"):
            train(cfg, tmp_path / "run")
    # A whole run as long as its ramp is still the codelab's schedule cut short.
    with pytest.raises(PetalError, match="no-records-here"):
        train(base.replace(fine_tune="all", head_epochs=0, epochs=5), tmp_path / "run")


def test_the_full_phase_of_head_then_all_scales_every_rate_of_its_schedule():
    """The full phase passed codelab_ramp only its scaled peak: with a peak below the fixed
    1e-5 start_lr and min_lr (fine_tune_lr_factor=0.01: 2e-6) its first epoch ran at 5x the
    stated peak and the "decay" rose (1e-5, 2e-6, 3.6e-6)."""
    from petal.training.config import get_preset
    from petal.training.loop import _phases, _schedule

    def rates(cfg, replicas=1, steps=3):
        out = {}
        for phase in _phases(cfg, cfg.learning_rate, replicas):
            fn = _schedule(cfg, phase.lr, phase.end - phase.start, steps, replicas, phase.name)
            out[phase.name] = per_epoch_values(fn, phase.end - phase.start, steps)
        return out

    xc = get_preset("codelab-xception")
    # The preset's own rates are the codelab's, on one and on eight replicas.
    assert rates(xc, 8)["all"] == pytest.approx(CODELAB_8_REPLICAS, rel=5e-4)
    assert rates(xc)["all"][:6] == pytest.approx(
        [1e-5 + (2e-4 - 1e-5) * e / 5 for e in range(6)], rel=1e-5)  # fmt: skip
    options = {**xc.schedule_options, "rampup_epochs": 1}
    cfg = xc.replace(fine_tune="head_then_all", head_epochs=2, epochs=5,
                     fine_tune_lr_factor=0.01, schedule_options=options)  # fmt: skip
    got = rates(cfg)
    assert got["head"] == pytest.approx([1e-5, 2e-4], rel=1e-5)
    # The head phase's schedule times 0.01: up to the stated 2e-6 peak, then down.
    assert got["full"] == pytest.approx([1e-7, 2e-6, 1.9e-6 * 0.8 + 1e-7], rel=1e-5)
    # Likewise below 1e-4 with the default factor (learning_rate=5e-5: a 5e-6 peak).
    got = rates(cfg.replace(learning_rate=5e-5, fine_tune_lr_factor=0.1))
    assert got["full"] == pytest.approx([1e-6, 5e-6, 4e-6 * 0.8 + 1e-6], rel=1e-5)
    # warmup_cosine's start and end rates too.
    cosine = cfg.replace(learning_rate=1e-3, schedule="warmup_cosine",
                         schedule_options={"warmup_epochs": 1, "end_lr": 1e-4})  # fmt: skip
    # (0.01 x 1e-4 at the end of the cosine: halfway there at its middle.)
    assert rates(cosine, steps=1)["full"] == pytest.approx([0.0, 1e-5, 5.5e-6], rel=1e-5)
    # A start or end rate above the peak itself is refused, named.
    cases = [
        (xc.replace(learning_rate=5e-6), r"^Schedule option start_lr must not exceed the peak "
         r"rate max_lr \(petal train sets it from learning_rate when that is set\): lower "
         r"start_lr \(--set schedule_options\.start_lr=\.\.\.\) or raise the peak\. Received: "
         r"start_lr=1e-05, max_lr=5e-06$"),
        (xc.replace(schedule_options={**xc.schedule_options, "min_lr": 1e-3}),
         r"min_lr must not exceed .* Received: min_lr=0\.001, max_lr=0\.0002$"),
        (cosine.replace(fine_tune="all", head_epochs=0, fine_tune_lr_factor=0.1,
                        learning_rate=1e-5),  # fmt: skip
         r"end_lr must not exceed the peak rate peak_lr \(petal train sets it from "
         r"learning_rate\): .* Received: end_lr=0\.0001, peak_lr=1e-05$"),
    ]
    for bad, match in cases:
        with pytest.raises(PetalError, match=match):
            rates(bad)


def test_a_cosine_warm_up_as_long_as_the_run_is_refused(tmp_path):
    """warmup_cosine accepted a warm-up as long as the run (or its total_epochs): the rate
    rose to the peak at the last step and never decayed, while the log stated a cosine."""
    from petal.training.config import get_preset
    from petal.training.loop import train

    with pytest.raises(PetalError, match=r"^warmup_epochs must be shorter than total_epochs"):
        warmup_cosine(10, peak_lr=1e-3, total_epochs=2, warmup_epochs=2)
    warmup_cosine(10, peak_lr=1e-3, total_epochs=2, warmup_epochs=1.9)
    base = get_preset("squeezenet-plus").replace(
        data=str(tmp_path / "no-records-here"), epochs=3, steps_per_epoch=1
    )  # warms up for 3 epochs
    with pytest.raises(PetalError, match=r"^The learning-rate warm-up \(schedule_options\."
                       r"warmup_epochs=3; warmup_cosine decays after it\) does not fit in the 3 "
                       r"epoch\(s\) to train: pass --epochs 4 or more, or a shorter warm-up"):
        train(base, tmp_path / "run")
    assert not (tmp_path / "run").exists()
    with pytest.raises(PetalError, match="no-records-here"):
        train(base.replace(epochs=4), tmp_path / "run")


def test_a_warm_up_shorter_than_the_run_in_epochs_is_taken_whatever_its_steps():
    # 0.9 of an epoch of 1 step rounds to the whole 1-epoch run: refused, saying 0.9 was not
    # shorter than 1.
    lr = warmup_cosine(1, peak_lr=1e-3, total_epochs=1, warmup_epochs=0.9)
    assert float(lr(0)) == 0.0  # its warm-up starts at start_lr
    warmup_cosine(1, peak_lr=1e-3, total_epochs=2, warmup_epochs=1.5)
    with pytest.raises(PetalError, match=r"^warmup_epochs must be shorter than total_epochs"):
        warmup_cosine(1, peak_lr=1e-3, total_epochs=2, warmup_epochs=2)
