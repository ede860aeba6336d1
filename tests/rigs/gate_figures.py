"""The job's figures that every node's health gate judges against (app/diagnostics/gate.py: the best of the records
in its records folder), set by a test: a cause that no load can shrink, where a CPU quota against figures measured
under load is a race with the machine.

    set_figures(Path("/tmp/x/gate"), KEEP_OUT)   # every node's next judgment keeps it out
    set_figures(Path("/tmp/x/gate"), LET_IN)     # ... lets it in
    python -c "$(source_of_set_figures)" /results/gate 1e18   # the same inside a container (SET_FIGURES)
"""

import inspect

from app import contract

KEEP_OUT, LET_IN = 1e18, 1.0
"""Figures (FLOP/s, and GB/s copy alike) that keep every node out (no device reaches an exaFLOP/s) and that let
every node in (any device does one FLOP/s), whatever the machine's load."""


GATE_SECONDS = 0.2
"""How long the gates of the container tests' nodes measure each device (the spec's nodes.gate_seconds, the
Makefile's GATE_SECONDS): a fifth of its default, which every node start and return spends, serially, on a machine
whose cores the suite keeps busy. The suite's gate verdicts come from the figures a test sets, not from how steady a
measurement is; the noise tests (make test-noise) keep the default (``MEASURED``)."""
MEASURED = ("--gate-seconds", f"{contract.GATE_SECONDS:g}")
"""``app cluster up``'s flags of a noise test, whose gate verdict rests on the measurement: the gate's default."""


def set_figures(folder, value: float) -> None:
    """Every record in ``folder`` (``<host>.json``) with each device's figures set to ``value``, each record replaced
    atomically (a gate reads them meanwhile). Self-contained: its source runs inside a container (SET_FIGURES)."""
    import json
    import os
    import pathlib

    for path in pathlib.Path(folder).glob("*.json"):
        body = json.loads(path.read_text())
        for device in body["devices"]:
            device["flops"], device["copy_gbps"] = value, value
        path.with_suffix(".tmp").write_text(json.dumps(body))
        os.replace(path.with_suffix(".tmp"), path)


SET_FIGURES = inspect.getsource(set_figures) + "\nimport sys\nset_figures(sys.argv[1], float(sys.argv[2]))\n"
"""``python -c SET_FIGURES FOLDER VALUE``: set_figures where only the product's Python runs (a node container)."""
