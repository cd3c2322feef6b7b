"""How long dropping a tf.data iterator waits, with tf.data's autotune thread and without.

Dropping an iterator waits for the autotune thread of its pipeline. That thread sleeps between
optimisations, for a period that doubles from 10 ms up to 60 s, and it can miss the wake-up
that says the iterator is gone: the drop then waits out the rest of the period. Every pipeline
petal builds runs without that thread (``petal.data.tfdata``). This script
uses each of ``--iterators`` iterators of ``train_dataset`` for ``--hold`` seconds after its
first batch, drops it, and counts the wait: the drop's wall time less the CPU time the process
spent meanwhile (on a busy machine, time the process waited for a CPU counts too).
It does so with tf.data's default (autotune on) and with petal's options, alternating.
Prints a table and writes JSON:

    python benchmarks/bench_teardown.py --records /tmp/lead/flowers-192 --iterators 15 --hold 1.5
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

RESULTS = Path(__file__).resolve().parent / "results"
MODES = ("autotune", "petal")
WAITED_S = 0.1  # a drop that waited longer than this counts as one that waited


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", required=True, help="a petal records folder")
    parser.add_argument("--iterators", type=int, default=15, help="iterators per mode")
    parser.add_argument("--hold", type=float, default=1.5, help="seconds each iterator is used")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--out", default=str(RESULTS / "teardown.json"), help="JSON to write")
    args = parser.parse_args(argv)
    if args.iterators < 1:
        parser.error(f"--iterators must be at least 1. Received: {args.iterators}")
    if not args.hold > 0:
        parser.error(f"--hold must be a positive number of seconds. Received: {args.hold}")
    if not os.path.isfile(os.path.join(args.records, "manifest.json")):
        parser.error(f"--records {args.records} has no manifest.json; pass a folder that "
                     "`petal convert` wrote.")

    from petal.data import bench, pipeline
    from petal.jsonfile import write_json

    petal_options = pipeline._options

    def autotune_options(deterministic, input_context):
        options = petal_options(deterministic, input_context)
        options.autotune.enabled = True  # tf.data's default, and petal's before session 41
        return options

    waits: dict[str, list[float]] = {mode: [] for mode in MODES}
    images: dict[str, int] = dict.fromkeys(MODES, 0)
    started = time.perf_counter()
    try:
        for i in range(args.iterators):
            for mode in MODES:
                pipeline._options = autotune_options if mode == "autotune" else petal_options
                ds = pipeline.train_dataset(args.records, batch_size=args.batch_size, cache=None)
                it = iter(ds)
                next(it)  # the pipeline has started: the hold counts steady batches only
                until = time.perf_counter() + args.hold
                while time.perf_counter() < until:
                    images[mode] += int(next(it)[0].shape[0])
                wall, cpu = time.perf_counter(), time.process_time()
                del it
                gc.collect()
                waits[mode].append(max(0.0, (time.perf_counter() - wall)
                                        - (time.process_time() - cpu)))
            print(f"\r{i + 1}/{args.iterators} iterators per mode, "
                  f"{time.perf_counter() - started:.0f} s", end="", file=sys.stderr, flush=True)
    finally:
        pipeline._options = petal_options
        print(file=sys.stderr)

    rows = []
    for mode in MODES:
        w = waits[mode]
        rows.append({
            "mode": mode,
            "iterators": len(w),
            "waited": sum(x > WAITED_S for x in w),
            "max_wait_s": round(max(w), 3),
            "median_wait_s": round(statistics.median(w), 3),
            "total_wait_s": round(sum(w), 3),
            "images_per_s": round(images[mode] / (len(w) * args.hold), 1),
            "waits_s": [round(x, 3) for x in w],
        })
    print(f"{'mode':<9} {'iterators':>9} {f'waited>{WAITED_S}s':>12} {'max s':>7} "
          f"{'total s':>8} {'images/s':>9}")
    for r in rows:
        print(f"{r['mode']:<9} {r['iterators']:>9} {r['waited']:>12} {r['max_wait_s']:>7.2f} "
              f"{r['total_wait_s']:>8.2f} {r['images_per_s']:>9.0f}")
    import tensorflow as tf

    result = {
        "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["python", "benchmarks/bench_teardown.py", *sys.argv[1:]]),
        "host": {"machine": platform.machine(), "cpus": bench.usable_cpus(),
                 "load_1min": os.getloadavg()[0]},
        "tensorflow_version": tf.__version__,
        "hold_s": args.hold,
        "batch_size": args.batch_size,
        "rows": rows,
    }
    write_json(args.out, result)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
