"""What the pages say about exit statuses through make is what make does: GNU make exits 2 whenever a
recipe fails and names the recipe's status (``make: *** [...] Error 137``); the command a target runs
(``python -m app cluster up``) is the one that exits with the job's status."""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [
    ROOT / "README.md",
    *sorted(ROOT.glob("*/README.md")),
    *sorted(ROOT.glob("docker/*/README.md")),
    *sorted((ROOT / "docs").glob("*.md")),
    *sorted((ROOT / "mk").glob("*.mk")),
]
# `make` exits with the job's status / `make slurm-job` exits with its status / `make x` then exits with its exit status
MAKE_EXITS_WITH = re.compile(r"`make[^`]*`( then| also)? exits with (the job's|its)( exit)? status", re.IGNORECASE)


def claims(text: str) -> list[str]:
    """Every sentence that says make exits with the job's status (lines joined: a claim may wrap)."""
    return [m[0] for m in MAKE_EXITS_WITH.finditer(" ".join(text.split()))]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_page_says_make_exits_with_the_jobs_status(page: Path) -> None:
    assert claims(page.read_text()) == []


def test_the_claim_is_found_where_a_page_makes_it() -> None:
    # The negative control: the wording issue 25 found in cluster/README.md (now docs/cluster.md) and docs/engines.md.
    assert claims("the full output is in the top-level\n[README](../README.md). `make` exits with the job's status.")
    assert claims("`make slurm-job` exits with the job's status; a job that did not complete")
    assert not claims("`python -m app cluster up`, which `make cluster-up` runs, exits with the job's status")


@pytest.mark.skipif(shutil.which("make") is None, reason="no GNU make on this machine")
def test_make_exits_2_and_names_the_status_of_the_command_it_ran(tmp_path) -> None:
    """The fact the pages state, on this machine's make, with the Makefile's own shell settings."""
    shell = next(line for line in (ROOT / "Makefile").read_text().splitlines() if line.startswith("SHELL ="))
    (tmp_path / "Makefile").write_text(f"{shell}\n.SHELLFLAGS = -ec\njob:\n\t@exit 137\n")
    env = {k: v for k, v in os.environ.items() if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS")}  # (as a user runs it)
    done = subprocess.run(["make", "-C", str(tmp_path), "job"], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 2, done
    assert re.search(r"make: \*\*\* \[.*job\] Error 137", done.stderr), done.stderr
