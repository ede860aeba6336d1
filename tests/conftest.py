"""One suite for CPU and GPU machines: what every test sees of the GPUs; and every test's environment
is its own (what one test's code sets in os.environ, such as app train's flight-recorder variables,
is gone before the next test and the processes it starts).

- A test marked ``gpu`` needs CUDA: it is skipped where no GPU is visible (one rule, one reason),
  and runs everywhere else (``make test-gpu`` runs only these; ``make test`` runs them too).
- Every other test asserts CPU/gloo behaviour, so it sees no GPU: ``CUDA_VISIBLE_DEVICES`` is empty
  in its environment (every subprocess it starts inherits that, module-scoped fixtures' too) and, in
  this process, torch reports no CUDA device. On a GPU workstation such a test then behaves as on a
  CPU machine instead of picking nccl, or two ranks on one GPU.
"""

import functools
import os
from collections import defaultdict
from collections.abc import Iterator

import pytest
import torch

NO_GPU = "needs a CUDA GPU (none is visible here): runs on a GPU machine, `make test-gpu`"


@functools.cache
def gpus_here() -> int:
    """CUDA devices this machine shows torch (asked once, before any test hides them)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


CONTAINER_MARKERS = ("ansible", "docker", "slurm")
"""Tests that mostly wait on the engine (containers start, apt, playbooks, paced steps) while the process suites
(tests/integration: torch ranks on this machine's cores) keep its CPUs busy."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items[:] = mixed_modules(items)
    if gpus_here():
        return
    skip = pytest.mark.skip(reason=NO_GPU)
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)


def mixed_modules(items: list[pytest.Item]) -> list[pytest.Item]:
    """The modules in an order that keeps waiting and computing side by side on make test's workers (xdist hands
    whole modules out in this order, --no-loadscope-reorder): the container modules (those marked slow first) and
    tests/integration's modules interleaved, each list spread evenly over the other; every other module (the unit
    tests, short) last as filler. Within a module the order is pytest's."""
    modules: dict[str, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::")[0], []).append(item)
    waiting = [name for name, tests in modules.items() if any(map(tests[0].get_closest_marker, CONTAINER_MARKERS))]
    waiting.sort(key=lambda name: not any(test.get_closest_marker("slow") for test in modules[name]))  # long first
    computing = [name for name in modules if name.startswith("tests/integration/") and name not in waiting]
    rest = [name for name in modules if name not in waiting and name not in computing]
    spread = [(k / len(names), kind, name) for kind, names in enumerate((waiting, computing))
              for k, name in enumerate(names)]  # fmt: skip
    order = [name for *_, name in sorted(spread)]
    return [item for name in order + rest for item in modules[name]]


@pytest.fixture(autouse=True, scope="session")
def _gpus_hidden_from_the_session() -> Iterator[str | None]:
    """``CUDA_VISIBLE_DEVICES`` empty for the whole session, so that the processes which module-scoped fixtures
    start (they run before any test's own fixtures) see no GPU either; yields the value it replaced."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    yield visible
    if visible is None:
        del os.environ["CUDA_VISIBLE_DEVICES"]
    else:
        os.environ["CUDA_VISIBLE_DEVICES"] = visible


@pytest.fixture(autouse=True)
def _cpu_unless_marked_gpu(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, _gpus_hidden_from_the_session: str | None
) -> None:
    """A ``gpu`` test gets the GPUs back; any other test sees none, in this process too."""
    if request.node.get_closest_marker("gpu"):
        if _gpus_hidden_from_the_session is None:
            monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
        else:
            monkeypatch.setenv("CUDA_VISIBLE_DEVICES", _gpus_hidden_from_the_session)
        return
    if gpus_here():  # torch already initialised CUDA here: the variable no longer reaches it
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)


@pytest.fixture(autouse=True)
def _environment_of_its_own():
    """Restore os.environ after each test: app code run in this process (app train sets TORCH_FR_* for its
    flight recorder) must not reach a later test's ranks (their dumps would go to this test's folder)."""
    before = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(before)


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    """The time of each suite (tests/<suite>/): its tests' summed time and the span from its first start to
    its last end (the suites run side by side on pytest-xdist's workers)."""
    spent: dict[str, float] = defaultdict(float)
    spans: dict[str, list[float]] = {}
    counts: dict[str, int] = defaultdict(int)
    for report, nodeid, start, stop in _timed(terminalreporter):
        suite = nodeid.split("/")[1]
        spent[suite] += stop - start
        counts[suite] += getattr(report, "when", "") == "call"
        first, last = spans.get(suite, (start, stop))
        spans[suite] = [min(first, start), max(last, stop)]
    if not spent:
        return
    terminalreporter.section("time of each suite")
    for suite in sorted(spent, key=spent.get, reverse=True):
        first, last = spans[suite]
        line = f"{suite:<12} {counts[suite]:>5} tests  {spent[suite]:>7.0f} s of test time"
        terminalreporter.write_line(f"{line}  {last - first:>6.0f} s from first to last")
    _last_modules(terminalreporter)


def _timed(terminalreporter) -> Iterator[tuple]:
    """(report, nodeid, start, stop) of each timed report of a test under tests/."""
    for reports in terminalreporter.stats.values():
        for report in reports:
            nodeid, start, stop = getattr(report, "nodeid", ""), getattr(report, "start", 0), getattr(report, "stop", 0)
            if nodeid.startswith("tests/") and start:
                yield report, nodeid, start, stop


def _last_modules(terminalreporter, shown: int = 12) -> None:
    """The modules that ended last, each with its worker and its span from the run's first test (the end of
    pytest's time: what a reordering of tests/conftest.py's mixed_modules could move)."""
    spans: dict[str, list] = {}
    for report, nodeid, start, stop in _timed(terminalreporter):
        worker = getattr(getattr(getattr(report, "node", None), "gateway", None), "id", "-")
        first, last, _ = spans.get(nodeid.split("::")[0], (start, stop, worker))
        spans[nodeid.split("::")[0]] = [min(first, start), max(last, stop), worker]
    if not spans:
        return
    zero = min(first for first, _, _ in spans.values())
    terminalreporter.section("the modules that ended last (s from the first test)")
    for module, (first, last, worker) in sorted(spans.items(), key=lambda kv: kv[1][1])[-shown:]:
        terminalreporter.write_line(f"{worker:<4} {first - zero:>6.0f} {last - zero:>6.0f}  {module}")
