"""What a check of the doctor finds: one line per check and rank, ok, failed or skipped."""

from dataclasses import dataclass

OK, FAILED, SKIPPED = "ok", "failed", "skipped"


@dataclass(frozen=True)
class Finding:
    """One check on one rank."""

    check: str
    status: str
    """ok, failed or skipped (not applicable to this job)."""
    detail: str
