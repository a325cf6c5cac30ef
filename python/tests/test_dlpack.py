"""DLPack with NumPy: capsules both ways (versioned and not), devices, sharing, dtypes. PyTorch: torch/."""
import numpy as np
import pytest

import ampforge as af


def test_dlpack_device_and_capsules():
    t = af.arange(6, dtype=af.float32).reshape(2, 3)
    assert t.__dlpack_device__() == (1, 0)
    assert "dltensor_versioned" in repr(t.__dlpack__(max_version=(1, 0)))
    assert "dltensor" in repr(t.__dlpack__())
    with pytest.raises(BufferError):
        t.__dlpack__(dl_device=(2, 0))
    copied = np.from_dlpack(af.from_dlpack(t.__dlpack__(copy=True)))  # copy=True exports a copy
    assert copied.ctypes.data != t.data_ptr() and copied.tolist() == t.tolist()
    with pytest.raises(RuntimeError, match="requires grad"):
        af.ones(2, requires_grad=True).__dlpack__()


def test_capsule_import_shares_memory():
    a = np.arange(4, dtype=np.int64)
    t = af.from_dlpack(a.__dlpack__())  # a bare capsule
    t[0] = 40
    assert a[0] == 40 and t.dtype == af.int64


@pytest.mark.parametrize("dtype", [af.float32, af.float16, af.float64, af.int64, af.int32, af.uint8, af.bool])
def test_numpy_dlpack_round_trip(dtype):
    t = af.tensor((np.arange(12) % 3).reshape(3, 4)).to(dtype)
    a = np.from_dlpack(t)
    assert a.shape == (3, 4) and a.ctypes.data == t.data_ptr()
    back = af.from_dlpack(a)
    assert back.dtype == dtype and back.data_ptr() == t.data_ptr()
    assert back.tolist() == t.tolist()


def test_views_and_strides_cross_over():
    a = np.arange(24, dtype=np.float32).reshape(4, 6)[1:, ::2]
    t = af.from_dlpack(a)
    assert t.shape == a.shape and t.stride() == (6, 2) and t.tolist() == a.tolist()
    tv = af.arange(24, dtype=af.float32).reshape(4, 6)[:, 1::3]
    av = np.from_dlpack(tv)
    assert av.strides == (24, 12) and av.tolist() == tv.tolist()
    with pytest.raises(ValueError, match="negative strides"):
        af.from_dlpack(np.arange(4, dtype=np.float32)[::-1])


def test_zero_size_and_scalars():
    e = af.from_dlpack(np.zeros((0, 3), dtype=np.float32))
    assert e.shape == (0, 3) and e.numel() == 0
    s = af.from_dlpack(np.array(2.5, dtype=np.float32))
    assert s.shape == () and s.item() == 2.5
    assert np.from_dlpack(af.tensor(3.0)).shape == ()


def test_bfloat16_is_refused_by_numpy_but_exported():
    t = af.ones(2, dtype=af.bfloat16)
    assert "dltensor" in repr(t.__dlpack__())  # a consumer with bfloat16 (PyTorch, JAX) takes it: torch/
    with pytest.raises((RuntimeError, BufferError, TypeError)):
        np.from_dlpack(t)
