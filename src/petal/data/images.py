"""Image loading, resizing and encoding for the converter, with PIL, simplejpeg and NumPy.

No TensorFlow here: this module runs inside the converter's worker processes, where a
TensorFlow import would cost seconds and hundreds of MB per worker.

Loading applies the EXIF orientation, converts every mode to RGB (alpha composited on
white), takes the first frame of animations and refuses images over a pixel limit before
decoding them, and JPEGs whose data end early (which PIL decodes part grey). Resizing
reproduces ``tf.image.resize`` (bilinear, half-pixel centres, no antialiasing, float32
arithmetic) followed by the truncating ``tf.cast`` to uint8, which is what the
Keras-on-TPU codelab's converter does, so petal's ``fill`` records match the codelab's
pixel for pixel before JPEG encoding.
"""

from __future__ import annotations

import functools
import io
import struct
import warnings
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageOps

# PIL's own default limit (about 89.5 megapixels, a 0.25 GB RGBA image).
DEFAULT_MAX_PIXELS = 89_478_485
DEFAULT_IMAGE_SIZE = 192
DEFAULT_QUALITY = 95
RESIZE_MODES = ("fill", "pad", "stretch", "none")
# libjpeg's JPEG_MAX_DIMENSION: larger images fail to encode ("broken data stream").
JPEG_MAX_SIDE = 65500
# A tf.train.Example is a protocol buffer, which cannot be 2 GiB or larger; the other
# fields of a record take far less than the margin left here.
RAW_MAX_BYTES = 2**31 - 2**20

# What PIL raises on bad data, across its format plugins: OSError (including
# UnidentifiedImageError and "image file is truncated"), SyntaxError (broken headers),
# ValueError, EOFError, struct.error and IndexError (short or inconsistent chunks).
DECODE_ERRORS = (
    OSError,
    SyntaxError,
    ValueError,
    EOFError,
    struct.error,
    IndexError,
    Image.DecompressionBombError,
)


class ImageError(Exception):
    """An input that cannot become a record; the message is the reason in the manifest."""


class PixelLimitError(ImageError):
    """An image over the pixel limit; ``petal convert --max-pixels`` raises the limit (the
    other commands keep the default)."""


@dataclass(frozen=True)
class Encoded:
    """One converted image.

    Attributes:
        data: JPEG bytes, or raw uint8 pixels (height x width x 3, row-major).
        height: stored height.
        width: stored width.
        original_height: source height after EXIF orientation, before resizing.
        original_width: source width after EXIF orientation, before resizing.
    """

    data: bytes
    height: int
    width: int
    original_height: int
    original_width: int


def parse_image_size(value: int | str | tuple[int, int] | list[int]) -> tuple[int, int]:
    """``192``, ``"192"``, ``"192x256"`` (height x width) or ``(h, w)`` -> ``(h, w)``.

    Raises:
        ValueError: anything else, or a non-positive side.
    """
    received = value
    try:
        if isinstance(value, str):
            parts = value.lower().replace("×", "x").split("x")
            value = tuple(int(p) for p in parts)
            if len(value) == 1:  # "192": a square's side
                value = (value[0], value[0])
        elif _is_integer(value):
            value = (int(value), int(value))
        else:
            # Whole numbers only: True (an int to Python) or 192.7 is no side.
            value = tuple(int(v) for v in value) if all(map(_is_integer, value)) else ()
    except (TypeError, ValueError):
        value = ()
    # A sequence is (height, width): (64,) is refused, as the input pipeline refuses it.
    if len(value) != 2 or min(value) < 1:
        raise ValueError(
            "image_size must be a positive size such as 192 or HxW (e.g. 192x256). "
            f"Received: image_size={received!r}"
        )
    return value[0], value[1]


def _is_integer(value) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool | np.bool_)


def open_image(data: bytes, max_pixels: int = DEFAULT_MAX_PIXELS) -> Image.Image:
    """Opens encoded bytes lazily (header only) and enforces the pixel limit.

    Raises:
        ImageError: empty, not an image, or over ``max_pixels``.
    """
    if not data:
        raise ImageError("empty file (0 bytes)")
    previous = Image.MAX_IMAGE_PIXELS
    # petal enforces its own (configurable) limit below; PIL's would refuse images
    # between its default and a larger --max-pixels.
    Image.MAX_IMAGE_PIXELS = None
    try:
        with warnings.catch_warnings():
            # Opening parses metadata too: a damaged EXIF block warns ("Corrupt EXIF
            # data"), naming no file, while the image itself decodes.
            warnings.simplefilter("ignore")
            image = Image.open(io.BytesIO(data))
    except Image.UnidentifiedImageError:
        raise ImageError("not an image (no known image format in the file)") from None
    except DECODE_ERRORS as err:
        raise ImageError(f"corrupt image header: {err}") from None
    finally:
        Image.MAX_IMAGE_PIXELS = previous
    width, height = image.size
    if width * height > max_pixels:
        # Height first, as --image-size and petal inspect give sizes.
        raise PixelLimitError(
            f"too many pixels (HxW {height}x{width} = {width * height:,} > max_pixels "
            f"{max_pixels:,}, a guard against decompression bombs)"
        )
    return image


def _to_rgb(image: Image.Image) -> Image.Image:
    """Any PIL mode -> RGB; transparent pixels become white, as on a web page."""
    mode = image.mode
    if "transparency" in image.info and mode in ("P", "L", "1", "RGB"):
        # A palette's transparent entries, or a grey or RGB colour key (PNG tRNS).
        image = image.convert("RGBA")
        mode = "RGBA"
    if mode == "RGB":
        return image
    if mode in ("RGBA", "LA", "PA", "RGBa", "La"):
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    if mode.startswith("I") or mode == "F":
        # 16-bit, 32-bit and float greyscale: PIL's convert would clip, not scale.
        values = np.asarray(image, dtype=np.float64)
        if mode == "F":
            values = _float_grey(values)
        elif mode.startswith("I;16") or values.max(initial=0) > 255:
            values = values / 257.0
        grey = np.clip(np.floor(values + 0.5), 0, 255).astype(np.uint8)
        key = image.info.get("transparency")
        if mode.startswith("I") and isinstance(key, int):
            # A 16-bit grey colour key (PNG tRNS), which PIL's RGBA conversion drops.
            grey[np.asarray(image) == key] = 255
        return Image.fromarray(grey, "L").convert("RGB")
    return image.convert("RGB")


def _png_colour_key(image: Image.Image, data: bytes) -> None:
    """Fits a PNG's colour key (tRNS) to the pixels PIL gives: a 2- or 4-bit grey image's
    levels are scaled to 8 bits, its key was not (no pixel matched: the transparency was
    dropped). A 16-bit RGB image's pixels are cut to 8 bits, its key not: pixels of other
    colours matched it, turning white, and the transparent ones did not; those 8 bits
    cannot tell the key from its neighbours, so such an image is refused.

    Raises:
        ImageError: a 16-bit RGB PNG with a colour key.
    """
    key = image.info.get("transparency")
    if image.format != "PNG" or key is None or len(data) < 26 or data[12:16] != b"IHDR":
        return
    depth, colour = data[24], data[25]
    if colour == 0 and depth in (2, 4) and isinstance(key, int):
        image.info["transparency"] = key * 255 // (2**depth - 1)
    elif colour == 2 and depth == 16:
        raise ImageError(
            "16-bit RGB PNG with a transparent colour (tRNS), which cannot be read exactly "
            "at 8 bits: save it with an alpha channel, or as an 8-bit PNG"
        )


def _float_grey(values: np.ndarray) -> np.ndarray:
    """Float greyscale pixels (mode F, e.g. a float TIFF) -> the 0..255 scale.

    Values within 0..1, the usual range of float images, are scaled by 255; within 0..255
    kept; larger ranges taken as 16-bit (divided by 257), as for 16-bit images.

    Raises:
        ImageError: NaN, infinite or negative values, which have no grey level.
    """
    if not np.isfinite(values).all():
        raise ImageError("float image holding NaN or infinite values; save it as an 8-bit image")
    low, high = values.min(initial=0), values.max(initial=0)
    if low < 0:
        raise ImageError(
            f"float image with negative values (from {low:g} to {high:g}); rescale it to "
            "0..1 or 0..255, or save it as an 8-bit image"
        )
    if high <= 1:
        return values * 255.0
    return values if high <= 255 else values / 257.0


def decode_rgb(
    data: bytes, max_pixels: int = DEFAULT_MAX_PIXELS
) -> tuple[np.ndarray, Image.Image, bool]:
    """Decodes image bytes to an RGB uint8 array (H, W, 3).

    Returns:
        (pixels, the opened image, whether the pixels equal a plain JPEG decode of ``data``:
        a JPEG in RGB or greyscale with no rotation to apply, so its bytes can be kept as is).

    Raises:
        ImageError: with the reason the image cannot be used.
    """
    image = open_image(data, max_pixels)
    previous = Image.MAX_IMAGE_PIXELS
    Image.MAX_IMAGE_PIXELS = None  # see open_image; some plugins check again on load
    try:
        with warnings.catch_warnings():
            # Only the first frame of an animation is used; PIL's palette warnings
            # about odd GIFs are not actionable here.
            warnings.simplefilter("ignore")
            image.seek(0)
            orientation = image.getexif().get(0x0112, 1)
            jpeg = image.format == "JPEG"
            plain_jpeg = jpeg and image.mode in ("RGB", "L") and orientation in (0, 1)
            pixels = None
            if jpeg and image.mode in ("RGB", "L"):
                # Rotated too (most phone photos): libjpeg finds a scan cut short, which PIL
                # decodes grey without a word; the rotation is applied to its pixels.
                pixels = _libjpeg_pixels(data, image.mode)
                if pixels is not None and orientation in _EXIF_TRANSPOSE:
                    turned = Image.fromarray(pixels).transpose(_EXIF_TRANSPOSE[orientation])
                    pixels = np.asarray(turned)
            elif jpeg:
                _refuse_cut_short(data)  # CMYK or YCCK, which PIL decodes
            if pixels is None:
                image.load()
                _png_colour_key(image, data)
                oriented = ImageOps.exif_transpose(image) if orientation not in (0, 1) else image
                pixels = np.asarray(_to_rgb(oriented), dtype=np.uint8)
    except ImageError:
        raise
    except DECODE_ERRORS as err:
        raise ImageError(f"corrupt or truncated image: {err}") from None
    finally:
        Image.MAX_IMAGE_PIXELS = previous
    if pixels.ndim != 3 or pixels.shape[2] != 3:
        raise ImageError(f"cannot convert image mode {image.mode!r} to RGB")
    return pixels, image, plain_jpeg


def _libjpeg_pixels(data: bytes, mode: str) -> np.ndarray | None:
    """An RGB or greyscale JPEG's RGB pixels (as stored, before any rotation), decoded by
    libjpeg-turbo through simplejpeg: PIL's pixels (the same library and settings), in half
    its time. Or None, for PIL to decode: a warning that PIL lets pass (extraneous bytes before a
    marker, an odd progression).

    Raises:
        ImageError: a scan's data end early, cut off by a marker, which PIL decoded without
            a word, the rest grey. (A file cut off by its end: PIL refuses it, in its words.)
    """
    import simplejpeg

    try:
        out = simplejpeg.decode_jpeg(data, colorspace="GRAY" if mode == "L" else "RGB")
    except ValueError as err:  # strict: libjpeg's warnings raise too
        if jpeg_cut_short(err):
            raise ImageError(f"corrupt or truncated image: {err}") from None
        return None
    return np.repeat(out, 3, axis=2) if mode == "L" else out


# EXIF orientation -> the transpose that shows the photo upright (as ImageOps.exif_transpose).
_EXIF_TRANSPOSE = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}


def _refuse_cut_short(data: bytes) -> None:
    """Raises ImageError for a JPEG (of any colour space) whose scan data end early, as
    libjpeg finds it; decoded by PIL, the rest would be grey, without a word."""
    import simplejpeg

    try:
        simplejpeg.decode_jpeg(data, colorspace="CMYK")
    except ValueError as err:
        if jpeg_cut_short(err):
            raise ImageError(f"corrupt or truncated image: {err}") from None


def jpeg_cut_short(err: ValueError) -> bool:
    """Whether simplejpeg's (strict) ``err`` says a scan's data end early, cut off by a
    marker: libjpeg decodes the rest grey, with a warning only."""
    return "premature end of data segment" in str(err).lower()


def _lerp_weights(
    in_size: int, out_size: int, start: int, count: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Source indices and weights for output rows/columns ``start..start+count``.

    The same float32 arithmetic as TensorFlow's ResizeBilinear kernel with half-pixel
    centres: ``x = (i + 0.5) * (in / out) - 0.5``.
    """
    scale = np.float32(in_size) / np.float32(out_size)
    x = (np.arange(start, start + count, dtype=np.float32) + np.float32(0.5)) * scale - np.float32(
        0.5
    )
    floor = np.floor(x)
    lower = np.maximum(floor, 0).astype(np.intp)
    upper = np.minimum(np.ceil(x), in_size - 1).astype(np.intp)
    return lower, upper, (x - floor).astype(np.float32)


@functools.lru_cache(maxsize=256)
def _resize_plan(in_h: int, in_w: int, size: tuple[int, int], crop: tuple[int, int, int, int]):
    """Indices and weights of one resize geometry; photos of a folder often share one."""
    top, left, out_h, out_w = crop
    y0, y1, wy = _lerp_weights(in_h, size[0], top, out_h)
    x0, x1, wx = _lerp_weights(in_w, size[1], left, out_w)
    rows, where = np.unique(np.concatenate([y0, y1]), return_inverse=True)
    for array in (x0, x1, wx, wy, rows, where):
        array.flags.writeable = False  # shared between calls
    return rows, where[:out_h], where[out_h:], x0, x1, wx[None, :, None], wy[:, None, None]


def resize_bilinear(
    pixels: np.ndarray,
    size: tuple[int, int],
    crop: tuple[int, int, int, int] | None = None,
) -> np.ndarray:
    """``tf.image.resize(pixels, size)`` (bilinear) then ``tf.cast(..., tf.uint8)``.

    Args:
        pixels: uint8 (H, W, C).
        size: (height, width) of the resized image.
        crop: optional (top, left, height, width) window of the resized image to compute;
            equal to resizing and then cropping, but only the kept pixels are computed.
    """
    in_h, in_w = pixels.shape[:2]
    crop = tuple(crop) if crop is not None else (0, 0, *size)
    rows, upper_rows, lower_rows, x0, x1, wx, wy = _resize_plan(in_h, in_w, tuple(size), crop)
    # Interpolate each needed source row horizontally once, then the rows vertically:
    # the same operations, in the same order, as the kernel's per-pixel
    # top = tl + (tr - tl) * wx; bottom = ...; out = top + (bottom - top) * wy.
    needed = pixels[rows]
    across = np.take(needed, x0, axis=1).astype(np.float32)
    right = np.take(needed, x1, axis=1).astype(np.float32)
    right -= across
    right *= wx
    across += right
    out = across[upper_rows]
    below = across[lower_rows]
    below -= out
    below *= wy
    out += below
    # tf.cast truncates toward zero; the clip only guards float round-off at the ends.
    np.clip(out, 0, 255, out=out)
    return out.astype(np.uint8)


def fill_geometry(height: int, width: int, size: tuple[int, int]) -> tuple[int, int]:
    """Size that covers ``size`` keeping the aspect ratio (the codelab's rule).

    The side that limits the scale becomes exactly the target; the other is the exact
    quotient truncated, as the codelab's ``tf.image.resize`` call with float sizes does.
    """
    th, tw = size
    if height * tw < width * th:  # relatively wider than the target: height decides
        return th, max(tw, width * th // height)
    return max(th, height * tw // width), tw


def fit_geometry(height: int, width: int, size: tuple[int, int]) -> tuple[int, int]:
    """Largest size inside ``size`` keeping the aspect ratio."""
    th, tw = size
    if height * tw > width * th:  # relatively taller than the target: height decides
        return th, min(tw, max(1, width * th // height))
    return min(th, max(1, height * tw // width)), tw


def resize(pixels: np.ndarray, size: tuple[int, int] | None, mode: str = "fill") -> np.ndarray:
    """Resizes RGB uint8 pixels to ``size`` (height, width).

    Args:
        pixels: uint8 (H, W, 3).
        size: target (height, width); ignored for ``none``.
        mode: ``fill`` scales to cover the target keeping the aspect ratio, then crops
            the centre (the codelab's); ``pad`` scales to fit inside and pads the borders
            with black (like ``tf.image.resize_with_pad``); ``stretch`` ignores the aspect
            ratio; ``none`` returns the pixels unchanged.
    """
    if mode == "none":
        return pixels
    if mode not in RESIZE_MODES:
        raise ValueError(f"resize must be one of {', '.join(RESIZE_MODES)}. Received: {mode!r}")
    th, tw = size
    h, w = pixels.shape[:2]
    if mode == "stretch":
        return resize_bilinear(pixels, (th, tw))
    if mode == "fill":
        nh, nw = fill_geometry(h, w, (th, tw))
        return resize_bilinear(pixels, (nh, nw), crop=((nh - th) // 2, (nw - tw) // 2, th, tw))
    nh, nw = fit_geometry(h, w, (th, tw))
    out = np.zeros((th, tw, pixels.shape[2]), np.uint8)
    top, left = (th - nh) // 2, (tw - nw) // 2
    out[top : top + nh, left : left + nw] = resize_bilinear(pixels, (nh, nw))
    return out


def encode_jpeg(pixels: np.ndarray, quality: int = DEFAULT_QUALITY) -> bytes:
    """JPEG bytes without chroma subsampling (4:4:4), as the codelab writes them."""
    buffer = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(buffer, format="JPEG", quality=quality, subsampling=0)
    return buffer.getvalue()


def convert_image(
    data: bytes,
    *,
    size: tuple[int, int] | None,
    mode: str = "fill",
    format: str = "jpeg",
    quality: int = DEFAULT_QUALITY,
    max_pixels: int = DEFAULT_MAX_PIXELS,
) -> Encoded:
    """Encoded source bytes -> the bytes stored in a record.

    Args:
        data: the source file's bytes.
        size: target (height, width), or None with ``mode="none"``.
        mode: one of ``RESIZE_MODES``.
        format: ``jpeg`` or ``raw`` (uint8 pixels).
        quality: JPEG quality.
        max_pixels: larger images are refused before decoding.

    Raises:
        ImageError: with the reason the image cannot be used.
    """
    pixels, _, plain_jpeg = decode_rgb(data, max_pixels)
    oh, ow = pixels.shape[:2]
    out = resize(pixels, size, mode)
    h, w = out.shape[:2]
    # Only reachable with mode "none" (petal convert checks a target size up front).
    if format == "raw" and h * w * 3 > RAW_MAX_BYTES:
        raise ImageError(f"too large for a raw record (HxW {h}x{w}); use --format jpeg")
    if format != "raw" and max(h, w) > JPEG_MAX_SIDE:
        raise ImageError(
            f"too large for JPEG (HxW {h}x{w}; at most {JPEG_MAX_SIDE} pixels per side); "
            "use --format raw"
        )
    if format == "raw":
        stored = np.ascontiguousarray(out).tobytes()
    elif mode == "none" and plain_jpeg:
        stored = data  # the original bytes decode to exactly these pixels
    else:
        stored = encode_jpeg(out, quality)
    return Encoded(stored, h, w, oh, ow)
