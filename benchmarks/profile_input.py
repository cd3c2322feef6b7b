"""Where the input pipeline's CPU time goes: a `perf` profile of each case, by category.

`petal bench input` compares images/s of the JPEG pipeline with the decode ceiling; this
script explains the ratio. It runs each case in a child process, samples that process with
Linux `perf record` (all threads), and sorts the samples into categories: JPEG decoding
(libjpeg-turbo's functions, inside TensorFlow or simplejpeg), memory copies, the allocator,
record CRCs, XLA-compiled batch ops (the float conversion and augmentation), the TensorFlow
runtime (executor, thread pools, parsing, tf.data), Python and
the kernel. If the pipeline decoded each image at exactly the ceiling's CPU cost, its
images/s could reach at most

    (pipeline's decode share) / (ceiling's decode share)

of the ceiling's: the rest of the pipeline's CPU time is work the ceiling does not do.

    python benchmarks/profile_input.py --records /tmp/lead/flowers-192 --seconds 6

Cases: ``ceiling`` (one process decoding the records' JPEG bytes with simplejpeg in a tight
loop, as each of the ceiling's processes does), ``jpeg`` (the default training pipeline,
float32 batches), ``jpeg-uint8`` (uint8 batches), ``jpeg-sj`` (simplejpeg decoder), without
augmentation. Needs `perf` (linux-tools) and permission to profile (root, or
``kernel.perf_event_paranoid`` <= 1). Writes benchmarks/results/profile_input.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
CASES = ("ceiling", "jpeg", "jpeg-uint8", "jpeg-sj")
READY = "READY"

# libjpeg-turbo's own functions (C names, no namespace) as TensorFlow links them; simplejpeg's
# extension module is libjpeg-turbo plus a thin Cython wrapper, counted whole.
_JPEG_SYMBOL = re.compile(
    r"^(decode_mcu|decompress_|jsimd_|jpeg_|jinit_|jdiv_|jcopy_|jzero_|process_data_|"
    r"sep_upsample|fullsize_upsample|h[12]v[12]_|ycc_rgb|rgb_|gray_|null_convert|"
    r"read_markers|get_(sos|sof|dht|dqt|dri|interesting_appn|soi)|next_marker|first_marker|"
    r"skip_variable|consume_|start_(pass|input_pass|output_pass)|finish_(input_pass|output_pass)|"
    r"reset_|process_restart|alloc_(small|large|sarray|barray)|realize_virt_arrays|"
    r"free_pool|self_destruct|prepare_range_limit|build_ycc|output_pass_setup|"
    r"master_selection|set_(bottom|wraparound)_pointers|make_funny_pointers|"
    r"tensorflow::jpeg::)"
)
CATEGORIES = (
    "JPEG decode",
    "XLA batch ops",
    "memory copy",
    "allocator",
    "record CRC",
    "TensorFlow runtime",
    "Python",
    "kernel",
    "other",
)


def categorise(dso: str, symbol: str) -> str:
    """The category of one (shared object, symbol) sample row."""
    if dso.startswith("_jpeg.") or _JPEG_SYMBOL.match(symbol):
        return "JPEG decode"
    if dso.startswith("[JIT]"):
        return "XLA batch ops"  # petal's compiled cast / normalise / augment pass
    if re.match(r"^__(memmove|memcpy|memset)", symbol):
        return "memory copy"
    if dso.startswith("libc.") and re.search(r"malloc|free|_int_|unlink_chunk|realloc", symbol):
        return "allocator"
    if "crc" in symbol.lower():
        return "record CRC"
    if dso.startswith(("libtensorflow", "_pywrap", "lib_pywrap")):
        return "TensorFlow runtime"
    if dso.startswith("libpython") or dso.startswith("_multiarray"):
        return "Python"
    if dso.startswith("[kernel") or dso.startswith("[vdso"):
        return "kernel"
    return "other"


# "  5.34%  libc.so.6  [.] memmove"; XLA's generated code shows as "[JIT] tid 123".
_ROW = re.compile(r"^\s*([0-9.]+)%\s+(.+?)\s+\[[.kgu]\]\s+(.*?)\s*$")


def parse_report(text: str) -> tuple[dict[str, float], list[tuple[float, str, str, str]]]:
    """From ``perf report --sort dso,sym --stdio``: percent of samples per category, and
    the rows ``(percent, category, shared object, symbol)``, largest first."""
    shares = dict.fromkeys(CATEGORIES, 0.0)
    rows = []
    for line in text.splitlines():
        m = _ROW.match(line)
        if m:
            pct, dso, symbol = float(m.group(1)), m.group(2), m.group(3)
            category = categorise(dso, symbol)
            shares[category] += pct
            rows.append((pct, category, dso, symbol))
    total = sum(shares.values()) or 1.0
    rows.sort(reverse=True)
    shares = {k: 100.0 * v / total for k, v in shares.items()}
    shares["(percent of samples parsed)"] = total
    return shares, rows


# --- the profiled child ----------------------------------------------------------------------


def child(case: str, records: str, seconds: float, batch_size: int) -> None:
    """Runs one case for ``seconds`` after warm-up; prints READY, then its CPU ms/image."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from petal.data import bench, pipeline

    if case == "ceiling":
        import simplejpeg

        blobs = bench.jpeg_bytes(records)
        for blob in blobs[:50]:
            simplejpeg.decode_jpeg(blob, colorspace="RGB")

        def step(i: int) -> int:
            simplejpeg.decode_jpeg(blobs[i % len(blobs)], colorspace="RGB")
            return 1
    else:
        options = {
            "jpeg": {},
            "jpeg-uint8": {"dtype": "uint8", "normalization": "raw"},
            "jpeg-sj": {"decoder": "simplejpeg"},
        }[case]
        ds = pipeline.train_dataset(
            records, batch_size=batch_size, augment=None, cache="off", **options
        )
        it = iter(ds)
        for _ in range(20):
            next(it)

        def step(i: int) -> int:
            return int(next(it)[0].shape[0])

    print(READY, flush=True)
    cpu, start, images, i = time.process_time(), time.perf_counter(), 0, 0
    while time.perf_counter() - start < seconds:
        images += step(i)
        i += 1
    wall = time.perf_counter() - start
    cpu = time.process_time() - cpu
    print(json.dumps({"cpu_ms_per_image": cpu / images * 1e3, "images_per_s": images / wall}))
    sys.stdout.flush()
    os._exit(0)  # no interpreter teardown (tf.data threads)


def profile(case: str, records: str, seconds: float, batch_size: int, perf: str) -> dict:
    """Profiles one case in a child process; returns its category shares and speed."""
    cmd = [sys.executable, __file__, "--child", case, "--records", records]
    cmd += ["--seconds", str(seconds + 2), "--batch-size", str(batch_size)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline().strip()
        if line != READY:
            raise SystemExit(f"profile_input: case {case!r} did not start (got {line!r})")
        with tempfile.TemporaryDirectory() as tmp:
            data = os.path.join(tmp, "perf.data")
            rec = subprocess.run(
                [perf, "record", "-F", "999", "-p", str(proc.pid), "-o", data, "--"]
                + ["sleep", str(seconds)],
                capture_output=True,
                text=True,
            )
            if rec.returncode != 0 or not os.path.exists(data):
                raise SystemExit(
                    f"profile_input: perf record failed ({rec.stderr.strip()[-300:]}); "
                    "run as root or set kernel.perf_event_paranoid <= 1."
                )
            report = subprocess.run(
                [perf, "report", "-i", data, "--no-children", "--sort", "dso,sym", "--stdio"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            count = re.search(r"# Samples: (\S+)", report)
        stats = json.loads(proc.stdout.readline())
    finally:
        proc.wait(timeout=120)
    shares, rows = parse_report(report)
    return {
        "case": case,
        "samples": count.group(1) if count else None,
        "shares": shares,
        # The largest items outside the decoder: what the pipeline spends besides decoding.
        "top_overhead": [
            {"percent": pct, "category": cat, "dso": dso, "symbol": sym[:120]}
            for pct, cat, dso, sym in rows
            if cat != "JPEG decode"
        ][:15],
        **stats,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", required=True, help="JPEG records (petal convert output)")
    parser.add_argument("--seconds", type=float, default=6.0, help="profiled seconds per case")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--cases", default=",".join(CASES), help=f"any of {', '.join(CASES)}")
    parser.add_argument("--top", type=int, default=5, help="largest non-decode items to show")
    parser.add_argument("--out", default=str(RESULTS / "profile_input.json"))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        try:
            child(args.child, args.records, args.seconds, args.batch_size)
        except KeyboardInterrupt:  # Ctrl-C reaches the child too: the parent says it
            os._exit(130)
        return

    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = sorted(set(cases) - set(CASES))
    if unknown:
        raise SystemExit(f"profile_input: unknown case(s) {', '.join(unknown)}; known: {CASES}")
    # NaN fails every comparison; 0 profiled a few samples, -1 failed as perf's permission.
    if not 0 < args.seconds < float("inf"):
        parser.error(f"--seconds must be positive and finite. Received: {args.seconds}")
    if args.batch_size < 1:  # was the child's traceback, then "case 'jpeg' did not start"
        parser.error(f"--batch-size must be at least 1. Received: {args.batch_size}")
    from petal.cli import _check_output_file
    from petal.errors import PetalError

    try:
        _check_output_file(args.out, "--out")
    except PetalError as err:
        parser.error(str(err))
    perf = shutil.which("perf")
    if perf is None:
        raise SystemExit("profile_input: needs Linux perf on PATH (package linux-tools).")
    if not os.path.exists(os.path.join(args.records, "manifest.json")):
        raise SystemExit(f"profile_input: {args.records} is not a petal records folder.")
    try:
        try:  # (TensorFlow's import, seconds: Ctrl-C meanwhile is said in one line too)
            _check_records(args.records, args.batch_size)
        except PetalError as err:
            parser.error(str(err))
        _profile_all(args, cases, perf)
    except KeyboardInterrupt:
        print(f"{parser.prog}: interrupted", file=sys.stderr)
        sys.exit(130)


def _check_records(records: str, batch_size: int) -> None:
    """Raises unless ``records`` are JPEG records (raw ones were profiled as case jpeg) whose
    training split fills a batch."""
    from petal.data import schema
    from petal.data.reader import open_source
    from petal.errors import PetalError

    src = open_source(records)
    if src.format != schema.FORMAT_JPEG:
        raise PetalError(
            f"--records {records} holds {src.format} records; the cases read JPEG records: "
            "pass those (petal convert's default format)."
        )
    if src.count("train") < batch_size:
        raise PetalError(
            f"--batch-size {batch_size} is more than the {src.count('train')} training images "
            f"of --records {records}: pass a smaller --batch-size."
        )


def _profile_all(args: argparse.Namespace, cases: list[str], perf: str) -> None:
    results = []
    for case in cases:
        result = profile(case, args.records, args.seconds, args.batch_size, perf)
        results.append(result)
        print(
            f"{case}: {result['images_per_s']:,.0f} images/s, "
            f"{result['cpu_ms_per_image']:.3f} CPU ms/image, "
            f"decode {result['shares']['JPEG decode']:.1f}% of {result['samples']} samples",
            flush=True,
        )
        for item in result["top_overhead"][: args.top]:
            print(
                f"    {item['percent']:5.2f}%  {item['category']:<18} {item['dso']}  "
                f"{item['symbol'][:70]}"
            )

    header = "| category | " + " | ".join(r["case"] for r in results) + " |"
    print("\n" + header)
    print("|---|" + "---:|" * len(results))
    for cat in CATEGORIES:
        print(f"| {cat} | " + " | ".join(f"{r['shares'][cat]:.1f}%" for r in results) + " |")
    print(
        "| CPU ms/image | " + " | ".join(f"{r['cpu_ms_per_image']:.3f}" for r in results) + " |"
    )
    ceiling = next((r for r in results if r["case"] == "ceiling"), None)
    bounds = {}
    if ceiling:
        for r in results:
            if r is not ceiling:
                bounds[r["case"]] = r["shares"]["JPEG decode"] / ceiling["shares"]["JPEG decode"]
        print(
            "\nat the ceiling's decode cost per image, each pipeline could reach at most: "
            + ", ".join(f"{k} {v:.2f}x" for k, v in bounds.items())
            + " of the ceiling (its decode share / the ceiling's)"
        )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    from petal.jsonfile import json_text

    out.write_text(
        json_text(
            {
                "benchmark": "profile_input",
                "records": args.records,
                "seconds": args.seconds,
                "batch_size": args.batch_size,
                "cpus": os.cpu_count(),
                "cases": results,
                "bound_x_ceiling": bounds,
            }
        )
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
