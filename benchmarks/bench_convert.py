"""Conversion throughput: `petal.data.convert` with all workers vs a single-process loop.

The baseline is the plain loop a user would write: for each file, read it, decode, resize
(``fill``) and JPEG-encode it with the same code and settings -- no hashing, no split, no
writing. ``convert`` does all of that plus the scan, the split, the record serialisation,
the TFRecord writing and the checksums, spread over ``--workers`` processes.

A third measurement shows what the machine allows at that moment: the same loop run by
``--workers`` independent processes at once, each on its share of the files (no
coordination at all). On a shared or virtualised machine two busy cores are often slower
than one, and that ceiling says by how much.

All three run on the same files in the same process, alternating their order each round
so that load from other processes falls on all of them; the table reports every round
and the medians.

    python benchmarks/bench_convert.py                       # ../shared/data/flowers
    python benchmarks/bench_convert.py --per-class 100 --rounds 5

Writes benchmarks/results/bench_convert.json.
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import platform
import statistics
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO.parent / "shared" / "data" / "flowers"
RESULTS = REPO / "benchmarks" / "results" / "bench_convert.json"


def _subset(src: Path, per_class: int | None, tmp: Path) -> Path:
    """The source itself, or a folder of symlinks to the first `per_class` files of each class."""
    if not per_class:
        return src
    dst = tmp / "subset"
    for cls in sorted(p for p in src.iterdir() if p.is_dir()):
        (dst / cls.name).mkdir(parents=True)
        for f in sorted(cls.iterdir())[:per_class]:
            (dst / cls.name / f.name).symlink_to(f.absolute())  # a relative --data: from here
    return dst


def baseline(paths: list[str], size: tuple[int, int]) -> int:
    """One process: read, decode, resize (fill), JPEG-encode each file. Returns images done."""
    from petal.data import images

    done = 0
    for path in paths:
        with open(path, "rb") as f:
            data = f.read()
        try:
            images.convert_image(data, size=size, mode="fill", format="jpeg", quality=95)
            done += 1
        except images.ImageError:
            pass
    return done


def _timed_baseline(paths: list[str], size: tuple[int, int]) -> tuple[float, int, float]:
    cpu = time.process_time()
    start = time.perf_counter()
    done = baseline(paths, size)
    return time.perf_counter() - start, done, time.process_time() - cpu


def _proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) a live process has used, from /proc (Linux)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def parallel(
    src: Path, out: Path, size: tuple[int, int], workers: int
) -> tuple[float, int, float, dict]:
    """`convert` with `workers` processes, timed around the call.

    Returns (seconds, images, CPU seconds of the main process and its workers -- NaN where
    /proc is missing --, phases): phases holds "start_s", the seconds before the first
    chunk of files goes to the workers (import, scan, duplicates, split, the workers'
    start), and "work_s", from then until the last chunk's result; both NaN with one
    worker (no chunks).
    """
    from petal.data import convert, writer

    worker_cpu = [0.0]
    close = writer._Mapper.close
    imap = writer._Mapper._imap
    marks: dict[str, float] = {}

    def timed_imap(mapper, *args):
        marks.setdefault("first", time.perf_counter())
        yield from imap(mapper, *args)
        marks["last"] = time.perf_counter()

    def close_and_count(mapper):
        # The workers are alive until the mapper closes: read their CPU time first.
        pool = getattr(mapper, "_pool", None)
        try:
            worker_cpu[0] += sum(_proc_cpu(pid) for pid in getattr(pool, "_processes", {}))
        except OSError:
            worker_cpu[0] = float("nan")
        close(mapper)

    writer._Mapper.close = close_and_count
    writer._Mapper._imap = timed_imap
    try:
        cpu = time.process_time()
        start = time.perf_counter()
        summary = convert(
            src, out, image_size=size, workers=workers, overwrite=True, progress=False
        )
        seconds = time.perf_counter() - start
        cpu = time.process_time() - cpu + worker_cpu[0]
    finally:
        writer._Mapper.close = close
        writer._Mapper._imap = imap
    phases = {"start_s": float("nan"), "work_s": float("nan")}
    if "last" in marks:
        phases = {"start_s": marks["first"] - start, "work_s": marks["last"] - marks["first"]}
    return seconds, summary.written, cpu, phases


def _loop_share(paths: list[str], size: tuple[int, int], parent: int) -> tuple[int, float]:
    from petal.data import writer

    writer._worker_setup(parent)  # the allocator settings convert's workers use
    cpu = time.process_time()
    return baseline(paths, size), time.process_time() - cpu


def independent(pool: ProcessPoolExecutor, paths: list[str], size: tuple[int, int], n: int):
    """The loop in `n` processes at once, each on every n-th file.

    Returns (seconds, images, CPU seconds of the n processes).
    """
    start = time.perf_counter()
    shares = list(
        pool.map(
            functools.partial(_loop_share, size=size, parent=os.getpid()),
            [paths[i::n] for i in range(n)],
        )
    )
    return time.perf_counter() - start, sum(d for d, _ in shares), sum(c for _, c in shares)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="class-folder tree")
    parser.add_argument(
        "--per-class", type=int, default=None, help="use a subset per class (default: all)"
    )
    parser.add_argument("--image-size", type=int, default=192)
    from petal.data.writer import usable_cpus

    parser.add_argument("--workers", type=int, default=usable_cpus())
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    # Before the warm-up (a --rounds 0 run ended in a traceback after it); --per-class 0
    # once meant every image.
    flags = (("--rounds", args.rounds), ("--per-class", args.per_class),
             ("--workers", args.workers), ("--image-size", args.image_size))  # fmt: skip
    for flag, value in flags:
        if value is not None and value < 1:
            parser.error(f"{flag} must be at least 1. Received: {value}")
    from petal.cli import run_script

    # Before the warm-up and the rounds: a bad --data was find_images' traceback, a bad --out
    # an OSError after the whole run.
    check_data_and_out(parser, args)
    # SIGTERM unwinds as Ctrl-C does: the temporary folder and the processes go.
    run_script(parser.prog, lambda: _run(args))


def check_data_and_out(parser: argparse.ArgumentParser, args: argparse.Namespace):
    """The image folder of ``--data`` (``find_images``'), after checking that ``--out`` can
    be written; either refused in one line (exit 2)."""
    from petal.cli import _check_output_file
    from petal.data.folders import find_images
    from petal.errors import PetalError

    try:
        found = find_images(str(args.data))
    except PetalError as err:
        parser.error(f"--data {args.data}: {err}")
    try:
        _check_output_file(str(args.out), "--out")
    except PetalError as err:
        parser.error(str(err))
    return found


def _run(args: argparse.Namespace) -> None:
    from petal.cli import start_tensorflow_quietly

    # Once up front, as `petal convert` starts it: its start-up is not conversion work.
    start_tensorflow_quietly()
    import tensorflow as tf

    from petal.data import writer
    from petal.data.folders import find_images

    size = (args.image_size, args.image_size)
    load_before = os.getloadavg()
    rows = []
    # Ctrl-C reaches the whole process group: workers forked from petal's server have it
    # blocked (no traceback from each); the pool's exit stops them.
    writer._start_workers_server()
    loops = ProcessPoolExecutor(args.workers, mp_context=writer._context())
    with tempfile.TemporaryDirectory() as tmp, loops:
        tmp = Path(tmp)
        src = _subset(args.data, args.per_class, tmp)
        paths = [f.path for f in find_images(str(src)).files]
        out = tmp / "records"
        # Warm-up: page cache, imports, the worker processes' first start.
        baseline(paths[:50], size)
        independent(loops, paths[:100], size, args.workers)
        parallel(_subset(args.data, 4, tmp / "warm"), tmp / "warm-out", size, args.workers)

        runs = {
            "loop": lambda: _timed_baseline(paths, size),
            "convert": lambda: parallel(src, out, size, args.workers),
            "independent": lambda: independent(loops, paths, size, args.workers),
        }
        for r in range(args.rounds):
            # Rotate the order, so a change of load hits each measurement alike.
            order = list(runs)[r % 3 :] + list(runs)[: r % 3]
            result = {name: runs[name]() for name in order}
            (l_s, l_n, l_cpu), (c_s, c_n, c_cpu, phases) = result["loop"], result["convert"]
            i_s, i_n, i_cpu = result["independent"]
            rows.append(
                {
                    "round": r + 1,
                    "order": order,
                    "images": c_n,
                    "loop_images_per_s": l_n / l_s,
                    "convert_images_per_s": c_n / c_s,
                    "independent_images_per_s": i_n / i_s,
                    "speedup": (c_n / c_s) / (l_n / l_s),
                    "ceiling": (i_n / i_s) / (l_n / l_s),
                    "loop_cpu_s": l_cpu,
                    # Main process and workers: the CPU time convert spends on the images,
                    # against the independent loops' (the same number of busy cores).
                    "convert_cpu_s": c_cpu,
                    "independent_cpu_s": i_cpu,
                    "cpu_overhead": c_cpu / i_cpu - 1,
                    # Where convert's time goes: its start, and its rate once the workers
                    # have files (against the loop's and the independent loops').
                    "convert_start_s": phases["start_s"],
                    "convert_work_s": phases["work_s"],
                    "work_speedup": (c_n / phases["work_s"]) / (l_n / l_s),
                }
            )
    load_after = os.getloadavg()

    print(
        f"\nconvert vs single-process loop: {len(paths)} images from {args.data}"
        f"{f' ({args.per_class} per class)' if args.per_class else ''}, "
        f"{args.image_size}px fill, JPEG q95 4:4:4, workers={args.workers}, "
        f"{writer.usable_cpus()} CPUs; load average before {load_before[0]:.2f}, "
        f"after {load_after[0]:.2f}\n"
    )
    print(
        f"| round | loop (img/s) | convert (img/s) | speedup | {args.workers} independent "
        "loops (img/s) | machine ceiling | convert's extra CPU |"
    )
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        print(
            f"| {row['round']} | {row['loop_images_per_s']:.0f} | "
            f"{row['convert_images_per_s']:.0f} | {row['speedup']:.2f}x | "
            f"{row['independent_images_per_s']:.0f} | {row['ceiling']:.2f}x | "
            f"{row['cpu_overhead']:+.1%} |"
        )
    median = {k: statistics.median(row[k] for row in rows) for k in ("speedup", "ceiling")}
    overhead = statistics.median(row["cpu_overhead"] for row in rows)
    print(
        f"| median | | | **{median['speedup']:.2f}x** | | {median['ceiling']:.2f}x | "
        f"{overhead:+.1%} |"
    )
    print(
        f"\nconvert reaches {median['speedup'] / median['ceiling']:.0%} of what "
        f"{args.workers} uncoordinated processes reach on this machine now"
    )
    start_s = statistics.median(row["convert_start_s"] for row in rows)
    work_speedup = statistics.median(row["work_speedup"] for row in rows)
    start_share = statistics.median(
        row["convert_start_s"] / (row["images"] / row["convert_images_per_s"]) for row in rows
    )
    if not math.isnan(start_s):  # one worker hands out no chunks
        print(
            f"convert's start (scan, duplicates, split, workers' start) took {start_s:.2f} s, "
            f"{start_share:.0%} of its time; from the workers' first files to their last it "
            f"ran {work_speedup:.2f}x the loop, {work_speedup / median['ceiling']:.0%} of the "
            "ceiling (medians)"
        )

    args.out.parent.mkdir(parents=True, exist_ok=True)
    from petal.jsonfile import json_text

    args.out.write_text(
        json_text(  # NaN (one worker's start) as null: strict JSON
            {
                "benchmark": "bench_convert",
                "data": str(args.data),
                "per_class": args.per_class,
                "images": len(paths),
                "image_size": args.image_size,
                "workers": args.workers,
                "cpus": writer.usable_cpus(),
                "load_average_before": load_before,
                "load_average_after": load_after,
                "tensorflow": tf.__version__,
                "python": platform.python_version(),
                "rounds": rows,
                "median_speedup": median["speedup"],
                "median_ceiling": median["ceiling"],
                "median_cpu_overhead": overhead,
                "median_convert_start_s": start_s,
                "median_work_speedup": work_speedup,
            }
        )
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
