"""tests/deps.py: what a test needs beside torch and pytest (a package, the Kubeflow CRDs) skips it where missing,
fails it where required."""

import json
from pathlib import Path

import pytest

from tests.deps import REQUIRE_ENV, need

MISSING = "no_such_package_of_ddp_cluster"
REQUIRED = [(REQUIRE_ENV, "1"), ("CI", "true")]
"""Either one makes a missing dependency fail."""


@pytest.fixture
def unrequired(monkeypatch) -> pytest.MonkeyPatch:
    """Neither DDP_REQUIRE_TEST_DEPS nor CI set."""
    monkeypatch.delenv(REQUIRE_ENV, raising=False)
    monkeypatch.delenv("CI", raising=False)
    return monkeypatch


def test_a_package_that_imports_is_the_module() -> None:
    assert need("json") is json


def test_a_missing_package_skips_with_one_reason(unrequired) -> None:
    with pytest.raises(pytest.skip.Exception, match=f"{MISSING} does not import .*pip install -e '.\\[test\\]'"):
        need(MISSING)


@pytest.mark.parametrize(("name", "value"), REQUIRED)
def test_a_missing_package_fails_where_the_packages_are_required(unrequired, name: str, value: str) -> None:
    unrequired.setenv(name, value)
    with pytest.raises(pytest.fail.Exception, match="these tests must run here"):
        need(MISSING)


def test_a_missing_crd_skips_with_one_line_naming_both_places(unrequired, tmp_path: Path) -> None:
    from tests.unit import kube_checks

    unrequired.setenv(kube_checks.SCHEMAS_ENV, str(tmp_path))
    with pytest.raises(pytest.skip.Exception) as skipped:
        kube_checks.schema_file(kube_checks.PYTORCHJOB_CRD)
    line = str(skipped.value)
    assert line.startswith(f"no {kube_checks.PYTORCHJOB_CRD} in {tmp_path}: "), line
    assert "shared/k8s beside the checkout" in line and f"set {kube_checks.SCHEMAS_ENV} to their folder" in line
    assert "\n" not in line


@pytest.mark.parametrize(("name", "value"), REQUIRED)
def test_a_missing_crd_fails_where_the_dependencies_are_required(unrequired, tmp_path: Path, name, value) -> None:
    from tests.unit import kube_checks

    unrequired.setenv(kube_checks.SCHEMAS_ENV, str(tmp_path))
    unrequired.setenv(name, value)
    with pytest.raises(pytest.fail.Exception, match=f"set {kube_checks.SCHEMAS_ENV} to their folder; .*must run here"):
        kube_checks.schema_file(kube_checks.TRAINJOB_CRD)


def test_a_crd_that_is_there_is_its_file(unrequired, tmp_path: Path) -> None:
    """The control: the folder holds it, and nothing fails where the dependencies are required."""
    from tests.unit import kube_checks

    (tmp_path / kube_checks.TRAINJOB_CRD).write_text("kind: CustomResourceDefinition\n")
    unrequired.setenv(kube_checks.SCHEMAS_ENV, str(tmp_path))
    unrequired.setenv(REQUIRE_ENV, "1")
    assert kube_checks.schema_file(kube_checks.TRAINJOB_CRD) == tmp_path / kube_checks.TRAINJOB_CRD
