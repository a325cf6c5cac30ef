#!/usr/bin/env python3
"""Writes tests/data/optim_golden.json: parameter trajectories of torch.optim.AdamW and torch.optim.SGD
(PyTorch 1.13, Debian python3-torch) for src/ampforge/optim/optim_test.cpp.

Inputs are closed-form (no random generator) so the C++ test rebuilds them exactly:
  parameter k (shape S_k), element i:  p0 = sin(0.37 * (i + 1) + k)
  gradient at step t (0-based):        g  = cos(0.11 * i + 0.7 * t + k) * 0.5
Usage: /usr/bin/python3 scripts/gen_optim_golden.py [OUT.json]
"""
import json
import math
import sys

import torch

SHAPES = [[3, 4], [5]]
STEPS = 6
CASES = [
    ("adamw_default", "adamw", dict(lr=1e-2)),
    ("adamw_wd", "adamw", dict(lr=3e-2, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1)),
    ("sgd_plain", "sgd", dict(lr=0.1)),
    ("sgd_momentum_wd", "sgd", dict(lr=0.05, momentum=0.9, weight_decay=1e-2)),
    ("sgd_nesterov", "sgd", dict(lr=0.05, momentum=0.8, nesterov=True)),
    ("sgd_dampening", "sgd", dict(lr=0.05, momentum=0.9, dampening=0.3)),
]


def initial(k, shape):
    n = math.prod(shape)
    return torch.tensor([math.sin(0.37 * (i + 1) + k) for i in range(n)], dtype=torch.float32).reshape(shape)


def grad(k, shape, t):
    n = math.prod(shape)
    return torch.tensor([math.cos(0.11 * i + 0.7 * t + k) * 0.5 for i in range(n)], dtype=torch.float32).reshape(shape)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/data/optim_golden.json"
    doc = {"torch_version": torch.__version__, "shapes": SHAPES, "steps": STEPS, "cases": []}
    for name, kind, kw in CASES:
        params = [initial(k, s).requires_grad_() for k, s in enumerate(SHAPES)]
        opt = torch.optim.AdamW(params, **kw) if kind == "adamw" else torch.optim.SGD(params, **kw)
        traj = []
        for t in range(STEPS):
            for k, (p, s) in enumerate(zip(params, SHAPES)):
                p.grad = grad(k, s, t)
            opt.step()
            traj.append([p.detach().flatten().tolist() for p in params])
        opts = {k: (list(v) if isinstance(v, tuple) else v) for k, v in kw.items()}
        doc["cases"].append({"name": name, "optimizer": kind, "options": opts, "trajectory": traj})
    with open(out, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
