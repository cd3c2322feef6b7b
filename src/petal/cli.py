"""The ``petal`` command line: parse arguments, build a config, call the library.

Kept thin on purpose: every command is a library function that tests call directly.
Each command has an ``_add_<name>`` function that declares its arguments and a
``_run_<name>`` function that calls the library. Heavy imports (TensorFlow) happen
inside the ``_run_`` functions so ``petal --help`` stays instant.
"""

from __future__ import annotations

import argparse
import sys

from petal import __version__
from petal.errors import PetalError

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
    parser.add_argument("--quality", type=int, default=None, help="JPEG quality (default 95)")
    parser.add_argument(
        "--val-fraction", type=float, default=0.19, help="validation share per class (0.19)"
    )
    parser.add_argument("--seed", type=int, default=42, help="split and order seed (42)")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--shards", type=int, default=None, help="shards per split")
    group.add_argument(
        "--shard-mb", type=float, default=None, help="largest shard in MB (default 200)"
    )
    parser.add_argument(
        "--classes", default=None, help="comma-separated class names, in index order"
    )
    parser.add_argument(
        "--workers", type=int, default=None, help="worker processes (default: all CPUs)"
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
    )
    for item in summary.manifest["skipped"][:10]:
        print(f"skipped {item['file']}: {item['reason']}", file=sys.stderr)
    if summary.skipped > 10:
        print(f"... {summary.skipped - 10} more skipped: see manifest.json", file=sys.stderr)
    print(summary)
    return 0


def _add_inspect(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("output", metavar="DST", help="records folder written by petal convert")
    parser.add_argument(
        "--verify", action="store_true", help="read every record: CRC, parse, decode, fields"
    )
    parser.add_argument("--grid", default=None, metavar="PNG", help="write a sample image grid")


def _run_inspect(args: argparse.Namespace) -> int:
    from petal.data import inspect_records

    report = inspect_records(args.output, verify=args.verify, grid=args.grid)
    print(report)
    return 0 if report.ok else 1


COMMANDS.append(
    ("convert", _add_convert, _run_convert, "image folder -> sharded TFRecords + manifest")
)
COMMANDS.append(
    ("inspect", _add_inspect, _run_inspect, "summarise (and --verify) a records folder")
)


# --- input pipeline: bench ------------------------------------------------------------------


# --- models and training: models, train, evaluate, predict, export, report, demo -----------

def _add_models(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--image-size", type=int, default=None, help="square side in pixels (default: each model's own)")
    parser.add_argument("--num-classes", type=int, default=5, help="classes of the head (default 5)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")


def _run_models(args: argparse.Namespace) -> int:
    import json

    from petal.models import list_models, model_info
    from petal.models.registry import model_summary

    if args.image_size is not None and args.image_size < 1:
        raise PetalError(f"--image-size must be a positive int. Received: image_size={args.image_size}")
    rows = []
    for name in list_models():
        info = model_info(name)
        if args.image_size is not None and args.image_size < info.min_image_size:
            rows.append({"name": name, "params": None, "mflops": None, "image_size": args.image_size,
                         "default_image_size": info.default_image_size, "min_image_size": info.min_image_size,
                         "normalization": info.normalization, "pretrained": info.pretrained,
                         "note": f"needs >= {info.min_image_size} px"})
            continue
        rows.append(model_summary(name, args.num_classes, args.image_size))
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'model':<22}{'params':>13}{'MFLOPs/img':>12}{'size':>6}{'default':>9}  {'normalization':<14}pretrained")
    for r in rows:
        params = f"{r['params']:,}" if r["params"] is not None else r["note"]
        mflops = f"{r['mflops']:.1f}" if r["mflops"] is not None else "-"
        print(f"{r['name']:<22}{params:>13}{mflops:>12}{r['image_size']:>6}{r['default_image_size']:>9}  "
              f"{r['normalization']:<14}{'imagenet' if r['pretrained'] else '-'}")
    print("MFLOPs: 2 x multiply-accumulates of conv and dense layers, forward pass, per image.")
    return 0


COMMANDS.append(("models", _add_models, _run_models, "list the registered models with parameters and MFLOPs per image"))



# --- dispatcher -----------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="petal",
        description="Folder of photos -> sharded TFRecords -> trained image classifier.",
    )
    parser.add_argument("--version", action="version", version=f"petal {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, add, run, help_text in COMMANDS:
        p = sub.add_parser(name, help=help_text, description=help_text)
        add(p)
        p.set_defaults(_run=run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    try:
        return int(args._run(args) or 0)
    except (PetalError, FileNotFoundError, FileExistsError, NotADirectoryError) as err:
        print(f"petal {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"petal {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
