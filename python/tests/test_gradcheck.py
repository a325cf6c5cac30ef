"""Finite-difference check of the gradients of a Python-defined module (conv, batch norm, ReLU, linear), in float64,
and that it trains."""
import numpy as np

import ampforge as af
import ampforge.nn.functional as F
from ampforge import nn


class SmallNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3, padding=1)
        self.bn = nn.BatchNorm2d(3)
        self.fc = nn.Linear(3 * 4 * 4, 5)

    def forward(self, x):
        return self.fc(F.relu(self.bn(self.conv(x))).flatten(1))


def _objective(model, x, w):
    # A scalar with a different weight per output, so that every output's gradient matters.
    return (model(x) * w).sum()


def test_finite_differences_match_backward():
    af.manual_seed(1)
    model = SmallNet().to(af.float64)
    x = af.randn(4, 2, 4, 4, dtype=af.float64, requires_grad=True)
    w = af.randn(4, 5, dtype=af.float64)
    _objective(model, x, w).backward()
    eps, rng = 1e-6, np.random.default_rng(0)
    checked = 0
    for name, p in list(model.named_parameters()) + [("input", x)]:
        grad = p.grad.numpy().reshape(-1)
        flat = p.detach().reshape(-1)  # a view: writes reach the parameter
        for i in rng.choice(flat.numel(), size=min(6, flat.numel()), replace=False):
            i = int(i)
            with af.no_grad():
                orig = flat[i].item()
                flat[i] = orig + eps
                up = _objective(model, x, w).item()
                flat[i] = orig - eps
                down = _objective(model, x, w).item()
                flat[i] = orig
            numeric = (up - down) / (2 * eps)
            assert abs(numeric - grad[i]) <= 1e-6 + 1e-5 * abs(numeric), (name, i, numeric, grad[i])
            checked += 1
    assert checked >= 30


def test_python_module_trains():
    af.manual_seed(0)
    model = SmallNet()
    x = af.randn(32, 2, 4, 4)
    y = af.tensor(np.arange(32) % 5)
    opt = af.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    first = None
    for _ in range(30):
        loss = F.cross_entropy(model(x), y)
        first = first if first is not None else loss.item()
        loss.backward()
        opt.step()
        opt.zero_grad()
    assert loss.item() < 0.25 * first
