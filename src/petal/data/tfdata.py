"""The tf.data options every dataset petal iterates runs with.

tf.data's autotune thread (on by default) makes dropping an iterator wait for it: the
thread sleeps between optimisations for a period that doubles from 10 ms up to 60 s, and
the wake-up that dropping the iterator sends can come before the thread sees the iterator
cancelled, so it sleeps out the rest of its period. Alone, 4 of 30 iterators dropped after
1.5 s of use waited 0.74-0.82 s; in the test suite, with a second process busy, single
tests waited up to 47 s (``benchmarks/bench_teardown.py`` measures it). So every pipeline
petal builds, the training and evaluation ones and the scans of records it runs itself
(counts, checks, verification), runs without that thread. Each AUTOTUNE stage then runs
min(16, CPUs) calls at once, tf.data's default (not more: a stage holds that many batches,
and nothing would bound their memory); prefetch buffers still grow as needed. On 2 cores
the images/s were the same.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import tensorflow as tf


def options() -> tf.data.Options:
    """A ``tf.data.Options`` with the autotune thread off (and nothing else set)."""
    import tensorflow as tf

    options = tf.data.Options()
    options.autotune.enabled = False
    return options


def untuned(ds: tf.data.Dataset) -> tf.data.Dataset:
    """``ds`` run without tf.data's autotune thread: see the module's docstring."""
    return ds.with_options(options())
