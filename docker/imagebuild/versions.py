"""docker/versions.env as a dict: the names, bases and pins of the images (the builder's defaults).

    PYTHONPATH=docker python3 -c 'from imagebuild import versions; print(versions.read())'

The file is KEY=VALUE lines (comments and blank lines aside), without quotes or spaces, so that
make (`include`-like, in the Makefile), shell (`. docker/versions.env`) and this reader agree.
"""

from __future__ import annotations

import re
from pathlib import Path

from .host import BuildError

FILE = Path(__file__).resolve().parents[1] / "versions.env"
LINE = re.compile(r"([A-Z][A-Z0-9_]*)=([^\s'\"$`\\]+)")


def read(path: Path = FILE) -> dict[str, str]:
    """Every KEY=VALUE of PATH; a line of another shape is an error naming it."""
    values: dict[str, str] = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        match = LINE.fullmatch(line)
        if match is None:
            raise BuildError(f"{path}:{number}: '{line}' is not KEY=VALUE (no quotes, spaces or $); fix that line")
        values[match[1]] = match[2]
    return values
