"""Neural-network modules, PyTorch's names: Module (subclass it), Parameter, the layers, functional, utils.

    class Net(ampforge.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(1, 8, 3, padding=1)   # registered as the submodule 'conv'
            self.scale = nn.Parameter(ampforge.ones(1))  # registered as the parameter 'scale'
        def forward(self, x):
            return self.conv(x) * self.scale

Attribute names become state-dict names ('conv.weight', 'scale'), as in PyTorch. A Python module is a C++ module
too: C++ containers (Sequential), the Trainer and the models run its forward.
"""
from .. import _core
from .._core import (  # noqa: F401
    AdaptiveAvgPool2d,
    AvgPool2d,
    BatchNorm2d,
    Conv2d,
    Dropout,
    Embedding,
    Flatten,
    GELU,
    LayerNorm,
    Linear,
    MaxPool2d,
    Module,
    Parameter,
    ReLU,
    Sequential,
    SiLU,
)
from . import functional, utils  # noqa: F401


def _apply(self, fn):
    """Calls fn on every submodule (children first) and on this module, as torch.nn.Module.apply; returns self."""
    for child in self.children():
        child.apply(fn)
    fn(self)
    return self


Module.apply = _apply


class ModuleList(Module):
    """A list of modules registered as children '0', '1', ... (torch.nn.ModuleList): indexable, iterable, no forward."""

    def __init__(self, modules=()):
        super().__init__()
        for m in modules:
            self.append(m)

    def append(self, module):
        self.add_module(str(len(self)), module)
        return self

    def extend(self, modules):
        for m in modules:
            self.append(m)
        return self

    def __len__(self):
        return len(self.children())

    def __getitem__(self, i):
        return self.children()[i]

    def __iter__(self):
        return iter(self.children())


class Identity(Module):
    """Returns its input."""

    def forward(self, x):
        return x


class CrossEntropyLoss(Module):
    """loss(input, target) = functional.cross_entropy(input, target, ...)."""

    def __init__(self, ignore_index=-100, reduction="mean", label_smoothing=0.0):
        super().__init__()
        self.ignore_index = ignore_index
        self.reduction = reduction
        self.label_smoothing = label_smoothing

    def forward(self, input, target):
        return functional.cross_entropy(input, target, ignore_index=self.ignore_index, reduction=self.reduction,
                                        label_smoothing=self.label_smoothing)


class MSELoss(Module):
    """loss(input, target) = functional.mse_loss(input, target, reduction)."""

    def __init__(self, reduction="mean"):
        super().__init__()
        self.reduction = reduction

    def forward(self, input, target):
        return functional.mse_loss(input, target, reduction=self.reduction)
