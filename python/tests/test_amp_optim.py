"""autocast, GradScaler, optimizers (PyTorch's names), schedulers, clip_grad_norm_."""
import math

import numpy as np
import pytest

import ampforge as af
import ampforge.nn.functional as F
from ampforge import nn


def test_autocast_dtypes_and_nesting():
    lin = nn.Linear(4, 3)
    x = af.randn(2, 4)
    with af.autocast("cpu", dtype=af.float16):
        assert af.is_autocast_enabled("cpu")
        y = lin(x)
        assert y.dtype == af.float16
        assert F.cross_entropy(y, af.tensor([0, 1])).dtype == af.float32  # losses in float32
        with af.autocast("cpu", enabled=False):
            assert lin(x).dtype == af.float32
    assert not af.is_autocast_enabled("cpu") and lin(x).dtype == af.float32
    with af.autocast("cpu"):  # PyTorch's CPU default: bfloat16
        assert lin(x).dtype == af.bfloat16

    @af.autocast("cpu", dtype=af.float16)
    def f(v):
        return lin(v)

    assert f(x).dtype == af.float16
    with pytest.raises(ValueError):
        af.autocast("cpu", dtype=af.float32)


def test_grad_scaler_scales_skips_and_grows():
    p = nn.Parameter(af.ones(2))
    opt = af.optim.SGD([p], lr=0.5)
    scaler = af.amp.GradScaler(init_scale=8.0, growth_interval=2)
    assert scaler.scale(af.tensor(2.0)).item() == 16.0
    for _ in range(2):
        scaler.scale((p * p).sum()).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
    assert scaler.get_scale() == 16.0  # two clean steps with growth_interval 2: doubled
    assert p.tolist() == [0.0, 0.0]  # p - 0.5 * 2p, twice (the gradients were unscaled)
    (p * float("inf")).sum().backward()
    scaler.step(opt)  # an Inf gradient: the step is skipped
    scaler.update()
    assert scaler.get_scale() == 8.0 and scaler.skipped_steps == 1 and p.tolist() == [0.0, 0.0]
    state = scaler.state_dict()
    assert state["scale"] == 8.0 and state["growth_interval"] == 2
    other = af.amp.GradScaler()
    other.load_state_dict(state)
    assert other.get_scale() == 8.0
    assert not af.amp.GradScaler(enabled=False).is_enabled()


def test_unscale_then_clip():
    p = nn.Parameter(af.ones(4))
    opt = af.optim.SGD([p], lr=1.0)
    scaler = af.amp.GradScaler(init_scale=1024.0)
    scaler.scale((p * 3).sum()).backward()
    scaler.unscale_(opt)
    norm = af.nn.utils.clip_grad_norm_(opt, 1.0)
    assert norm == pytest.approx(6.0)
    scaler.step(opt)
    np.testing.assert_allclose(p.detach().numpy(), 1 - 0.5, rtol=1e-5)
    with pytest.raises(ValueError):
        scaler.unscale_(opt)  # twice before update(), as PyTorch refuses


def test_adamw_matches_the_reference_formula():
    p = nn.Parameter(af.tensor([1.0, -2.0]))
    opt = af.optim.AdamW([p], lr=0.1, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.01)
    (p * p).sum().backward()
    opt.step()
    g, w = np.array([2.0, -4.0]), np.array([1.0, -2.0])
    w = w * (1 - 0.1 * 0.01)
    m, v = 0.1 * g, 0.01 * g * g
    expected = w - 0.1 * (m / 0.1) / (np.sqrt(v / 0.01) + 1e-8)
    np.testing.assert_allclose(p.detach().numpy(), expected, rtol=1e-5)
    assert opt.steps == 1
    with pytest.raises(ValueError, match="amsgrad"):
        af.optim.AdamW([nn.Parameter(af.ones(1))], amsgrad=True)


def test_param_groups_lr_and_scheduler():
    a, b = nn.Parameter(af.ones(1)), nn.Parameter(af.ones(1))
    opt = af.optim.SGD([{"params": [a]}, {"params": [b], "lr": 0.5}], lr=0.1)
    assert [g["lr"] for g in opt.param_groups] == [0.1, 0.5]
    opt.param_groups[0]["lr"] = 0.2
    assert opt.param_groups[0]["lr"] == 0.2
    sched = af.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=4)
    lrs = []
    for _ in range(4):
        opt.step()
        sched.step()
        lrs.append(sched.get_last_lr()[0])
    expected = [0.2 * (1 + math.cos(math.pi * k / 4)) / 2 for k in range(1, 5)]
    np.testing.assert_allclose(lrs, expected, atol=1e-12)
    step = af.optim.lr_scheduler.StepLR(af.optim.SGD([nn.Parameter(af.ones(1))], lr=1.0), step_size=2, gamma=0.5)
    for _ in range(2):
        step.step()
    assert step.get_last_lr() == [0.5]


def test_optimizer_state_dict_round_trip():
    p = nn.Parameter(af.ones(3))
    opt = af.optim.AdamW([p])
    (p * 2).sum().backward()
    opt.step()
    state = opt.state_dict()
    assert any("exp_avg" in k or "m" in k for k in state)
    q = nn.Parameter(af.ones(3))
    opt2 = af.optim.AdamW([q])
    opt2.load_state_dict(state)
    assert opt2.steps == 1
