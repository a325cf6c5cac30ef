"""Optimizers with PyTorch's argument names: SGD, AdamW (fused over flat buffers), and lr_scheduler.

Building an optimizer moves its parameters into one buffer per group (modules' handles follow; NumPy arrays made
from a parameter before keep the old memory). Gradients are never None: zero_grad() zeroes them.
"""
from .._core import SGD, AdamW, Optimizer  # noqa: F401
from . import lr_scheduler  # noqa: F401

__all__ = ["SGD", "AdamW", "Optimizer", "lr_scheduler"]
