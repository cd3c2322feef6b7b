"""petal: a folder of photos to a trained image classifier at accelerator speed.

The data flows one way: folder -> records -> tf.data pipeline -> model under a
strategy -> saved artefacts -> report.
"""

__version__ = "0.1.0"
