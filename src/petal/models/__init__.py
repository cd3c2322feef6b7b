"""Model registry: ``create_model(name, num_classes, image_size, weights=None)`` and friends.

Importing this package registers every family (dense, convnet, squeezenet, inception,
keras.applications backbones). Keras 3 APIs only, no TensorFlow imports, so the models run on
the TensorFlow, JAX and PyTorch backends.
"""

from petal.models import applications, convnet, dense, inception, squeezenet  # noqa: F401 (registers)
from petal.models.registry import (
    ModelInfo,
    count_flops,
    count_params,
    create_model,
    freeze_batchnorm,
    get_backbone,
    list_models,
    load_weights_file,
    model_info,
    register,
    set_backbone_trainable,
)

__all__ = [
    "ModelInfo",
    "count_flops",
    "count_params",
    "create_model",
    "freeze_batchnorm",
    "get_backbone",
    "list_models",
    "load_weights_file",
    "model_info",
    "register",
    "set_backbone_trainable",
]
