"""The tests that share memory with PyTorch. They import torch at module level: an interpreter without it fails them
(scripts/test runs this folder with Debian's PyTorch, which scripts/setup installs, and with .venv-peer's PyTorch
2.14 when `scripts/setup --peer` made it)."""
import pytest


@pytest.fixture(autouse=True)
def _seed():
    import ampforge

    ampforge.manual_seed(0)
