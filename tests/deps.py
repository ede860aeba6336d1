"""Packages that some tests need beside torch and pytest: the ``test`` extra's jsonschema,
kubernetes-validate and pyyaml, and the Docker SDK. A test takes each with ``need`` where it uses it,
so that a machine with torch and pytest alone (a GPU machine with no package index) still collects
every module and runs the gpu tests: ``python -m pytest -m gpu tests/unit tests/integration``.

    yaml = need("yaml")        # the module; or this test (at module level: this module) skips, with one reason

Where the packages belong (``make test`` installs them and sets DDP_REQUIRE_TEST_DEPS=1; CI sets
CI=true), a missing one fails instead of skipping: a suite cannot pass by leaving tests out.
"""

import importlib
import os
from types import ModuleType

import pytest

REQUIRE_ENV = "DDP_REQUIRE_TEST_DEPS"
"""Set to 1, a missing package fails the tests that need it (as under CI=true)."""


def required() -> bool:
    """Whether a missing package fails its tests here rather than skipping them."""
    return os.environ.get(REQUIRE_ENV) == "1" or os.environ.get("CI") == "true"


def need(name: str) -> ModuleType:
    """The module ``name``; where it does not import, skip the caller (a test, or a test module at its top), or
    fail it where the packages are ``required``."""
    try:
        return importlib.import_module(name)
    except ImportError as error:
        line = f"{name} does not import ({error}): pip install -e '.[test]' installs it"
        if required():
            pytest.fail(f"{line}; {REQUIRE_ENV}=1 or CI=true: these tests must run here", pytrace=False)
        pytest.skip(f"{line} (the tests that need it skip)", allow_module_level=True)
