"""Class names on screen and in plots: terminal columns, and fonts that can draw them.

Class names are folder names, so any script: a CJK name takes two terminal columns per
character, and matplotlib's bundled font (DejaVu Sans) has no CJK glyphs, drawing empty boxes
with a warning per glyph. Tables pad by columns; plots fall back glyph by glyph to an installed
font that has them, and label a class that no installed font can draw by its number (with
one warning naming the font to install). Names are drawn literally: a ``$`` is escaped, so
matplotlib never reads ``price_$1_to_$5`` as mathematics (:func:`literal`).
"""

from __future__ import annotations

import functools
import sys
import unicodedata
from collections.abc import Sequence

from petal.errors import printable

# Families with CJK (and wide Unicode) coverage, tried after matplotlib's default in order.
FALLBACK_FONTS = (
    "Noto Sans CJK JP",
    "Noto Sans CJK SC",
    "Noto Sans CJK TC",
    "Noto Sans CJK KR",
    "Source Han Sans",
    "WenQuanYi Zen Hei",
    "WenQuanYi Micro Hei",
    "Droid Sans Fallback",
    "IPAGothic",
    "Noto Sans",
    "Unifont",
)


def columns(text: str) -> int:
    """Terminal columns of ``text``: wide and full-width characters take two, combining
    marks none."""
    total = 0
    for ch in text:
        if unicodedata.combining(ch):
            continue
        total += 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1
    return total


def ljust(text: str, width: int) -> str:
    """``text`` padded with spaces to ``width`` terminal columns."""
    return text + " " * max(0, width - columns(text))


@functools.lru_cache(maxsize=1)
def use_fallback_fonts() -> tuple[str, ...]:
    """Sets matplotlib's font family to its default followed by the installed
    :data:`FALLBACK_FONTS` (matplotlib falls back glyph by glyph); returns the families."""
    import matplotlib
    from matplotlib import font_manager

    installed = {f.name for f in font_manager.fontManager.ttflist}
    default = font_manager.FontProperties(family=matplotlib.rcParams["font.family"])
    first = font_manager.FontProperties(fname=font_manager.findfont(default)).get_name()
    families = (first, *(f for f in FALLBACK_FONTS if f in installed and f != first))
    matplotlib.rcParams["font.family"] = list(families)
    return families


@functools.lru_cache(maxsize=1)
def _drawable() -> frozenset[int]:
    """The code points some family of :func:`use_fallback_fonts` has a glyph for."""
    from matplotlib import font_manager, ft2font

    chars: set[int] = set()
    for family in use_fallback_fonts():
        path = font_manager.findfont(font_manager.FontProperties(family=family))
        chars.update(ft2font.FT2Font(path).get_charmap())
    return frozenset(chars)


def can_draw(text: str) -> bool:
    """Whether the plot fonts have a glyph for every character of ``text``."""
    drawable = _drawable()
    return all(ch.isprintable() and (ch == " " or ord(ch) in drawable) for ch in text)


def literal(text: str) -> str:
    """``text`` for a matplotlib title, label or tick, drawn as written: matplotlib reads
    text between two ``$`` as mathematics (``$5-$10 bills`` drew "5 - 10 bills", and
    ``price_$1_to_$5`` failed to parse); an escaped ``\\$`` is drawn as ``$``."""
    return text.replace("$", r"\$")


def plot_labels(classes: Sequence[str]) -> list[str]:
    """The class names to draw (:func:`literal`): each name (a control character in it
    escaped, as ``\\n``: no font draws one), or ``class N`` for one the installed fonts
    cannot draw (said once per set of names on stderr)."""
    shown = [printable(c) for c in classes]
    labels = [s if can_draw(s) else f"class {i}" for i, s in enumerate(shown)]
    missing = tuple(c for c, s, label in zip(classes, shown, labels, strict=True) if s != label)
    if missing:
        _warn_once(missing, tuple(labels[list(classes).index(c)] for c in missing))
    return [literal(label) for label in labels]


@functools.cache
def _warn_once(names: tuple[str, ...], labels: tuple[str, ...]) -> None:
    shown = ", ".join(
        f"{printable(name)} as '{label}'" for name, label in zip(names, labels, strict=True)
    )
    print(
        f"petal: warning: no installed font draws {len(names)} class name(s); plots label "
        f"them by number ({shown}). Install a font that has their characters (e.g. Noto Sans "
        "CJK: the fonts-noto-cjk package) to see the names.",
        file=sys.stderr,
    )


def shorten(label: str, chars: int) -> str:
    """A label of :func:`plot_labels` in at most ``chars`` characters, its middle replaced
    by "…" when longer (a dataset's names often share a start, or an end). Cut as the name
    it draws: an escaped ``$`` is one character, never split from its escape."""
    text = label.replace(r"\$", "$")
    if len(text) <= chars:
        return label
    keep = max(chars - 1, 2)
    return literal(text[: (keep + 1) // 2] + "…" + text[len(text) - keep // 2 :])


def fit_text(
    text, name: str, width: float, renderer, chars: int = 24, before: str = "", after: str = ""
) -> str:
    """``before + shorten(name, n) + after`` for the largest ``n`` up to ``chars`` that draws
    at most ``width`` pixels wide in matplotlib's ``text`` (left holding it): long class
    names ran into the next image's title."""
    for n in range(chars, 2, -1):
        text.set_text(before + shorten(name, n) + after)
        if text.get_window_extent(renderer).width <= width:
            break
    return text.get_text()
