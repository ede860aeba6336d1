"""Slurm host-list expansion."""

import pytest

from app.errors import UsageError
from app.runtime.hostlist import expand


@pytest.mark.parametrize(
    ("nodelist", "hosts"),
    [
        ("node1", ["node1"]),
        ("a,b", ["a", "b"]),
        ("node[01-03,07]", ["node01", "node02", "node03", "node07"]),
        ("gpu[1-2],cpu5,io[9-10]", ["gpu1", "gpu2", "cpu5", "io9", "io10"]),
        ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
    ],
)
def test_expand(nodelist: str, hosts: list[str]) -> None:
    assert expand(nodelist) == hosts


@pytest.mark.parametrize("nodelist", ["", "node[1-", "node[a-b]", "node[5-2]"])
def test_bad_host_lists(nodelist: str) -> None:
    with pytest.raises(UsageError):
        expand(nodelist)
