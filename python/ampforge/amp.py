"""Automatic mixed precision: autocast(device_type, dtype=...) and GradScaler, as torch.amp.

    scaler = GradScaler()
    with autocast("cpu", dtype=ampforge.float16):
        loss = loss_fn(model(x), y)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()

Inside autocast, products and convolutions run in `dtype` and losses, softmax and normalisation statistics in float32
(PyTorch's op lists per device type). The default dtype is float16 on CUDA and bfloat16 on the CPU, as PyTorch's.
"""
import functools

from . import _core
from ._core import GradScaler, get_autocast_dtype, is_autocast_enabled  # noqa: F401


class autocast:
    """Context manager (and decorator) of an autocast region for one device type ('cuda' or 'cpu'), on this thread."""

    def __init__(self, device_type, dtype=None, enabled=True, cache_enabled=None):
        if not isinstance(device_type, str):
            device_type = str(device_type)
        self.device_type = device_type.split(":")[0]
        self._ctx = _core._Autocast(self.device_type, dtype, bool(enabled))
        self.fast_dtype = self._ctx.dtype

    def __enter__(self):
        self._ctx.__enter__()
        return self

    def __exit__(self, exc_type, exc, tb):
        self._ctx.__exit__(exc_type, exc, tb)
        return False

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with autocast(self.device_type, self._ctx.dtype, self._ctx.enabled):
                return fn(*args, **kwargs)

        return wrapper


__all__ = ["autocast", "GradScaler", "is_autocast_enabled", "get_autocast_dtype"]
