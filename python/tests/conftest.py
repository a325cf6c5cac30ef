"""Shared fixtures of the Python package's tests (README command 2, scripts/test, runs them after ctest).

The suite needs what it checks: the CLI for the state-dict test (AMPFORGE_CLI, default build/bin/ampforge, which
scripts/test builds first) and Fashion-MNIST (scripts/setup installs dataset-fashion-mnist). A missing one is a
failure, never a skip. The tests that need PyTorch are in torch/, run by scripts/test with interpreters that have it.
"""
import os
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def cli():
    path = pathlib.Path(os.environ.get("AMPFORGE_CLI", ROOT / "build" / "bin" / "ampforge"))
    assert path.is_file() and os.access(path, os.X_OK), (
        f"the ampforge CLI is not at {path}: build it (scripts/build) or point AMPFORGE_CLI at it")
    return str(path)


@pytest.fixture(autouse=True)
def _seed():
    import ampforge

    ampforge.manual_seed(0)
