"""The job's figures that every node's health gate judges against (app/diagnostics/gate.py: the best of the records
in its records folder), set by a test: a cause that no load can shrink, where a CPU quota against figures measured
under load is a race with the machine.

    set_figures(Path("/tmp/x/gate"), KEEP_OUT)   # every node's next judgment keeps it out
    set_figures(Path("/tmp/x/gate"), LET_IN)     # ... lets it in
    python -c "$(source_of_set_figures)" /results/gate 1e18   # the same inside a container (SET_FIGURES)
"""

import inspect

KEEP_OUT, LET_IN = 1e18, 1.0
"""Figures (FLOP/s, and GB/s copy alike) that keep every node out (no device reaches an exaFLOP/s) and that let
every node in (any device does one FLOP/s), whatever the machine's load."""


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
