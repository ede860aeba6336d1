"""What some tests need beside torch and pytest: the ``test`` extra's jsonschema, kubernetes-validate and
pyyaml, the Docker SDK, and data or programs (the Kubeflow CRDs, promtool). A test takes each package with
``need`` where it uses it, so that a machine with torch and pytest alone (a GPU machine with no package
index) still collects every module and runs the gpu tests: ``python -m pytest -m gpu tests/unit
tests/integration``; anything else it finds missing, it hands to ``missing``.

    yaml = need("yaml")        # the module; or this test (at module level: this module) skips, with one reason
    shutil.which("promtool") or missing("no promtool: make host-deps installs it")

Where they belong (``make test`` installs them and sets DDP_REQUIRE_TEST_DEPS=1; CI sets CI=true), a
missing one fails instead of skipping: a suite cannot pass by leaving tests out.
"""

import importlib
import os
from types import ModuleType
from typing import NoReturn

import pytest

REQUIRE_ENV = "DDP_REQUIRE_TEST_DEPS"
"""Set to 1, a missing dependency fails the tests that need it (as under CI=true)."""


def required() -> bool:
    """Whether a missing dependency fails its tests here rather than skipping them."""
    return os.environ.get(REQUIRE_ENV) == "1" or os.environ.get("CI") == "true"


def missing(line: str) -> NoReturn:
    """Skip the caller (a test, or a test module at its top) with ``line``, what is missing and how to provide it;
    or fail it where the dependencies are ``required``."""
    if required():
        pytest.fail(f"{line}; {REQUIRE_ENV}=1 or CI=true: these tests must run here", pytrace=False)
    pytest.skip(line, allow_module_level=True)


def need(name: str) -> ModuleType:
    """The module ``name``; where it does not import, the caller is ``missing`` it."""
    try:
        return importlib.import_module(name)
    except ImportError as error:
        missing(f"{name} does not import ({error}): pip install -e '.[test]' installs it")
