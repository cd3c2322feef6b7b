"""Input pipeline throughput: `petal bench input` on the flowers records, with the issue's targets.

Converts ``../shared/data/flowers`` at 192x192 (JPEG and raw) into a temporary folder unless
``--records`` (and ``--raw-records``) name existing conversions, then measures, in rounds
(every case once per round, so load from other processes falls on all of them):

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
    parser.add_argument("--folder", default=str(DEFAULT_DATA), help="source image folder")
    parser.add_argument("--records", help="JPEG records of --folder (default: convert now)")
    parser.add_argument("--raw-records", help="raw records of --folder (default: convert now)")
    parser.add_argument("--image-size", type=int, default=192)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--remote-latency-ms",
        type=float,
        default=20.0,
        help="latency of the loopback store; 0 skips the remote cases",
    )
    parser.add_argument(
        "--cases",
        help="comma-separated cases to run (ceiling, folder, jpeg, jpeg-uint8, jpeg-sj, raw, cached, remote; "
        "'+aug' variants run with their base case); default: all",
    )
    parser.add_argument("--out", default=str(RESULTS / "bench_input.json"))
    args = parser.parse_args()

    from petal.data import bench, convert
    from petal.errors import PetalError

    # Before converting (a minute or more): bench.run would refuse them only then.
    try:
        cases = bench.check_settings(
            batch_size=args.batch_size, seconds=args.seconds, repeats=args.repeat,
            cases=_cases(args.cases),
        )  # fmt: skip
    except PetalError as err:
        parser.error(str(err))
    if not 0 <= args.remote_latency_ms < float("inf"):
        parser.error(f"--remote-latency-ms must be >= 0 (0 skips the remote cases). "
                     f"Received: {args.remote_latency_ms}")  # fmt: skip

    tmp = tempfile.mkdtemp(prefix="petal-bench-input-")
    try:
        records, raw = args.records, args.raw_records
        if records is None:
            records = os.path.join(tmp, "jpeg")
            print(f"converting {args.folder} -> {records} ({args.image_size}px JPEG)")
            convert(args.folder, records, image_size=args.image_size, progress=False)
        if raw is None:
            raw = os.path.join(tmp, "raw")
            print(f"converting {args.folder} -> {raw} ({args.image_size}px raw)")
            convert(args.folder, raw, image_size=args.image_size, format="raw", progress=False)
        result = bench.run(
            records,
            folder=args.folder,
            raw_records=raw,
            batch_size=args.batch_size,
            seconds=args.seconds,
            repeats=args.repeat,
            remote_latency_ms=args.remote_latency_ms or None,
            cases=cases,
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
    out["host"] = {"machine": platform.machine(), "cpus": os.cpu_count(), "load_1min": load}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    import json

    Path(args.out).write_text(json.dumps(out, indent=2))
    bench.write_png(result, str(Path(args.out).with_suffix(".png")))
    print(f"wrote {args.out}")


def _cases(text: str | None) -> tuple[str, ...] | None:
    """``"ceiling,jpeg,jpeg+aug"`` -> ``("ceiling", "jpeg")``: "+aug" runs with its base case.
    None (no --cases) is all; an empty --cases is refused by ``bench.check_settings``."""
    if text is None:
        return None
    names = [name.strip().removesuffix("+aug") for name in text.split(",") if name.strip()]
    return tuple(dict.fromkeys(names))


if __name__ == "__main__":
    main()
