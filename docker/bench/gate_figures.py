"""The job's figures that every node's health gate judges against (app/diagnostics/gate.py: the best of the records
in its records folder), set by a test: a cause that no load can shrink, where a CPU quota against figures measured
under load is a race with the machine. Here, beside the fault job's driver (drive.py), which starts every job of the
tests and the benchmarks with the gate flags QUICK.

    set_figures(Path("/tmp/x/gate"), KEEP_OUT)   # every node's next judgment keeps it out
    set_figures(Path("/tmp/x/gate"), LET_IN)     # ... lets it in
    python -c "$(source_of_set_figures)" /results/gate 1e30   # the same inside a container (SET_FIGURES)
"""

import inspect

from app import contract

KEEP_OUT, LET_IN = 1e30, 1.0
"""Figures (FLOP/s, and GB/s copy alike) that keep every node out and that let every node in (any device does one
FLOP/s), whatever the machine's load. A gate whose node falls short lowers the job's figures to what its running peers
measure now, each in the units of its record (app/diagnostics/peers.py): a peer whose record a test set to KEEP_OUT
answers a few hundredths of it at the least, and a millionth (FAIL_BELOW) of that is still far beyond any device."""


GATE_SECONDS = 0.2
"""How long the gates of the container tests' nodes measure each device (the spec's nodes.gate_seconds, the
Makefile's GATE_SECONDS): a fifth of its default, which every node start and return spends, serially, on a machine
whose cores the suite keeps busy. The suite's gate verdicts come from the figures a test sets, not from how steady a
measurement is; the noise tests (make test-noise) keep the default (``MEASURED``)."""
FAIL_BELOW = 1e-6
"""The gate's fraction in the container tests (the spec's nodes.gate_fail_below): a node that measures a millionth of
the best figure recorded at the job's start passes, whatever the load when each node measured, and KEEP_OUT still
keeps every node out (a millionth of it is 1e24 FLOP/s). Every gate verdict of make test is then the test's figures'."""
QUICK = ("--gate-seconds", f"{GATE_SECONDS:g}", "--gate-fail-below", f"{FAIL_BELOW:g}")
"""``app cluster up``'s gate flags in the container tests and the benchmarks (a test's own, given after them, win)."""
QUICK_MAKE = (f"GATE_SECONDS={GATE_SECONDS:g}", f"GATE_FAIL_BELOW={FAIL_BELOW:g}")
"""The same as make's knobs (mk/cluster.mk)."""
QUICK_SPEC = {"gate_seconds": GATE_SECONDS, "gate_fail_below": FAIL_BELOW}
"""The same as the spec's nodes section (Ansible's cluster_spec.nodes)."""
MEASURED = ("--gate-seconds", f"{contract.GATE_SECONDS:g}", "--gate-fail-below", f"{contract.GATE_FAIL_BELOW:g}")
"""``app cluster up``'s flags of a noise test, whose gate verdict rests on the measurement: the gate's defaults."""


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
