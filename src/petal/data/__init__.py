"""Data: image folders -> sharded TFRecords -> tf.data pipelines.

Exports are resolved lazily (PEP 562): ``petal convert``'s worker processes import
``petal.data.images`` and must not pay for TensorFlow or anything else on the way in.
Add an export by naming its module in ``_EXPORTS``; do not import modules here.
"""

from __future__ import annotations

import importlib

# name -> module that defines it.
_EXPORTS = {
    # records (issue 2)
    "convert": "petal.data.writer",
    "read_manifest": "petal.data.writer",
    "ConvertSummary": "petal.data.writer",
    "inspect_records": "petal.data.inspect",
    "InspectReport": "petal.data.inspect",
    "find_images": "petal.data.folders",
    "IMAGE_EXTENSIONS": "petal.data.folders",
    # input pipeline (issue 3)
    "train_dataset": "petal.data.pipeline",
    "eval_dataset": "petal.data.pipeline",
    "distributed_dataset": "petal.data.pipeline",
    "open_source": "petal.data.reader",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'petal.data' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
