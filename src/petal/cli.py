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


# --- input pipeline: bench ------------------------------------------------------------------


# --- models and training: models, train, evaluate, predict, export, report, demo -----------


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
