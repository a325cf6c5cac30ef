"""Sharing memory with PyTorch through DLPack, both ways; dtypes; a Python model's state dict loading in torch.

Needs torch (imported at module level: an interpreter without it fails here). scripts/test runs this folder with
Debian's PyTorch (python3-torch, installed by scripts/setup) and with .venv-peer's PyTorch 2.14 when present.
"""
import numpy as np
import pytest
import torch

import ampforge as af
import ampforge.nn.functional as F
from ampforge import nn

DTYPES = [(af.float32, torch.float32), (af.float16, torch.float16), (af.bfloat16, torch.bfloat16),
          (af.int64, torch.int64)]


@pytest.mark.parametrize("af_dtype,torch_dtype", DTYPES)
def test_torch_to_ampforge_shares_memory(af_dtype, torch_dtype):
    src = torch.arange(12).reshape(3, 4).to(torch_dtype)
    t = af.from_dlpack(src)
    assert t.dtype == af_dtype and t.shape == (3, 4) and t.data_ptr() == src.data_ptr()
    t[1, 2] = 100  # ampforge writes, torch reads
    assert src[1, 2].item() == 100
    src[0, 0] = -3  # torch writes, ampforge reads
    assert t[0, 0].item() == -3
    assert t.float().tolist() == src.float().tolist()


@pytest.mark.parametrize("af_dtype,torch_dtype", DTYPES)
def test_ampforge_to_torch_shares_memory(af_dtype, torch_dtype):
    t = af.arange(12).reshape(3, 4).to(af_dtype)
    u = torch.from_dlpack(t)
    assert u.dtype == torch_dtype and tuple(u.shape) == (3, 4) and u.data_ptr() == t.data_ptr()
    u[2, 3] = 77  # torch writes, ampforge reads
    assert t[2, 3].item() == 77
    t[0, 1] = 5  # ampforge writes, torch reads
    assert u[0, 1].item() == 5
    back = af.from_dlpack(u)  # and back again: still the same memory
    assert back.data_ptr() == t.data_ptr() and back.dtype == af_dtype


def test_strided_views_cross_over():
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    view = base[1:, ::2]
    t = af.from_dlpack(view)
    assert t.shape == (3, 3) and t.stride() == (6, 2) and t.tolist() == view.tolist()
    tv = af.arange(24, dtype=af.float32).reshape(4, 6).transpose(0, 1)
    u = torch.from_dlpack(tv)
    assert u.stride() == (1, 6) and u.tolist() == tv.tolist()


def test_channels_last_is_pytorchs_layout():
    # The same strides for the same memory_format, and a channels-last tensor crosses DLPack as one.
    x = af.randn(2, 3, 4, 5)
    cl = x.contiguous(memory_format=af.channels_last)
    t = torch.from_numpy(x.numpy()).contiguous(memory_format=torch.channels_last)
    assert cl.stride() == t.stride()
    shared = torch.from_dlpack(cl)
    assert shared.is_contiguous(memory_format=torch.channels_last)
    np.testing.assert_array_equal(shared.numpy(), t.numpy())


def test_gradients_flow_separately():
    x = torch.randn(4, 3)
    a = af.from_dlpack(x).requires_grad_()  # an ampforge leaf over torch's memory
    (a * a).sum().backward()
    np.testing.assert_allclose(a.grad.numpy(), 2 * x.numpy(), rtol=1e-6)
    with pytest.raises(RuntimeError):
        torch.from_dlpack(a)  # it requires grad: export a.detach()
    assert torch.from_dlpack(a.detach()).data_ptr() == x.data_ptr()


class Stacked(nn.Module):
    def __init__(self):
        super().__init__()
        layers = [nn.Conv2d(1, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                  nn.Flatten(), nn.Linear(8 * 4 * 4, 10)]
        for i, layer in enumerate(layers):
            self.add_module(str(i), layer)

    def forward(self, x):
        for layer in self.children():
            x = layer(x)
        return x


def test_state_dict_from_python_loads_in_torch(tmp_path):
    model = Stacked()
    opt = af.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x = af.randn(6, 1, 8, 8)
    y = af.tensor([0, 1, 2, 3, 4, 5])
    for _ in range(3):
        F.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    model.eval()
    with af.no_grad():
        expected = model(x).numpy()
    af.save_file(model.state_dict(), str(tmp_path / "model.safetensors"))

    ref = torch.nn.Sequential(torch.nn.Conv2d(1, 8, 3, padding=1, bias=False), torch.nn.BatchNorm2d(8),
                              torch.nn.ReLU(), torch.nn.MaxPool2d(2), torch.nn.Flatten(), torch.nn.Linear(128, 10))
    state = {k: torch.from_dlpack(v) for k, v in af.load_file(str(tmp_path / "model.safetensors")).items()}
    result = ref.load_state_dict(state, strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    ref.eval()
    with torch.no_grad():
        got = ref(torch.from_dlpack(x)).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


def test_the_dlpack_example_runs():
    import pathlib
    import subprocess
    import sys

    example = pathlib.Path(__file__).resolve().parents[3] / "examples" / "python" / "dlpack_torch.py"
    r = subprocess.run([sys.executable, str(example)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "writes cross over both ways: ok" in r.stdout, r.stdout + r.stderr
