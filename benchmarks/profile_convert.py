"""Where `petal convert`'s CPU time goes, part by part, for each image.

`bench_convert.py` compares convert with a loop that only reads, decodes, resizes and encodes
each file; convert also serialises each record, frames it (TFRecord length and CRC32C), writes
it to a piece file, and its main process appends the pieces to their shard and hashes it.
This script does that work in one process, in convert's order, over the same files, and
times each part with the process's CPU clock:

- worker: ``read``, ``convert`` (decode, resize, encode), ``serialise``, ``frame``, ``write``
  (pieces of 32 records, as the workers write them);
- main process: ``append`` (read a piece back, write it to its shard) and ``hash`` (sha256
  of the shard).

The loop of `bench_convert.py` does ``read`` and ``convert`` only: the other parts are
convert's extra work. By default the allocator is set as convert's workers set it
(`--glibc-default`: as a fresh process has it; glibc hosts only).

    python benchmarks/profile_convert.py                       # ../shared/data/flowers
    python benchmarks/profile_convert.py --per-class 100 --image-size 224

Writes benchmarks/results/profile_convert.json.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import tempfile
import time
from pathlib import Path

from bench_convert import DEFAULT_DATA, check_data_and_out

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results" / "profile_convert.json"
WORKER_PARTS = ("read", "convert", "serialise", "frame", "write")
MAIN_PARTS = ("append", "hash")
PIECE = 32  # records per piece, as convert's workers write them


def profile(files, classes, size: tuple[int, int], tmp: str, progress) -> tuple[dict, list]:
    """CPU seconds per part over ``files`` ((path, label, relpath), in order), and the
    files skipped as (relpath, reason): convert skips them too, and they are left out of
    every part."""
    from petal.data import images, writer

    cpu = time.process_time
    spent = dict.fromkeys(WORKER_PARTS + MAIN_PARTS, 0.0)
    framed: list[bytes] = []
    digest = hashlib.sha256()
    skipped: list[tuple[str, str]] = []

    def piece_done(n: int) -> None:
        t0 = cpu()
        piece = os.path.join(tmp, f"piece-{n:06d}")
        with open(piece, "wb") as f:
            f.write(b"".join(framed))
        t1 = cpu()
        with open(piece, "rb") as f:
            data = f.read()
        shard.write(data)
        t2 = cpu()
        digest.update(data)
        t3 = cpu()
        os.remove(piece)
        spent["write"] += t1 - t0
        spent["append"] += t2 - t1
        spent["hash"] += t3 - t2
        framed.clear()

    with open(os.path.join(tmp, "shard.tfrec"), "wb") as shard:
        for n, (path, label, relpath) in enumerate(files):
            t0 = cpu()
            data = writer._read(path)
            t1 = cpu()
            try:
                if isinstance(data, str):  # the reason it cannot be read
                    raise images.ImageError(data)
                encoded = images.convert_image(data, size=size, mode="fill", format="jpeg",
                                               quality=95)  # fmt: skip
            except images.ImageError as err:
                skipped.append((relpath, str(err)))
                progress(n + 1)
                continue
            t2 = cpu()
            record = writer.example_bytes(encoded, label, relpath, classes)
            t3 = cpu()
            framed.append(writer.frame_record(record))
            t4 = cpu()
            for part, took in zip(WORKER_PARTS, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=False):
                spent[part] += took
            if len(framed) == PIECE:
                piece_done(n)
            progress(n + 1)
        if framed:
            piece_done(len(files))
    return spent, skipped


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="class-folder tree")
    parser.add_argument(
        "--per-class", type=int, default=None, help="the first N files of each class"
    )
    parser.add_argument("--image-size", type=int, default=192)
    parser.add_argument("--glibc-default", action="store_true",
                        help="leave the allocator as a fresh process has it")  # fmt: skip
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    for flag, value in (("--per-class", args.per_class), ("--image-size", args.image_size)):
        if value is not None and value < 1:
            parser.error(f"{flag} must be at least 1. Received: {value}")
    from petal.cli import run_script

    found = check_data_and_out(parser, args)
    run_script(parser.prog, lambda: _run(args, found))


def _run(args: argparse.Namespace, found) -> None:
    from petal.data import writer
    from petal.data.writer import _progress
    from petal.errors import PetalError

    if not args.glibc_default:
        writer._keep_freed_memory()
    taken: dict[int, int] = {}
    files = []
    for f in found.files:
        taken[f.label] = taken.get(f.label, 0) + 1
        if args.per_class is None or taken[f.label] <= args.per_class:
            files.append((f.path, f.label, f.relpath))
    size = (args.image_size, args.image_size)
    load_before = os.getloadavg()
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp, _progress(len(files), "profile", None) as bar:
        done = [0]

        def progress(n: int) -> None:
            bar.update(n - done[0])
            done[0] = n

        spent, skipped = profile(files, tuple(found.classes), size, tmp, progress)
    seconds = time.perf_counter() - start
    written = len(files) - len(skipped)
    if not written:  # nothing to divide by (a ZeroDivisionError)
        relpath, reason = skipped[0]
        raise PetalError(
            f"none of the {len(files)} files of --data {args.data} could be converted "
            f"(e.g. {relpath}: {reason}); pass a folder of photos."
        )
    total = sum(spent.values())
    allocator = "glibc default" if args.glibc_default else "as convert's workers"
    print(f"\nconvert's CPU per part: {written} of {len(files)} images from {args.data}, "
          f"{args.image_size}px fill, JPEG q95 4:4:4, one process, allocator {allocator}; "
          f"{seconds:.1f} s, load average before {load_before[0]:.2f}")  # fmt: skip
    for relpath, reason in skipped:
        print(f"skipped {relpath}: {reason}")
    print()
    print("| part | process | CPU s | us/image | share | in bench_convert's loop |")
    print("|---|---|---:|---:|---:|---|")
    for part, cpu_s in spent.items():
        where = "worker" if part in WORKER_PARTS else "main"
        in_loop = "yes" if part in ("read", "convert") else "no"
        print(f"| {part} | {where} | {cpu_s:.3f} | {cpu_s / max(written, 1) * 1e6:.1f} | "
              f"{cpu_s / total:.1%} | {in_loop} |")  # fmt: skip
    extra = total - spent["read"] - spent["convert"]
    loop = spent["read"] + spent["convert"]
    print(
        f"\nconvert's extra work beyond the loop's: {extra:.3f} s of CPU, "
        f"{extra / loop:.1%} of the loop's {loop:.3f} s"
    )
    result = {
        "benchmark": "profile_convert",
        "data": str(args.data),
        "per_class": args.per_class,
        "images": len(files),
        "written": written,
        "skipped": [{"file": relpath, "reason": reason} for relpath, reason in skipped],
        "image_size": args.image_size,
        "allocator": allocator,
        "seconds": seconds,
        "parts": {
            part: {
                "process": "worker" if part in WORKER_PARTS else "main",
                "cpu_s": cpu_s,
                "us_per_image": cpu_s / max(written, 1) * 1e6,
                "share": cpu_s / total,
            }
            for part, cpu_s in spent.items()
        },
        "extra_over_loop": extra / loop,
        "host": {
            "machine": platform.machine(),
            "cpus": os.cpu_count(),
            "load_1min": load_before[0],
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    from petal.jsonfile import json_text

    args.out.write_text(json_text(result))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
