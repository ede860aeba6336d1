"""PNG pictures of measurements: curves over a log axis and heatmaps (matplotlib, headless).

    from app import plots
    plots.curves("comm.png", {"all_reduce": [(8, 0.01), (1024, 0.9)]}, xlabel="message size (bytes)",
                 ylabel="bus bandwidth (GB/s)", title="app comm", logx=True)
    plots.heatmap("links.png", [[None, 1.2], [1.1, None]], ["a", "b"], unit="GB/s", title="app links")
    plt = plots.pyplot(); fig, ax = plt.subplots(); ...; plots.save(fig, "own.png")   # a figure of one's own

matplotlib is imported only when a picture is drawn (the commands' ``--plot``), with the Agg
backend, so no display is needed and commands without ``--plot`` never load it. Files are written
atomically. The commands call this on rank 0 only.
"""

import io
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from app.atomic import atomic_write_bytes
from app.errors import UsageError

DPI = 120


def pyplot():
    """matplotlib.pyplot on the Agg backend (UsageError when matplotlib is missing)."""
    try:
        import matplotlib
    except ImportError:
        raise UsageError("--plot needs matplotlib: pip install matplotlib (or leave out --plot)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def prepare(path: str | os.PathLike) -> None:
    """Refuse a --plot path that is not a .png, or a missing matplotlib, before any measurement runs."""
    try:
        png_path(str(path))
    except UsageError as error:
        raise UsageError(f"--plot {error}") from None


def png_path(text: str) -> str:
    """A --plot flag's parser (``flag(parse=plots.png_path)``): ``text``, a .png path, with matplotlib there."""
    if Path(text).suffix.lower() != ".png":
        raise UsageError(f"{text}: the picture is a PNG, give a path ending in .png")
    pyplot()
    return text


def save(fig, path: str | os.PathLike) -> Path:
    """Write ``fig`` as a PNG at ``path``, atomically."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI, bbox_inches="tight")
    return atomic_write_bytes(path, buffer.getvalue())


def curves(
    path: str | os.PathLike,
    series: Mapping[str, Sequence[tuple[float, float]]],
    *,
    xlabel: str,
    ylabel: str,
    title: str,
    logx: bool = False,
    hlines: Mapping[str, float] | None = None,
) -> Path:
    """One line per series of (x, y) points; ``hlines``: labelled horizontal references (a ceiling)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    try:
        for label, points in series.items():
            if points:
                xs, ys = zip(*points, strict=True)
                ax.plot(xs, ys, marker="o", markersize=3, label=label)
        for label, y in (hlines or {}).items():
            ax.axhline(y, linestyle="--", color="grey", linewidth=1)
            ax.annotate(label, (0.01, y), xycoords=("axes fraction", "data"), va="bottom", fontsize=8, color="grey")
        if logx:
            ax.set_xscale("log", base=2)
        ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=8)
        return save(fig, path)
    finally:
        plt.close(fig)


def heatmap(
    path: str | os.PathLike,
    matrix: Sequence[Sequence[float | None]],
    labels: Sequence[str],
    *,
    unit: str,
    title: str,
    xlabel: str = "receiver",
    ylabel: str = "sender",
) -> Path:
    """A square matrix as coloured cells with their values; None (the diagonal) stays blank."""
    plt = pyplot()
    values = [[math.nan if v is None else v for v in row] for row in matrix]
    fig, ax = plt.subplots(figsize=(1.2 * len(labels) + 3, 1.0 * len(labels) + 2))
    try:
        image = ax.imshow(values, cmap="viridis")
        fig.colorbar(image, ax=ax, label=unit)
        ax.set_xticks(range(len(labels)), labels=labels, rotation=30, ha="right")
        ax.set_yticks(range(len(labels)), labels=labels)
        for i, row in enumerate(values):
            for j, v in enumerate(row):
                if not math.isnan(v):
                    colour = "black" if image.norm(v) > 0.6 else "white"  # dark text on viridis' light end
                    ax.text(j, i, f"{v:.3g}", ha="center", va="center", color=colour, fontsize=8)
        ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
        return save(fig, path)
    finally:
        plt.close(fig)
