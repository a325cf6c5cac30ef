#!/usr/bin/env python3
"""PyTorch peer for ampforge's benchmarks: the same work, timed the same way, printed as one JSON object.

Run by bench programs in the same run as ampforge (same machine state, same thread count):
    python3 torch_peer.py ops   --threads T
    python3 torch_peer.py train --threads T --precision fp32|bf16|fp16 --steps N --batch B
PyTorch runs "at its best" on the CPU: its default memory format (NCHW), Debian's OpenBLAS, T threads.
"""
import argparse
import json
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def timeit(fn, min_time=0.5, min_reps=3):
    fn()  # warm-up
    reps, start = 0, time.perf_counter()
    while True:
        fn()
        reps += 1
        el = time.perf_counter() - start
        if reps >= min_reps and el >= min_time:
            return el / reps


def ops_bench():
    res = {}
    for n in (256, 512, 1024):
        a, b = torch.randn(n, n), torch.randn(n, n)
        res[f"gemm_{n}"] = timeit(lambda: torch.mm(a, b))
    for name, (N, C, H, W, K) in {"conv_cnn2": (128, 32, 14, 14, 64), "conv_resnet": (16, 64, 28, 28, 64),
                                  "conv_yolo80": (2, 80, 80, 80, 80)}.items():
        x = torch.randn(N, C, H, W, requires_grad=True)
        w = torch.randn(K, C, 3, 3, requires_grad=True)
        res[name + "_fwd"] = timeit(lambda: F.conv2d(x, w, padding=1))
        def fb():
            y = F.conv2d(x, w, padding=1)
            gx, gw = torch.autograd.grad(y, (x, w), torch.ones_like(y))
        res[name + "_fwdbwd"] = timeit(fb)
    for name, (N, C, H, W, act) in {"bn_relu": (8, 64, 56, 56, torch.relu),
                                     "bn_silu": (2, 32, 160, 160, F.silu)}.items():
        x = torch.randn(N, C, H, W).contiguous(memory_format=torch.channels_last).requires_grad_()
        w, b = torch.ones(C, requires_grad=True), torch.zeros(C, requires_grad=True)
        g = torch.randn(N, C, H, W).contiguous(memory_format=torch.channels_last)
        def fb():
            y = act(F.batch_norm(x, None, None, w, b, training=True))
            torch.autograd.grad(y, (x, w, b), g)
        res[name + "_fwdbwd"] = timeit(fb)
    # ResNet-50 layer1's block end, relu(bn3(x) + identity), in PyTorch's faster layout of the two.
    best = None
    for fmt in (torch.contiguous_format, torch.channels_last):
        x = torch.randn(8, 256, 56, 56).contiguous(memory_format=fmt).requires_grad_()
        r = torch.randn(8, 256, 56, 56).contiguous(memory_format=fmt).requires_grad_()
        w, b = torch.ones(256, requires_grad=True), torch.zeros(256, requires_grad=True)
        g = torch.randn(8, 256, 56, 56).contiguous(memory_format=fmt)
        def fb():
            y = torch.relu(F.batch_norm(x, None, None, w, b, training=True) + r)
            torch.autograd.grad(y, (x, r, w, b), g)
        t = timeit(fb)
        best = t if best is None else min(best, t)
    res["bn_add_relu_fwdbwd"] = best
    n = 1 << 22
    x, y = torch.randn(n), torch.randn(n)
    res["add_4M"] = timeit(lambda: torch.add(x, y))
    res["mul_4M"] = timeit(lambda: torch.mul(x, y))
    res["relu_4M"] = timeit(lambda: torch.relu(x))
    res["gelu_4M"] = timeit(lambda: F.gelu(x))
    res["sum_4M"] = timeit(lambda: torch.sum(x))
    return res


def small_cnn():
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))


def train_bench(precision, steps, batch):
    torch.manual_seed(0)
    model = small_cnn()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(batch, 1, 28, 28)
    y = torch.randint(0, 10, (batch,))
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)

    def step():
        opt.zero_grad()
        with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()

    for _ in range(3):
        step()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    el = time.perf_counter() - start
    return {"samples_per_sec": steps * batch / el, "seconds": el}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("what", choices=["ops", "train"])
    p.add_argument("--threads", type=int, required=True)
    p.add_argument("--precision", default="fp32")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=128)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    out = {"torch": torch.__version__, "threads": torch.get_num_threads()}
    try:
        if a.what == "ops":
            out["seconds"] = ops_bench()
        else:
            out.update(train_bench(a.precision, a.steps, a.batch))
    except RuntimeError as e:  # e.g. an autocast dtype the CPU build does not support
        out["error"] = str(e).splitlines()[0]
    print(json.dumps(out))


if __name__ == "__main__":
    sys.exit(main())
