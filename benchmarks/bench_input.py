"""Input pipeline throughput: `petal bench input` on the flowers records, with the issue's targets.

Converts ``../shared/data/flowers`` at 192x192 into a temporary folder unless ``--records``
names an existing conversion (case raw reads a raw-pixel copy of those records, written then,
unless ``--raw-records`` names one), then measures, in rounds (every case once per round, so
load from other processes falls on all of them):

- the decode ceiling (the records' JPEG bytes, one simplejpeg process per core),
- the per-file folder path, TFRecord JPEG, TFRecord raw and the cached pipeline, each
  without and with the codelab augmentation,
- with ``--remote-latency-ms``, per-file vs sharded reads through the loopback object store.

    python benchmarks/bench_input.py                                   # 3 rounds, 20 ms remote
    python benchmarks/bench_input.py --records /tmp/petal-flowers-192 \
        --raw-records /tmp/petal-flowers-192-raw --repeat 5 --seconds 8

Writes benchmarks/results/bench_input.json (and bench_input.png).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO.parent / "shared" / "data" / "flowers"
RESULTS = REPO / "benchmarks" / "results"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", help="source image folder (default: ../shared/data/flowers)")
    parser.add_argument("--records", help="JPEG records of --folder (default: convert now)")
    parser.add_argument(
        "--raw-records", help="raw records of --folder (default: written from the JPEG records)"
    )
    parser.add_argument(
        "--image-size", metavar="SIZE",
        help="192 or HxW: size to convert --folder at (default 192); with "
        "--records, the size they hold (records that record none)",
    )  # fmt: skip
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--remote-latency-ms",
        type=float,
        help="latency of the loopback store (default 20); 0 skips the remote cases",
    )
    parser.add_argument(
        "--cases",
        help="comma-separated cases to run (ceiling, folder, jpeg, jpeg-uint8, jpeg-sj, raw, cached, remote; "
        "'+aug' variants run with their base case); default: all",
    )
    parser.add_argument("--out", default=str(RESULTS / "bench_input.json"))
    args = parser.parse_args()

    from petal.cli import run_script
    from petal.errors import PetalError

    def work() -> None:
        try:
            _main(parser, args)
        except (PetalError, OSError) as err:
            # bench.run names the JPEG records as the CLI calls them; here they are --records.
            message = str(err).replace("RECORDS", "--records")
            parser.exit(2, f"{parser.prog}: error: {message}\n")

    # SIGTERM unwinds as Ctrl-C does: the temporary conversions are removed (as petal's).
    run_script(parser.prog, work)


def _main(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    from petal.cli import _check_output_file, start_tensorflow_quietly
    from petal.data import bench
    from petal.errors import PetalError

    # Before converting (a minute or more) or measuring: bench.run would refuse them only
    # then, and the results' paths only after the whole run. The settings and paths before
    # TensorFlow starts (seconds), the records after it.
    png = str(Path(args.out).with_suffix(".png"))
    try:
        cases = bench.check_settings(
            batch_size=args.batch_size, seconds=args.seconds, repeats=args.repeat,
            cases=_cases(args.cases),
        )  # fmt: skip
        size = None
        if args.image_size is not None:
            from petal.data.images import parse_image_size

            try:
                size = parse_image_size(args.image_size)
            except (PetalError, ValueError) as err:
                raise PetalError(f"--image-size: {err}") from None
        _check_output_file(args.out, "--out")
        if os.path.abspath(png) == os.path.abspath(args.out):
            raise PetalError(
                f"--out {args.out}: the chart is written there (a .png next to the JSON); "
                "pass a path ending in .json."
            )
        _check_output_file(png, "--out's chart")
        from petal.cli import _check_not_an_input

        # The default folder is read to convert it, and by the cases that read a folder.
        reads_default = args.records is None or not cases or {"folder", "remote"} & set(cases)
        for option, path in (("--out", args.out), ("--out's chart", png)):
            _check_not_an_input(path, option, **{"--records": args.records,
                                "--raw-records": args.raw_records,
                                "--folder": args.folder or (reads_default
                                                            and str(DEFAULT_DATA))})  # fmt: skip
        if args.remote_latency_ms == 0 and cases and "remote" in cases:
            raise PetalError(
                "--cases remote needs --remote-latency-ms above 0 (0 skips the remote cases)."
            )
        if args.remote_latency_ms is not None and not 0 <= args.remote_latency_ms < float("inf"):
            raise PetalError(
                f"--remote-latency-ms must be >= 0 (0 skips the remote cases). "
                f"Received: {args.remote_latency_ms}"
            )
        start_tensorflow_quietly()  # as `petal bench input` does: without its start-up lines
        if args.records is not None:
            _check_records(args.records, size)
    except PetalError as err:
        parser.error(str(err))
    from petal.data import convert

    wanted = set(cases or bench.CASES)
    # An option left out is passed on only to a case that uses it: bench.run warns about an
    # unused one ("--folder is not used by the cases chosen"), which the user never passed.
    latency = args.remote_latency_ms
    if latency is None and "remote" in wanted:
        latency = 20.0
    folder = args.folder or str(DEFAULT_DATA)
    measured = {"folder", "remote"} & wanted or (args.records and args.folder)
    tmp = tempfile.mkdtemp(prefix="petal-bench-input-")
    try:
        records = args.records
        if records is None:
            records = os.path.join(tmp, "jpeg")
            size = size or (192, 192)
            print(f"converting {folder} -> {records} ({size[0]}x{size[1]} JPEG)")
            convert(folder, records, image_size=size, progress=False)
        # Without --raw-records, bench.run writes case raw's copy of the records' images.
        result = bench.run(
            records,
            folder=folder if measured else None,
            raw_records=args.raw_records,
            batch_size=args.batch_size,
            seconds=args.seconds,
            repeats=args.repeat,
            remote_latency_ms=latency or None,
            cases=cases,
            image_size=args.image_size if args.records is not None else None,
            progress=lambda line: print(line, flush=True),
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(bench.format_table(result))
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = None
    out = result.to_dict()
    out["host"] = {"machine": platform.machine(), "cpus": bench.usable_cpus(), "load_1min": load}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    from petal.jsonfile import json_text

    Path(args.out).write_text(json_text(out))
    bench.write_png(result, png)
    print(f"wrote {args.out}")


def _check_records(records: str, image_size: tuple[int, int] | None) -> None:
    """--records must be JPEG records (of --image-size, when given and they record a size);
    refused in the script's words before anything is converted or measured."""
    from petal.data import bench, schema
    from petal.errors import PetalError

    src = bench._opened("--records", records)
    if src.kind == "folder":
        raise PetalError(
            f"--records {records} is a folder of images; pass it as --folder (converted now) "
            "or convert it first with `petal convert`."
        )
    if src.format != schema.FORMAT_JPEG:
        raise PetalError(
            f"--records {records} holds {src.format} records, not JPEG ones; pass them as "
            "--raw-records and the JPEG records as --records (or leave --records out)."
        )
    held = tuple(src.image_size) if src.image_size is not None else None
    if image_size is not None and held not in (None, tuple(image_size)):
        height, width = held
        raise PetalError(
            f"--image-size {image_size[0]}x{image_size[1]}: --records {records} holds "
            f"{height}x{width} images; "
            "leave the option out (it is the size to convert --folder at)."
        )


def _cases(text: str | None) -> tuple[str, ...] | None:
    """``"ceiling,jpeg,jpeg+aug"`` -> ``("ceiling", "jpeg")``: "+aug" runs with its base case.
    None (no --cases) is all; an empty --cases is refused by ``bench.check_settings``."""
    if text is None:
        return None
    names = [name.strip().removesuffix("+aug") for name in text.split(",") if name.strip()]
    return tuple(dict.fromkeys(names))


if __name__ == "__main__":
    main()
