"""Grad mode: ampforge.no_grad(), enable_grad(), set_grad_enabled() - context managers and decorators, per thread."""
import functools

from . import _core


class _GradMode:
    _enabled = True

    def __enter__(self):
        self._prev = _core.is_grad_enabled()
        _core._set_grad_enabled(self._enabled)
        return self

    def __exit__(self, *exc):
        _core._set_grad_enabled(self._prev)
        return False

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with type(self)():
                return fn(*args, **kwargs)

        return wrapper


class no_grad(_GradMode):
    """Inside, ops record no autograd history (inference, in-place updates of parameters)."""

    _enabled = False


class enable_grad(_GradMode):
    """Inside, autograd records history again (inside a no_grad region)."""

    _enabled = True


class set_grad_enabled:
    """set_grad_enabled(False): as a call, switches grad mode; as a context manager, for its block only."""

    def __init__(self, mode):
        self._prev = _core.is_grad_enabled()
        _core._set_grad_enabled(bool(mode))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        _core._set_grad_enabled(self._prev)
        return False
