#!/usr/bin/env python3
"""PyTorch peer of bench/resnet_bench.cpp: one ResNet-50 training step on the CPU, timed per step, as JSON.

    python3 torch_resnet_peer.py --threads T --precision fp32|bf16 --batch 8 --size 224 --steps N --warmup W
                                 --optimizer sgd|adamw [--memory-format nchw|channels_last|both]
The step is the one ampforge times: zero_grad, forward under torch.autocast("cpu", bfloat16) for bf16 (plain
for fp32), cross-entropy, backward, optimizer step (SGD momentum 0.9 or AdamW, lr 1e-3). torchvision's resnet50,
synthetic data (fixed random input and labels), T threads. PyTorch "at its best": both memory formats are
timed (model and input in channels_last, or NCHW) and the faster reported as "best". Warm-up steps are not
timed; the result has every timed step's seconds, their median and mean, and the process CPU seconds per step.
"""
import argparse
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F


def run(precision, batch, size, steps, warmup, optimizer, memory_format):
    import torchvision
    torch.manual_seed(0)
    model = torchvision.models.resnet50()
    x = torch.randn(batch, 3, size, size)
    y = torch.randint(0, 1000, (batch,))
    if memory_format == "channels_last":
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    model.train()
    if optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    bf16 = precision == "bf16"

    def step():
        opt.zero_grad(set_to_none=False)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()

    for _ in range(warmup):
        step()
    times, cpu = [], []
    for _ in range(steps):
        t0, c0 = time.perf_counter(), time.process_time()
        step()
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return {"seconds": times, "median": statistics.median(times), "mean": statistics.fmean(times),
            "cpu_seconds": cpu, "cpu_median": statistics.median(cpu),
            "images_per_sec": batch / statistics.median(times)}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, required=True)
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--optimizer", choices=["sgd", "adamw"], default="sgd")
    p.add_argument("--memory-format", choices=["nchw", "channels_last", "both"], default="both")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    out = {"torch": torch.__version__, "threads": torch.get_num_threads(), "results": {}}
    formats = ["nchw", "channels_last"] if a.memory_format == "both" else [a.memory_format]
    try:
        for fmt in formats:
            out["results"][fmt] = run(a.precision, a.batch, a.size, a.steps, a.warmup, a.optimizer, fmt)
        out["best"] = min(out["results"], key=lambda k: out["results"][k]["median"])
    except RuntimeError as e:
        out["error"] = str(e).splitlines()[0]
    print(json.dumps(out))


if __name__ == "__main__":
    sys.exit(main())
