"""The ``petal`` command line: parse arguments, build a config, call the library.

Kept thin on purpose: every command is a library function that tests call directly.
Each command has an ``_add_<name>`` function that declares its arguments and a
``_run_<name>`` function that calls the library. Heavy imports (TensorFlow) happen
inside the ``_run_`` functions so ``petal --help`` stays instant.
"""

from __future__ import annotations

import _thread
import argparse
import contextlib
import dataclasses
import gc
import glob
import io
import os
import re
import signal
import stat
import sys
import tempfile
import threading
import time
from typing import NoReturn

# TensorFlow's C++ INFO/WARNING lines (oneDNN, CUDA probing) drown the output users read;
# errors still show. Set before any command imports TensorFlow.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from petal import __version__
from petal.display import columns, ljust
from petal.errors import (
    PetalError,
    cannot_write,
    disk_full,
    first_line,
    printable,
    tf_message,
)
from petal.jsonfile import json_text
from petal.running import signals_watched

# What TensorFlow 2.21 writes to stderr while it starts, on every run, before its logging
# honours TF_CPP_MIN_LOG_LEVEL: absl's preamble, INFO lines (oneDNN, "Could not find cuda
# drivers") and, on machines without a GPU, the failed cuInit. Warnings and other errors pass.
_STARTUP_NOISE = re.compile(
    r"^WARNING: All log messages before absl::InitializeLog\(\) is called"
    r"|^I\d{4} \S+ +\d+ [\w.]+:\d+\] "
    r"|^E\d{4} \S+ +\d+ cuda_\w+\.cc:\d+\] failed call to cuInit"
)

# (name, add-arguments function, run function, one-line help); sections below append here.
COMMANDS: list[tuple[str, object, object, str]] = []


# --- records: convert, inspect -------------------------------------------------------------


def _add_convert(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", metavar="SRC", help="folder of class sub-folders (or gs://...)")
    parser.add_argument("output", metavar="DST", help="records folder to write")
    parser.add_argument(
        "--image-size", default=None, metavar="SIZE", help="stored size: 192 or HxW (default 192)"
    )
    parser.add_argument(
        "--resize",
        choices=("fill", "pad", "stretch", "none"),
        default="fill",
        help="fill: cover and centre-crop, like the codelab (default); pad; stretch; "
        "none: keep sizes",
    )
    parser.add_argument(
        "--format", choices=("jpeg", "raw"), default="jpeg", help="jpeg (default) or raw uint8"
    )
    parser.add_argument(
        "--quality", type=int, default=None,
        help="JPEG quality of the images it encodes (default 95; with --resize none a plain "
        "JPEG keeps its own bytes)",
    )
    parser.add_argument(
        "--val-fraction", type=float, default=0.19, help="validation share per class (0.19)"
    )
    parser.add_argument("--seed", type=int, default=42, help="split and order seed (42)")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--shards", type=int, default=None, help="shards per split")
    group.add_argument(
        "--shard-mb", type=float, default=None, help="target shard size in MB (default 200)"
    )
    parser.add_argument(
        "--classes", default=None, help="comma-separated class names, in index order"
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        help="worker processes (default: the CPUs this process may run on)",
    )
    parser.add_argument(
        "--max-pixels",
        type=int,
        default=None,
        help="skip images with more pixels (default 89478485, PIL's)",
    )
    parser.add_argument(
        "--overwrite", action="store_true", help="replace an existing conversion in DST"
    )


def _run_convert(args: argparse.Namespace) -> int:
    from petal.data import convert
    from petal.data.images import DEFAULT_MAX_PIXELS

    if args.output.startswith("ram://"):
        # TensorFlow's in-memory file system: the records would vanish as the command ends.
        raise PetalError(
            f"DST {args.output} is TensorFlow's in-memory file system: its records would be "
            "gone when petal exits; pass a local folder or a gs:// one."
        )
    summary = convert(
        args.source,
        args.output,
        image_size=args.image_size,
        resize=args.resize,
        format=args.format,
        quality=args.quality,
        val_fraction=args.val_fraction,
        seed=args.seed,
        shards=args.shards,
        shard_mb=args.shard_mb,
        classes=args.classes,
        workers=args.workers,
        max_pixels=DEFAULT_MAX_PIXELS if args.max_pixels is None else args.max_pixels,
        overwrite=args.overwrite,
        progress=sys.stderr.isatty(),
    )
    for line in summary.skipped_lines():
        print(line, file=sys.stderr)
    print(str(summary).splitlines()[0])
    for warning in summary.warnings:  # on stderr with the skipped files, as train's are
        print(f"petal convert: warning: {warning}", file=sys.stderr)
    return 0


def _add_inspect(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "output",
        metavar="DST",
        help="records folder written by petal convert, or shards without a manifest (the "
        "codelab's: a folder or a quoted glob)",
    )
    parser.add_argument(
        "--verify", action="store_true", help="read every record: CRC, parse, decode, fields"
    )
    parser.add_argument("--grid", default=None, metavar="PNG", help="write a sample image grid")


def _run_inspect(args: argparse.Namespace) -> int:
    from petal.data import inspect_records
    from petal.data.folders import is_remote
    from petal.data.inspect import image_path

    if args.grid is not None:
        args.grid = image_path(args.grid)
        if not is_remote(args.grid):  # before the records are read
            _check_output_file(args.grid, "--grid")
    report = inspect_records(
        args.output, verify=args.verify, grid=args.grid, progress=sys.stderr.isatty()
    )
    print(report)
    return 0 if report.ok else 1


COMMANDS.append(
    ("convert", _add_convert, _run_convert, "image folder -> sharded TFRecords + manifest")
)
COMMANDS.append(
    ("inspect", _add_inspect, _run_inspect, "summarise (and --verify) records or codelab shards")
)


# --- input pipeline: bench ------------------------------------------------------------------

def _add_bench(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="bench_command", metavar="WHAT")
    p = sub.add_parser(
        "input",
        help="images/s of each input path against the JPEG decode ceiling",
        description="Images/s and batches/s (after warm-up) of the per-file folder path, "
        "TFRecord JPEG, TFRecord raw and the cached pipeline, each with and without "
        "augmentation, against the decode ceiling; names the bottleneck.",
    )
    p.add_argument("records", metavar="RECORDS", help="JPEG records folder (petal convert output)")
    p.add_argument("--folder", metavar="SRC", help="the image folder RECORDS came from (per-file case)")
    p.add_argument("--raw-records", metavar="DIR",
                   help="the same images as raw records (default: written to a temporary folder)")
    p.add_argument("--json", metavar="OUT", help="write the results as JSON")
    p.add_argument("--png", metavar="OUT", help="write a bar chart (.png, .jpg, .webp, .pdf, .svg; "
                   "no extension: .png added)")
    p.add_argument("--batch-size", type=int, default=64, help="batch size (default 64)")
    p.add_argument("--seconds", type=float, default=6.0, help="timed seconds per case (default 6)")
    p.add_argument("--augment", default="codelab", help="augmentation of the +aug cases (codelab)")
    p.add_argument("--repeat", type=int, default=1, metavar="N",
                   help="rounds over all cases; medians reported (default 1)")
    p.add_argument("--cases", help="comma-separated subset: ceiling,folder,jpeg,jpeg-uint8,jpeg-sj,raw,cached,remote")
    p.add_argument("--remote-latency-ms", type=float, metavar="MS",
                   help="also read through a loopback object server with MS ms per request")
    p.add_argument("--image-size", metavar="SIZE",
                   help="size of the records' images, 192 or HxW, for records that do not "
                   "record one (codelab shards with only image and class)")
    p.set_defaults(_run=_run_bench_input)
    parser.set_defaults(_bench_parser=parser)


def _run_bench(args: argparse.Namespace) -> int:
    args._bench_parser.print_help()
    return 2


def _run_bench_input(args: argparse.Namespace) -> int:
    import tensorflow as tf

    from petal.data import bench

    cases = bench.check_settings(
        batch_size=args.batch_size, seconds=args.seconds, repeats=args.repeat, cases=args.cases
    )
    # Output paths fail now, not after minutes of measuring.
    if args.json:
        _check_output_file(args.json, "--json")
    if args.png:
        from petal.data.inspect import image_path

        args.png = image_path(args.png, "--png")
        _check_output_file(args.png, "--png")
        # The chart, written second, replaced the JSON.
        if args.json and os.path.realpath(args.json) == os.path.realpath(args.png):
            raise PetalError(f"--json and --png both name {args.png}; pass two file paths.")
    for option, path in (("--json", args.json), ("--png", args.png)):
        _check_not_an_input(path, option, RECORDS=args.records, **{
            "--raw-records": args.raw_records, "--folder": args.folder})
    try:
        result = bench.run(
            args.records,
            folder=args.folder,
            raw_records=args.raw_records,
            batch_size=args.batch_size,
            seconds=args.seconds,
            augment=args.augment,
            repeats=args.repeat,
            remote_latency_ms=args.remote_latency_ms,
            cases=cases,
            image_size=args.image_size,
            progress=lambda line: print(line, flush=True),
        )
    except tf.errors.OpError as err:  # not the input's fault (bench.run names bad input)
        raise PetalError(tf_message(err).splitlines()[0]) from None
    print(bench.format_table(result))
    if args.json:
        bench.write_json(result, args.json)
        print(f"wrote {args.json}")
    if args.png:
        bench.write_png(result, args.png)
        print(f"wrote {args.png}")
    return 0


def _check_not_an_input(path: str | None, option: str, **inputs) -> None:
    """Raise when output ``path`` lies in one of the local ``inputs`` (a folder, a file or a
    glob of shards): --json RECORDS/manifest.json replaced the records' manifest."""
    import glob

    from petal.data.folders import expand_home, is_within

    for name, given in inputs.items():
        if not path or not given:
            continue
        given = expand_home(str(given))
        files = glob.glob(given) if glob.has_magic(given) else [given]
        real = os.path.realpath(path)
        if is_within(path, given) or any(os.path.realpath(f) == real for f in files):
            raise PetalError(
                f"{option} {path} lies in {name} {given}, the data measured: pass a path "
                "outside it."
            )


def _check_output_file(path: str, option: str) -> None:
    """Raise unless ``path`` can be created or replaced as a file (its folder may be new)."""
    if os.path.isdir(path):
        raise PetalError(f"{option} {path} is a folder; pass a file path.")
    if reason := cannot_write(path, folder=False):
        raise PetalError(f"{option} {path}: {reason}; pass another path.")


COMMANDS.append(("bench", _add_bench, _run_bench, "benchmarks: `petal bench input RECORDS`"))


# --- models and training: models, train, evaluate, predict, export, report, demo -----------

def _add_models(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--image-size", type=int, default=None, help="square side in pixels (default: each model's own)")
    parser.add_argument("--num-classes", type=int, default=5, help="classes of the head (default 5)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")


def _run_models(args: argparse.Namespace) -> int:
    import json

    import keras
    import tensorflow as tf

    from petal.models import list_models, model_info
    from petal.models.registry import model_summary

    if args.image_size is not None and args.image_size < 1:
        raise PetalError(f"--image-size must be a positive int. Received: image_size={args.image_size}")
    if args.num_classes < 2:
        raise PetalError(f"--num-classes must be an int >= 2. Received: num_classes={args.num_classes}")
    rows = []
    for name in list_models():
        info = model_info(name)
        note = None
        if args.image_size is not None and args.image_size < info.min_image_size:
            note = f"needs >= {info.min_image_size} px"
        else:
            try:
                row = model_summary(name, args.num_classes, args.image_size)
                rows.append({**row, "note": None})
                continue
            except tf.errors.ResourceExhaustedError:  # e.g. dense's weights at 4000 px
                keras.backend.clear_session()
                note = "out of memory"
        # The keys of a measured row, unmeasured ones null.
        rows.append({"name": name, "params": None, "trainable_params": None, "mflops": None,
                     "image_size": args.image_size or info.default_image_size,
                     **{k: v for k, v in dataclasses.asdict(info).items() if k != "name"},
                     "note": note})
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'model':<22}{'params':>15}{'MFLOPs/img':>12}{'size':>6}{'default':>9}  "
          f"{'normalization':<15}pretrained")
    for r in rows:
        params = f"{r['params']:,}" if r["params"] is not None else r["note"]
        mflops = f"{r['mflops']:.1f}" if r["mflops"] is not None else "-"
        print(f"{r['name']:<22}{params:>15}{mflops:>12}{r['image_size']:>6}"
              f"{r['default_image_size']:>9}  {r['normalization']:<15}"
              f"{'imagenet' if r['pretrained'] else '-'}")
    print("MFLOPs: 2 x multiply-accumulates of conv and dense layers, forward pass, per image.")
    return 0


COMMANDS.append(("models", _add_models, _run_models, "list the registered models with parameters and MFLOPs per image"))


def _add_train(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--preset", default=None, help="named preset (default: 'default'; --list-presets)"
    )
    parser.add_argument("--list-presets", action="store_true", help="list the presets and exit")
    parser.add_argument("--config", default=None, metavar="FILE", help="JSON file of config fields")
    parser.add_argument(
        "--data",
        default=None,
        metavar="PATH",
        help="records folder from petal convert, codelab shards or an image folder",
    )
    parser.add_argument(
        "--classes",
        default=None,
        metavar="NAMES",
        help="comma-separated class names in index order: for codelab shards (needed when "
        "they name no classes) or an image folder (the class folders to train on)",
    )
    parser.add_argument(
        "--workdir",
        default=None,
        metavar="DIR",
        help="output folder (default runs/PRESET: the preset of --preset, else of the --config "
        "file, else runs/default)",
    )
    parser.add_argument(
        "--model",
        default=None,
        help="registered model name (petal models); it takes its own input normalization "
        "and model options, not the preset's, unless --set sets them",
    )
    parser.add_argument(
        "--epochs", type=int, default=None,
        help="total epochs (the preset's by default; with --resume, more trains on)",
    )
    parser.add_argument("--batch-size", type=int, default=None, help="batch per replica")
    parser.add_argument(
        "--image-size",
        type=int,
        default=None,
        help="square model input size in pixels (evaluation; training too unless the preset "
        "or --set train_image_size trains on other crops)",
    )
    parser.add_argument(
        "--strategy",
        default=None,
        help="auto, tpu, mirrored, multi-worker, one-device, cpu, default (TensorFlow's "
        "default: one device, no distribution)",
    )
    parser.add_argument(
        "--precision", default=None, help="auto, float32, mixed_bfloat16, mixed_float16"
    )
    parser.add_argument(
        "--weights",
        default=None,
        help="'imagenet', a .weights.h5 file (the model's, its backbone's, or a run's "
        "best.weights.h5 for other classes: all but the head loads) or 'none'",
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override any config field (repeatable), e.g. --set label_smoothing=0.1; "
        "fine-tuning a pretrained backbone head first: --set fine_tune=head_then_all --set "
        "head_epochs=2 (fine_tune_lr_factor, model_options.bn_frozen: README, Fine-tuning)",
    )
    parser.add_argument("--resume", action="store_true", help="continue the run in --workdir")
    parser.add_argument("--overwrite", action="store_true", help="replace the run in --workdir")
    parser.add_argument(
        "--skip-corrupt",
        action="store_true",
        help="skip corrupt records with a warning and count them (default: stop)",
    )


def _run_train(args: argparse.Namespace) -> int:
    from pathlib import Path

    from petal.training.config import get_preset, list_presets, load_config, preset_doc

    if args.list_presets:
        for name in list_presets():
            print(f"{name:<20}{preset_doc(name)}")
        return 0
    if args.workdir is None and args.resume:
        raise PetalError("--resume needs the --workdir of the run to continue.")
    base = None
    if args.resume:
        if args.preset:
            raise PetalError(
                f"--resume continues the run saved in {args.workdir}; --preset starts a new "
                "one: drop --preset (change fields with --set KEY=VALUE), or drop --resume and "
                "pass --overwrite to start afresh."
            )
        from petal.training.loop import recover_replaced, resume_config

        recover_replaced(args.workdir, print)  # an --overwrite killed: the run it replaced
        base = resume_config(args.workdir)  # a --config file's fields apply on top
    elif args.preset:
        get_preset(args.preset)  # unknown preset: list the valid ones before anything else
    # --set comes last, as it does over every flag.
    overrides = (["skip_corrupt=true"] if args.skip_corrupt else []) + list(args.overrides)
    try:
        config = load_config(
            args.preset,
            args.config,
            overrides,
            base=base,
            data=args.data,
            classes=args.classes,
            model=args.model,
            epochs=args.epochs,
            batch_size=args.batch_size,
            image_size=args.image_size,
            strategy=args.strategy,
            precision=args.precision,
            weights=args.weights,  # 'none' in any case is no weights (the config reads it)
        )
    except PetalError:
        if base is not None:  # a change --resume refuses anyway is the one to name
            from petal.training.config import parse_overrides
            from petal.training.loop import refuse_checkpoint_changes

            given = parse_overrides(overrides)
            if args.model is not None:
                given["model"] = args.model
            refuse_checkpoint_changes(args.workdir, base, given)
        raise
    if args.workdir is None:  # the preset resolved: --preset's, else the --config file's
        args.workdir = str(Path("runs") / config.preset)

    from petal.training.loop import train
    from petal.training.saved import run_restored

    before = _state_file(args.workdir)
    try:
        train(config, args.workdir, resume=args.resume, overwrite=args.overwrite)
    except KeyboardInterrupt as err:
        wanted = config.epochs if args.resume else None
        _print_resume_hint(args.workdir, restored=run_restored(err), epochs=wanted)
        raise
    except Exception as err:
        # An error once this run saved an epoch (a full disk, a corrupt record): say how to
        # go on from it, unless the message says so (a non-finite loss).
        if _state_file(args.workdir) != before and "--resume" not in str(err):
            _print_resume_hint(args.workdir)
        raise
    return 0


def _state_file(workdir: str) -> tuple | None:
    """``workdir``'s ``state.json`` (None without one), to tell whether it changed: training
    replaces it with each epoch it saves (its wall time too), and writes it nowhere else."""
    path = os.path.join(workdir, "state.json")
    try:
        stat = os.stat(path)
        with open(path, "rb") as f:
            return stat.st_ino, stat.st_mtime_ns, f.read()
    except OSError:
        return None


def _print_resume_hint(
    workdir: str, command: str = "train", restored: bool = False, epochs: int | None = None
) -> None:
    """After Ctrl-C (or an error): say how to continue from the last saved epoch, if one was
    saved (or that the run is complete, when it was stopped after its last file). For
    ``demo``: its run, which the demo run again would start over. ``restored``: an
    --overwrite (the demo's too) stopped before it saved an epoch, and the run it replaced is
    back: that run is not the one to finish. ``epochs``: those a --resume was to reach; an
    extension of a complete run stopped before its first new epoch is continued with them
    (``--resume`` alone has nothing to do), and so is a resume of an unfinished run for
    other epochs than its ``config.json`` names (rewritten only at its first save). A stderr
    that cannot take the line loses it, not the exit status (:func:`_tell`)."""
    import shlex

    from petal.training.saved import configured_epochs, finished_epochs, saved_epoch

    demo = command == "demo"

    def nothing_saved() -> None:
        what = "demo" if demo else "run"
        _tell(f"petal {command}: no epoch was saved; the same command starts the {what} again")

    if restored:
        what = "the demo" if demo else "it"
        _tell(
            f"petal {command}: no epoch of the new run was saved (the run it replaced is back "
            f"in {workdir}); the same command starts {what} again"
        )
        return
    if demo and not os.path.isfile(os.path.join(workdir, "config.json")):
        nothing_saved()  # no run there yet: the demo was converting (it converts again)
        return
    quoted = shlex.quote(workdir)
    rest = f"`petal evaluate {quoted}` and `petal report {quoted}`"  # what the demo had left
    if (done := finished_epochs(workdir)) and not demo and epochs and epochs > done:
        _tell(
            f"petal {command}: the run is complete at its {done} epoch{'s' * (done != 1)} and "
            f"no later one was saved (model.keras and metrics.json are of epoch {done}); "
            f"continue with `petal train --resume --epochs {epochs} --workdir {quoted}`"
        )
        return
    if done:  # stopped after its last file: nothing to resume
        _tell(
            f"petal {command}: the run is complete: its {done} epoch{'s' * (done != 1)}, "
            "model.keras and "
            f"metrics.json are saved in {workdir}" + (f"; {rest} finish the demo" if demo else "")
        )
        return
    epoch = saved_epoch(workdir)
    if epoch:
        then = f", then {rest} (the demo run again starts over)" if demo else ""
        # A resume for other epochs stopped before it saved one: config.json still names the
        # old count, which a plain --resume would go on to.
        more = f" --epochs {epochs}" if epochs and epochs != configured_epochs(workdir) else ""
        _tell(
            f"petal {command}: epoch {epoch} is saved; continue with "
            f"`petal train --resume{more} --workdir {quoted}`{then}"
        )
    elif demo or (command == "train" and not os.path.exists(os.path.join(workdir, "state.json"))):
        nothing_saved()


def _add_evaluate(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("workdir", metavar="WORKDIR", help="work directory of a finished run")
    parser.add_argument(
        "--data",
        default=None,
        metavar="PATH",
        help="records or image folder (default: the run's training data)",
    )
    parser.add_argument(
        "--classes",
        default=None,
        metavar="NAMES",
        help="comma-separated class names in index order of codelab shards that name none, "
        "or the class folders of an image folder to read (default: the run's, on its data)",
    )
    parser.add_argument(
        "--split",
        default=None,
        help="validation, train or all (default: validation for records and for the image "
        "folder the run trained on, all for other image folders)",
    )
    parser.add_argument("--batch-size", type=int, default=64, help="images per forward pass "
                        "(default 64)")
    parser.add_argument(
        "--top-k", type=int, default=None,
        help="k of the top-k accuracy (default 3; at most the class count)",
    )
    parser.add_argument("--json", action="store_true", help="print eval.json")
    parser.add_argument("--out", default=None, metavar="DIR", help="default WORKDIR/eval")
    parser.add_argument(
        "--skip-corrupt",
        action="store_true",
        help="skip corrupt records with a warning and count them (default: stop)",
    )


def _local_data_exists(data: str) -> bool:
    """Whether a local data path exists, or is a glob of shards matching some (a run trained
    on ``'shards/*.tfrec'`` keeps the pattern as its data)."""
    return os.path.exists(data) or (any(ch in data for ch in "*?[") and bool(glob.glob(data)))


def _run_evaluate(args: argparse.Namespace) -> int:

    from petal.evaluation.evaluate import evaluate
    from petal.evaluation.workdir import open_run

    data = args.data if args.data is not None else open_run(args.workdir).config.get("data")
    if not data:
        raise PetalError("Pass --data PATH (records or an image folder) to evaluate on.")
    if args.data is None and "://" not in str(data) and not _local_data_exists(data):
        # Runs written before data paths were stored absolute hold the path as typed.
        where = "" if os.path.isabs(data) else " (relative to the folder the run was started in)"
        raise PetalError(
            f"The training data of {args.workdir}, {data}{where}, is not found; "
            "pass --data PATH to evaluate on."
        )
    quiet = (lambda line: None) if args.json else None
    report = evaluate(
        args.workdir,
        data,
        split=args.split,
        batch_size=args.batch_size,
        top_k=args.top_k,
        out_dir=args.out,
        skip_corrupt=args.skip_corrupt,
        classes=args.classes,
        log=quiet,
    )
    if args.json:
        _print_all(json_text(report))
    else:
        # A control character in a class name (a newline) written as its escape, as
        # labels.txt and predict write it: one row a class.
        width = max(12, *(columns(printable(c)) for c in report["classes"]))
        print(f"{ljust('class', width)}  precision  recall     f1  support")
        # Each class, then the averages as scikit-learn's classification_report ends.
        rows = [(printable(name), m) for name, m in report["per_class"].items()]
        rows += [(f"{key} avg", report[key]) for key in ("macro", "weighted") if key in report]
        for name, m in rows:
            print(
                f"{ljust(name, width)}  {m['precision']:9.3f}  {m['recall']:6.3f}  "
                f"{m['f1']:5.3f}  {m['support']:7d}"
            )
    return 0


def _add_predict(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("workdir", metavar="WORKDIR", help="work directory of a finished run")
    parser.add_argument(
        "images", metavar="IMAGE", nargs="+", help="image files, or folders of them (recursive)"
    )
    parser.add_argument(
        "--top-k", type=int, default=None, help="labels per image (default 3; at most the class count)"
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument(
        "--skip-corrupt",
        action="store_true",
        help="skip unreadable images, each named in a warning (default: stop, naming them)",
    )
    parser.add_argument(
        "--max-pixels",
        type=int,
        default=None,
        help="refuse images with more pixels (default 89478485, PIL's)",
    )


def _run_predict(args: argparse.Namespace) -> int:
    from petal.data.images import DEFAULT_MAX_PIXELS
    from petal.evaluation.predict import format_predictions, predict

    results = predict(
        args.workdir,
        args.images,
        top_k=args.top_k,
        skip_corrupt=args.skip_corrupt,
        max_pixels=DEFAULT_MAX_PIXELS if args.max_pixels is None else args.max_pixels,
    )
    if args.json:
        _print_all(json_text(results))  # strict JSON: NaN probabilities as null
    else:
        _print_all(format_predictions(results) + "\n")
    return 0


def _add_export(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("workdir", metavar="WORKDIR", help="work directory of a finished run")
    parser.add_argument("--out", default=None, metavar="DIR", help="default WORKDIR/export")
    parser.add_argument("--tflite", action="store_true", help="also write model.tflite (pixels in)")
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace saved_model, labels.txt, model.tflite and export.json in --out that no "
        "petal export wrote there, or another run's export (this run's earlier export is "
        "replaced anyway; other files stay)",
    )


def _run_export(args: argparse.Namespace) -> int:
    from petal.evaluation.export import export

    out = export(args.workdir, args.out, tflite=args.tflite, overwrite=args.overwrite)
    print(f"SavedModel (encoded image bytes in): {out['saved_model']}")
    print(f"labels: {out['labels']}")
    if out["tflite"]:
        print(f"TFLite (float pixels 0..255 in): {out['tflite']}")
    for path in out["removed"]:
        print(f"removed {path}, which would not match this export (pass --tflite to write one)")
    return 0


def _add_report(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("workdir", metavar="WORKDIR", help="work directory of a run")
    parser.add_argument("--embed", action="store_true", help="embed the PNGs in the HTML")
    parser.add_argument(
        "--eval",
        dest="eval_dir",
        default=None,
        metavar="DIR",
        help="the run's evaluation, as `petal evaluate --out DIR` wrote it (default WORKDIR/eval)",
    )


def _run_report(args: argparse.Namespace) -> int:
    from petal.evaluation.report import build_report

    print(build_report(args.workdir, embed=args.embed, eval_dir=args.eval_dir))
    return 0


def _add_demo(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data",
        default=None,
        metavar="FOLDER",
        help="folder of class sub-folders (default $PETAL_DATA, else tf_flowers)",
    )
    parser.add_argument(
        "--workdir",
        default="petal-demo",
        metavar="DIR",
        help="default ./petal-demo, outside --data; the records go to DIR/records and are reused "
        "while the photos are unchanged (records or a run no demo wrote are never replaced)",
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a field of the quick preset (repeatable)",
    )


def _run_demo(args: argparse.Namespace) -> int:
    from petal.demo import run_demo

    run_demo(args.data, args.workdir, overrides=tuple(args.overrides))
    return 0


COMMANDS.append(
    (
        "train",
        _add_train,
        _run_train,
        "train a model from records with a preset, config and overrides",
    )
)
COMMANDS.append(
    (
        "evaluate",
        _add_evaluate,
        _run_evaluate,
        "accuracy, top-k, per-class metrics and plots of a run",
    )
)
COMMANDS.append(
    ("predict", _add_predict, _run_predict, "top-k labels with probabilities for image files or folders")
)
COMMANDS.append(
    ("export", _add_export, _run_export, "SavedModel taking encoded image bytes (and TFLite)")
)
COMMANDS.append(
    ("report", _add_report, _run_report, "PNG plots and report.html from a run's saved files")
)
COMMANDS.append(
    ("demo", _add_demo, _run_demo, "convert, train the quick preset, evaluate and report")
)



# --- dispatcher -----------------------------------------------------------------------------

# The arguments naming what petal writes or reads on a local disk only, per command: (attribute,
# option, what it holds, read or written, folder or file). A URL there is refused before
# TensorFlow starts; a Path made the local folder gs:/b/run of gs://b/run. Data (--data, SRC,
# DST, RECORDS) may be a URL and is not among them.
_READ, _WRITE = True, False
_LOCAL_ONLY = {
    "train": (
        ("workdir", "--workdir", "run folders", _WRITE, True),
        ("config", "--config", "config files", _READ, False),
        ("weights", "--weights", "weights files", _READ, False),
    ),
    "evaluate": (
        ("workdir", "WORKDIR", "run folders", _READ, True),
        ("out", "--out", "evaluations", _WRITE, True),
    ),
    "predict": (("workdir", "WORKDIR", "run folders", _READ, True),),
    "export": (
        ("workdir", "WORKDIR", "run folders", _READ, True),
        ("out", "--out", "exports", _WRITE, True),
    ),
    "report": (
        ("workdir", "WORKDIR", "run folders", _READ, True),
        ("eval_dir", "--eval", "evaluations", _READ, True),
    ),
    "demo": (
        ("data", "--data", "the demo's photos", _READ, True),
        ("workdir", "--workdir", "the demo's records and run", _WRITE, True),
    ),
    "bench": (
        ("json", "--json", "benchmark results", _WRITE, False),
        ("png", "--png", "benchmark charts", _WRITE, False),
    ),
}


# The path arguments, per command: (attribute, option, what to pass instead). An empty one (an
# unset shell variable) is refused before TensorFlow starts: a Path made it the current folder,
# so predict read every image under it and evaluate and export wrote their files into it.
_RUN = "the work directory of a `petal train` run"
_PATHS = {
    "convert": (
        ("source", "SRC", "a folder of class sub-folders"),
        ("output", "DST", "the records folder to write"),
    ),
    "inspect": (("output", "DST", "a records folder or codelab shards"),),
    "train": (
        ("data", "--data", "records, codelab shards or an image folder"),
        ("workdir", "--workdir", "the run's folder, or leave --workdir out for runs/PRESET"),
        ("config", "--config", "a JSON file of config fields"),
        ("weights", "--weights", "'imagenet', a .weights.h5 file or 'none'"),
        # Not a path, but as empty from a shell variable: it trained the default preset.
        ("preset", "--preset", "a preset (petal train --list-presets), or leave --preset out"),
    ),
    "evaluate": (
        ("workdir", "WORKDIR", _RUN),
        ("data", "--data", "records or an image folder, or leave --data out for the run's"),
        ("out", "--out", "a folder, or leave --out out for WORKDIR/eval"),
    ),
    "predict": (
        ("workdir", "WORKDIR", _RUN),
        ("images", "IMAGE", "image files or folders of them"),
    ),
    "export": (
        ("workdir", "WORKDIR", _RUN),
        ("out", "--out", "a folder, or leave --out out for WORKDIR/export"),
    ),
    "report": (
        ("workdir", "WORKDIR", _RUN),
        ("eval_dir", "--eval", "the folder of `petal evaluate --out`, or leave --eval out"),
    ),
    "demo": (
        ("data", "--data", "a folder of class sub-folders, or leave --data out"),
        ("workdir", "--workdir", "a folder, or leave --workdir out for ./petal-demo"),
    ),
    "bench": (
        ("records", "RECORDS", "a JPEG records folder (petal convert output)"),
        ("folder", "--folder", "the image folder RECORDS came from, or leave --folder out"),
        ("raw_records", "--raw-records", "raw records, or leave --raw-records out"),
        ("json", "--json", "a file to write, or leave --json out"),
        ("png", "--png", "a file to write, or leave --png out"),
    ),
}


def refuse_empty_paths(args: argparse.Namespace) -> None:
    """Raise a PetalError naming the first of ``args``' path arguments given as ``''``."""
    for attr, option, what in _PATHS.get(args.command, ()):
        value = getattr(args, attr, None)
        if value == "" or (isinstance(value, list) and "" in value):
            raise PetalError(f"{option} is empty (an unset shell variable?); pass {what}.")


def expand_homes(args: argparse.Namespace) -> None:
    """Expand a leading ``~`` in ``args``' path arguments (and inspect's ``--grid``): a shell
    leaves ``--workdir=~/runs`` as it is, and petal made a folder named ``~``."""
    from petal.data.folders import expand_home

    for attr in [attr for attr, _, _ in _PATHS.get(args.command, ())] + ["grid"]:
        value = getattr(args, attr, None)
        if isinstance(value, list):
            setattr(args, attr, [expand_home(v) for v in value])
        elif value is not None:
            setattr(args, attr, expand_home(value))


def refuse_urls(args: argparse.Namespace) -> None:
    """Raise a PetalError naming the first URL among ``args``' local-only arguments."""
    from petal.data.folders import refuse_url

    for attr, option, what, reads, folder in _LOCAL_ONLY.get(args.command, ()):
        refuse_url(getattr(args, attr, None), option, what, reads=reads, folder=folder)


def refuse_missing_inputs(args: argparse.Namespace) -> None:
    """Raise a PetalError naming convert's SRC or train's --weights when that local path does
    not exist: before TensorFlow starts (seconds) and, for --weights, before train's start-up
    lines (the file was looked for as the model was built)."""
    if args.command == "convert":
        source = args.source
        if "://" not in source and not os.path.lexists(source):
            raise PetalError(
                f"SRC {source} does not exist; check the path (SRC is a folder with one "
                "sub-folder of images per class)."
            )
    elif args.command == "train" and not args.resume and not args.list_presets:
        # A --resume's weights were loaded when the run started: the run does not read them.
        weights = args.weights
        if weights and weights.strip().lower() not in ("none", "imagenet") and (
            "://" not in weights and not os.path.lexists(weights)
        ):
            raise PetalError(
                f"--weights {weights} does not exist; pass an existing .weights.h5 file, "
                "'imagenet' or 'none'."
            )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="petal",
        description="Folder of photos -> sharded TFRecords -> trained image classifier.",
    )
    parser.add_argument("--version", action="version", version=f"petal {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, add, run, help_text in COMMANDS:
        p = sub.add_parser(name, help=help_text, description=help_text)
        add(p)
        p.set_defaults(_run=run, _parser=p)
    return parser


def _parse(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """The arguments; an unknown option of a command is refused in that command's name,
    pointing at its --help (argparse gave petal's own usage, which names neither the command
    nor its options)."""
    args, unknown = parser.parse_known_args(argv)
    command = getattr(args, "_parser", None)
    takes_files = command is not None and any(
        a.nargs in ("+", "*") for a in command._actions if not a.option_strings
    )
    options = unknown[: unknown.index("--")] if "--" in unknown else unknown  # then files
    if unknown and takes_files and not any(u.startswith("-") for u in options):
        # `predict RUN a.jpg --top-k 2 b.jpg`: argparse ends a list of files at an option
        argv = sys.argv[1:] if argv is None else argv
        rest = argv[argv.index(args.command) + 1 :]
        return command.parse_intermixed_args(rest, argparse.Namespace(command=args.command))
    if unknown:
        (command or parser).error(f"unrecognized arguments: {' '.join(unknown)}")
    return args


def start_tensorflow_quietly() -> None:
    """Imports TensorFlow and Keras and finds the devices with TensorFlow's start-up lines
    (:data:`_STARTUP_NOISE`) dropped from stderr; everything else written meanwhile is kept.

    Ctrl-C and SIGTERM wait until the import is over: raised inside it, their exception left
    TensorFlow's or matplotlib's modules half-initialised (a crash or a traceback instead of
    "interrupted"). ``TF_CPP_MIN_LOG_LEVEL=0`` shows everything. No-op once TensorFlow is
    imported.
    """
    if "tensorflow" in sys.modules:
        return
    from petal.running import signals_held

    _use_tensorflow_backend()
    with signals_held("TensorFlow's start"):
        try:
            _import_tensorflow()
        except ValueError as err:  # Keras' settings file: an unknown floatx, backend, ...
            settings = os.path.join(
                os.environ.get("KERAS_HOME") or os.path.join(os.path.expanduser("~"), ".keras"),
                "keras.json",
            )
            raise PetalError(
                f"Keras did not start: {first_line(err)}; fix or remove its settings file "
                f"{settings} (Keras writes a default one)."
            ) from None
    # The 400,000 objects TensorFlow and Keras leave live as long as the process: the
    # collector's full passes skip them once frozen. Each pass over them took 0.2 s, a
    # stall of the whole conversion during its scan (the workers wait for files).
    gc.freeze()


def _use_tensorflow_backend() -> None:
    """petal's commands run Keras on TensorFlow: a ``KERAS_BACKEND`` (or ``keras.json``
    backend) naming another is overridden, ``KERAS_BACKEND`` with a warning. On JAX,
    evaluate, predict and export crashed, and train ran slower without saying so."""
    if "keras" in sys.modules:
        return
    chosen = os.environ.get("KERAS_BACKEND", "tensorflow")
    os.environ["KERAS_BACKEND"] = "tensorflow"
    if chosen != "tensorflow":
        print(
            f"petal: warning: KERAS_BACKEND={chosen} is ignored: petal's commands run Keras "
            "on TensorFlow (petal's models and schedules work on other backends as a library)",
            file=sys.stderr,
        )


def _import_tensorflow() -> None:
    saved = None
    if os.environ.get("TF_CPP_MIN_LOG_LEVEL") != "0":
        try:
            sys.stderr.flush()
            saved = os.dup(2)
        except (OSError, ValueError, AttributeError):  # no real stderr (None when closed)
            pass
    if saved is None:  # everything is to be shown, or there is no stderr to capture
        import keras  # noqa: F401
        import tensorflow  # noqa: F401

        return
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            import keras  # noqa: F401
            import tensorflow as tf

            tf.config.list_physical_devices()
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            text = captured.read().decode("utf-8", errors="replace")
            kept = [ln for ln in text.splitlines(True) if not _STARTUP_NOISE.search(ln)]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()


def _needs_tensorflow(args: argparse.Namespace) -> bool:
    return not (args.command == "train" and getattr(args, "list_presets", False))


class _Terminated(KeyboardInterrupt):
    """SIGTERM (a job scheduler, a preempted VM, ``kill``) unwinds a command as Ctrl-C
    does: a conversion removes its temporary files and stops its workers, and training
    says how to resume."""


def _terminate(signum, frame):
    raise _Terminated


def run_script(prog: str, work) -> None:
    """``work()`` for a benchmark script named ``prog``: SIGTERM unwinds as Ctrl-C does (its
    temporary files go), and either ends in one line and the shell's exit status; so does a
    PetalError (exit 2, as argparse's errors)."""
    signal.signal(signal.SIGTERM, _terminate)
    try:
        with signals_watched(prog):
            work()
    except PetalError as err:
        _tell(f"{prog}: error: {err}")
        sys.exit(2)
    except _Terminated:
        _tell(f"{prog}: terminated")
        sys.exit(128 + signal.SIGTERM)
    except KeyboardInterrupt:
        _tell(f"{prog}: interrupted")
        sys.exit(130)


def _interrupting(hook):
    """Wraps ``sys.unraisablehook`` ``hook`` so that a Ctrl-C or SIGTERM Python dropped is
    delivered again.

    A signal's exception is raised in whatever Python code runs next, and when that is a
    callback of the garbage collector (JAX, which TensorFlow imports, registers one) or a
    ``__del__``, Python prints it and carries on: Ctrl-C during TensorFlow's import was
    often ignored, and the conversion ran to the end.
    """

    def unraisablehook(unraisable) -> None:
        if not isinstance(unraisable.exc_value, KeyboardInterrupt):
            hook(unraisable)
            return
        terminated = isinstance(unraisable.exc_value, _Terminated)
        signum = signal.SIGTERM if terminated else signal.SIGINT
        # Sent from a new thread a moment later: raised in this hook (or the callback), the
        # exception would be dropped again, and a thread that runs at once can be given the
        # GIL while this one is still in them.
        _thread.start_new_thread(_send_later, (threading.main_thread().ident, signum))

    return unraisablehook


def _send_later(thread_id: int, signum: int, delay: float = 0.05) -> None:
    time.sleep(delay)
    with contextlib.suppress(OSError):  # the main thread ended meanwhile
        signal.pthread_kill(thread_id, signum)


def _writes_into(command: str | None) -> tuple[str | None, str | None]:
    """(attribute, option) of the folder ``command`` writes into, for the fix of a full
    disk: convert's DST (which may be a URL, so not among :data:`_LOCAL_ONLY`), else the
    folder :data:`_LOCAL_ONLY` lists as written; (None, None) for a command that writes
    into no folder of its own."""
    if command == "convert":
        return "output", "DST"
    for attr, option, _, reads, folder in _LOCAL_ONLY.get(command, ()):
        if not reads and folder:
            return attr, option
    return None, None


def _os_error_line(err: OSError, args: argparse.Namespace | None = None) -> str:
    """An OSError in one line, naming its file when it has one; a full disk with its fix
    (its message, ``[Errno 28] No space left on device``, said neither), naming the output
    of ``args``' command when the error names no file."""
    if disk_full(err):
        attr, option = _writes_into(getattr(args, "command", None))
        output = getattr(args, attr, None) if attr else None
        if err.filename:
            where = f" writing {printable(err.filename)}"
        else:
            where = f" writing into {printable(str(output))}" if output else ""
        instead = f" (pass another {option})" if option else ""
        return (
            f"No space left on the device{where}: free space on that disk, or write to "
            f"another one{instead}."
        )
    return re.sub(r"\s*\n\s*", " ", str(err).strip())  # h5py's messages span lines


def main(argv: list[str] | None = None) -> int:
    """The ``petal`` command; ``argv`` None: this process's arguments (the command itself,
    which may then end the process: see :func:`_leave`)."""
    kept: list[BaseException] = []
    for stream in (sys.stdout, sys.stderr):
        # A class or file name the locale cannot encode (LANG=C, Latin-1): escaped, as
        # stderr's are by default, instead of a UnicodeEncodeError part-way through a table.
        with contextlib.suppress(AttributeError, ValueError, io.UnsupportedOperation):
            stream.reconfigure(errors="backslashreplace")
    code = _main(argv, kept)
    remote = sys.modules.get("petal.data.remote")
    if argv is None and getattr(remote, "GENERATORS_MADE", False):
        _leave(code)
    return code


def _leave(code: int) -> None:
    """End the process now, with ``code``, after the exit handlers (temporary files, logs):
    without tearing down the datasets that read a store, whose generator threads can wait
    on the GIL that the teardown holds (the command hung after printing its error). The
    failure that ended the command is kept alive until then, as it holds them."""
    import atexit

    def flush() -> None:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()

    flush()  # what the command printed, before the handlers print theirs
    if remote := sys.modules.get("petal.data.remote"):
        # No teardown follows os._exit: the store's generators need not end first (a
        # download in flight would hold the exit up to remote's limit).
        atexit.unregister(remote._end_generators)
    atexit._run_exitfuncs()
    flush()
    os._exit(code)


# What Ctrl-C leaves, after "interrupted" (train and demo say which epoch is saved).
_KEPT = {
    "convert": "; DST is as it was, or holds the whole new conversion if it had just finished "
    "(never a part of one)",
    "evaluate": "; the evaluation folder holds its earlier evaluation, or this one if it was "
    "being written (never a part of either)",
    "export": "; the export folder holds its earlier export, or this one if it was being "
    "written (never a part of either)",
}


# A write to stdout failed on a full disk (or /dev/full).
_STDOUT_FULL = (
    "No space left on the device writing the standard output: send it elsewhere, or free "
    "space on its disk."
)


def _unwritten(err: OSError) -> int:
    """The exit code of ``--help`` or ``--version`` whose text could not be written to stdout
    (``err``): 2 with one line, or quietly 141 when the reader of a pipe went away."""
    if isinstance(err, BrokenPipeError) and _stdout_gone():
        _stdout_nowhere()
        return 128 + signal.SIGPIPE
    text = f"{err.strerror or err} writing the standard output: send it elsewhere."
    if disk_full(err) and _stdout_full():
        text = _STDOUT_FULL
    _stdout_nowhere()
    _tell(f"petal: error: {text}")
    return 2


class _Parser(argparse.ArgumentParser):
    """argparse's parser, but a failed write of ``--help`` or ``--version`` to stdout raises
    (argparse drops it, then exits 0), and a refused argument is one line pointing at
    ``--help`` (argparse's whole usage block came first)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def _print_message(self, message: str, file=None) -> None:
        if message and file is not None and file is sys.stdout:  # closed (None): stderr
            file.write(message)
        else:
            super()._print_message(message, file)


def _stdout_full() -> bool:
    """Whether stdout is ``/dev/full`` or a file on a full disk; then it is pointed
    nowhere (:func:`_stdout_nowhere`)."""
    try:
        fd = sys.stdout.fileno()
        info = os.fstat(fd)
        if stat.S_ISCHR(info.st_mode):
            full = os.path.exists("/dev/full") and info.st_rdev == os.stat("/dev/full").st_rdev
        else:
            full = stat.S_ISREG(info.st_mode) and os.fstatvfs(fd).f_bavail == 0
    except (OSError, ValueError, AttributeError):
        return False
    if full:
        _stdout_nowhere()
    return full


def _stdout_nowhere() -> None:
    """Points stdout at the null device once its own writes failed, so that the exit's
    flush of what is left in its buffer fails no more."""
    with contextlib.suppress(OSError, ValueError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _print_all(text: str, chunk: int = 8192) -> None:
    """Writes ``text`` to stdout in pieces: written whole, a text larger than a pipe's buffer
    whose reader went away (``| head -1``) was cut short without an error (CPython took the
    kernel's partial write for the end), and the command exited 0, not 141."""
    for start in range(0, len(text), chunk):
        sys.stdout.write(text[start : start + chunk])
    sys.stdout.flush()


def _stdout_gone() -> bool:
    """Whether stdout is a pipe whose reader has closed it."""
    import select

    try:
        poll = select.poll()
        poll.register(sys.stdout.fileno(), select.POLLOUT)
        return any(event & select.POLLERR for _, event in poll.poll(0))
    except (OSError, ValueError, AttributeError):
        return False


def _main(argv: list[str] | None, kept: list[BaseException]) -> int:
    parser = build_parser()
    try:
        args = _parse(parser, argv)
        # --help, --version: argparse exits 0 after writing, then a failed write went unsaid
    except OSError as err:
        return _unwritten(err)
    except SystemExit as done:
        if done.code not in (0, None):
            raise
        try:
            if sys.stdout is not None:  # closed (`>&-`): argparse wrote to stderr
                sys.stdout.flush()
        except OSError as err:
            return _unwritten(err)
        return 0
    if not getattr(args, "_run", None):
        with contextlib.suppress(OSError):  # exit 2 either way
            parser.print_help()
        return 2
    previous = signal.getsignal(signal.SIGTERM)
    previous_hook = sys.unraisablehook
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _terminate)
        sys.unraisablehook = _interrupting(previous_hook)
    try:
        refuse_empty_paths(args)
        expand_homes(args)
        refuse_urls(args)
        refuse_missing_inputs(args)
        with signals_watched(f"petal {args.command}"):
            if _needs_tensorflow(args):
                start_tensorflow_quietly()
            code = int(args._run(args) or 0)
        sys.stdout.flush()  # its failure (a closed pipe, a full disk) said as the others
        return code
    except (PetalError, OSError) as err:
        kept.append(err)
        if isinstance(err, BrokenPipeError) and _stdout_gone():
            # The reader of stdout went away (`petal predict DIR | head -1`): quiet, as other
            # tools.
            _stdout_nowhere()
            return 128 + signal.SIGPIPE
        # OSError: a file the command could not read or write (missing, a folder, no
        # permission, disk full).
        text = _os_error_line(err, args) if isinstance(err, OSError) else str(err)
        if isinstance(err, OSError) and disk_full(err) and not err.filename and _stdout_full():
            text = _STDOUT_FULL
        # A URL's user and password are never shown, whatever message carries them.
        shown = re.sub(r"(\b[a-z][a-z0-9+.-]*://)[^/@\s]+@", r"\1***@", text, flags=re.I)
        _tell(f"petal {args.command}: error: {shown}")
        return 2
    except KeyboardInterrupt as err:
        kept.append(err)
        # SIGTERM says what was kept as Ctrl-C does (it said only "terminated").
        said = "terminated" if isinstance(err, _Terminated) else "interrupted"
        _tell(f"petal {args.command}: {said}{_KEPT.get(args.command, '')}")
        if args.command == "demo":
            from petal.training.saved import run_restored

            _print_resume_hint(str(args.workdir), "demo", restored=run_restored(err))
        return 128 + signal.SIGTERM if isinstance(err, _Terminated) else 130
    finally:
        sys.unraisablehook = previous_hook
        if previous is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, previous)


def _tell(line: str) -> None:
    """Writes ``line`` to stderr. A stderr that cannot take it (closed, on a full disk)
    loses the line, not the command's (or benchmark script's) exit status: the failed
    write ended it with 1 and a traceback nobody saw."""
    if sys.stderr is None:  # closed when Python started: print() would write to stdout
        return
    with contextlib.suppress(OSError, ValueError):
        print(line, file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
