"""A job's results brought home: the results volume copied into the host's RESULTS folder so that each run's
folder there holds what the job kept, nothing that an earlier copy left. Stdlib only.

    ok = collect.bring_home(lambda into: engine.copy_out(container, "/results", into), Path("build/results"))

The volume is copied into a staging folder inside RESULTS first (same file system: every move is a rename).
A run's folder (one with ``OUT/progress``, which rank 0 of ``app train`` writes from its first step) then
replaces the host's folder of that name whole: checkpoints that ``--keep-checkpoints`` pruned, an emergency
snapshot that the final checkpoint superseded, a log or summary of an earlier cluster's run in the same ``--out``
are gone from the copy as they are from the volume. Other folders merge, file by file, so RESULTS keeps what
the volume never held (``make comm``'s ``RESULTS/comm/local.json``, the runs of a cluster since removed). The
staging folder is removed in every case: nothing is left beside the results.
"""

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from app import progress


def bring_home(copy: Callable[[Path], bool], results: Path) -> bool:
    """Copy (``copy(folder)`` fills ``folder``, False when it could not) and place the copy in ``results``;
    False, with ``results`` as it was, when the copy failed."""
    results.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".copying-", dir=results) as work:
        staged, replaced = Path(work, "in"), Path(work, "out")
        staged.mkdir()
        replaced.mkdir()
        if not copy(staged):
            return False
        place(staged, results, replaced)
    return True


def is_run(folder: Path) -> bool:
    """A training run's output folder (``--out``): the copy of it replaces the host's whole."""
    return (folder / progress.FILE).is_file()


def place(staged: Path, results: Path, replaced: Path) -> None:
    """Move what ``staged`` holds into ``results``: a run's folder replaces the one there, other folders merge;
    what is replaced goes to ``replaced`` (removed with it)."""
    for entry in sorted(staged.iterdir()):
        target = results / entry.name
        if entry.is_dir() and not is_run(entry) and target.is_dir() and not target.is_symlink():
            place(entry, target, replaced)
            continue
        if os.path.lexists(target) and (entry.is_dir() or target.is_dir()):
            target.rename(Path(tempfile.mkdtemp(dir=replaced)) / entry.name)  # os.replace cannot swap folders
        os.replace(entry, target)
