"""A single static ``report.html`` for a work directory, drawn from its saved files.

Reads ``config.json``, ``metrics.json``, ``history.csv`` (up to the epoch ``state.json`` says
is saved) and, when ``petal evaluate`` has run, ``eval/eval.json`` with its image samples;
redraws every plot into ``plots/`` and writes ``report.html`` referencing them by relative
path (or embedding them, so the page can be mailed on its own).
"""

from __future__ import annotations

import base64
import html
import json
import math
import sys
import zipfile
from pathlib import Path

from petal.errors import PetalError, damage_reason, first_line
from petal.evaluation import plots
from petal.evaluation.workdir import check_not_in_the_way, unfinished_resume
from petal.training.callbacks import read_history

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


def _fmt(value) -> str:
    if isinstance(value, bool) or value is None:
        return html.escape(json.dumps(value))
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e4 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, (dict, list)):
        return f"<code>{html.escape(json.dumps(value))}</code>"
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


def build_report(workdir: str | Path, embed: bool = False) -> Path:
    """Redraw the plots from the saved files and write ``WORKDIR/report.html``.

    Args:
        workdir: a training work directory.
        embed: embed the PNGs as data URIs instead of referencing ``plots/*.png``.

    Returns:
        The path of ``report.html``.

    Raises:
        PetalError: when ``workdir`` holds no training run, or one of its saved files is
            damaged (the message names it and what to run again).
    """
    workdir = Path(workdir)
    if not workdir.is_dir():
        what = "is a file, not" if workdir.exists() else "does not exist; pass"
        raise PetalError(
            f"Run folder {workdir} {what} a folder petal train wrote (its --workdir)."
        )
    retrain = f"the run is damaged: retrain it (`petal train --workdir {workdir} --overwrite`)."
    config = _read_json(workdir / "config.json", retrain)
    metrics = _read_json(workdir / "metrics.json", retrain)
    history = workdir / "history.csv"
    missing = [p.name for p in (workdir / "config.json", history) if not p.is_file()]
    if missing:
        raise PetalError(
            f"{workdir} holds no training run ({' and '.join(missing)} missing); "
            "run `petal train --workdir` first."
        )
    plot_dir = workdir / PLOTS_DIR
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
    if unsaved:
        # Interrupted before the epoch's checkpoint: --resume trains it again.
        epochs_done = [row for row in epochs_done if row["epoch"] <= saved]
        which = f"epoch {unsaved[0]}" if len(unsaved) == 1 else f"epochs {unsaved[0]}-{unsaved[-1]}"
        not_saved = (
            f"{history} holds {which}, which the run did not save (it stopped before the "
            f"checkpoint): left out of this report; `petal train --workdir {workdir} --resume` "
            "trains it again."
        )
        print(f"petal report: warning: {not_saved}", file=sys.stderr)
    figures: list[tuple[str, Path]] = []
    if epochs_done:  # no epoch finished yet: no curves to draw
        figures += [
            ("Accuracy and loss", plots.plot_history(epochs_done, plot_dir / "curves.png")),
            ("Learning rate", plots.plot_lr(epochs_done, plot_dir / "lr.png")),
        ]
    evaluate_again = f"run `petal evaluate {workdir}` again."
    eval_json = workdir / EVAL_DIR / "eval.json"
    evaluation = _read_json(eval_json, evaluate_again)
    if evaluation is not None:
        missing = [key for key in _EVAL_KEYS if key not in evaluation]
        if missing:
            raise PetalError(f"{eval_json} has no {', '.join(missing)}; {evaluate_again}")
        try:
            eval_parts = _eval_section(evaluation)
            figures.append(
                (
                    "Confusion matrix",
                    plots.plot_confusion_from_json(eval_json, plot_dir / "confusion_matrix.png"),
                )
            )
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as err:
            # Values of the wrong kind or shape (the keys are there): one line, not numpy's.
            reason = damage_reason(err)
            raise PetalError(f"{eval_json} is damaged ({reason}); {evaluate_again}") from None
        for name, title in (("samples", "Sample predictions"), ("misclassified", "Misclassified")):
            npz = workdir / EVAL_DIR / f"{name}.npz"
            if npz.is_file():
                try:
                    png = plots.plot_image_grid(npz, plot_dir / f"{name}.png")
                except (ValueError, KeyError, EOFError, zipfile.BadZipFile) as err:
                    reason = first_line(err)
                    if not zipfile.is_zipfile(npz):  # numpy's guess: "pickled data"
                        reason = "not an .npz archive: truncated or overwritten"
                    raise PetalError(
                        f"{npz} is damaged ({reason}); {evaluate_again}"
                    ) from None
                if png is not None:
                    figures.append((title, png))

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
        rows = [(label, shown[key]) for key, label in labels.items() if key in shown]
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
        elif unfinished := unfinished_resume(
            workdir, completed, len(epochs_done), "history.csv and the curves hold them"
        ):
            # Resumed for more epochs and stopped before the end: metrics.json is the end
            # of the run before the resume (predict, evaluate and export say so too).
            print(f"petal report: warning: {unfinished}", file=sys.stderr)
            parts.append(f"<p><b>Not finished:</b> {html.escape(unfinished)}</p>")
        elif stopped:
            parts.append(f"<p><b>Stopped:</b> {html.escape(str(stopped))}</p>")
    else:
        parts.append("<p>metrics.json missing: the run has not finished.</p>")
        if epochs_done:
            parts += ["<h2>Training so far</h2>", _table(_so_far(epochs_done, config))]
    if not_saved is not None:
        parts.append(f"<p><b>Not saved:</b> {html.escape(not_saved)}</p>")
    if evaluation is not None:
        model_file = workdir / "model.keras"
        if model_file.is_file() and model_file.stat().st_mtime > eval_json.stat().st_mtime:
            # Resumed since: the scores are an earlier model's.
            stale = (
                f"{eval_json} scored an earlier model: {model_file} was saved after it (the "
                f"run was trained further); {evaluate_again}"
            )
            print(f"petal report: warning: {stale}", file=sys.stderr)
            eval_parts.insert(1, f"<p><b>Warning:</b> {html.escape(stale)}</p>")
        parts += eval_parts
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
    out.write_text("\n".join(parts) + "\n")
    return out


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


def _eval_section(evaluation: dict) -> list[str]:
    """The evaluation's heading and tables.

    Raises:
        ValueError: the confusion matrix does not match the classes (and the errors of
            values of the wrong kind: KeyError, TypeError...).
    """
    n = len(evaluation["classes"])
    shape = [len(row) for row in evaluation["confusion_matrix"]]
    if shape != [n] * n:
        raise ValueError(f"a confusion matrix of {len(shape)} rows for {n} classes")
    warnings = [
        f"<p><b>Warning:</b> {html.escape(str(line))}</p>"
        for line in evaluation.get("warnings", [])
    ]
    return [
        f"<h2>Evaluation on <code>{html.escape(str(evaluation.get('data', '')))}</code></h2>",
        *warnings,
        _table(
            [("images", evaluation["count"]), ("accuracy", evaluation["accuracy"])]
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
