"""tests/deps.py: a package a test needs beside torch and pytest skips it where missing, fails it where required."""

import json

import pytest

from tests.deps import REQUIRE_ENV, need

MISSING = "no_such_package_of_ddp_cluster"


def test_a_package_that_imports_is_the_module() -> None:
    assert need("json") is json


def test_a_missing_package_skips_with_one_reason(monkeypatch) -> None:
    monkeypatch.delenv(REQUIRE_ENV, raising=False)
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match=f"{MISSING} does not import .*pip install -e '.\\[test\\]'"):
        need(MISSING)


@pytest.mark.parametrize(("name", "value"), [(REQUIRE_ENV, "1"), ("CI", "true")])
def test_a_missing_package_fails_where_the_packages_are_required(monkeypatch, name: str, value: str) -> None:
    monkeypatch.delenv(REQUIRE_ENV, raising=False)
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setenv(name, value)
    with pytest.raises(pytest.fail.Exception, match="these tests must run here"):
        need(MISSING)
