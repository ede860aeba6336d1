"""The health gate's settings (app/diagnostics/gate.py), apart from the gate: ``app node`` reads them as its
flags before it imports torch, which its fork server imports at the same time (app/node/command.py).

    python -m app gate --help        # these flags, with the gate's
    python -m app node --help        # these flags, with the node's and torchrun's
"""

from dataclasses import dataclass, field
from pathlib import Path

from app import contract
from app.errors import UsageError
from app.flags import flag


@dataclass(frozen=True)
class GateConfig:
    """Gate: where the job's figures are, what it checks, how it waits."""

    records: Path = field(default=Path(contract.RESULTS_DIR, "gate"), metadata=flag(metavar="DIR"))
    """Each node's device figures at the job's start, one <host>.json (every engine mounts the job's results
    at /results)."""
    torchrun_args: Path | None = field(default=None, metadata=flag(metavar="PATH"))
    """torchrun's arguments (ddp-node's /cluster/torchrun.args): the rendezvous the doctor checks; none: devices
    only."""
    fail_below: float = field(default=contract.GATE_FAIL_BELOW, metadata=flag(metavar="FRACTION"))
    """Keep the node out when a device figure is below FRACTION x the job's at its start."""
    device_seconds: float = field(default=contract.GATE_SECONDS, metadata=flag(metavar="S"))
    """Seconds measuring each device (matrix product, then copy), as app check's --device-seconds."""
    timeout_s: float = field(default=5.0, metadata=flag(option="--timeout", metavar="S"))
    """Seconds the rendezvous port has to answer."""
    retry_every: float = field(default=0.0, metadata=flag(metavar="S"))
    """0: judge once (exit 3 when kept out); S: say it once, then judge again every S seconds until it passes."""

    def __post_init__(self) -> None:
        contract.check_gate_fail_below(self.fail_below, "--fail-below")
        for name, value in (("--device-seconds", self.device_seconds), ("--timeout", self.timeout_s)):
            if value <= 0:
                raise UsageError(f"{name} {value:g} must be a positive number of seconds")
        if self.retry_every < 0:
            raise UsageError(f"--retry-every {self.retry_every:g} must be >= 0 (0 judges once)")
