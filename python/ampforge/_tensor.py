"""Tensors from Python data, NumPy and DLPack producers, and Tensor's repr."""

import numpy as _np

from . import _core

_NUMPY_DEFAULTS = {  # torch.tensor's choices for Python data: floats -> float32, ints -> int64
    "f": _core.float32,
    "i": _core.int64,
    "u": _core.int64,
    "b": _core.bool,
}
_NUMPY_OF = {
    _core.float32: _np.float32,
    _core.float16: _np.float16,
    _core.float64: _np.float64,
    _core.int32: _np.int32,
    _core.int64: _np.int64,
    _core.uint8: _np.uint8,
    _core.bool: _np.bool_,
}


def tensor(data, dtype=None, device=None, requires_grad=False):
    """A new tensor holding a copy of `data` (nested lists, numbers, NumPy arrays, tensors of any DLPack framework).

    dtype defaults as torch.tensor: float32 for floats (float64 NumPy arrays keep float64), int64 for ints, bool for
    bools."""
    if isinstance(data, _core.Tensor):
        t = data.detach().clone()
    elif hasattr(data, "__dlpack__") and not isinstance(data, _np.ndarray):
        t = _core._from_dlpack_copy(data)
    else:
        arr = _np.asarray(data)
        if arr.dtype.kind not in "fiub":
            raise TypeError(f"tensor(): cannot make a tensor of NumPy dtype {arr.dtype}")
        want = dtype
        if want is None:
            want = _core.float64 if arr.dtype == _np.float64 and isinstance(data, _np.ndarray) else _NUMPY_DEFAULTS[arr.dtype.kind]
        if arr.dtype == _np.float16 and dtype is None:
            want = _core.float16
        np_dtype = _NUMPY_OF.get(want, _np.float32)  # bfloat16: via float32
        t = _core._from_dlpack_copy(_np.array(arr, dtype=np_dtype, order="C"))  # keeps 0-d arrays 0-d
    if dtype is not None and t.dtype != dtype:
        t = t.to(dtype)
    if device is not None:
        t = t.to(device)
    if requires_grad:
        t.requires_grad_(True)
    return t


def from_numpy(array):
    """A tensor sharing `array`'s memory (writes through either are seen by the other). A read-only array is
    copied (ampforge tensors are always writable)."""
    if not isinstance(array, _np.ndarray):
        raise TypeError(f"from_numpy: expected a numpy.ndarray, got {type(array).__name__}")
    if not array.flags.writeable:
        return _core._from_dlpack_copy(array)
    return _core._from_dlpack_shared(array)


def from_dlpack(x, *, device=None, copy=None):
    """A tensor over the memory of `x`: any object with __dlpack__ (PyTorch, NumPy, JAX, CuPy, ...) or a DLPack
    capsule, without a copy (copy=True copies; a read-only producer is copied unless copy=False, which then raises
    BufferError)."""
    if isinstance(x, _core.Tensor):
        t = x.clone() if copy else x
    elif copy:
        t = _core._from_dlpack_copy(x)
    else:
        try:
            t = _core._from_dlpack_shared(x)
        except TypeError:
            if copy is False:
                raise BufferError("from_dlpack(copy=False): the producer's memory is read-only or not shareable") from None
            t = _core._from_dlpack_copy(x)
    if device is not None:
        t = t.to(device)
    return t


def _repr(self):
    suffix = []
    if self.dtype not in (_core.float32, _core.int64, _core.bool):
        suffix.append(f"dtype={self.dtype!r}")
    if self.device.type != "cpu":
        suffix.append(f"device='{self.device}'")
    if self.grad_fn is not None:
        suffix.append(f"grad_fn=<{self.grad_fn}>")
    elif self.requires_grad:
        suffix.append("requires_grad=True")
    if self.device.type == "meta":
        body = f"..., size={self.shape}"
    else:
        arr = self.detach().numpy(force=True)
        body = _np.array2string(arr, separator=", ", prefix="tensor(", threshold=1000)
    return "tensor(" + body + "".join(", " + s for s in suffix) + ")"


def _rebuild(array, dtype, requires_grad):
    t = tensor(array, dtype=dtype)
    return t.requires_grad_(True) if requires_grad else t


def _reduce(self):
    """Pickling (and copy.deepcopy): the values on the CPU, the dtype, requires_grad; not the autograd history."""
    values = self.detach().numpy(force=True)  # bfloat16 travels as float32, exactly, and is converted back
    return _rebuild, (values.copy(), self.dtype, self.requires_grad and self.is_leaf)


def _deepcopy(self, memo):
    return _rebuild(*_reduce(self)[1])


_core.Tensor.__repr__ = _repr
_core.Tensor.__str__ = _repr
_core.Tensor.__reduce__ = _reduce
_core.Tensor.__deepcopy__ = _deepcopy
__all__ = ["tensor", "from_numpy", "from_dlpack"]
