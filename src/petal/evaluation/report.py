"""A single static ``report.html`` for a work directory, drawn from its saved files.

Reads ``config.json``, ``metrics.json``, ``history.csv`` (up to the epoch ``state.json`` says
is saved) and, when ``petal evaluate`` has run, ``eval/eval.json`` (or that of the folder
``eval_dir`` names: ``petal evaluate --out``) with its image samples;
redraws every plot into ``plots/`` (removing those of an earlier report it does not draw) and
writes ``report.html`` referencing them by relative path (or embedding them, so the page can
be mailed on its own).
"""

from __future__ import annotations

import base64
import html
import json
import math
import shlex
import sys
import zipfile
from pathlib import Path

from petal.data.folders import expand_home, holds_run_config, is_run_config, same_place
from petal.errors import PetalError, damage_reason, disk_full, first_line, need_folder
from petal.evaluation import plots
from petal.evaluation.workdir import (
    MODEL_FILE,
    check_not_in_the_way,
    file_sha256,
    no_model,
    replaced_run,
    retrain_command,
    run_folder,
    still_training,
    unfinished_resume,
)
from petal.jsonfile import save_atomically
from petal.training.callbacks import read_history
from petal.training.loop import RUN_DIR_FILES

EVAL_DIR = "eval"
PLOTS_DIR = "plots"

_CSS = """
body { font-family: system-ui, -apple-system, Segoe UI, Roboto, sans-serif; margin: 2rem auto;
       max-width: 1100px; color: #222; padding: 0 1rem; }
h1 { margin-bottom: 0.2rem; } .sub { color: #666; margin-top: 0; }
table { border-collapse: collapse; margin: 0.5rem 0 1.5rem; font-size: 0.92rem; }
th, td { border-bottom: 1px solid #ddd; padding: 0.25rem 0.8rem; text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
img { max-width: 100%; border: 1px solid #eee; margin: 0.3rem 0 1rem; }
details { margin: 1rem 0; } code { background: #f4f4f4; padding: 0 0.2rem; }
"""


# Keys of eval.json the report reads (written by petal evaluate).
_EVAL_KEYS = ("count", "accuracy", "classes", "confusion_matrix", "per_class", "macro")


def _read_json(path: Path, fix: str) -> dict | None:
    """The JSON object in ``path``, None when there is no such file.

    Raises:
        PetalError: the file is not a JSON object (the message names it and ``fix``).
    """
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise PetalError(f"{path} is not valid JSON ({err}); {fix}") from None
    if not isinstance(data, dict):
        raise PetalError(f"{path} holds no JSON object; {fix}")
    return data


def _retrain(workdir: Path, config: dict | None) -> str:
    """The fix for a damaged run: train it again from its own config.json where that reads
    (its preset, data, classes and settings: ``--workdir`` alone asks for ``--data``, and with
    it trains the default preset), else from the preset and data the user names."""
    if config is None:
        return (
            "the run is damaged: retrain it with its preset and data (`petal train --preset "
            f"PRESET --data DATA --workdir {shlex.quote(str(workdir))} --overwrite`)."
        )
    return f"the run is damaged: retrain it (`{retrain_command(workdir)}`)."


def _fmt(value) -> str:
    if isinstance(value, bool) or value is None:
        return html.escape(json.dumps(value))
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e4 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, (dict, list)):
        return f"<code>{html.escape(json.dumps(value, ensure_ascii=False))}</code>"
    return html.escape(str(value))


def _so_far(epochs_done: list[dict], config: dict) -> list[tuple[str, object]]:
    """The numbers of an unfinished run, from the epochs its history saved."""
    planned = config.get("epochs")
    done = f"{len(epochs_done)} of {planned}" if isinstance(planned, int) else len(epochs_done)
    rows: list[tuple[str, object]] = [("epochs done", done)]
    scored = [r for r in epochs_done if math.isfinite(r.get("val_accuracy", math.nan))]
    if scored:
        best = max(scored, key=lambda r: r["val_accuracy"])
        rows += [
            ("last validation accuracy", scored[-1]["val_accuracy"]),
            (f"best validation accuracy (epoch {best['epoch']})", best["val_accuracy"]),
        ]
    return rows


def _table(rows: list[tuple[str, object]]) -> str:
    body = "".join(
        f"<tr><th>{html.escape(k)}</th><td class='num'>{_fmt(v)}</td></tr>" for k, v in rows
    )
    return f"<table>{body}</table>"


def _image(path: Path, workdir: Path, alt: str, embed: bool) -> str:
    if embed:
        src = "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")
    else:
        src = path.relative_to(workdir).as_posix()
    return f"<img src='{src}' alt='{html.escape(alt)}'>"


_METRIC_ROWS = (
    ("final_val_accuracy", "final validation accuracy"),
    ("mean_last5_val_accuracy", "mean of last 5 validation accuracies"),
    ("best_val_accuracy", "best validation accuracy"),
    ("best_epoch", "best epoch"),
    ("epochs_completed", "epochs completed"),
    ("wall_seconds", "wall time (s)"),
    ("train_images_per_sec", "training images/s"),
    ("model", "model"),
    ("params", "parameters"),
    ("image_size", "image size"),
    ("global_batch", "global batch"),
    ("replicas", "replicas"),
    ("precision", "precision"),
    ("strategy", "strategy"),
)


def build_report(
    workdir: str | Path, embed: bool = False, eval_dir: str | Path | None = None
) -> Path:
    """Redraw the plots from the saved files and write ``WORKDIR/report.html``.

    Args:
        workdir: a training work directory.
        embed: embed the PNGs as data URIs instead of referencing ``plots/*.png``.
        eval_dir: the folder of the run's evaluation (``petal evaluate --out``); default
            ``WORKDIR/eval``. Without one there, the page says where it looked.

    Returns:
        The path of ``report.html``.

    Raises:
        PetalError: when ``workdir`` holds no training run, ``eval_dir`` no evaluation, or
            one of their saved files is damaged (the message names it and what to run again).
    """
    workdir = run_folder(workdir)
    if not workdir.is_dir():
        what = "is a file, not" if workdir.exists() else "does not exist; pass"
        raise PetalError(
            f"Run folder {workdir} {what} a folder petal train wrote (its --workdir)."
        )
    if eval_dir is not None:
        need_folder(eval_dir, "eval_dir", "the folder `petal evaluate --out` wrote")
        eval_dir = Path(expand_home(eval_dir))
        if not (eval_dir / "eval.json").is_file():
            what = "holds no eval.json" if eval_dir.is_dir() else "is not a folder"
            raise PetalError(
                f"--eval {eval_dir} {what}; pass the folder `petal evaluate --out` wrote, or "
                "leave --eval out for WORKDIR/eval."
            )
    else:
        eval_dir = workdir / EVAL_DIR
    damaged = _retrain(workdir, None)
    config = _read_json(workdir / "config.json", damaged)
    if config is not None and not is_run_config(config):  # '{}': an empty report
        raise PetalError(
            f"{workdir / 'config.json'} has no resolved classes; it was not written by petal "
            f"train: {damaged}"
        )
    retrain = _retrain(workdir, config)
    metrics = _read_json(workdir / "metrics.json", retrain)
    if metrics is not None and "epochs_completed" not in metrics:  # '{}': an empty table
        raise PetalError(f"{workdir / 'metrics.json'} is not petal's metrics (no "
                         f"epochs_completed); {retrain}")  # fmt: skip
    history = workdir / "history.csv"
    if config is None:
        if replaced := replaced_run(workdir):
            raise PetalError(f"{workdir} holds no run (config.json): {replaced}")
        missing = " and ".join(p.name for p in (workdir / "config.json", history)
                               if not p.is_file())  # fmt: skip
        raise PetalError(
            f"{workdir} holds no training run ({missing} missing); run `petal train --workdir` "
            "first."
        )
    if not history.is_file():  # a run's folder: training again would be refused
        raise PetalError(f"{history} is missing: the run's epoch history is gone; {retrain}")
    plot_dir = workdir / PLOTS_DIR
    run_dir = shlex.quote(str(workdir))  # for the commands its messages suggest
    # Both places the report writes, checked before any plot is drawn.
    again = "move it away and run petal report again."
    writes = ((plot_dir, True, "plots"), (workdir / "report.html", False, "page"))
    for target, folder, what in writes:
        check_not_in_the_way(target, folder, f"the report writes its {what}", again)
    try:
        if not history.read_text().strip():
            raise ValueError("empty file")
        epochs_done = read_history(history)
        if epochs_done and not all("epoch" in row for row in epochs_done):
            raise KeyError("epoch")
    except (ValueError, KeyError, UnicodeDecodeError) as err:
        raise PetalError(f"{history} is not petal's history ({type(err).__name__}: {err}); "
                         f"{retrain}") from None
    completed = (metrics or {}).get("epochs_completed")
    if isinstance(completed, int) and len(epochs_done) < completed:
        raise PetalError(
            f"{history} holds {len(epochs_done)} epoch(s) but {workdir / 'metrics.json'} says "
            f"{completed} were completed; {retrain}"
        )
    stopped = (metrics or {}).get("stopped")
    saved = _saved_epoch(workdir, metrics)
    if saved is not None and stopped and saved == completed:
        saved = None  # history.csv holds the epoch a non-finite loss stopped: said below
    if saved is not None and isinstance(completed, int):
        saved = max(saved, completed)
    unsaved = [row["epoch"] for row in epochs_done if saved is not None and row["epoch"] > saved]
    not_saved = None
    training = still_training(workdir)  # --resume would be refused: say so instead
    if training:
        epochs_done = [row for row in epochs_done if saved is None or row["epoch"] <= saved]
        of = (
            f"{workdir / 'metrics.json'} and {MODEL_FILE} are of its last finish (epoch "
            f"{completed}), "
            if metrics is not None and isinstance(completed, int)
            else ""
        )
        training = (
            f"{training}: {of}the curves show the {len(epochs_done)} epoch(s) it has saved so "
            f"far; run `petal report {run_dir}` again when it finishes."
        )
        print(f"petal report: warning: {training}", file=sys.stderr)
    elif unsaved:
        # Interrupted before the epoch's checkpoint: --resume trains it again.
        epochs_done = [row for row in epochs_done if row["epoch"] <= saved]
        which = f"epoch {unsaved[0]}" if len(unsaved) == 1 else f"epochs {unsaved[0]}-{unsaved[-1]}"
        # A complete run so stopped was being extended: --resume alone has nothing to do.
        more = f" --epochs {unsaved[-1]}" if completed == saved and metrics is not None else ""
        not_saved = (
            f"{history} holds {which}, which the run did not save (it stopped before the "
            f"checkpoint): left out of this report; `petal train --resume{more} --workdir "
            f"{run_dir}` trains {'it' if len(unsaved) == 1 else 'them'} again."
        )
        print(f"petal report: warning: {not_saved}", file=sys.stderr)
    figures: list[tuple[str, Path]] = []
    if epochs_done:  # no epoch finished yet: no curves to draw
        try:
            figures += [
                ("Accuracy and loss", plots.plot_history(epochs_done, plot_dir / "curves.png")),
                ("Learning rate", plots.plot_lr(
                    epochs_done, plot_dir / "lr.png", _batches(workdir, metrics, config)
                )),
            ]
        except OSError as err:
            raise _cannot_write(workdir, err) from None
    evaluate_again = f"run `petal evaluate {run_dir}` again."
    if not same_place(eval_dir, workdir / EVAL_DIR):
        evaluate_again = (
            f"run `petal evaluate {run_dir} --out {shlex.quote(str(eval_dir))}` again."
        )
    eval_json = eval_dir / "eval.json"
    evaluation = _read_json(eval_json, evaluate_again)
    if evaluation is not None:
        missing = [key for key in _EVAL_KEYS if key not in evaluation]
        if missing:
            raise PetalError(f"{eval_json} has no {', '.join(missing)}; {evaluate_again}")
        try:
            eval_parts = _eval_section(evaluation, config)
            wrong = evaluation["count"] - sum(
                row[i] for i, row in enumerate(evaluation["confusion_matrix"])
            )
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as err:
            # Values of the wrong kind or shape (the keys are there): one line, not numpy's.
            reason = damage_reason(err)
            raise PetalError(f"{eval_json} is damaged ({reason}); {evaluate_again}") from None
        # Every file read before any drawing, so that only a damaged file is called damaged.
        grids = []
        for name, title in (
            ("samples", "Sample predictions"),
            ("misclassified", ""),
        ):
            npz = eval_dir / f"{name}.npz"
            if npz.is_file():
                try:
                    samples = plots.read_samples(npz)
                    if name == "misclassified":  # titled as petal evaluate's own grid
                        shown = len(samples["images"])
                        title = plots.misclassified_title(wrong, evaluation["count"], shown)
                    grids.append((title, samples, name))
                except (ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile) as err:
                    reason = first_line(err)
                    if not zipfile.is_zipfile(npz):  # numpy's guess: "pickled data"
                        reason = "not an .npz archive: truncated or overwritten"
                    raise PetalError(
                        f"{npz} is damaged ({reason}); {evaluate_again}"
                    ) from None
        confusion = _draw(
            plots.plot_confusion_from_json, eval_json, plot_dir / "confusion_matrix.png"
        )
        figures += [("Confusion matrix", confusion)] if confusion else []
        for title, samples, name in grids:
            grid_title = title if name == "misclassified" else ""
            png = _draw(plots.plot_image_grid, samples, plot_dir / f"{name}.png", grid_title)
            if png is not None:
                figures.append((title, png))
    _remove_undrawn(plot_dir, {png.name for _, png in figures})

    title = f"petal run: {config.get('preset', '')} / {config.get('model', '')}"
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        f"<p class='sub'>{html.escape(str(workdir.resolve()))}</p>",
    ]
    if metrics is not None:
        shown = dict(metrics)
        if isinstance(shown.get("image_size"), list):
            shown["image_size"] = "x".join(map(str, shown["image_size"]))
        labels = dict(_METRIC_ROWS)
        if isinstance(completed, int) and 0 < completed < 5:
            labels["mean_last5_val_accuracy"] = f"mean of last {completed} validation accuracies"
        # None: no epoch completed (a NaN loss stopped the first), so nothing to show.
        rows = [
            (label, "n/a" if shown[key] is None else shown[key])
            for key, label in labels.items()
            if key in shown
        ]
        rows += _skipped_rows(metrics)
        parts += ["<h2>Training</h2>", _table(rows)]
        if stopped and isinstance(completed, int) and len(epochs_done) == completed + 1:
            # history.csv holds the epoch the loss stopped, which completed nothing.
            before = (
                f"the numbers above are of the {completed} epoch(s) before it"
                if completed
                else "no epoch completed before it"
            )
            line = (
                f"the run stopped at a {stopped}: history.csv and the curves hold that "
                f"epoch, {before}."
            )
            print(f"petal report: warning: {line}", file=sys.stderr)
            parts.append(f"<p><b>Stopped:</b> {html.escape(line)}</p>")
        elif not training and (unfinished := unfinished_resume(
            workdir, completed, len(epochs_done), "history.csv and the curves hold them"
        )):
            # Resumed for more epochs and stopped before the end: metrics.json is the end
            # of the run before the resume (predict, evaluate and export say so too).
            print(f"petal report: warning: {unfinished}", file=sys.stderr)
            parts.append(f"<p><b>Not finished:</b> {html.escape(unfinished)}</p>")
        elif stopped:
            parts.append(f"<p><b>Stopped:</b> {html.escape(str(stopped))}</p>")
    else:
        resume = (
            ""
            if training  # --resume would be refused while it trains
            else f" Resume it with `petal train --resume --workdir {run_dir}`."
        )
        parts.append(
            f"<p>metrics.json missing: the run has not finished.{html.escape(resume)}</p>"
        )
        if epochs_done:
            parts += ["<h2>Training so far</h2>", _table(_so_far(epochs_done, config))]
    if training:
        parts.append(f"<p><b>Still training:</b> {html.escape(training)}</p>")
    if not_saved is not None:
        parts.append(f"<p><b>Not saved:</b> {html.escape(not_saved)}</p>")
    if evaluation is not None:
        model_file = workdir / MODEL_FILE
        scored = _scored_another_model(evaluation, eval_json, model_file, workdir)
        if scored == "another run":
            # Never `evaluate --out` that folder: it is the other run's evaluation.
            own = shlex.quote(str(workdir))
            stale = (
                f"{eval_json} is an evaluation of another run ({evaluation['workdir']}), whose "
                f"model is not {model_file}; evaluate this run with `petal evaluate {own}` "
                f"(it writes {workdir / EVAL_DIR}) and run `petal report {own}` again."
            )
        elif scored:
            # Resumed since: the scores are an earlier model's.
            stale = (
                f"{eval_json} scored an earlier model: {model_file} was saved after it (the "
                f"run was trained further); {evaluate_again}"
            )
        if scored:
            print(f"petal report: warning: {stale}", file=sys.stderr)
            eval_parts.insert(1, f"<p><b>Warning:</b> {html.escape(stale)}</p>")
        parts += eval_parts
    else:
        # Said, so that an evaluation written elsewhere (evaluate --out) is not just missing.
        none = (
            f"no evaluation in {eval_dir}: run `petal evaluate {run_dir}` to add one, or pass "
            "--eval DIR for one written with `petal evaluate --out DIR`."
        )
        if not (workdir / MODEL_FILE).is_file():  # evaluate would refuse it: say why
            none = (
                f"no evaluation in {eval_dir}, and no model to evaluate: "
                f"{no_model(workdir, config)}"
            )
        print(f"petal report: {none}")
        parts.append(f"<p>{html.escape('N' + none[1:])}</p>")
    if not epochs_done:
        parts.append("<p>No epoch has finished yet: no training curves.</p>")
    for caption, png in figures:
        parts += [f"<h3>{html.escape(caption)}</h3>", _image(png, workdir, caption, embed)]
    parts += [
        "<details><summary>Resolved configuration</summary>",
        _table(sorted(config.items())),
        "</details></body></html>",
    ]
    out = workdir / "report.html"
    try:
        text = "\n".join(parts) + "\n"
        save_atomically(out, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
    except OSError as err:
        raise _cannot_write(workdir, err) from None
    return out


def _cannot_write(workdir: Path, err: OSError) -> PetalError:
    """The one-line error of a report whose plots or page cannot be written in ``workdir``
    (``err``): the report has no --out, so the fix is to make the run folder writable."""
    if disk_full(err):
        return PetalError(
            f"Cannot write the report in {workdir}: no space left on its disk; free some space "
            "there and run petal report again."
        )
    what = f"{err.strerror or err}: {err.filename}" if err.filename else err.strerror or err
    return PetalError(
        f"Cannot write the report in {workdir} ({what}); make {workdir} and its "
        f"{PLOTS_DIR}/ folder writable and run petal report again."
    )


def _saved_epoch(workdir: Path, metrics: dict | None) -> int | None:
    """The last epoch the run checkpointed (``state.json``; 0 when a run that has not
    finished has none): history.csv's rows after it are of an epoch cut short after its row
    was written. None when not known."""
    try:
        state = json.loads((workdir / "state.json").read_text())
    except FileNotFoundError:
        return 0 if metrics is None else None
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    epoch = state.get("epoch") if isinstance(state, dict) else None
    return epoch if isinstance(epoch, int) and not isinstance(epoch, bool) else None


def _batches(workdir: Path, metrics: dict | None, config: dict) -> list[dict] | None:
    """The run's steps per epoch, per session (``{from_epoch, steps_per_epoch}``): from
    ``state.json``, which a resume updates first, else ``metrics.json``, else the last
    session's in ``config.json`` (runs saved before they were kept). None when unknown."""
    try:
        batches = json.loads((workdir / "state.json").read_text()).get("batches")
    except (OSError, UnicodeDecodeError, ValueError, AttributeError):
        batches = None
    batches = batches or (metrics or {}).get("batches")
    if isinstance(batches, list) and batches:
        return batches
    steps = (config.get("resolved") or {}).get("steps_per_epoch")
    return [{"from_epoch": 1, "steps_per_epoch": steps}] if isinstance(steps, int) else None


def _remove_undrawn(plot_dir: Path, drawn: set[str]) -> None:
    """Removes the plots an earlier report drew in ``plot_dir`` that this one did not
    (``drawn``: their names): an earlier evaluation's grid of mistakes beside one with none,
    or the evaluation's plots once eval/ is gone, contradict the page. Only the report's own
    plot names (which ``--overwrite`` deletes too); other files there are the user's."""
    for name in RUN_DIR_FILES[PLOTS_DIR]:
        stale = plot_dir / name
        if name in drawn or not stale.is_file():
            continue
        try:
            stale.unlink()
        except OSError as err:
            print(
                f"petal report: warning: cannot remove {stale}, an earlier report's plot "
                f"({err.strerror or err}); the report does not show it.",
                file=sys.stderr,
            )


def _draw(plot, source, out: Path, *args) -> Path | None:
    """``plot(source, out, *args)``: the PNG drawn, or None when matplotlib could not draw
    it (said on stderr; the files it is drawn from were read and checked before)."""
    try:
        return plot(source, out, *args)
    except OSError as err:
        raise _cannot_write(out.parent.parent, err) from None  # out: WORKDIR/plots/NAME
    except (ValueError, RuntimeError) as err:
        print(
            f"petal report: warning: cannot draw {out} ({first_line(err)}); the report leaves "
            "it out.",
            file=sys.stderr,
        )
        return None


def _scored_another_model(
    evaluation: dict, eval_json: Path, model_file: Path, workdir: Path
) -> str | None:
    """Whether ``eval.json`` scored another model than ``model.keras``: ``"another run"``'s,
    when it names another run folder than ``workdir`` (``petal report RUN --eval`` of
    another run's evaluation), or ``"earlier"`` (the run was trained further, or again,
    since); None when not, or not known. By the model's SHA-256 where eval.json records it
    (a copied or moved run keeps it), else by the files' times, which only the folder
    evaluate wrote keeps (``cp -r`` gives a copy new ones, the model's possibly later than
    eval.json's)."""
    if not model_file.is_file():
        return None
    scored_in = evaluation.get("workdir")
    scored_here = isinstance(scored_in, str) and same_place(scored_in, workdir)
    digest = evaluation.get("model_sha256")
    if isinstance(digest, str):
        if digest == file_sha256(model_file):
            return None
        # The run's own eval/ is its own evaluation, though the run was moved since; not
        # when it names another run that is there (`evaluate OTHER --out RUN/eval`).
        other = isinstance(scored_in, str) and not scored_here and holds_run_config(scored_in)
        own = not other and (
            not isinstance(scored_in, str)
            or scored_here
            or same_place(str(eval_json.parent), str(workdir / EVAL_DIR))
        )
        return "earlier" if own else "another run"
    if not scored_here:
        return None  # a copy of the run (or moved from where it was scored): times unknown
    return "earlier" if model_file.stat().st_mtime > eval_json.stat().st_mtime else None


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _scored_split(evaluation: dict, config: dict) -> str:
    """The split evaluate scored, for the heading: `` (train split: images the model trained
    on)`` when it holds them (the train or whole split of the run's own data), "" when
    eval.json does not say."""
    split = evaluation.get("split")
    if not isinstance(split, str) or not split:
        return ""
    data = evaluation.get("data")
    own = (config.get("data"), (config.get("resolved") or {}).get("records_source"))
    trained_on = (
        split in ("train", "all")
        and isinstance(data, str)
        and any(isinstance(path, str) and path and same_place(data, path) for path in own)
    )
    if split == "all":
        return " (all images" + (": the model trained on some of them)" if trained_on else ")")
    return f" ({split} split" + (": images the model trained on)" if trained_on else ")")


def _skipped_rows(data: dict) -> list[tuple[str, object]]:
    """A row per ``skipped_*`` entry of metrics.json or eval.json: a count, or the number of
    entries of a list (of the files or records dropped). An image folder's count of
    ``skipped_corrupt_records`` and its list ``skipped_corrupt_files`` are the same files:
    one row, of files."""
    files = isinstance(data.get("skipped_corrupt_files"), list)
    rows: list[tuple[str, object]] = []
    for key, value in data.items():
        if key.startswith("skipped_") and (_is_number(value) or isinstance(value, list)):
            if files and key == "skipped_corrupt_files" and _is_number(
                data.get("skipped_corrupt_records")
            ):
                continue  # its count's row says it
            if files and key == "skipped_corrupt_records":
                key = "skipped_corrupt_files"
            label = "skipped: " + key.removeprefix("skipped_").replace("_", " ")
            rows.append((label, len(value) if isinstance(value, list) else value))
    return rows


def _eval_section(evaluation: dict, config: dict) -> list[str]:
    """The evaluation's heading and tables.

    Raises:
        ValueError: the confusion matrix does not match the classes, or holds no counts; the
            count or the accuracy is no number (and the errors of values of the wrong kind:
            KeyError, TypeError...).
    """
    classes = evaluation["classes"]
    n = len(classes)
    shape = [len(row) for row in evaluation["confusion_matrix"]]
    if shape != [n] * n:
        raise ValueError(f"a confusion matrix of {len(shape)} rows for {n} classes")
    if not all(isinstance(c, int) for row in evaluation["confusion_matrix"] for c in row):
        raise ValueError("a confusion matrix that holds other values than counts")
    if not all(isinstance(name, str) for name in classes):
        raise ValueError("classes that are not all names")
    for key in ("count", "accuracy"):
        if not _is_number(evaluation[key]):
            raise ValueError(f"{key} {evaluation[key]!r} is not a number")
    warnings = [
        f"<p><b>Warning:</b> {html.escape(str(line))}</p>"
        for line in evaluation.get("warnings", [])
    ]
    data = html.escape(str(evaluation.get("data", "")))
    split = html.escape(_scored_split(evaluation, config))
    return [
        f"<h2>Evaluation on <code>{data}</code>{split}</h2>",
        *warnings,
        _table(
            [("images", evaluation["count"])]
            + _skipped_rows(evaluation)
            + [("accuracy", evaluation["accuracy"])]
            + list(evaluation.get("top_k_accuracy", {}).items())
            + [("macro F1", evaluation["macro"]["f1"])]
        ),
        _per_class_table(evaluation),
    ]


def _per_class_table(evaluation: dict) -> str:
    head = "<tr><th>class</th><th>precision</th><th>recall</th><th>F1</th><th>support</th></tr>"
    body = ""
    for name, m in evaluation["per_class"].items():
        body += (
            f"<tr><th>{html.escape(name)}</th><td class='num'>{m['precision']:.3f}</td>"
            f"<td class='num'>{m['recall']:.3f}</td><td class='num'>{m['f1']:.3f}</td>"
            f"<td class='num'>{m['support']}</td></tr>"
        )
    return f"<table>{head}{body}</table>"
