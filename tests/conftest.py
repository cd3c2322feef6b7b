"""Shared test fixtures: tiny real data drawn from ../shared/data, never copied into the repo.

Fixtures are added here by each area with str_replace edits only (several people edit this
file); keep each fixture small and session-scoped where it builds something expensive.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("PETAL_SHARED_DATA", REPO.parent / "shared" / "data"))
FLOWERS = SHARED_DATA / "flowers"
ORIGINALS = SHARED_DATA / "flowers-originals"
CLASSES = ["daisy", "dandelion", "roses", "sunflowers", "tulips"]


def _link_subset(src: Path, dst: Path, per_class: int) -> Path:
    """A folder of class sub-folders holding symlinks to the first `per_class` images of each."""
    if not src.is_dir():
        pytest.skip(f"sample data not found at {src} (set PETAL_SHARED_DATA)")
    for cls in CLASSES:
        (dst / cls).mkdir(parents=True, exist_ok=True)
        for f in sorted((src / cls).iterdir())[:per_class]:
            (dst / cls / f.name).symlink_to(f)
    return dst


@pytest.fixture(scope="session")
def flowers_dir() -> Path:
    """The full 224x224 flowers folder (3,119 images). Read only."""
    if not FLOWERS.is_dir():
        pytest.skip(f"sample data not found at {FLOWERS}")
    return FLOWERS


@pytest.fixture(scope="session")
def originals_dir() -> Path:
    """40 original-resolution photos per class (sizes and aspect ratios vary). Read only."""
    if not ORIGINALS.is_dir():
        pytest.skip(f"sample data not found at {ORIGINALS}")
    return ORIGINALS


@pytest.fixture(scope="session")
def small_flowers(tmp_path_factory) -> Path:
    """12 real 224x224 photos per class (60 in all), as symlinks in a temporary folder."""
    return _link_subset(FLOWERS, tmp_path_factory.mktemp("small_flowers"), 12)


@pytest.fixture(scope="session")
def small_originals(tmp_path_factory) -> Path:
    """6 original-resolution photos per class (30 in all), as symlinks."""
    return _link_subset(ORIGINALS, tmp_path_factory.mktemp("small_originals"), 6)
