"""What Python costs: the small CNN's training step (AdamW, Fashion-MNIST-shaped batch, channels-last) timed
  (1) in C++: ampforge.train.TrainStep, the Trainer's own step (train/step.h) on the same batch,
  (2) driven from Python: the brief's loop (autocast, GradScaler for fp16, backward, step, update, zero_grad) over the
      registry's C++ model, and over the same network written as a Python nn.Module subclass,
  (3) in PyTorch's eager Python loop on the same network, batch, optimizer and thread count, in a process of its own
      (--peer-python, default .venv-peer/bin/python when present): PyTorch brings its own OpenMP runtime, whose
      threads spin after each op and would slow ampforge's if both ran in one process.
A benchmark, not a test: it prints a Markdown table (median ms per step) and the command, CPU and threads to record
with it. ampforge's three variants take turns step by step (a machine whose speed drifts slows them alike); PyTorch
runs in blocks of --steps between ampforge's rounds.

    .venv/bin/python python/bench/step_bench.py
    .venv/bin/python python/bench/step_bench.py --precisions fp32 --peer-python none
"""
import argparse
import functools
import os
import platform
import statistics
import sys
import time

import json
import subprocess

import numpy as np

if "--torch-only" not in sys.argv:
    import ampforge as af
    import ampforge.nn.functional as F
    from ampforge import nn

    _Module = nn.Module
else:  # the PyTorch process: no ampforge in it
    import torch

    _Module = object


class PyCNN(_Module):
    """The registry's `cnn` (models/small.cpp) as a Python subclass: same layers, same state-dict layout."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(32)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(64)
        self.fc1 = nn.Linear(64 * 7 * 7, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def ampforge_step(model, x, y, precision):
    """The brief's loop body, one step at a time."""
    opt = af.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = af.amp.GradScaler(enabled=precision == "fp16")
    dtype = {"fp16": af.float16, "bf16": af.bfloat16}.get(precision)

    def step():
        with af.autocast("cpu", dtype=dtype or af.bfloat16, enabled=dtype is not None):
            loss = F.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        return loss.item()  # the loss reaches the host, as the Trainer's CPU step reads it

    return step


def torch_step(x_np, y_np, precision):
    """PyTorch's eager loop on the same network (torch.nn.Sequential of the same layers), batch and optimizer."""
    model = torch.nn.Sequential(
        torch.nn.Conv2d(1, 32, 3, padding=1, bias=False), torch.nn.BatchNorm2d(32), torch.nn.ReLU(),
        torch.nn.MaxPool2d(2), torch.nn.Conv2d(32, 64, 3, padding=1, bias=False), torch.nn.BatchNorm2d(64),
        torch.nn.ReLU(), torch.nn.MaxPool2d(2), torch.nn.Flatten(), torch.nn.Linear(64 * 7 * 7, 128),
        torch.nn.ReLU(), torch.nn.Linear(128, 10)).to(memory_format=torch.channels_last)
    x = torch.from_numpy(x_np).contiguous(memory_format=torch.channels_last)
    y = torch.from_numpy(y_np)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", enabled=precision == "fp16")
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(precision)

    def step():
        with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        return loss.item()

    return step


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def batch(n):
    rng = np.random.default_rng(0)
    return (rng.standard_normal((n, 1, 28, 28)).astype(np.float32), (np.arange(n) % 10).astype(np.int64))


def torch_only(args):
    """--torch-only: time PyTorch's steps in this process and print them as JSON."""
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    step = torch_step(*batch(args.batch), args.precisions)
    for _ in range(args.warmup):
        step()
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    print(json.dumps({"version": torch.__version__, "times": times}))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--precisions", default="fp32,bf16,fp16")
    p.add_argument("--steps", type=int, default=30, help="timed steps per variant and round")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=0, help="0: ampforge's default (every core)")
    here = os.path.dirname(os.path.abspath(__file__))
    default_peer = os.path.join(here, "..", "..", ".venv-peer", "bin", "python")
    p.add_argument("--peer-python", default=default_peer if os.path.exists(default_peer) else "none",
                   help="an interpreter with torch for the PyTorch column ('none': leave it out)")
    p.add_argument("--torch-only", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.torch_only:
        return torch_only(args)
    if args.threads:
        af.set_num_threads(args.threads)
    threads = af.get_num_threads()
    x_np, y_np = batch(args.batch)
    x = af.from_numpy(x_np).contiguous(channels_last=True)
    y = af.from_numpy(y_np)
    print(f"# step_bench: batch {args.batch}, {threads} threads, {args.rounds} rounds x {args.steps} steps per "
          f"variant after {args.warmup} warm-up, {cpu_model()}, ampforge {af.__version__}, load average "
          f"{os.getloadavg()[0]:.1f} at the start")
    print(f"# command: {os.path.basename(sys.executable)} {' '.join(sys.argv)}")
    print("| precision | C++ step (TrainStep, ms) | Python loop, C++ model (ms) | Python loop, Python module (ms) | "
          "Python / C++ | PyTorch eager (ms) | PyTorch / ampforge Python |")
    print("|---|---|---|---|---|---|---|")
    peer_version = None
    for precision in args.precisions.split(","):
        af.manual_seed(0)
        cpp = af.train.TrainStep(af.models.create("cnn"), precision, "adamw", 1e-3)
        af.manual_seed(0)
        variants = {"cpp": functools.partial(cpp, x, y),
                    "py_cpp": ampforge_step(af.models.create("cnn"), x, y, precision)}
        af.manual_seed(0)
        variants["py_py"] = ampforge_step(PyCNN(), x, y, precision)
        names = list(variants)
        times = {k: [] for k in names + ["pt"]}
        for k in names:
            for _ in range(args.warmup):
                variants[k]()
        for _ in range(args.rounds):
            # One step of each variant in turn, the order rotating.
            for i in range(args.steps):
                for j in range(len(names)):
                    k = names[(i + j) % len(names)]
                    t0 = time.perf_counter()
                    variants[k]()
                    times[k].append(time.perf_counter() - t0)
            if args.peer_python != "none":
                out = subprocess.run([args.peer_python, os.path.abspath(__file__), "--torch-only", "--batch",
                                      str(args.batch), "--precisions", precision, "--steps", str(args.steps),
                                      "--warmup", str(args.warmup), "--threads", str(threads)],
                                     check=True, capture_output=True, text=True).stdout
                r = json.loads(out.strip().splitlines()[-1])
                peer_version = r["version"]
                times["pt"] += r["times"]
        med = {k: statistics.median(v) * 1e3 for k, v in times.items() if v}
        ratio = med["py_cpp"] / med["cpp"]
        pt_cell = f"{med['pt']:.1f}" if "pt" in med else "n/a"
        pt_ratio = f"{med['pt'] / med['py_cpp']:.2f}x" if "pt" in med else "n/a"
        print(f"| {precision} | {med['cpp']:.1f} | {med['py_cpp']:.1f} | {med['py_py']:.1f} | "
              f"{ratio:.3f} ({(ratio - 1) * 100:+.1f}%) | {pt_cell} | {pt_ratio} |", flush=True)
    print(f"# PyTorch: {peer_version or 'not measured'} ({args.peer_python}); load average {os.getloadavg()[0]:.1f} "
          f"at the end")


if __name__ == "__main__":
    main()
