"""Data: image folders -> sharded TFRecords -> tf.data pipelines."""
