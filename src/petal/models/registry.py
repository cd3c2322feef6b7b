"""The model registry: one builder per name, one place that validates what a caller asks for.

Each model family module registers its named variants with :func:`register`. Callers only use
:func:`create_model`, :func:`list_models` and :func:`model_info`; an unknown name, an image size
a model cannot take or a weights file that does not fit raise :class:`~petal.errors.PetalError`
with one line that names what was received.

Keras 3 APIs only in this package (no ``tensorflow`` import), so the models also run on Keras'
JAX and PyTorch backends.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import numbers
import os
import re
import shutil
import tempfile
import warnings
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path

import keras

from petal.data.folders import expand_home
from petal.errors import PetalError, first_line

NORMALIZATIONS = ("unit", "symmetric", "imagenet", "raw")

#: Name given to the feature extractor inside models that have one (keras.applications
#: backbones); :func:`get_backbone` and the freeze helpers look it up by this name.
BACKBONE_NAME = "backbone"


@dataclasses.dataclass(frozen=True)
class ModelInfo:
    """What a caller needs to know about a registered model before building it.

    Attributes:
        name: Registry name, e.g. ``"squeezenet"``.
        family: Module that builds it, e.g. ``"squeezenet"`` or ``"applications"``.
        description: One line for ``petal models``.
        normalization: Pixel range the model expects: ``"unit"`` (0..1), ``"symmetric"``
            (-1..1), ``"imagenet"`` (mean/std) or ``"raw"`` (0..255 floats); the input pipeline
            takes the same names.
        default_image_size: Side in pixels used when no size is given (the codelab's size where
            there is one).
        min_image_size: Smallest side the architecture accepts.
        pretrained: Whether published ImageNet weights exist (``weights="imagenet"``).
    """

    name: str
    family: str
    description: str
    normalization: str
    default_image_size: int
    min_image_size: int
    pretrained: bool = False

    def image_hw(
        self,
        image_size: int | Sequence[int] | None,
        argument: str = "image_size",
        options: dict | None = None,
    ) -> tuple[int, int]:
        """``image_size`` (a side or (height, width)) as (height, width), checked against the
        model's minimum under its model ``options``; None gives the default. ``argument``
        names it in the messages (``"train_image_size"`` for training crops)."""
        if image_size is None:
            return self.default_image_size, self.default_image_size
        if _is_int(image_size):
            hw = (int(image_size), int(image_size))
        elif (
            isinstance(image_size, Sequence)
            and len(image_size) == 2
            and all(map(_is_int, image_size))
        ):
            hw = (int(image_size[0]), int(image_size[1]))
        else:
            raise PetalError(
                f"{argument} must be a positive int or a (height, width) pair for model "
                f"{self.name!r}. Received: {argument}={image_size!r}"
            )
        side = self.min_image_size
        if options and self.name in _MIN_SIDES:  # e.g. a strided stem: a larger minimum
            with contextlib.suppress(TypeError, ValueError):  # the builder names a bad option
                side = _MIN_SIDES[self.name](**options)
        if min(hw) < side:
            if argument == "image_size":
                # Asked for, or the size of the records when none was: say both ways out.
                fix = (
                    f"pass --image-size {side} or more (image_size={side}; smaller records are "
                    f"upscaled), or convert the photos at that size or more (petal convert SRC "
                    f"DST --image-size {side})"
                )
            else:
                fix = f"pass --set {argument}={side} or more"
            under = ""
            if side != self.min_image_size:
                under = " with model_options " + ", ".join(f"{k}={v!r}" for k, v in options.items())
            raise PetalError(
                f"Model {self.name!r} needs images of at least {side}x{side} pixels{under} "
                f"(default {self.default_image_size}): {fix}. Received: {argument}={image_size!r}"
            )
        return hw


# Builder signature: (num_classes, (height, width), weights, **kwargs) -> keras.Model, where
# weights is None or "imagenet" (local files are loaded here, after building).
Builder = Callable[..., keras.Model]

_INFOS: dict[str, ModelInfo] = {}
_BUILDERS: dict[str, Builder] = {}
_MIN_SIDES: dict[str, Callable[..., int]] = {}


def register(
    name: str,
    *,
    family: str,
    description: str,
    normalization: str,
    default_image_size: int,
    min_image_size: int,
    pretrained: bool = False,
    min_side: Callable[..., int] | None = None,
) -> Callable[[Builder], Builder]:
    """Decorator that registers a model builder under ``name``.

    Args:
        name: Registry name; must be new.
        family: Family (module) name.
        description: One-line description.
        normalization: One of :data:`NORMALIZATIONS`.
        default_image_size: Default square side in pixels.
        min_image_size: Smallest square side the model takes.
        pretrained: Whether ``weights="imagenet"`` is available.
        min_side: ``(**model_options) -> int``, the smallest side under those options,
            where they change it (a strided stem); ``min_image_size`` is the default's.

    Returns:
        The decorator, which returns the builder unchanged.
    """
    if name in _INFOS:
        raise ValueError(f"Model {name!r} is registered twice.")
    if normalization not in NORMALIZATIONS:
        raise ValueError(
            f"normalization must be one of {NORMALIZATIONS}. Received: {normalization!r}"
        )

    def decorator(builder: Builder) -> Builder:
        _INFOS[name] = ModelInfo(
            name=name,
            family=family,
            description=description,
            normalization=normalization,
            default_image_size=default_image_size,
            min_image_size=min_image_size,
            pretrained=pretrained,
        )
        _BUILDERS[name] = builder
        if min_side is not None:
            _MIN_SIDES[name] = min_side
        return builder

    return decorator


# Listing order: the codelab's progression first, pretrained backbones last.
_FAMILY_ORDER = ("dense", "convnet", "squeezenet", "inception", "applications")


def list_models() -> list[str]:
    """Registered model names: codelab models in the codelab's order, then pretrained backbones."""

    def rank(item: tuple[int, str]) -> tuple[int, int]:
        index, name = item
        family = _INFOS[name].family
        return (
            _FAMILY_ORDER.index(family) if family in _FAMILY_ORDER else len(_FAMILY_ORDER),
            index,
        )

    return [name for _, name in sorted(enumerate(_INFOS), key=rank)]


def model_info(name: str) -> ModelInfo:
    """The :class:`ModelInfo` of a registered model.

    Raises:
        PetalError: ``name`` is not registered (the message lists the registered names).
    """
    if name not in _INFOS:
        raise PetalError(
            f"Unknown model {name!r}. Choose one of: {', '.join(list_models())}. Received: model={name!r}"
        )
    return _INFOS[name]


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def create_model(
    name: str,
    num_classes: int,
    image_size: int | Sequence[int] | None = None,
    weights: str | Path | None = None,
    log: Callable[[str], None] | None = None,
    fresh_head: bool = False,
    **kwargs,
) -> keras.Model:
    """Build a registered model with a float32 softmax head.

    Build it after choosing the precision policy (and inside ``strategy.scope()`` when
    distributing): layers take the global dtype policy when they are created.

    Args:
        name: Registry name (see :func:`list_models`).
        num_classes: Number of output classes (at least 2).
        image_size: Square side in pixels or a (height, width) pair; ``None`` uses the model's
            default size.
        weights: ``None`` (random initialisation), ``"imagenet"`` (published weights, downloaded
            when online; pretrained models only) or the path of a local ``.weights.h5`` file
            holding the weights of the whole model, of its backbone, or of the same model
            for another number of classes (a run's ``best.weights.h5``: everything but the
            classifier head loads, and the head starts from random weights). A published
            ``keras.applications`` ``.h5`` file loads into the backbone too, with or without
            its ImageNet top.
        log: Called with one line saying what a weights file filled, when one is given.
        fresh_head: A weights file's classifier head is never loaded, even when its number
            of classes fits (it was trained on other classes, or on the same in another order).
        **kwargs: Family-specific options, e.g. ``dropout`` or ``bn_frozen`` for backbones.

    Returns:
        An uncompiled ``keras.Model`` named ``name``.

    Raises:
        PetalError: Unknown name, bad ``num_classes``/``image_size``, ImageNet weights asked for
            a model without them or unavailable offline, or a weights file that does not fit.
    """
    info = model_info(name)
    if not _is_int(num_classes) or num_classes < 2:
        raise PetalError(
            f"num_classes must be an int of at least 2 for model {name!r}. "
            f"Received: num_classes={num_classes!r}"
        )
    num_classes = int(num_classes)  # a NumPy integer is one, but Keras' Dense takes only int
    hw = info.image_hw(image_size, options=kwargs)

    weights_file: Path | None = None
    builder_weights: str | None = None
    if weights is None:
        pass
    elif str(weights) == "imagenet":
        if not info.pretrained:
            pretrained = [n for n in list_models() if _INFOS[n].pretrained]
            raise PetalError(
                f"Model {name!r} has no published ImageNet weights; use weights=None (`--weights "
                f"none` on the command line), a local weights file, or a model that has them: "
                f"{', '.join(pretrained)}. Received: weights='imagenet'"
            )
        builder_weights = "imagenet"
    else:
        # Before the model is built: a file that is no weights file is named at once.
        weights = expand_home(weights)
        check_weights_file(weights, ", 'imagenet', or None: `--weights none` on the "
                           "command line")
        weights_file = Path(weights)

    try:
        model = _build(name, num_classes, hw, builder_weights, **kwargs)
    except PetalError:
        raise
    except (TypeError, ValueError) as err:
        options = model_options(name)
        unknown = [key for key in sorted(kwargs) if key not in options]
        # ("multiple values": an option the builder sets itself, squeezenet_separable's)
        if unknown and re.search(r"unexpected keyword argument|multiple values", str(err)):
            which = ", ".join(f"model_options.{key}" for key in unknown)
            some = f"its options: {', '.join(options)}" if options else "it takes none"
            raise PetalError(
                f"{which} {'is not an option' if len(unknown) == 1 else 'are not options'} "
                f"of {name}; {some}. Received: model_options={kwargs}"
            ) from err
        if not kwargs:
            raise
        if mistyped := _mistyped(_option_defaults(name), kwargs):
            raise PetalError(f"{mistyped}. Received: model_options={kwargs}") from err
        # An option of the right name with a value the layers refuse (dropout 5, filters "a").
        raise PetalError(
            f"Model {name!r} cannot be built with model_options {kwargs} ({first_line(err)}); "
            "fix or drop the option."
        ) from err
    if weights_file is not None:
        part = load_weights_file(
            model,
            weights_file,
            rebuild=lambda n: _build(name, n, hw, None, **kwargs),
            fresh_head=fresh_head,
        )
        if log is not None:
            log(f"weights from {weights_file}: {part}")
    return model


def model_options(name: str) -> list[str]:
    """The options model ``name`` takes (``model_options``' keys), in its builder's order."""
    return list(_option_defaults(name))


def _option_defaults(name: str) -> dict:
    """Model ``name``'s options (:func:`model_options`) with their defaults.

    A registered builder passes them on to its family's ``build_*`` function (blocks ->
    builder -> named variants), whose keyword parameters with a default they are; the name
    and weights come from the caller, and so do those the builder sets itself
    (squeezenet_separable's ``separable=True``).
    """
    import ast
    import textwrap

    builder = _BUILDERS[model_info(name).name]
    called = [builder.__globals__.get(n) for n in builder.__code__.co_names
              if n.startswith("build_")]  # fmt: skip
    function = next((f for f in called if inspect.isfunction(f)), builder)
    fixed = {"name", "weights"}
    if function is not builder:
        with contextlib.suppress(OSError, TypeError, SyntaxError):  # no source: all listed
            tree = ast.parse(textwrap.dedent(inspect.getsource(builder)))
            fixed |= {k.arg for node in ast.walk(tree) if isinstance(node, ast.Call)
                      for k in node.keywords if k.arg}  # fmt: skip
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return {p.name: p.default for p in inspect.signature(function).parameters.values()
            if p.kind in kinds and p.default is not p.empty and p.name not in fixed}


def _mistyped(defaults: dict, given: dict) -> str | None:
    """A line naming an option given text where its default is a number or true/false
    (dropout "abc", as --set gives a word), or None. (Other kinds may be meant: a stride
    of [2, 2] builds.)"""
    for key, value in given.items():
        default = defaults.get(key)
        if not isinstance(value, str):
            continue
        if isinstance(default, bool):
            return f"model_options.{key} must be true or false, as its default {default!r} is"
        if isinstance(default, int | float):
            return f"model_options.{key} must be a number, as its default {default!r} is"
    return None


def _build(name: str, num_classes: int, hw: tuple[int, int], weights: str | None, **kwargs):
    """``name``'s builder, called in Keras' ``channels_last`` image format whatever the
    caller's: the models take (height, width, 3) images, and layers (and
    ``keras.applications``) read the global format when created, so ``channels_first`` (in
    ``keras.json``, or set by the caller) built convolutions over the wrong axis, or failed."""
    previous = keras.config.image_data_format()
    keras.config.set_image_data_format("channels_last")
    try:
        return _BUILDERS[name](num_classes, hw, weights, **kwargs)
    finally:
        keras.config.set_image_data_format(previous)


def check_bool_options(model: str, **options) -> None:
    """Refuses a model option meant as true/false given as anything else: the string
    ``"False"`` (``--set model_options.any_size=False``) is truthy and would do the opposite."""
    for key, value in options.items():
        if not isinstance(value, bool):
            raise PetalError(
                f"Model {model!r} option {key} must be true or false (on the command line: "
                f"--set model_options.{key}=true or =false, lower case). "
                f"Received: {key}={value!r}"
            )


def load_weights_file(
    model: keras.Model,
    path: str | Path,
    rebuild: Callable[[int], keras.Model] | None = None,
    fresh_head: bool = False,
) -> str:
    """Load a local weights file into ``model``, its backbone, or all of it but the head.

    Args:
        model: A model from :func:`create_model`.
        path: A ``.weights.h5`` file saved by ``model.save_weights`` from the same architecture
            (same classes and image channels), or from the backbone alone; or a legacy ``.h5``
            file of the backbone (Keras' published ImageNet files), with or without its top.
            Either layout loads whatever its name (``.weights.h5``, ``.h5``, ``.hdf5``,
            none).
        rebuild: Builds the same architecture for a given number of classes. With it, a file
            saved from the same model for other classes fills every layer but the final
            ``Dense`` classifier, which keeps its fresh weights (what timm and Keras users do
            to fine-tune their own model on a new set of classes).
        fresh_head: Never fill the classifier head, even from a file whose head fits (with
            ``rebuild``): the file's classes are not the model's.

    Returns:
        ``"model"``, ``"backbone"``, ``"backbone (the file's top left out: predictions)"``
        (the file's weighted layers the backbone has not, legacy or Keras 3 file), or ``"all
        but the N-class head"`` (N the file's classes): which part the file filled.

    Raises:
        PetalError: ``model`` is not a ``keras.Model``, or the file fits neither the model nor
            its backbone (the message names it).
    """
    _check_model(
        model, "load_weights_file", "loads weights into",
        f"build it with the file (create_model({model!r}, num_classes, image_size, "
        f"weights={str(path)!r}))",
    )  # fmt: skip
    check_weights_file(path)  # else Keras would say it does not fit
    path = Path(expand_home(path))
    with _named_for_keras(path) as keras_path:
        return _load_weights_file(model, path, keras_path, rebuild, fresh_head)


def _load_weights_file(
    model: keras.Model,
    path: Path,
    keras_path: str,
    rebuild: Callable[[int], keras.Model] | None,
    fresh_head: bool,
) -> str:
    """:func:`load_weights_file` once the file is known to be readable, from ``keras_path``
    (``path``, or a link to it whose name tells Keras its layout); messages name ``path``."""
    errors: list[str] = []
    targets: list[tuple[str, keras.Model]] = [] if fresh_head else [("model", model)]
    backbone = get_backbone(model)
    if backbone is not None:
        targets.append(("backbone", backbone))
    for label, target in targets:
        try:
            with warnings.catch_warnings():
                # A file for the other target makes Keras warn per skipped container before it
                # raises; the error below says it once.
                warnings.simplefilter("ignore", UserWarning)
                target.load_weights(keras_path)
        except (OSError, RuntimeError) as err:  # h5py's: a read failed, whatever the model
            raise _damaged(path, err) from None
        except (ValueError, KeyError, TypeError) as err:
            # Keras raises ValueError on shape/count mismatches, KeyError on missing groups.
            errors.append(f"{label}: {_keras_reason(err)}")
            continue
        if label == "backbone" and (top := _keras3_layers_left_out(target, keras_path)):
            return f"backbone (the file's top left out: {', '.join(top)})"
        return label
    if backbone is not None:
        try:
            top = _load_backbone_of_full_application(backbone, keras_path)
        except (ValueError, KeyError, TypeError) as err:
            errors.append(f"backbone {_keras_reason(err)}")
        else:
            if top:
                return f"backbone (the file's top left out: {', '.join(top)})"
    if rebuild is not None:
        for classes in _head_sizes_in_file(model, path, own=fresh_head):
            twin = rebuild(classes)
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", UserWarning)
                    twin.load_weights(keras_path)
            except (ValueError, KeyError, TypeError, OSError):
                continue
            # The same architecture but for the head: every other layer's weights carry over.
            for mine, theirs in zip(model.layers[:-1], twin.layers[:-1], strict=True):
                mine.set_weights(theirs.get_weights())
            return f"all but the {classes}-class head"
    raise PetalError(
        f"Weights file {path} does not match model {model.name!r} "
        f"({'; '.join(errors) or 'no layers but the head fit'}). Save the weights from the "
        "same model (at the same image size where its weights depend on it, as dense's do)"
        + (", with any number of classes." if rebuild is not None else ", and classes.")
    )


def h5_layout(path: str | Path) -> str | None:
    """Which Keras saved an HDF5 weights file, whatever its name.

    Returns:
        ``"legacy"`` for the ``.h5`` layout of tf.keras 2 and of the published
        ``keras.applications`` files (one group per layer, listed in a ``layer_names``
        attribute), ``"keras3"`` for Keras 3's ``.weights.h5`` layout (``layers`` and ``vars``
        groups), or ``None`` for neither, or a file h5py cannot open.
    """
    import h5py

    try:
        with h5py.File(path, "r") as file:
            if _legacy_group(file) is not None:
                return "legacy"
            if "layers" in file or "vars" in file:
                return "keras3"
    except (OSError, RuntimeError):
        pass
    return None


def _legacy_group(file):
    """The group of a legacy ``.h5`` file that lists its layers (the root, or a whole model's
    ``model_weights``), or ``None``."""
    for group in (file, file.get("model_weights")):
        if group is not None and any(key.startswith("layer_names") for key in group.attrs):
            return group
    return None


def _h5_names(group, key: str) -> list[str]:
    """A legacy ``.h5`` name list (``layer_names``, ``weight_names``): one attribute, or
    ``key0``, ``key1``, ... where Keras split a long one."""
    if key in group.attrs:
        chunks = [group.attrs[key]]
    else:
        chunks = []
        while f"{key}{len(chunks)}" in group.attrs:
            chunks.append(group.attrs[f"{key}{len(chunks)}"])
    return [
        name.decode() if isinstance(name, bytes) else str(name)
        for chunk in chunks
        for name in chunk
    ]


@contextlib.contextmanager
def _named_for_keras(path: Path):
    """``path`` as a name Keras reads with the right loader: Keras picks it from the name
    (``.weights.h5``: Keras 3, other ``.h5`` or ``.hdf5``: legacy), reads a file of the other
    layout as holding no layers ("found 0 saved layers") and refuses other names ("File format
    not supported"). A Keras 3 file renamed to ``.h5``, a published ``.h5`` renamed to
    ``.weights.h5``, or either named otherwise (``.H5``, no suffix) is read through a link
    named for its layout (an HDF5 file of neither layout, as a Keras 3 file)."""
    layout = h5_layout(path)
    keras3_name = path.name.endswith(".weights.h5")
    legacy_name = not keras3_name and path.name.endswith((".h5", ".hdf5"))
    if (keras3_name and layout != "legacy") or (legacy_name and layout != "keras3"):
        yield str(path)
        return
    with tempfile.TemporaryDirectory(prefix="petal-weights-") as tmp:
        link = Path(tmp) / ("file.h5" if layout == "legacy" else "file.weights.h5")
        try:
            link.symlink_to(path.resolve())
        except OSError:  # no symbolic links here (Windows without the privilege)
            shutil.copyfile(path, link)
        yield str(link)


def _load_backbone_of_full_application(backbone: keras.Model, keras_path: str) -> list[str]:
    """Load a legacy ``.h5`` file saved from a whole ``keras.applications`` model (the
    ImageNet file Keras downloads for ``include_top=True``) into ``backbone``.

    By layer name when every weighted layer of the backbone has a group in the file (Keras'
    ``by_name`` loading skips the layers it does not find, silently). Otherwise in layer order,
    the file's weighted layers but its last ones (the top) against the backbone's, every
    weight's shape checked first: the names differ where Keras numbers unnamed layers per
    process (Xception's ``conv2d_N``) or the backbone ends otherwise (ConvNeXt's no-top
    ``layer_normalization`` is the file's ``convnext_tiny_head_layernorm``).

    Returns:
        The file's weighted layers the backbone has not (its top), or ``[]`` when the file is
        not such a file (nothing is loaded).

    Raises:
        ValueError: a layer's weights do not fit (another width or variant of the model); the
            message says "by layer name" or "in layer order" before the reason.
    """
    import h5py

    with h5py.File(keras_path, "r") as file:
        group = _legacy_group(file)
        if group is None:
            return []
        shapes = {}  # the file's weighted layers, in the model's order
        for name in _h5_names(group, "layer_names"):
            if name in group:
                weight_names = _h5_names(group[name], "weight_names")
                if weight_names:
                    shapes[name] = [group[name][w].shape for w in weight_names]
    mine = [layer for layer in backbone.layers if layer.weights]
    if len(shapes) <= len(mine):
        return []  # no top: Keras' own loading has said why the layers do not fit
    if {layer.name for layer in mine} <= shapes.keys():
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                backbone.load_weights(keras_path, by_name=True)
        except (ValueError, KeyError, TypeError) as err:
            raise ValueError(f"by layer name: {_keras_reason(err)}") from None
        return sorted(shapes.keys() - {layer.name for layer in mine})
    names, top = list(shapes)[: len(mine)], list(shapes)[len(mine) :]
    for k, (layer, name) in enumerate(zip(mine, names, strict=True)):
        expected = [tuple(w.shape) for w in _legacy_order(layer)]
        if shapes[name] != expected:
            raise ValueError(
                f"in layer order: weighted layer #{k}, the backbone's {layer.name} of shapes "
                f"{expected}, is the file's {name} of shapes {shapes[name]}"
            )
    with h5py.File(keras_path, "r") as file:
        group = _legacy_group(file)
        for layer, name in zip(mine, names, strict=True):
            values = [group[name][w][()] for w in _h5_names(group[name], "weight_names")]
            for variable, value in zip(_legacy_order(layer), values, strict=True):
                variable.assign(value)
    return top


def _keras3_layers_left_out(model: keras.Model, keras_path: str) -> list[str]:
    """The weighted layers of a Keras 3 ``.weights.h5`` file that ``model`` has not (a whole
    ``keras.applications`` model's top, when loaded into its backbone): Keras loads the
    layers it finds and passes over the others. ``[]`` for a legacy file.

    Keras 3 files name a layer by its class and rank among the model's layers of that class
    (``dense``, ``dense_1``), not by its name.
    """
    import h5py
    from keras.src.utils.naming import to_snake_case

    counts: dict[str, int] = {}
    mine = set()
    for layer in model.layers:
        key = to_snake_case(type(layer).__name__)
        count = counts.get(key, 0)
        counts[key] = count + 1
        mine.add(f"{key}_{count}" if count else key)

    def weighted(group) -> bool:
        found = []
        group.visititems(lambda _name, item: found.append(isinstance(item, h5py.Dataset)))
        return any(found)

    with h5py.File(keras_path, "r") as file:
        layers = file.get("layers") if _legacy_group(file) is None else None
        if not isinstance(layers, h5py.Group):
            return []
        return [key for key in layers if key not in mine and weighted(layers[key])]


def _legacy_order(layer: keras.Layer) -> list:
    """A layer's weights in the order the legacy ``.h5`` layout saves them (Keras'
    ``legacy_h5_format._legacy_weights``)."""
    return layer.trainable_weights + layer.non_trainable_weights


def _is_keras_archive(path: Path) -> bool:
    """Whether ``path`` is a whole model saved by Keras 3 (``model.save('x.keras')``): a zip
    holding its config and weights."""
    try:
        with zipfile.ZipFile(path) as archive:
            return {"config.json", "model.weights.h5"} <= set(archive.namelist())
    except (zipfile.BadZipFile, OSError):
        return False


def check_weights_file(path: str | Path, others: str = "") -> None:
    """Refuse a path that holds no readable Keras weights file, saying what it holds instead.

    Args:
        path: the weights file.
        others: what may be passed instead of a file, for the messages (``", 'imagenet'"``).

    Raises:
        PetalError: ``path`` is empty, missing, a folder, not HDF5 (whatever its name), or an
            HDF5 file whose structure cannot be read (truncated, overwritten in part).
    """
    import h5py

    if not isinstance(path, str | os.PathLike):  # True, or a list: Path's TypeError
        raise PetalError(
            f"weights must be the path of a .weights.h5 file{others}. Received: weights={path!r}"
        )
    received = f"Received: weights={str(path)!r}"  # as given: Path("") would say '.'
    if not str(path).strip():
        raise PetalError(
            f"weights is empty and names no file; pass the path of a .weights.h5 "
            f"file{others}. {received}"
        )
    path = Path(expand_home(path))
    if path.is_dir():
        raise PetalError(
            f"Weights file {path} is a folder; pass a .weights.h5 file{others}. {received}"
        )
    if not path.is_file():
        raise PetalError(
            f"Weights file not found: {path} (pass an existing .weights.h5 file{others}). "
            f"{received}"
        )
    try:
        # By its content, whatever its name (tf.keras' ".hdf5", ".H5", none): Keras is given
        # a name it reads (_named_for_keras).
        if not h5py.is_hdf5(path):
            if _is_keras_archive(path):
                # A run's model.keras: "not a Keras weights file" said the wrong thing.
                beside = path.parent / "best.weights.h5"
                use = f"save its weights with keras.models.load_model('{path}')" \
                      ".save_weights('name.weights.h5')"
                if beside.is_file():
                    use = f"pass {beside} (its run's best epoch), or {use}"
                raise PetalError(
                    f"Weights file {path} is a whole saved model (a .keras archive), not a "
                    f"weights file: {use}. {received}"
                )
            if not path.name.endswith(".h5"):
                raise PetalError(
                    f"Weights file {path} is not a Keras weights file: save one with "
                    f"model.save_weights('name.weights.h5'). {received}"
                )
            raise PetalError(
                f"Weights file {path} is not an HDF5 weights file (it has no HDF5 signature); "
                f"pass a file saved by model.save_weights('name.weights.h5'). {received}"
            )
        with h5py.File(path, "r") as file:
            # Reads every group's and array's header (not the numbers): a file cut short or
            # overwritten in part fails here, before any model is built.
            file.visititems(lambda name, item: None)
    except (OSError, RuntimeError) as err:
        raise _damaged(path, err) from None


def _damaged(path: Path, err: Exception) -> PetalError:
    """A weights file h5py cannot read, named with its reason."""
    return PetalError(
        f"Weights file {path} is damaged or truncated ({_h5_reason(err)}); save it again, or "
        f"copy it again from where it was saved. Received: weights={str(path)!r}"
    )


def _h5_reason(err: Exception) -> str:
    """Why h5py cannot read a file, in a few words (HDF5's, in parentheses)."""
    text = first_line(err)
    if m := re.search(r"truncated file: eof = (\d+).*stored_eof = (\d+)", text):
        return f"it holds {int(m[1]):,} of its {int(m[2]):,} bytes"
    if m := re.search(r"\(([^()]+)\)\s*$", text):
        return m[1]
    return text[:200]


def _keras_reason(err: Exception) -> str:
    """Keras' reason in one line: its first line, and the next where the first ends in a
    colon ("Example error message for object <Conv2D ...>:" is followed by the shapes)."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    if not lines:
        return type(err).__name__
    reason = lines[0]
    if reason.endswith(":") and len(lines) > 1:
        reason = f"{reason} {lines[1]}"
    return reason if len(reason) <= 300 else reason[:297] + "..."


def _head_sizes_in_file(model: keras.Model, path: Path, own: bool = False) -> list[int]:
    """Class counts a weights file's arrays could hold for ``model``'s final Dense kernel:
    those of every array shaped like it but for the last axis (other than the model's own,
    unless ``own``)."""
    import h5py

    head = model.layers[-1]
    if not isinstance(head, keras.layers.Dense):
        return []
    kernel = tuple(head.kernel.shape)
    sizes: set[int] = set()

    def visit(_name: str, item) -> None:
        shape = getattr(item, "shape", None)
        if shape is not None and len(shape) == 2 and tuple(shape[:1]) == kernel[:1]:
            sizes.add(int(shape[1]))

    try:
        with h5py.File(path, "r") as file:
            file.visititems(visit)
    except OSError:
        return []
    return sorted(n for n in sizes if n >= 2 and (own or n != kernel[1]))


def get_backbone(model: keras.Model) -> keras.Model | None:
    """The pretrained feature extractor inside ``model``, or ``None`` for from-scratch models."""
    for layer in model.layers:
        if layer.name == BACKBONE_NAME and isinstance(layer, keras.Model):
            return layer
    return None


def freeze_batchnorm(model: keras.Model) -> int:
    """Keep every BatchNormalization layer in inference mode, also while fine-tuning.

    Keras recommends running a pretrained backbone's BatchNorm in inference mode when
    fine-tuning, so small batches do not wreck the ImageNet statistics. Calling the backbone
    with ``training=False`` does not achieve that in a Keras 3 functional model (checked on
    Keras 3.15: the outer call's ``training=True`` overrides it), but a BatchNormalization layer
    with ``trainable=False`` always normalises with its moving statistics and leaves them
    unchanged, and the flag is saved with the model.

    Args:
        model: Any model; nested models are searched too.

    Returns:
        How many BatchNormalization layers were frozen.
    """
    count = 0
    for layer in walk_layers(model):
        if isinstance(layer, keras.layers.BatchNormalization):
            layer.trainable = False
            count += 1
    return count


def set_backbone_trainable(model: keras.Model, trainable: bool, *, bn_frozen: bool = True) -> None:
    """Freeze the backbone for a head-only warm-up, or unfreeze it for full fine-tuning.

    Recompile the model afterwards: Keras reads the trainable flags at compile time.

    Args:
        model: A model from :func:`create_model` with a backbone.
        trainable: ``False`` trains only the new head; ``True`` trains every layer.
        bn_frozen: When unfreezing, keep BatchNorm layers in inference mode (Keras'
            recommendation for fine-tuning pretrained weights). ``False`` trains them as the
            codelab did.

    Raises:
        PetalError: The model has no backbone.
    """
    backbone = get_backbone(model)
    if backbone is None:
        raise PetalError(
            f"Model {model.name!r} has no pretrained backbone to freeze or unfreeze; head-only "
            f"warm-up needs a keras.applications model (e.g. xception)."
        )
    backbone.trainable = trainable
    if trainable:  # a backbone already trainable does not pass True on to its layers
        for layer in walk_layers(backbone):
            layer.trainable = True
        if bn_frozen:
            freeze_batchnorm(backbone)


def walk_layers(model: keras.Layer):
    """Every leaf layer of ``model``, descending into nested models."""
    for layer in getattr(model, "layers", []):
        if isinstance(layer, keras.Model):
            yield from walk_layers(layer)
        else:
            yield layer


def _check_model(model, function: str, does: str = "counts", fix: str | None = None) -> None:
    """Refuses anything but a built Keras model, a registered name included: what is counted
    (or loaded) depends on the classes and the image size the model is built for. ``fix``:
    what to do instead for a name."""
    if isinstance(model, keras.Model):
        return
    if isinstance(model, str):
        fix = fix or (
            f"build it first (create_model({model!r}, num_classes, image_size)), or use "
            f"model_summary({model!r}) as `petal models` does"
        )
        raise PetalError(
            f"{function} {does} a built keras.Model, not a name: {fix}. Received: model={model!r}"
        )
    raise PetalError(
        f"{function} {does} a built keras.Model (from create_model). "
        f"Received: model of type {type(model).__name__}"
    )


def count_params(model: keras.Model) -> tuple[int, int]:
    """(total, trainable) parameter counts, as ``model.summary()`` reports them.

    Args:
        model: A built model (a registered name is refused: build it with
            :func:`create_model`, or describe it with :func:`model_summary`).

    Raises:
        PetalError: ``model`` is not a ``keras.Model``.
    """
    _check_model(model, "count_params")
    trainable = sum(_size(w) for w in model.trainable_weights)
    total = sum(_size(w) for w in model.weights)
    return total, trainable


def _size(variable) -> int:
    n = 1
    for d in variable.shape:
        n *= int(d)
    return n


def _macs_of_call(layer: keras.Layer, in_shape: Sequence, out_shape: Sequence) -> int:
    """Multiply-accumulates of one call of a weighted layer (bias and activations ignored)."""
    out_spatial = 1
    for d in out_shape[1:-1]:
        out_spatial *= int(d)
    if isinstance(layer, keras.layers.SeparableConv2D):
        kh, kw = layer.kernel_size
        cin = int(in_shape[-1])
        mult = layer.depth_multiplier
        return out_spatial * (kh * kw * cin * mult + cin * mult * layer.filters)
    if isinstance(layer, keras.layers.DepthwiseConv2D):
        kh, kw = layer.kernel_size
        return out_spatial * kh * kw * int(in_shape[-1]) * layer.depth_multiplier
    if isinstance(layer, keras.layers.Conv2D):
        kh, kw = layer.kernel_size
        cin = int(in_shape[-1]) // layer.groups
        return out_spatial * kh * kw * cin * layer.filters
    if isinstance(layer, keras.layers.Dense):
        # Dense on a feature map (ConvNeXt's pointwise layers) runs once per position.
        return out_spatial * int(in_shape[-1]) * layer.units
    return 0


def count_flops(model: keras.Model) -> int:
    """Forward-pass FLOPs per image, counted analytically from the layers.

    Counts 2 FLOPs per multiply-accumulate of Conv2D, DepthwiseConv2D, SeparableConv2D and
    Dense layers (including those inside nested backbones); pooling, normalisation, activations
    and element-wise ops are left out, as in the usual published "FLOPs" figures, so this is a
    slight undercount.

    Args:
        model: A built functional model with a fixed input size (a registered name is
            refused: build it with :func:`create_model`, or describe it with
            :func:`model_summary`).

    Returns:
        FLOPs for one image (divide by 1e6 for MFLOPs).

    Raises:
        PetalError: ``model`` is not a ``keras.Model``.
    """
    _check_model(model, "count_flops")
    macs = 0
    for layer in walk_layers(model):
        for node in getattr(layer, "_inbound_nodes", []):
            ins = node.input_tensors
            outs = node.output_tensors
            if not ins or not outs:
                continue
            macs += _macs_of_call(layer, ins[0].shape, outs[0].shape)
    return 2 * macs


def model_summary(name: str, num_classes: int = 5, image_size: int | None = None) -> dict:
    """Build ``name`` once (random weights) and describe it for ``petal models``.

    Args:
        name: Registry name.
        num_classes: Output classes of the head.
        image_size: Square side in pixels; ``None`` uses the model's default size.

    Returns:
        A dict with ``name``, ``params``, ``trainable_params``, ``mflops`` (per image),
        ``image_size``, ``default_image_size``, ``min_image_size``, ``normalization``,
        ``pretrained`` and ``description``.

    Raises:
        PetalError: As :func:`create_model` (e.g. an image size below the model's minimum).
    """
    info = model_info(name)
    size = info.default_image_size if image_size is None else image_size
    model = create_model(name, num_classes, size)
    total, trainable = count_params(model)
    row = {
        "name": name,
        "params": total,
        "trainable_params": trainable,
        "mflops": count_flops(model) / 1e6,
        "image_size": size,
        **{k: v for k, v in dataclasses.asdict(info).items() if k != "name"},
    }
    del model
    # Free the graph between models: `petal models` builds every one in turn.
    keras.backend.clear_session()
    return row
