"""ampforge's errors as Python exceptions with the engine's message, and no crash from misuse."""
import numpy as np
import pytest

import ampforge as af
from ampforge import nn


def test_shape_and_usage_errors_are_value_errors():
    with pytest.raises(ValueError, match=r"matmul.*\[2, 3\].*\[4, 5\]|\[2, 3\].*\[4, 5\]"):
        af.matmul(af.ones(2, 3), af.ones(4, 5))
    with pytest.raises(ValueError, match="broadcast"):
        af.ones(2, 3) + af.ones(4)
    with pytest.raises(ValueError, match="unknown model 'nope'"):
        af.models.create("nope")
    with pytest.raises(ValueError):
        af.ones(3).reshape(2, 2)
    with pytest.raises(ValueError, match="unknown device"):
        af.ones(2).to("tpu")
    with pytest.raises(ValueError):
        af.nn.functional.cross_entropy(af.zeros(2, 3), af.zeros(2))  # float targets: int64 expected


def test_missing_files_are_file_not_found_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere.safetensors"):
        af.load_file(str(tmp_path / "nowhere.safetensors"))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        af.data.FashionMNIST(root=str(tmp_path / "no-such-dir"))
    with pytest.raises(FileNotFoundError):
        af.memory.replay(str(tmp_path / "no.memtrace"))


def test_corrupt_file_is_runtime_error(tmp_path):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all")
    with pytest.raises(RuntimeError, match="bad.safetensors"):
        af.load_file(str(bad))


def test_wrong_types_are_type_errors():
    with pytest.raises(TypeError):
        af.zeros("two")
    with pytest.raises(TypeError):
        nn.Linear(2, 2)("not a tensor")
    with pytest.raises(TypeError):
        af.ones(2) @ 3
    with pytest.raises(TypeError):
        af.optim.SGD([1, 2], lr=0.1)
    with pytest.raises(TypeError):
        af.data.DataLoader(42)


def test_module_misuse():
    class NoInit(nn.Module):
        def __init__(self):
            self.fc = nn.Linear(2, 2)  # before super().__init__()

    with pytest.raises(AttributeError, match="super\\(\\).__init__"):
        NoInit()

    class NoForward(nn.Module):
        pass

    with pytest.raises(ValueError, match="forward"):
        NoForward()(af.ones(1))

    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(af.ones(1))
            self.w = nn.Parameter(af.ones(1))

    with pytest.raises(KeyError, match="already registered"):
        Twice()
    with pytest.raises(AttributeError):
        nn.Linear(2, 2).nothing_here


def test_errors_inside_python_forward_propagate_through_cpp():
    class Broken(nn.Module):
        def forward(self, x):
            raise ZeroDivisionError("from forward")

    seq = nn.Sequential(nn.ReLU(), Broken())
    with pytest.raises(ZeroDivisionError, match="from forward"):
        seq(af.ones(2))


def test_cuda_without_a_device_is_an_error_not_a_crash():
    if af.cuda.is_available():
        assert af.ones(2).cuda().cpu().tolist() == [1.0, 1.0]
    else:
        with pytest.raises((ValueError, RuntimeError)) as e:
            af.ones(2).cuda()
        assert "cuda" in str(e.value).lower()


def test_storage_replaced_under_views_is_safe():
    lin = nn.Linear(4, 4)
    w_view = lin.weight.detach().numpy()
    dl = af.from_dlpack(np.ones((4, 4), dtype=np.float32))
    lin.weight = dl  # set_data: every handle now refers to dl's memory
    del dl
    assert lin.weight.sum().item() == 16
    assert w_view.shape == (4, 4) and np.isfinite(w_view).all()  # the old storage is still alive


def test_exceptions_keep_the_engine_message():
    try:
        af.ones(2, 3) + af.ones(4)
    except ValueError as e:
        message = str(e)
    assert "[2, 3]" in message and "[4]" in message
