"""benchmarks/profile_input.py: sorting perf samples into the categories it reports."""

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "profile_input.py"


@pytest.fixture(scope="module")
def profile_input():
    spec = importlib.util.spec_from_file_location("profile_input", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Rows as `perf report --no-children --sort dso,sym --stdio` prints them (TF 2.21, perf 6.x).
REPORT = """\
# Samples: 5K of event 'cpu-clock:ppp'
#
# Overhead  Shared Object                 Symbol
# ........  ............................  .......
#
    43.68%  libtensorflow_cc.so.2         [.] decode_mcu
     7.72%  libtensorflow_cc.so.2         [.] jsimd_idct_islow_avx2.column_end
     5.09%  libtensorflow_cc.so.2         [.] jsimd_ycc_rgb_convert_avx2.columnloop
     2.34%  libtensorflow_cc.so.2         [.] decompress_onepass
     5.34%  [JIT] tid 6234                [.] 0x00007efd3ea5d087
     5.69%  libc.so.6                     [.] __memmove_avx512_unaligned_erms
     0.71%  libc.so.6                     [.] _int_malloc
     1.44%  libtensorflow_framework.so.2  [.] absl::lts_20250814::crc_internal::CRC32::Extend
     0.95%  libtensorflow_framework.so.2  [.] Eigen::ThreadPoolTempl<X>::GlobalSteal
     0.26%  libpython3.11.so.1.0          [.] _PyEval_EvalFrameDefault
     0.75%  [kernel.kallsyms]             [k] finish_task_switch.isra.0
    20.00%  _jpeg.cpython-311-x86_64-linux-gnu.so  [.] 0x00000000000aed01
     0.03%  ld-linux-x86-64.so.2          [.] __tls_get_addr
"""


def test_rows_fall_into_their_categories(profile_input):
    shares, rows = profile_input.parse_report(REPORT)
    parsed = shares.pop("(percent of samples parsed)")
    assert parsed == pytest.approx(94.0)
    raw = {cat: sum(p for p, c, *_ in rows if c == cat) for cat in profile_input.CATEGORIES}
    assert raw["JPEG decode"] == pytest.approx(43.68 + 7.72 + 5.09 + 2.34 + 20.0)
    assert raw["XLA batch ops"] == pytest.approx(5.34)
    assert raw["memory copy"] == pytest.approx(5.69)
    assert raw["allocator"] == pytest.approx(0.71)
    assert raw["record CRC"] == pytest.approx(1.44)
    assert raw["TensorFlow runtime"] == pytest.approx(0.95)
    assert raw["Python"] == pytest.approx(0.26)
    assert raw["kernel"] == pytest.approx(0.75)
    assert raw["other"] == pytest.approx(0.03)
    # Shares are of the parsed samples and add up to 100.
    assert sum(shares.values()) == pytest.approx(100.0)
    assert shares["JPEG decode"] == pytest.approx(100 * 78.83 / 94.0)
    assert rows[0][0] == 43.68 and rows[0][3] == "decode_mcu"  # largest first


def test_tensorflow_names_outside_libjpeg_are_not_decode(profile_input):
    assert profile_input.categorise("libtensorflow_cc.so.2", "tensorflow::PackOp::Compute") == (
        "TensorFlow runtime"
    )
    assert profile_input.categorise("libtensorflow_cc.so.2", "jpeg_read_scanlines") == (
        "JPEG decode"
    )


def test_bad_seconds_records_and_out_are_refused_up_front(profile_input, make_records, tmp_path):
    """--seconds 0 wrote a complete-looking profile of a few samples, -1 failed with perf's
    permission hint; raw records were profiled as case jpeg; a bad --out failed at the end."""
    import subprocess
    import sys

    from petal.errors import PetalError

    records = make_records("jpeg", fmt="jpeg")
    for args, message in (
        (["--seconds", "0"], "error: --seconds must be positive and finite. Received: 0.0"),
        (["--seconds", "-1"], "error: --seconds must be positive and finite. Received: -1.0"),
        (["--seconds", "nan"], "error: --seconds must be positive and finite. Received: nan"),
        (["--out", str(tmp_path)], f"error: --out {tmp_path} is a folder; pass a file path."),
    ):
        done = subprocess.run(
            [sys.executable, str(SCRIPT), "--records", str(records), "--out",
             str(tmp_path / "no.json"), *args],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
        assert done.stderr.strip().splitlines()[-1].endswith(message), done.stderr
    raw = make_records("raw", fmt="raw")
    with pytest.raises(PetalError, match=rf"^--records {raw} holds raw records; the cases read"):
        profile_input._check_records(str(raw), 4)
    profile_input._check_records(str(records), 4)


def test_a_batch_larger_than_the_training_split_is_refused_up_front(profile_input, small_records):
    # It was the child's traceback, then "case 'jpeg' did not start (got '')".
    from petal.errors import PetalError

    with pytest.raises(PetalError) as caught:
        profile_input._check_records(str(small_records), 64)
    assert str(caught.value) == (
        f"--batch-size 64 is more than the 50 training images of --records {small_records}: "
        "pass a smaller --batch-size."
    )
    profile_input._check_records(str(small_records), 50)
