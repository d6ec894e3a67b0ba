"""Line charts as PNG files, in pure Python: the soak's plot without a plotting library.

matplotlib would draw this in three lines, but it brings numpy, Pillow, fonttools, kiwisolver
and contourpy (about 60 MB) onto every machine the tool runs on, build hosts and serving hosts
alike, for one picture per soak. A soak's plot is a few line panels over time with their
ranges written on them; a raster, a 5x7 bitmap font and zlib do that in a page of code.
"""

from __future__ import annotations

import math
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

RGB = tuple[int, int, int]
WHITE: RGB = (255, 255, 255)
BLACK: RGB = (0, 0, 0)
GREY: RGB = (200, 200, 200)
BLUE: RGB = (31, 119, 180)
ORANGE: RGB = (255, 127, 14)
GREEN: RGB = (44, 160, 44)
RED: RGB = (214, 39, 40)

#: 5x7 glyphs, one string of 7 rows of 5 columns per character ('#' lit). Upper case only:
#: text is upper-cased before drawing; a character without a glyph is drawn as '?'.
_GLYPHS = {
    "0": ".###.#...##..###.#.###..##...#.###.",
    "1": "..#...##....#....#....#....#...###.",
    "2": ".###.#...#....#...#...#...#...#####",
    "3": "#####...#...#.....#.....##...#.###.",
    "4": "...#...##..#.#.#..#.#####...#....#.",
    "5": "######....####.....#....##...#.###.",
    "6": "..##..#...#....####.#...##...#.###.",
    "7": "#####....#...#...#...#....#....#...",
    "8": ".###.#...##...#.###.#...##...#.###.",
    "9": ".###.#...##...#.####....#...#..##..",
    "A": ".###.#...##...#######...##...##...#",
    "B": "####.#...##...#####.#...##...#####.",
    "C": ".###.#...##....#....#....#...#.###.",
    "D": "###..#..#.#...##...##...##..#.###..",
    "E": "######....#....####.#....#....#####",
    "F": "######....#....####.#....#....#....",
    "G": ".###.#...##....#.####...##...#.####",
    "H": "#...##...##...#######...##...##...#",
    "I": ".###...#....#....#....#....#...###.",
    "J": "..###...#....#....#....#.#..#..##..",
    "K": "#...##..#.#.#..##...#.#..#..#.#...#",
    "L": "#....#....#....#....#....#....#####",
    "M": "#...###.###.#.##.#.##...##...##...#",
    "N": "#...##...###..##.#.##..###...##...#",
    "O": ".###.#...##...##...##...##...#.###.",
    "P": "####.#...##...#####.#....#....#....",
    "Q": ".###.#...##...##...##.#.##..#..##.#",
    "R": "####.#...##...#####.#.#..#..#.#...#",
    "S": ".#####....#.....###.....#....#####.",
    "T": "#####..#....#....#....#....#....#..",
    "U": "#...##...##...##...##...##...#.###.",
    "V": "#...##...##...##...##...#.#.#...#..",
    "W": "#...##...##...##.#.##.#.##.#.#.#.#.",
    "X": "#...##...#.#.#...#...#.#.#...##...#",
    "Y": "#...##...#.#.#...#....#....#....#..",
    "Z": "#####....#...#...#...#...#....#####",
    " ": "...................................",
    ".": "..........................##...##..",
    ",": ".....................##....#...#...",
    ":": "......##...##........##...##.......",
    "-": "................###................",
    "+": ".......#....#..#####..#....#.......",
    "/": "....#....#...#...#...#...#....#....",
    "(": "...#...#...#....#....#.....#.....#.",
    ")": ".#.....#.....#....#....#...#...#...",
    "%": "##...##..#...#...#...#...#..##...##",
    "=": "..........#####.....#####..........",
    "_": "..............................#####",
    "?": ".###.#...#....#...#...#.........#..",
    "<": "...#...#...#...#.....#.....#.....#.",
    ">": "#.....#.....#.....#...#...#...#....",
}
GLYPH_W, GLYPH_H = 5, 7


class Canvas:
    """An RGB raster with the few drawing operations a line chart needs."""

    def __init__(self, width: int, height: int, background: RGB = WHITE) -> None:
        self.width = width
        self.height = height
        self.pixels = bytearray(bytes(background) * (width * height))

    def set(self, x: int, y: int, color: RGB) -> None:
        if 0 <= x < self.width and 0 <= y < self.height:
            at = 3 * (y * self.width + x)
            self.pixels[at : at + 3] = bytes(color)

    def rect(self, x0: int, y0: int, x1: int, y1: int, color: RGB) -> None:
        """Filled, corners inclusive."""
        for y in range(max(0, min(y0, y1)), min(self.height, max(y0, y1) + 1)):
            for x in range(max(0, min(x0, x1)), min(self.width, max(x0, x1) + 1)):
                self.set(x, y, color)

    def line(self, x0: int, y0: int, x1: int, y1: int, color: RGB, width: int = 1) -> None:
        """Bresenham's line, `width` pixels thick."""
        dx, dy = abs(x1 - x0), -abs(y1 - y0)
        sx, sy = (1 if x0 < x1 else -1), (1 if y0 < y1 else -1)
        error = dx + dy
        half = (width - 1) // 2
        while True:
            if width == 1:
                self.set(x0, y0, color)
            else:
                self.rect(x0 - half, y0 - half, x0 - half + width - 1, y0 - half + width - 1, color)
            if x0 == x1 and y0 == y1:
                return
            doubled = 2 * error
            if doubled >= dy:
                error += dy
                x0 += sx
            if doubled <= dx:
                error += dx
                y0 += sy

    def text(self, x: int, y: int, text: str, color: RGB = BLACK, scale: int = 1) -> int:
        """Draw text with its top left at (x, y); returns the x after it."""
        for char in text.upper():
            glyph = _GLYPHS.get(char, _GLYPHS["?"])
            for row in range(GLYPH_H):
                for col in range(GLYPH_W):
                    if glyph[row * GLYPH_W + col] == "#":
                        px, py = x + col * scale, y + row * scale
                        self.rect(px, py, px + scale - 1, py + scale - 1, color)
            x += (GLYPH_W + 1) * scale
        return x

    def png(self) -> bytes:
        raw = b"".join(
            b"\x00" + bytes(self.pixels[3 * y * self.width : 3 * (y + 1) * self.width])
            for y in range(self.height)
        )
        header = struct.pack(">IIBBBBB", self.width, self.height, 8, 2, 0, 0, 0)
        return (
            b"\x89PNG\r\n\x1a\n"
            + _chunk(b"IHDR", header)
            + _chunk(b"IDAT", zlib.compress(raw, 9))
            + _chunk(b"IEND", b"")
        )


def text_width(text: str, scale: int = 1) -> int:
    return len(text) * (GLYPH_W + 1) * scale


def _chunk(kind: bytes, data: bytes) -> bytes:
    crc = zlib.crc32(kind + data) & 0xFFFFFFFF
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)


@dataclass(frozen=True)
class Series:
    """One line of a panel: (x, y) points; a None y breaks the line."""

    label: str
    points: Sequence[tuple[float, float | None]]
    color: RGB = BLUE


@dataclass(frozen=True)
class Panel:
    title: str
    unit: str
    series: Sequence[Series]
    #: A horizontal line (a limit), drawn dashed in red, with its label.
    limit: float | None = None
    limit_label: str = ""


def chart(title: str, panels: Sequence[Panel], x_label: str, width: int = 960) -> bytes:
    """Panels stacked over one x axis; each panel's y range starts at 0."""
    panel_h, top, left, right, gap = 170, 34, 70, 20, 38
    height = top + len(panels) * (panel_h + gap) + 16
    canvas = Canvas(width, height)
    room = width - left - right
    scale = 2 if text_width(title, 2) <= room else 1
    if text_width(title, scale) > room:
        title = title[: room // (GLYPH_W + 1) - 3] + "..."
    canvas.text(left, 10 if scale == 2 else 14, title, BLACK, scale=scale)
    xs = [x for panel in panels for s in panel.series for x, _ in s.points]
    x_max = max(xs, default=1.0) or 1.0
    plot_w = width - left - right
    for index, panel in enumerate(panels):
        y0 = top + index * (panel_h + gap) + 14
        _panel(canvas, panel, left, y0, plot_w, panel_h, x_max)
    canvas.text(left + plot_w - text_width(x_label), height - 12, x_label, BLACK)
    return canvas.png()


def _panel(canvas: Canvas, panel: Panel, x0: int, y0: int, w: int, h: int, x_max: float) -> None:
    values = [y for s in panel.series for _, y in s.points if y is not None]
    if panel.limit is not None:
        values.append(panel.limit)
    y_max = _nice(max(values, default=1.0))
    canvas.text(x0, y0 - 12, f"{panel.title} ({panel.unit})", BLACK)
    label_x = x0 + text_width(f"{panel.title} ({panel.unit})") + 18
    for series in panel.series:
        canvas.rect(label_x, y0 - 10, label_x + 10, y0 - 6, series.color)
        label_x = canvas.text(label_x + 14, y0 - 12, series.label, series.color) + 12
    for step in range(5):  # grid and y labels
        grid_y = y0 + h - round(h * step / 4)
        canvas.line(x0, grid_y, x0 + w, grid_y, GREY)
        label = _fmt(y_max * step / 4)
        canvas.text(x0 - 6 - text_width(label), grid_y - 3, label, BLACK)
    for step in range(6):  # x ticks
        tick_x = x0 + round(w * step / 5)
        canvas.line(tick_x, y0 + h, tick_x, y0 + h + 3, BLACK)
        label = _fmt(x_max * step / 5)
        canvas.text(tick_x - text_width(label) // 2, y0 + h + 6, label, BLACK)
    canvas.line(x0, y0, x0, y0 + h, BLACK)
    canvas.line(x0, y0 + h, x0 + w, y0 + h, BLACK)

    def at(x: float, y: float) -> tuple[int, int]:
        return x0 + round(w * x / x_max), y0 + h - round(h * min(y, y_max) / y_max)

    if panel.limit is not None:
        _, ly = at(0, panel.limit)
        for dash in range(x0, x0 + w, 12):
            canvas.line(dash, ly, min(dash + 6, x0 + w), ly, RED)
        if panel.limit_label:
            canvas.text(x0 + w - text_width(panel.limit_label) - 2, ly - 10, panel.limit_label, RED)
    for series in panel.series:
        last: tuple[int, int] | None = None
        for x, y in series.points:
            if y is None or not math.isfinite(y):
                last = None
                continue
            point = at(x, y)
            if last is not None:
                canvas.line(*last, *point, series.color, width=2)
            else:
                canvas.rect(point[0] - 1, point[1] - 1, point[0] + 1, point[1] + 1, series.color)
            last = point


def _nice(value: float) -> float:
    """The smallest of 1, 2, 2.5, 5 x 10^n at or above value (a readable axis top)."""
    if value <= 0:
        return 1.0
    power = 10.0 ** math.floor(math.log10(value))
    for step in (1.0, 2.0, 2.5, 5.0, 10.0):
        if value <= step * power:
            return step * power
    return 10.0 * power


def _fmt(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}".rstrip("0").rstrip(".")
    return f"{value:.2f}".rstrip("0").rstrip(".")


__all__ = ["Canvas", "Panel", "Series", "chart"]
