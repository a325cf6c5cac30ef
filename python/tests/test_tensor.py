"""ampforge.Tensor: metadata, creation, operators, indexing, autograd, conversions, NumPy sharing, dtype round trips."""
import time

import numpy as np
import pytest

import ampforge as af


def test_creation_and_metadata():
    t = af.zeros(2, 3)
    assert t.shape == (2, 3) and t.dtype == af.float32 and str(t.device) == "cpu" and t.ndim == 2
    assert af.zeros((2, 3)).shape == (2, 3)
    assert af.ones(4, dtype=af.float16).dtype == af.float16
    assert af.full((2,), 7.5).tolist() == [7.5, 7.5]
    assert af.arange(5).dtype == af.int64 and af.arange(5).tolist() == [0, 1, 2, 3, 4]
    assert af.arange(0, 1, 0.25).tolist() == [0.0, 0.25, 0.5, 0.75]
    assert af.tensor([[1, 2], [3, 4]]).dtype == af.int64
    assert af.tensor([1.5, 2]).dtype == af.float32
    assert af.tensor([True, False]).dtype == af.bool
    assert af.tensor(np.zeros(3)).dtype == af.float64  # NumPy float64 keeps its dtype, as torch.tensor
    assert af.randn(3, 4).shape == (3, 4) and af.rand(2).numel() == 2
    assert af.zeros_like(af.ones(2, dtype=af.bfloat16)).dtype == af.bfloat16
    t = af.zeros(2, 3, 4)
    assert t.size() == (2, 3, 4) and t.size(-1) == 4 and t.stride() == (12, 4, 1) and len(t) == 2
    assert repr(af.tensor([1.0, 2.0])) == "tensor([1., 2.])"
    assert "dtype=ampforge.float16" in repr(af.ones(1, dtype=af.float16))
    assert af.dtype.float32 is af.float32 and repr(af.bfloat16) == "ampforge.bfloat16"
    assert af.device("cuda", 1) == "cuda:1" and af.device("cpu").type == "cpu"


def test_manual_seed_repeats():
    af.manual_seed(123)
    a = af.randn(5).tolist()
    af.manual_seed(123)
    assert af.randn(5).tolist() == a


def test_operators_against_numpy():
    a_np = np.array([[1.0, -2.0, 3.0], [4.0, 5.0, -6.0]], dtype=np.float32)
    b_np = np.array([0.5, 2.0, -1.0], dtype=np.float32)
    a, b = af.tensor(a_np), af.tensor(b_np)
    np.testing.assert_allclose((a + b).numpy(), a_np + b_np)
    np.testing.assert_allclose((a - b).numpy(), a_np - b_np)
    np.testing.assert_allclose((a * b).numpy(), a_np * b_np)
    np.testing.assert_allclose((a / b).numpy(), a_np / b_np, rtol=1e-6)
    np.testing.assert_allclose((2 - a).numpy(), 2 - a_np)
    np.testing.assert_allclose((1 / b).numpy(), 1 / b_np, rtol=1e-6)
    np.testing.assert_allclose((a ** 2).numpy(), a_np ** 2)
    np.testing.assert_allclose((-a).numpy(), -a_np)
    np.testing.assert_allclose((a @ b.reshape(3, 1)).numpy(), a_np @ b_np.reshape(3, 1), rtol=1e-6)
    assert (a > 0).dtype == af.bool and (a > 0).tolist() == (a_np > 0).tolist()
    assert (a == a).numpy().all() and a.eq(a_np.tolist()[0][0]).sum().item() == 1
    np.testing.assert_allclose(a.sum(1).numpy(), a_np.sum(1))
    np.testing.assert_allclose(a.mean().item(), a_np.mean(), rtol=1e-6)
    values, indices = a.max(1)
    assert values.tolist() == a_np.max(1).tolist() and indices.tolist() == a_np.argmax(1).tolist()
    assert a.argmax().item() == int(a_np.argmax())
    np.testing.assert_allclose(a.softmax(1).numpy(), np.exp(a_np) / np.exp(a_np).sum(1, keepdims=True), rtol=1e-5)
    np.testing.assert_allclose(a.clamp(min=0).numpy(), np.maximum(a_np, 0))
    assert isinstance(a.sum().item(), float) and isinstance(af.arange(3)[1].item(), int)
    assert (a == None) is False  # noqa: E711  (NotImplemented -> identity comparison)


def test_indexing_views():
    base = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    t = af.tensor(base)
    for index in [1, -1, (0, 2), (slice(None), 1), (slice(None), slice(1, 3)), (Ellipsis, 0), (0, Ellipsis, 1),
                  (slice(None, None, 2),), (slice(None), slice(None), slice(1, None, 2)), (None, 0), (1, None, 2)]:
        np.testing.assert_array_equal(t[index].numpy(), base[index], err_msg=str(index))
    with pytest.raises(IndexError):
        t[2]
    with pytest.raises(IndexError):
        t[0, 0, 0, 0]
    with pytest.raises(ValueError, match="step"):
        t[::-1]
    with pytest.raises(TypeError, match="ints, slices"):
        t[af.tensor([0, 1])]
    rows = [r.tolist() for r in af.tensor([[1, 2], [3, 4]])]
    assert rows == [[1, 2], [3, 4]]


def test_setitem_and_inplace():
    t = af.zeros(2, 3)
    t[0] = 1.5
    t[1, 1:] = af.tensor([2.0, 3.0])
    assert t.tolist() == [[1.5, 1.5, 1.5], [0.0, 2.0, 3.0]]
    t.add_(1).mul_(2)
    assert t.tolist() == [[5.0, 5.0, 5.0], [2.0, 6.0, 8.0]]
    t.zero_()
    assert t.sum().item() == 0
    p = af.ones(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="in place"):
        p.add_(1)
    with af.no_grad():
        p.add_(1)
    assert p.tolist() == [2.0, 2.0, 2.0]


def test_autograd_basics():
    x = af.tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = (x * x + 3 * x).sum()
    assert y.grad_fn is not None and x.is_leaf and not y.is_leaf
    y.backward()
    assert x.grad.tolist() == [5.0, 7.0, 9.0]
    seen = []
    z = x * 2
    z.register_hook(lambda g: seen.append(g.tolist()))
    z.sum().backward()
    assert seen == [[1.0, 1.0, 1.0]] and x.grad.tolist() == [7.0, 9.0, 11.0]
    x.grad = None
    assert x.grad is None
    with af.no_grad():
        w = x * 2
    assert not w.requires_grad and w.grad_fn is None
    assert af.is_grad_enabled()

    @af.no_grad()
    def f(v):
        return v * 2

    assert not f(x).requires_grad
    assert not x.detach().requires_grad
    with pytest.raises(ValueError):
        (x * 2).backward()  # not one element: needs a gradient


def test_to_and_dtype_conversions():
    t = af.tensor([1.5, -2.25])
    assert t.to(af.float16).dtype == af.float16 and t.half().float().tolist() == [1.5, -2.25]
    assert t.bfloat16().float().tolist() == [1.5, -2.25]
    assert t.to(dtype=af.float64).dtype == af.float64 and t.long().tolist() == [1, -2]
    assert t.to("cpu") is not None and t.cpu().device == "cpu"
    assert t.to(af.ones(1, dtype=af.bfloat16)).dtype == af.bfloat16


@pytest.mark.parametrize("dtype,np_dtype", [(af.float32, np.float32), (af.float16, np.float16),
                                            (af.int64, np.int64), (af.float64, np.float64), (af.int32, np.int32),
                                            (af.uint8, np.uint8), (af.bool, np.bool_)])
def test_numpy_round_trip_per_dtype(dtype, np_dtype):
    src = (np.arange(12) % 5).astype(np_dtype).reshape(3, 4)
    t = af.from_numpy(src)
    assert t.dtype == dtype and t.shape == (3, 4)
    back = t.numpy()
    assert back.dtype == np_dtype
    np.testing.assert_array_equal(back, src)
    assert np.shares_memory(back, src)


def test_bfloat16_round_trip_through_float32():
    values = [1.0, -2.5, 3.140625, 65280.0]  # exactly representable in bfloat16
    t = af.tensor(values, dtype=af.bfloat16)
    assert t.dtype == af.bfloat16 and t.float().tolist() == values
    with pytest.raises(TypeError, match="bfloat16"):
        t.numpy()
    assert np.asarray(t).dtype == np.float32  # __array__ widens


def test_numpy_shares_memory_both_ways():
    a = np.zeros((2, 3), dtype=np.float32)
    t = af.from_numpy(a)
    t[1, 2] = 5.0  # ampforge writes, NumPy reads
    assert a[1, 2] == 5.0
    a[0, 0] = -1.0  # NumPy writes, ampforge reads
    assert t[0, 0].item() == -1.0
    v = t.numpy()
    v[0, 1] = 9.0
    assert a[0, 1] == 9.0 and t[0, 1].item() == 9.0
    strided = a[:, ::2]
    ts = af.from_numpy(strided)
    assert ts.shape == (2, 2) and ts.stride() == (3, 2)
    ts[0, 1] = 7.0
    assert a[0, 2] == 7.0
    ro = np.ones(3, dtype=np.float32)
    ro.flags.writeable = False
    c = af.from_numpy(ro)  # read-only: copied
    c[0] = 2.0
    assert ro[0] == 1.0
    assert af.from_dlpack(a).data_ptr() == a.ctypes.data  # NumPy's __dlpack__, no copy
    assert np.from_dlpack(t).ctypes.data == a.ctypes.data  # ampforge's __dlpack__, no copy


def test_numpy_view_outlives_rebinding():
    p = af.nn.Parameter(af.ones(4))
    view = p.detach().numpy()
    af.optim.SGD([p], lr=0.1)  # moves the parameter into the optimizer's flat buffer (set_data)
    with af.no_grad():
        p.mul_(3)
    assert p.tolist() == [3.0] * 4
    assert view.tolist() == [1.0] * 4  # the old storage is kept alive, not freed under the array


def test_long_calls_release_the_gil():
    import threading

    counter, stop = [0], [False]

    def spin():
        while not stop[0]:
            counter[0] += 1

    a = af.randn(1024, 1024)
    worker = threading.Thread(target=spin)
    worker.start()
    try:
        time.sleep(0.05)
        advanced = []
        for _ in range(3):
            before = counter[0]
            a @ a  # one product: ~0.1 s on 2 cores, run without the GIL
            advanced.append(counter[0] - before)
    finally:
        stop[0] = True
        worker.join()
    assert max(advanced) > 1000, advanced  # the Python thread ran during the product


def test_pickle_and_deepcopy():
    import copy
    import pickle

    for t in [af.tensor([[1.5, -2.0]]), af.tensor([1, 2, 3]), af.ones(2, dtype=af.bfloat16),
              af.ones(3, requires_grad=True), af.tensor(True)]:
        for back in (pickle.loads(pickle.dumps(t)), copy.deepcopy(t)):
            assert back.dtype == t.dtype and back.shape == t.shape and back.tolist() == t.tolist()
            assert back.requires_grad == t.requires_grad and back.data_ptr() != t.data_ptr()


def test_memory_format_takes_pytorchs_names():
    x = af.randn(2, 3, 4, 5)
    assert repr(af.channels_last) == "ampforge.channels_last"
    cl = x.contiguous(memory_format=af.channels_last)
    assert cl.is_contiguous(memory_format=af.channels_last) and not cl.is_contiguous()
    assert cl.stride() == (60, 1, 15, 3)  # NHWC strides of an NCHW-shaped tensor, as PyTorch's
    assert cl.contiguous(memory_format=af.contiguous_format).is_contiguous()
    assert cl.contiguous(channels_last=True).stride() == cl.stride()  # the short form still works
    np.testing.assert_array_equal(cl.numpy(), x.numpy())
    with pytest.raises(ValueError, match="contradicts"):
        x.contiguous(memory_format=af.contiguous_format, channels_last=True)
    with pytest.raises(ValueError, match="contiguous_format or ampforge.channels_last"):
        x.contiguous(memory_format=af.preserve_format)
