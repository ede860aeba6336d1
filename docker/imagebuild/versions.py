"""docker/versions.env as a dict: the names, bases and pins of the images (the builder's defaults).

    PYTHONPATH=docker:. python3 -c 'from imagebuild import versions; print(versions.read())'
    PYTHONPATH=docker:. python3 -m imagebuild versions      # KEY=VALUE lines: the Makefile's knobs

The file is KEY=VALUE lines (comments and blank lines aside), without quotes or spaces, so that make and shell
(`. docker/versions.env`) read it as this does. Its one reader is the app's (``app.contract.read_versions``, stdlib
only): the builder, the Makefile (through ``versions``) and the app cannot disagree.
"""

from __future__ import annotations

from pathlib import Path

from app.contract import VERSIONS_FILE, read_versions
from app.errors import UsageError

from .host import ROOT, BuildError

FILE = ROOT / VERSIONS_FILE


def read(path: Path = FILE) -> dict[str, str]:
    """Every KEY=VALUE of PATH; a line of another shape is an error naming it."""
    try:
        return read_versions(path)
    except UsageError as error:
        raise BuildError(str(error)) from None
