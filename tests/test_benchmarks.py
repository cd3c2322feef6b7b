"""The benchmark scripts still run against petal's current code (a renamed or re-signed
internal once broke bench_convert.py unnoticed): each on a few images, for a moment."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import FLOWERS

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def _run(script: str, *args: str) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *args],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_bench_convert_runs(tmp_path):
    if not FLOWERS.is_dir():
        pytest.skip(f"sample data not found at {FLOWERS}")
    out = tmp_path / "convert.json"
    _run("bench_convert.py", "--data", str(FLOWERS), "--per-class", "3", "--rounds", "1",
         "--image-size", "64", "--out", str(out))  # fmt: skip
    result = json.loads(out.read_text())
    assert result["images"] == 15 and len(result["rounds"]) == 1
    assert result["median_speedup"] > 0 and result["median_ceiling"] > 0


def test_bench_input_runs(small_flowers, tmp_path):
    out = tmp_path / "input.json"
    _run("bench_input.py", "--folder", str(small_flowers), "--image-size", "32",
         "--batch-size", "8", "--seconds", "0.3", "--repeat", "1", "--remote-latency-ms", "0",
         "--cases", "ceiling,jpeg,raw", "--out", str(out))  # fmt: skip
    result = json.loads(out.read_text())
    assert [case["name"] for case in result["cases"]][:1] == ["ceiling"]
    assert all(case["images_per_s"] > 0 for case in result["cases"])
    assert "jpeg/ceiling" in result["ratios"]


def test_bench_train_speed_runs(tmp_path):
    out = tmp_path / "speed.json"
    _run("bench_train_speed.py", "--models", "dense", "--precisions", "float32",
         "--warmup", "1", "--steps", "1", "--image-size", "32", "--batch", "4",
         "--out", str(out))  # fmt: skip
    [row] = json.loads(out.read_text())["rows"]
    assert row["model"] == "dense" and row["precision"] == "float32"


@pytest.mark.slow  # JAX compiles the model: ~15 s on a slow 2-core host
def test_bench_train_speed_on_jax_without_tensorflow(tmp_path):
    pytest.importorskip("jax")
    out = tmp_path / "speed.json"
    _run("bench_train_speed.py", "--backend", "jax", "--models", "dense",
         "--precisions", "float32", "--warmup", "1", "--steps", "1", "--image-size", "32",
         "--batch", "4", "--out", str(out))  # fmt: skip
    result = json.loads(out.read_text())
    assert result["backend"] == "jax" and "tensorflow_version" not in result
    [row] = result["rows"]
    assert row["batch_norm"] == "keras" and row["loss_finite"] and row["images_per_s"] > 0
    # TensorFlow's fused kernel is not on offer there: one line, not a traceback later.
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "bench_train_speed.py"), "--backend", "jax",
         "--batch-norm", "fused", "--out", str(tmp_path / "no.json")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2 and "--batch-norm fused needs TensorFlow" in done.stderr


def test_bench_train_speed_refuses_bad_arguments_in_one_line(tmp_path):
    for args, message in ((["--steps", "0"], "--steps must be at least 1"),
                          (["--jit", "maybe"], "--jit takes auto, on, off"),
                          (["--batch", "0"], "--batch must be at least 1")):  # fmt: skip
        done = subprocess.run(
            [sys.executable, str(BENCHMARKS / "bench_train_speed.py"), *args,
             "--out", str(tmp_path / "no.json")],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 2 and message in done.stderr, done.stderr[-2000:]
        assert "Traceback" not in done.stderr
