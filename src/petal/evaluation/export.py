"""``petal export``: a SavedModel that takes encoded image bytes, and optionally TFLite.

The SavedModel's default signature ``serve(image_bytes)`` takes a batch of encoded images
(``tf.string [N]``: JPEG, PNG, GIF, BMP or WebP), decodes them as ``petal predict`` does
(JPEG with the accurate integer DCT and its EXIF orientation applied, PNG transparency
composited on white), fits them to the records' size the way the converter did (``fill``:
scale to cover and crop the centre), resizes to the model's input as the input pipeline
does (records of ``--resize none``, at the photos' own sizes, only that), normalizes and returns
``probabilities [N, classes]``, ``label [N]`` (string) and ``score [N]``: phone photos,
stored sideways with an orientation tag, are classified upright. A second signature,
``serve_pixels(images)``, takes float pixels in 0..255 at the model's size; it is the one
converted to TFLite, since TFLite has no image decoders. Left to TensorFlow's decoders:
transparency in GIF and BMP (dropped, where predict composites it on white) and EXIF tags in
formats other than JPEG. WebP transparency is composited on white as predict does, and a
BMP's colour table looked up (an RLE-compressed one is refused); an animated WebP is refused
(``InvalidArgumentError``), never handed to TensorFlow's decoder, and so is an image whose
header states more pixels than ``petal predict``'s default limit.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from petal.data.folders import held_output, refuse_url, same_place
from petal.data.images import DEFAULT_MAX_PIXELS
from petal.errors import PetalError, first_line, need_bool, printable, write_failed
from petal.evaluation.workdir import (
    RunInfo,
    check_not_in_the_way,
    check_output_folder,
    load_model,
    make_output_folder,
    open_run,
)
from petal.running import (
    RUNNING_FILE,
    in_use_error,
    mark_running,
    running_elsewhere,
    signals_held,
)

EXPORT_DIR = "export"


def _fit_tf(image, size: tuple[int, int], mode: str):
    """Resize one image (uint8 or float) to ``size`` with the converter's resize mode, to
    float32."""
    import tensorflow as tf

    th, tw = size
    if mode == "stretch":
        return tf.image.resize(image, size)
    hw = tf.shape(image, out_type=tf.int64)[:2]
    h, w = hw[0], hw[1]
    th64, tw64 = tf.constant(th, tf.int64), tf.constant(tw, tf.int64)
    if mode == "pad":
        # images.fit_geometry: inside the target, at least one pixel on the short side (a
        # 3000x10 strip keeps a row; tf.image.resize_with_pad would make it 0 and fail).
        taller = h * tw64 > w * th64
        one = tf.constant(1, tf.int64)
        new_h = tf.where(taller, th64, tf.minimum(th64, tf.maximum(one, h * tw64 // w)))
        new_w = tf.where(taller, tf.minimum(tw64, tf.maximum(one, w * th64 // h)), tw64)
        image = tf.image.resize(image, tf.cast(tf.stack([new_h, new_w]), tf.int32))
        top, left = (th64 - new_h) // 2, (tw64 - new_w) // 2
        return tf.pad(
            image, [[top, th64 - new_h - top], [left, tw64 - new_w - left], [0, 0]]
        )
    # fill: the limiting side becomes the target, the other the truncated exact quotient.
    wider = h * tw64 < w * th64
    new_h = tf.where(wider, th64, tf.maximum(th64, h * tw64 // w))
    new_w = tf.where(wider, tf.maximum(tw64, w * th64 // h), tw64)
    # Only the centre window is computed, as images.resize_bilinear's crop= does: resizing
    # the whole cover size first made a 1x40000 strip a 64x2560000 image (GBs).
    rows = _lerp_weights(h, new_h, (new_h - th64) // 2, th)
    cols = _lerp_weights(w, new_w, (new_w - tw64) // 2, tw)

    def corners(y, x):
        where = tf.stack(tf.meshgrid(y, x, indexing="ij"), axis=-1)
        return tf.cast(tf.gather_nd(image, where), tf.float32)

    # tf.image.resize's bilinear kernel, its operations in its order.
    wx, wy = cols[2][None, :, None], rows[2][:, None, None]
    top, top_right = corners(rows[0], cols[0]), corners(rows[0], cols[1])
    bottom, bottom_right = corners(rows[1], cols[0]), corners(rows[1], cols[1])
    top = top + (top_right - top) * wx
    bottom = bottom + (bottom_right - bottom) * wx
    return top + (bottom - top) * wy


def _lerp_weights(in_size, out_size, start, count: int):
    """Source indices (lower, upper) and weights of output rows or columns
    ``start..start+count`` of resizing ``in_size`` to ``out_size`` (int64 scalars), with
    TensorFlow's ResizeBilinear half-pixel arithmetic, as images._lerp_weights in numpy."""
    import tensorflow as tf

    scale = tf.cast(in_size, tf.float32) / tf.cast(out_size, tf.float32)
    x = (tf.cast(start + tf.range(count, dtype=tf.int64), tf.float32) + 0.5) * scale - 0.5
    floor = tf.floor(x)
    lower = tf.cast(tf.maximum(floor, 0.0), tf.int64)
    upper = tf.minimum(tf.cast(tf.math.ceil(x), tf.int64), in_size - 1)
    return lower, upper, x - floor


# JPEG marker segments walked to find the EXIF one (it comes first in practice, but ICC
# profiles (several APP2 segments of up to 64 KiB each), XMP and maker data may come before
# it; each step reads a 10-byte segment header, and the walk stops at the image data), and
# the orientation's directory entries looked at.
_EXIF_MAX_SEGMENTS = 1024
_EXIF_MAX_ENTRIES = 64
_ORIENTATION_TAG = 0x0112
# Bytes of one value of each TIFF type (1 BYTE .. 13 IFD, 16 LONG8; 0, 14 and 15 are none),
# and which of exif_orientation's candidate readings gives PIL's value of that type.
_TIFF_TYPE_SIZES = (0, 1, 1, 2, 4, 8, 1, 1, 2, 4, 8, 4, 8, 4, 0, 0, 8)
_TIFF_TYPE_READS = (0, 0, 0, 1, 2, 4, 3, 0, 1, 2, 4, 5, 6, 2, 0, 0, 7)
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _bytes_at(data, pos, count: int, size):
    """``count`` bytes of ``data`` from ``pos`` as int32, -1 past its end (``size`` bytes)."""
    import tensorflow as tf

    part = tf.strings.substr(data, tf.clip_by_value(pos, 0, size), count)
    raw = tf.cast(tf.io.decode_raw(part, tf.uint8), tf.int32)
    return tf.concat([raw, tf.fill([count], -1)], 0)[:count]


def exif_orientation(data):
    """The EXIF orientation (1-8) of JPEG bytes (scalar string), 1 where there is none.

    TensorFlow ops only, so that it runs inside a SavedModel: walks the JPEG's marker
    segments to the first ``Exif`` APP1 segment (however much ICC profile or other metadata
    comes before it), reads the TIFF header's byte order and the first image directory
    inside that segment, and takes tag 0x0112 from it, as PIL's ``getexif`` does.
    """
    import tensorflow as tf

    size = tf.strings.length(data)
    exif_id = tf.constant([0x45, 0x78, 0x69, 0x66, 0, 0])  # "Exif\0\0"

    def segment(k, pos, tiff, tiff_size):
        head = _bytes_at(data, pos, 10, size)  # marker, length, the first 6 bytes inside
        marker, length = head[1], head[2] * 256 + head[3]
        is_exif = (marker == 0xE1) & (length >= 8) & tf.reduce_all(head[4:] == exif_id)
        tiff = tf.where(is_exif, pos + 10, tiff)
        tiff_size = tf.where(is_exif, length - 8, tiff_size)
        # Stop at the image data (SOS) or at anything that is not a marker segment.
        stop = (head[0] != 0xFF) | (marker == 0xDA) | (length < 2)
        return k + 1, tf.where(stop, size, pos + 2 + length), tiff, tiff_size

    def more(k, pos, tiff, tiff_size):
        return (k < _EXIF_MAX_SEGMENTS) & (pos + 4 <= size) & (tiff < 0)

    start = _bytes_at(data, 0, 2, size)
    is_jpeg = (start[0] == 0xFF) & (start[1] == 0xD8)
    _, _, tiff, tiff_size = tf.while_loop(
        more,
        segment,
        (tf.constant(0), tf.where(is_jpeg, 2, size), tf.constant(-1), tf.constant(0)),
    )
    # The TIFF data of the segment (at most 64 KiB); offsets inside it count from its start.
    block = tf.strings.substr(data, tf.clip_by_value(tiff, 0, size), tf.maximum(tiff_size, 0))
    raw = tf.cast(tf.io.decode_raw(block, tf.uint8), tf.int32)
    n = tf.size(raw)
    raw = tf.concat([raw, [-1]], 0)  # byte(i) reads -1 outside the block, even for b""

    def byte(i):
        return tf.gather(raw, tf.where((i >= 0) & (i < n), i, n))

    def u16_big(i):
        return byte(i) * 256 + byte(i + 1)

    little = (byte(0) == 0x49) & (byte(1) == 0x49)  # "II"

    def u16(i):
        return tf.where(little, byte(i) + byte(i + 1) * 256, u16_big(i))

    def u32(i):
        lo, hi = u16(tf.where(little, i, i + 2)), u16(tf.where(little, i + 2, i))
        return tf.where((hi >= 0) & (hi < 0x8000), hi * 65536 + lo, -1)

    ifd = u32(4)
    count = u16(ifd)
    entry = ifd + 2 + 12 * tf.range(_EXIF_MAX_ENTRIES)
    # PIL takes the first value of any count: in the entry when they fit in its 4 bytes,
    # else at the offset it holds. Its BYTE (1), ASCII (2) and UNDEFINED (7) values are bytes
    # or text, never an orientation.
    kind = u16(entry + 2)
    kind, values = tf.where((kind >= 0) & (kind <= 16), kind, 0), u32(entry + 4)
    size = tf.gather(_TIFF_TYPE_SIZES, kind)
    outside = (size > 0) & (values > 4 // tf.maximum(size, 1))
    at = tf.where(outside, u32(entry + 8), entry + 8)
    first, second = u32(at), u32(at + 4)
    # A RATIONAL or SRATIONAL (numerator, denominator), a FLOAT or a DOUBLE (its bits; 1.0 to
    # 8.0 have a zero low word) is an orientation when its value is a whole number; a LONG8
    # when its high word is zero.
    ratio = tf.where((first >= 0) & (second > 0), first // tf.maximum(second, 1), -1)
    ratio = tf.where(ratio * second == first, ratio, -1)
    high, low = tf.where(little, second, first), tf.where(little, first, second)
    double = tf.bitcast(tf.cast(high, tf.int64) * 2**32, tf.float64)
    double = tf.where((high >= 0) & (low == 0), tf.cast(double, tf.float32), -1.0)

    def whole(x):
        return tf.where((x >= 1.0) & (x <= 8.0) & (x == tf.round(x)), tf.cast(x, tf.int32), -1)

    candidates = tf.stack(
        [
            tf.fill(tf.shape(entry), -1),  # BYTE, ASCII, UNDEFINED or no TIFF type
            u16(at),  # SHORT, SSHORT (a negative one reads above 8)
            first,  # LONG, SLONG, IFD (-1 when negative)
            byte(at),  # SBYTE
            ratio,  # RATIONAL, SRATIONAL
            whole(tf.bitcast(first, tf.float32)),  # FLOAT
            whole(double),  # DOUBLE
            tf.where(high == 0, low, -1),  # LONG8
        ],
        axis=1,
    )
    value = tf.gather(candidates, tf.gather(_TIFF_TYPE_READS, kind), batch_dims=1)
    found = (tf.range(_EXIF_MAX_ENTRIES) < count) & (u16(entry) == _ORIENTATION_TAG)
    found &= values >= 1
    value = tf.reduce_max(tf.where(found, value, 0))
    valid = (tiff >= 0) & (ifd >= 8) & (value >= 1) & (value <= 8)
    return tf.where(valid, value, 1)


_PNG_MAX_CHUNKS = 64


def png_colour_key(data):
    """Whether PNG bytes (scalar string) hold a ``tRNS`` chunk before their image data: a
    palette's transparency, or a grey or RGB colour that stands for transparent."""
    import tensorflow as tf

    size = tf.strings.length(data)

    def chunk(k, pos, found, done):
        head = tf.strings.substr(tf.strings.join([data, b"\0" * 8]), pos, 8)
        raw = tf.cast(tf.io.decode_raw(head, tf.uint8), tf.int64)
        length = ((raw[0] * 256 + raw[1]) * 256 + raw[2]) * 256 + raw[3]
        kind = tf.strings.substr(head, 4, 4)
        found = tf.equal(kind, "tRNS")
        done = found | tf.equal(kind, "IDAT") | tf.equal(kind, "IEND") | (pos + 8 > size)
        after = tf.minimum(tf.cast(pos, tf.int64) + 12 + length, tf.cast(size, tf.int64))
        return k + 1, tf.cast(after, tf.int32), found, done

    def more(k, pos, found, done):
        return tf.logical_not(done) & (k < _PNG_MAX_CHUNKS)

    start = (tf.constant(0), tf.constant(len(_PNG_SIGNATURE)), tf.constant(False), size < 8)
    return tf.while_loop(more, chunk, start)[2]


# No image file is shorter (a GIF of one pixel has 26 bytes): a shorter input is refused with
# that reason, before the format checks read past its end.
_MIN_IMAGE_BYTES = 8
# RIFF chunks of a WebP walked to find its animation chunk (they come before the image data).
_WEBP_MAX_CHUNKS = 16


def webp_animated(data):
    """Whether WebP bytes (scalar string) hold an animation: the animation flag of their
    ``VP8X`` header, or an ``ANIM``/``ANMF`` chunk before the image data."""
    import tensorflow as tf

    size = tf.strings.length(data)
    flags = tf.maximum(_bytes_at(data, 20, 1, size)[0], 0)  # of a VP8X first chunk
    flagged = tf.equal(tf.strings.substr(data, tf.minimum(12, size), 4), b"VP8X") & (
        tf.bitwise.bitwise_and(flags, 0x02) != 0
    )

    def chunk(k, pos, found, done):
        kind = tf.strings.substr(data, tf.clip_by_value(pos, 0, size), 4)
        raw = _bytes_at(data, pos + 4, 4, size)
        length = ((raw[3] * 256 + raw[2]) * 256 + raw[1]) * 256 + raw[0]
        found = tf.equal(kind, "ANIM") | tf.equal(kind, "ANMF")
        image = tf.equal(kind, "VP8 ") | tf.equal(kind, "VP8L") | tf.equal(kind, "ALPH")
        done = found | image | (pos + 8 > size) | (length < 0) | (length > size - pos - 8)
        # Chunks are padded to an even length.
        return k + 1, pos + 8 + length + length % 2, found, done

    def more(k, pos, found, done):
        return tf.logical_not(done) & (k < _WEBP_MAX_CHUNKS)

    start = (tf.constant(0), tf.constant(12), tf.constant(False), size < 20)
    return flagged | tf.while_loop(more, chunk, start)[2]


def apply_orientation(image, orientation):
    """``image [H, W, C]`` turned upright for an EXIF ``orientation`` (1-8), as PIL's
    ``ImageOps.exif_transpose`` turns it."""
    import tensorflow as tf

    def transpose(x):
        return tf.transpose(x, [1, 0, 2])

    branches = [
        lambda: image,                                # 1: upright
        lambda: tf.image.flip_left_right(image),      # 2: mirrored
        lambda: tf.image.rot90(image, 2),             # 3: upside down
        lambda: tf.image.flip_up_down(image),         # 4: mirrored upside down
        lambda: transpose(image),                     # 5: transposed
        lambda: tf.image.rot90(image, 3),             # 6: turned left (viewers turn right)
        lambda: tf.image.rot90(transpose(image), 2),  # 7: transversed
        lambda: tf.image.rot90(image, 1),             # 8: turned right
    ]
    return tf.switch_case(tf.clip_by_value(orientation, 1, 8) - 1, branches)


def header_size(data):
    """``(height, width)`` (int64 scalars) that the header of image bytes (scalar string)
    states, read without decoding: JPEG, PNG, GIF (its screen), BMP and WebP (its canvas);
    0 where there is no header of those formats to read."""
    import tensorflow as tf

    size = tf.strings.length(data)

    def number(pos, count: int, little: bool = True):
        raw = tf.cast(_bytes_at(data, pos, count, size), tf.int64)
        value = tf.constant(0, tf.int64)
        for k in reversed(range(count)) if little else range(count):
            value = value * 256 + raw[k]
        return tf.where(tf.reduce_all(raw >= 0), value, 0)

    def starts(text: bytes, pos: int = 0):
        return tf.equal(tf.strings.substr(data, tf.minimum(pos, size), len(text)), text)

    bmp_height, bmp_width, _ = _bmp_sides(number)
    bmp_width = tf.where(bmp_width >= 2**31, 2**32 - bmp_width, bmp_width)  # as a height
    # WebP: a canvas of 24-bit sizes - 1 (VP8X), 14-bit sizes - 1 (lossless), or 14-bit
    # sizes after the frame's start code (lossy).
    lossless, lossy = number(21, 4), number(26, 4)
    webp = tf.where(
        starts(b"VP8X", 12),
        tf.stack([number(27, 3), number(24, 3)]) + 1,
        tf.where(
            starts(b"VP8L", 12),
            tf.stack([lossless // 2**14 % 2**14, lossless % 2**14]) + 1,
            tf.where(
                starts(b"VP8 ", 12), tf.stack([lossy // 2**16 % 2**14, lossy % 2**14]), 0
            ),
        ),
    )
    zero = tf.zeros([2], tf.int64)
    sides = tf.where(
        starts(_PNG_SIGNATURE),
        tf.stack([number(20, 4, False), number(16, 4, False)]),
        tf.where(
            starts(b"GIF8"),
            tf.stack([number(8, 2), number(6, 2)]),  # its screen
            tf.where(
                starts(b"BM"),
                tf.stack([bmp_height, bmp_width]),
                tf.where(starts(b"RIFF") & starts(b"WEBP", 8), webp, zero),
            ),
        ),
    )
    sides = tf.cond(
        tf.io.is_jpeg(data),
        lambda: tf.image.extract_jpeg_shape(data, output_type=tf.int64)[:2],
        lambda: sides,
    )
    return sides[0], sides[1]


def _bmp_sides(number):
    """``(height, width, top_down)`` (int64, bool) of a BMP's header, read with
    ``number(pos, count)`` (a little-endian reader of its bytes): OS/2's header has 16-bit
    sizes, the others' 32-bit ones, a negative height for rows stored top-down (the width
    as stored)."""
    import tensorflow as tf

    core = tf.equal(number(14, 4), 12)
    height = tf.where(core, number(20, 2), number(22, 4))
    width = tf.where(core, number(18, 2), number(18, 4))
    top_down = height >= 2**31
    return tf.where(top_down, 2**32 - height, height), width, top_down


def _bmp_header(data):
    """``number(pos, count)``: the little-endian unsigned number (int64) at ``pos`` of the
    first 54 bytes of BMP bytes (scalar string), bytes past their end read as 0."""
    import tensorflow as tf

    raw = _bytes_at(data, 0, 54, tf.strings.length(data))
    raw = tf.cast(tf.maximum(raw, 0), tf.int64)  # one read: a few ops where a trace counts

    def number(pos: int, count: int):
        return tf.reduce_sum(raw[pos:pos + count] * [256**k for k in range(count)])

    return number


def palette_bmp(data):
    """Whether image bytes (scalar string) are a BMP with a colour table: 1, 4 or 8 bits a
    pixel. TensorFlow's decoder returns an 8-bit one's palette indices as grey (and refuses
    1 and 4 bits); :func:`decode_palette_bmp` looks them up as PIL does."""
    import tensorflow as tf

    number = _bmp_header(data)
    # OS/2's header has the bits a pixel at byte 24, the others at 28.
    bits = tf.where(tf.equal(number(14, 4), 12), number(24, 2), number(28, 2))
    is_bmp = tf.equal(tf.strings.substr(data, 0, 2), b"BM")
    return is_bmp & (tf.equal(bits, 1) | tf.equal(bits, 4) | tf.equal(bits, 8))


def decode_palette_bmp(data):
    """The pixels (uint8 ``[H, W, 3]``) of a BMP for which :func:`palette_bmp` holds: its
    rows unpacked and their indices looked up in its colour table, as PIL decodes it."""
    import tensorflow as tf

    size = tf.strings.length(data)
    number = _bmp_header(data)
    header = number(14, 4)
    core = tf.equal(header, 12)  # OS/2: 16-bit sizes, rows bottom-up, 3 bytes a colour
    bits = tf.where(core, number(24, 2), number(28, 2))
    height, width, top_down = _bmp_sides(number)
    compression = tf.where(core, tf.constant(0, tf.int64), number(30, 4))
    entry = tf.where(core, tf.constant(3, tf.int64), 4)
    # No count in the header (0) stands for all 2**bits colours.
    colours = tf.where(core, tf.constant(0, tf.int64), number(46, 4))
    colours = tf.where(tf.equal(colours, 0), 2**bits, colours)
    table = tf.minimum(colours, 256) * entry
    start = number(10, 4)
    # As PIL: pixels said to start right after the header start after the colour table.
    start = tf.where(tf.equal(start, 14 + header), start + colours * entry, start)
    stride = (bits * width + 31) // 32 * 4
    refuse = tf.debugging.Assert(
        tf.equal(compression, 0),
        ["RLE-compressed BMP is not supported by the SavedModel; send it as PNG or JPEG"],
    )
    truncated = tf.debugging.Assert(
        (14 + header + table <= tf.cast(size, tf.int64))
        & (start + stride * height <= tf.cast(size, tf.int64)),
        ["the BMP is truncated (its header states more bytes than it holds); send the "
         "whole file"],
    )
    with tf.control_dependencies([refuse, truncated]):
        palette = tf.io.decode_raw(tf.strings.substr(data, 14 + header, table), tf.uint8)
        pixels = tf.io.decode_raw(tf.strings.substr(data, start, stride * height), tf.uint8)
    palette = tf.reverse(tf.reshape(palette, [-1, entry])[:, :3], [1])  # BGR -> RGB
    # Indices past the table: black, as PIL looks them up.
    palette = tf.pad(palette, [[0, 256 - tf.shape(palette)[0]], [0, 0]])
    rows = tf.cast(tf.reshape(pixels, tf.stack([height, stride])), tf.int64)
    # Rows are stored bottom-up unless the height is negative.
    y = tf.range(height)
    rows = tf.gather(rows, tf.where(top_down, y, height - 1 - y))
    # Pixel x lies in byte x * bits // 8 of its row, the first in the high bits.
    at = tf.range(width) * bits
    rows = tf.bitwise.right_shift(tf.gather(rows, at // 8, axis=1), 8 - bits - at % 8)
    return tf.gather(palette, tf.bitwise.bitwise_and(rows, 2**bits - 1))


def decode_like_predict(data, max_pixels: int = DEFAULT_MAX_PIXELS):
    """Encoded image bytes -> uint8 ``[H, W, 3]`` with TensorFlow ops, as
    :func:`petal.data.images.decode_rgb` (``petal predict``) decodes them: JPEG with the
    accurate integer DCT and its EXIF orientation, PNG and WebP transparency on white,
    the colour table of a 1-, 4- or 8-bit BMP.
    An image whose header states more than ``max_pixels`` pixels (predict's default limit,
    a guard against decompression bombs) is refused (``InvalidArgumentError``) before it is
    decoded."""
    import tensorflow as tf

    from petal.data.pipeline import DCT_METHOD

    size = tf.strings.length(data)
    short = tf.debugging.Assert(
        size >= _MIN_IMAGE_BYTES,
        [tf.strings.format(
            "the image is empty or too short to be one ({} bytes); send the bytes of an "
            "image file",
            size,
        )],
    )
    with tf.control_dependencies([short]):
        height, width = header_size(data)
    too_many = tf.debugging.Assert(
        height * width <= max_pixels,
        [tf.strings.format(
            "the image has too many pixels (HxW {}x{} = {} > {}, the pixel limit of petal "
            "predict: a guard against decompression bombs); send a smaller image",
            [height, width, height * width, tf.constant(max_pixels, tf.int64)],
        )],
    )
    with tf.control_dependencies([short, too_many]):
        data = tf.identity(data)  # nothing is decoded before both checks

    def jpeg():
        image = tf.io.decode_jpeg(data, channels=3, dct_method=DCT_METHOD)
        return apply_orientation(image, exif_orientation(data))

    def on_white(color, alpha):
        alpha = tf.cast(alpha, tf.float32) / 255.0
        mixed = tf.cast(color, tf.float32) * alpha + 255.0 * (1.0 - alpha)
        return tf.cast(tf.round(mixed), tf.uint8)

    def stored(image):
        """Grey, grey + alpha, RGB or RGBA -> RGB, transparency on white."""
        channels = tf.shape(image)[-1]
        color = tf.cond(
            channels < 3, lambda: tf.tile(image[..., :1], [1, 1, 3]), lambda: image[..., :3]
        )
        # Without alpha the colours as they are: no float copy of the whole image.
        return tf.cond(
            tf.equal(channels % 2, 0), lambda: on_white(color, image[..., -1:]), lambda: color
        )

    def png():
        # The channels as stored: grey, grey + alpha, RGB or RGBA (a palette expanded).
        # Asked for 4 channels instead, a 1/2/4-bit PNG without transparency gets an alpha
        # of 2**bits - 1, not 255: nearly transparent, so nearly white.
        image = tf.io.decode_png(data)

        def keyed():  # a tRNS colour key: made an alpha channel when 4 are asked for
            rgba = tf.io.decode_png(data, channels=4)
            return on_white(rgba[..., :3], rgba[..., 3:])

        colour_key = png_colour_key(data) & tf.equal(tf.shape(image)[-1] % 2, 1)
        return tf.cond(colour_key, keyed, lambda: stored(image))

    def webp():
        # Never handed to TensorFlow's decoder when animated: TensorFlow 2.21's corrupts the
        # process's memory on animated WebP (it crashes the server) unless asked for 4
        # channels, and predict would take the first frame, which TensorFlow cannot.
        refuse = tf.debugging.Assert(
            tf.logical_not(webp_animated(data)),
            ["animated WebP is not supported by the SavedModel; send a still image (its "
             "first frame)"],
        )
        with tf.control_dependencies([refuse]):
            # As stored (RGB or RGBA): TensorFlow's WebP decoder refuses 3 channels of an
            # RGBA file, and predict composites its transparency on white.
            return stored(
                tf.io.decode_image(tf.identity(data), channels=0, expand_animations=False)
            )

    def other():
        return tf.io.decode_image(data, channels=3, expand_animations=False)

    head = tf.strings.substr(data, 0, 12)
    is_webp = tf.equal(tf.strings.substr(head, 0, 4), b"RIFF") & tf.equal(
        tf.strings.substr(head, 8, 4), b"WEBP"
    )
    head = tf.strings.substr(head, 0, len(_PNG_SIGNATURE))
    image = tf.case(
        [
            (tf.io.is_jpeg(data), jpeg),
            (tf.equal(head, _PNG_SIGNATURE), png),
            (is_webp, webp),
            (palette_bmp(data), lambda: decode_palette_bmp(data)),
        ],
        default=other,
    )
    return tf.ensure_shape(image, [None, None, 3])


def make_preprocess(run: RunInfo):
    """``bytes -> float32 [H, W, 3]`` at the model's size and normalization (TensorFlow ops)."""
    import tensorflow as tf

    from petal.data.pipeline import normalize, resize_fill

    records = run.records_size or run.image_size
    mode = run.fit_mode

    def preprocess(data):
        image = decode_like_predict(data)
        if mode == "none":
            # Records of images at their own sizes: the input pipeline resizes each.
            image = resize_fill(image, run.image_size)
            return normalize(image, run.normalization)
        # uint8 in: converted to float32 only in the resize's output (or its window's
        # corners), not the whole decoded photo (4 bytes a channel).
        image = _fit_tf(image, records, mode)
        # The converter stores uint8, truncated like its tf.cast.
        image = tf.cast(tf.clip_by_value(image, 0.0, 255.0), tf.uint8)
        if records != run.image_size:
            # Records at another size than the model's: resize as the input pipeline does.
            image = resize_fill(image, run.image_size)
        image = tf.ensure_shape(image, (*run.image_size, 3))
        return normalize(image, run.normalization)

    return preprocess


# What an export folder holds, and whether each is a folder; EXPORT_MARKER lists which of
# them this export wrote (an earlier export's may be replaced, nothing else unasked).
EXPORT_MARKER = "export.json"
_OUTPUTS = {"saved_model": True, "labels.txt": False, "model.tflite": False, EXPORT_MARKER: False}
_WRITTEN_BY = "petal export"
EXPORT_OUTPUTS = tuple(_OUTPUTS)


def exported_names(out: Path) -> set[str]:
    """The names of ``out`` that an earlier ``petal export`` wrote there, as its
    :data:`EXPORT_MARKER` lists them (the marker included); empty without one."""
    try:
        marker = json.loads((out / EXPORT_MARKER).read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return set()
    if not isinstance(marker, dict) or marker.get("written_by") != _WRITTEN_BY:
        return set()
    files = marker.get("files")
    listed = {f for f in files if f in _OUTPUTS} if isinstance(files, list) else set()
    return listed | {EXPORT_MARKER}


def exported_run(out: Path) -> str | None:
    """The run folder whose export :data:`EXPORT_MARKER` in ``out`` says it holds, or None
    (no export's marker there, or one that names no run)."""
    if not exported_names(out):
        return None
    try:
        theirs = json.loads((out / EXPORT_MARKER).read_text()).get("run")
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return theirs if isinstance(theirs, str) and theirs else None


def _write_marker(out: Path, staging: Path, run: RunInfo, names) -> None:
    """:data:`EXPORT_MARKER` in ``out`` listing ``names``, written in ``staging`` and moved."""
    marker = {"written_by": _WRITTEN_BY, "run": str(run.workdir.absolute()),
              "files": sorted(names)}
    (staging / EXPORT_MARKER).write_text(json.dumps(marker, indent=2) + "\n")
    os.replace(staging / EXPORT_MARKER, out / EXPORT_MARKER)


def _check_out(out: Path, overwrite: bool, run: RunInfo | None = None) -> None:
    """Refuses what is in the way of the export in ``out``, before any work: a link or the
    wrong kind (file, folder) where it writes, or, without ``overwrite``, files an earlier
    ``petal export`` did not write there (:func:`exported_names`), or the export of another
    run than ``run`` (:func:`exported_run`) unless ``out`` is ``run``'s own export folder."""
    from petal.evaluation.evaluate import WRITTEN
    from petal.training.loop import refuse_out_holding_data

    refuse_out_holding_data(out, (*_OUTPUTS, *WRITTEN), "export")  # an evaluation is no data
    elsewhere = "move it away or pass --out another folder."
    for name, is_dir in _OUTPUTS.items():
        target = out / name
        if target.is_symlink():  # never written by an export: the link or its target?
            raise PetalError(f"{target} is a link, where the export writes its {name}; {elsewhere}")
        check_not_in_the_way(target, is_dir, f"the export writes its {name}", elsewhere)
    if overwrite:
        return
    theirs = exported_run(out)
    if (
        run is not None
        and theirs is not None
        and not same_place(theirs, run.workdir)
        # A run copied or moved keeps its export, which names the run where it was: its own
        # folder is exported into again.
        and not same_place(out, run.workdir / EXPORT_DIR)
    ):
        raise PetalError(
            f"--out {out} holds the export of another run, {theirs} (as its {EXPORT_MARKER} "
            f"says): pass --out another folder, or --overwrite to replace that export with "
            f"this run's ({', '.join(_OUTPUTS)}; other files stay)."
        )
    ours = exported_names(out)
    foreign = [str(out / name) for name in _OUTPUTS if (out / name).exists() and name not in ours]
    if foreign:
        were = "was" if len(foreign) == 1 else "were"
        raise PetalError(
            f"{' and '.join(foreign)} {were} not written by petal export (not listed in "
            f"{out / EXPORT_MARKER}, which it writes; an older petal's export has none): pass "
            f"--out another folder, or --overwrite to replace the export's files there "
            f"({', '.join(_OUTPUTS)}; other files stay)."
        )


# The temporary folder an export writes into inside ``out`` (``.export-XXXXXXXX``), with the
# marker of the process writing it (:func:`petal.running.mark_running`). One whose process
# died (killed before its cleanup) is removed by the next export into ``out``; one without a
# marker (left by a petal before it wrote one, or made a moment ago by an export about to
# write it) once it has not changed for this long.
_STAGING_PREFIX = ".export-"
_UNMARKED_STALE_SECONDS = 3600


def _abandoned(staging: Path) -> bool:
    """Whether the staging folder ``staging`` of an export is no live process's."""
    try:
        holder = json.loads((staging / RUNNING_FILE).read_text())
        ours = holder.get("pid") == os.getpid()  # another export of this process (a thread)
    except (OSError, UnicodeDecodeError, ValueError, AttributeError):
        try:
            return time.time() - staging.stat().st_mtime > _UNMARKED_STALE_SECONDS
        except OSError:
            return False  # gone meanwhile
    return not ours and running_elsewhere(staging) is None


def _remove_abandoned(out: Path, warn) -> None:
    """Removes the staging folders in ``out`` of exports that were killed before their
    cleanup (a partial SavedModel may be large), saying so with ``warn``; those of exports
    still running are left alone."""
    for staging in sorted(out.glob(f"{_STAGING_PREFIX}*")):
        if staging.is_symlink() or not staging.is_dir() or not _abandoned(staging):
            continue
        shutil.rmtree(staging, ignore_errors=True)
        if not staging.exists():
            warn(f"removed {staging}, left by an export that was stopped before it ended")


def _warn(line: str) -> None:
    print(f"petal export: warning: {line}", file=sys.stderr, flush=True)


def export(
    workdir: str | Path,
    out: str | Path | None = None,
    tflite: bool = False,
    overwrite: bool = False,
    warn=None,
) -> dict:
    """Write ``WORKDIR/export/saved_model`` (and ``model.tflite``) plus ``labels.txt``, and
    ``export.json`` listing them.

    Everything is written into a temporary folder inside ``out`` first and moved into place
    at the end, replacing an earlier export's files: a failure leaves ``out`` as it was,
    and an earlier ``saved_model`` is never mixed with the new one. The temporary folders
    of exports killed before their cleanup are removed (not those of exports running). An
    earlier ``model.tflite`` is removed when ``tflite`` is off (it would not match the rest). Files
    of those names that no export wrote there (not listed in its ``export.json``, as in the
    exports of petal before it wrote one) are refused, unless ``overwrite``, and so is the
    export of another run (its ``export.json`` names that run) anywhere but in this run's own
    export folder; other files in ``out`` are left alone.

    Args:
        workdir: a finished ``petal train`` work directory.
        out: output folder; default ``WORKDIR/export``.
        tflite: also convert the ``serve_pixels`` signature to ``model.tflite``.
        overwrite: replace ``saved_model``, ``labels.txt``, ``model.tflite`` and
            ``export.json`` in ``out`` whatever wrote them, another run's export too
            (``--overwrite``).
        warn: receives the warning lines (default: printed to stderr): a model that is not
            the run's latest (a training still running in it, or an unfinished resume), and
            the temporary folders of killed exports removed from ``out``.

    Returns:
        ``{"saved_model": path, "labels": path, "tflite": path or None,
        "removed": [the model.tflite removed, which would not match]}``.

    Raises:
        PetalError: no finished run, a damaged model, ``workdir`` or ``out`` is a URL,
            ``out`` (or one of the names above inside it) is in the way, another process
            exports into it, or it cannot be written (a full disk).
    """
    import keras
    import tensorflow as tf

    from petal.data.pipeline import normalize

    overwrite = need_bool(overwrite, "overwrite")
    tflite = need_bool(tflite, "tflite")
    warn = warn or _warn
    # Before the model is read (open_run refuses a URL workdir): a Path made the local
    # folder gs:/b/exp of gs://b/exp.
    refuse_url(out, "out", "exports")
    run = open_run(workdir, warn=warn)
    # The model first: a damaged one leaves no empty export folder behind.
    model = load_model(run, float32=True)
    # Checked now, created once the archive is built (the folder is what is made last).
    out = check_output_folder(out if out is not None else run.workdir / EXPORT_DIR, "export")
    if who := running_elsewhere(out, "exporting into it"):
        # Another export swapping its files in: refused now, not after the archive is
        # written (held below, as evaluate holds its folder, from the folder's creation).
        raise in_use_error(out, who, "--out")
    _check_out(out, overwrite, run)
    preprocess = make_preprocess(run)
    classes = list(run.classes)
    h, w = run.image_size

    def probabilities(images):
        # No images, no probabilities: TensorFlow's CPU convolution of an empty batch gave
        # BatchNorm a tensor of the wrong shape ("Incompatible shapes: [32] vs. [0,64,64,3]").
        # Not in serve_pixels, which model.tflite is converted from: the branch became an IF
        # op there, and the output lost its shape ([-1, classes]) until a first invoke.
        return tf.cond(
            tf.shape(images)[0] > 0,
            lambda: model(images, training=False),
            lambda: tf.zeros([0, len(classes)], tf.float32),
        )

    def serve(image_bytes):
        images = tf.map_fn(
            preprocess,
            image_bytes,
            fn_output_signature=tf.TensorSpec((h, w, 3), tf.float32),
        )
        probs = probabilities(images)
        best = tf.argmax(probs, axis=-1)
        return {
            "probabilities": probs,
            "label": tf.gather(tf.constant(classes), best),
            "score": tf.reduce_max(probs, axis=-1),
        }

    def serve_pixels(images):
        return {"probabilities": model(normalize(images, run.normalization), training=False)}

    archive = keras.export.ExportArchive()
    archive.track(model)
    # The first endpoint also becomes "serving_default".
    archive.add_endpoint(
        name="serve",
        fn=serve,
        input_signature=[tf.TensorSpec([None], tf.string, name="image_bytes")],
    )
    archive.add_endpoint(
        name="serve_pixels",
        fn=serve_pixels,
        input_signature=[tf.TensorSpec([None, h, w, 3], tf.float32, name="images")],
    )
    # Created folders are removed again if the export fails or is interrupted; a second
    # export into out is refused while this one holds it.
    holding = held_output(
        out, lambda: make_output_folder(out, "export"), "--out", "exporting into it"
    )
    removed, staging, target = None, None, None
    with holding as out:
        _remove_abandoned(out, warn)
        try:
            staging = Path(tempfile.mkdtemp(prefix=_STAGING_PREFIX, dir=out))
            # Tells a later export that this folder is not left over while this process lives.
            mark_running(staging, lambda who: PetalError(who), "exporting into it")
            archive.write_out(str(staging / "saved_model"), verbose=False)
            # One class a line: a control character (a newline) written as an escape, and so
            # a backslash too (\\), or a name holding a backslash and an n would read back as
            # a newline.
            lines = "".join(printable(name.replace("\\", "\\\\")) + "\n" for name in classes)
            (staging / "labels.txt").write_text(lines, encoding="utf-8")
            if tflite:
                _to_tflite(staging / "saved_model", staging / "model.tflite", run.model_path)
            written = [name for name in _OUTPUTS if (staging / name).exists()]
            # Everything written: only now replace the earlier export. The marker first lists
            # what is replaced or removed too, so an interruption leaves all of it the export's.
            # Ctrl-C waits for the replacement: the folder holds the earlier export or this one.
            with signals_held():
                gone = {name for name in _OUTPUTS if (out / name).exists()}
                _write_marker(out, staging, run, set(written) | gone)
                removed = []
                for name in _OUTPUTS:
                    target = out / name
                    if name == EXPORT_MARKER:
                        continue
                    if target.is_dir():
                        shutil.rmtree(target)
                    if name in written:
                        os.replace(staging / name, target)
                    elif target.exists():
                        target.unlink()
                        removed.append(str(target))
                _write_marker(out, staging, run, [*written, EXPORT_MARKER])
        except (OSError, tf.errors.OpError) as err:  # SaveV2's ResourceExhaustedError: disk full
            # Files written into a target as it was replaced: not a permission problem.
            clash = getattr(err, "errno", None) in (errno.ENOTEMPTY, errno.EEXIST)
            if removed is not None and clash:
                raise PetalError(
                    f"Cannot replace {target} with the new export: something else wrote into it "
                    f"meanwhile ({err.strerror}); let it finish and run petal export again."
                ) from None
            raise write_failed(out, "export", err) from None
        finally:
            if staging is not None:
                shutil.rmtree(staging, ignore_errors=True)
    return {
        "saved_model": str(out / "saved_model"),
        "labels": str(out / "labels.txt"),
        "tflite": str(out / "model.tflite") if tflite else None,
        "removed": removed,
    }


def _to_tflite(saved: Path, path: Path, name: Path) -> Path:
    """Convert ``saved``'s pixel signature to ``path``; errors name ``name`` (the model)."""
    import tensorflow as tf

    converter = tf.lite.TFLiteConverter.from_saved_model(
        str(saved), signature_keys=["serve_pixels"]
    )
    try:
        data = converter.convert()
    except Exception as err:  # the converter raises ConverterError and plain Exceptions
        raise PetalError(
            f"TFLite conversion of {name} failed: {first_line(err)}"
        ) from err
    path.write_bytes(data)
    return path
