#!/usr/bin/env python3
"""PyTorch peer of `ampforge bench`: full training steps of one model at one precision, as one JSON object.

    python3 torch_bench_peer.py --model cnn|resnet50|... --precision fp32|tf32|fp16|bf16 --batch B
                                [--image-size S] [--seq-len L] --steps N --warmup W [--device cpu|cuda[:N]]
                                [--threads T] [--optimizer sgd|adamw] [--memory-format nchw|channels_last|both]
                                [--serve]

The step is the one ampforge times (src/ampforge/train/benchmark.h): zero_grad, forward under autocast for
fp16/bf16 (plain for fp32/tf32), the task's loss, backward (through the CUDA GradScaler for fp16),
optimizer step (SGD momentum 0.9 or AdamW, lr 1e-3), on a fixed synthetic batch of the same shapes. The
reference models are defined as ampforge's are (torchvision's resnet50; the small CNN of models/small.cpp) and
report their parameter count, so a reader can check both sides train the same model. PyTorch runs at its best:
for image models both memory formats are timed and the faster is "best". CUDA steps are timed with CUDA
events; "fp32" is true FP32 (TF32 off for cuBLAS and cuDNN), "tf32" turns both on. A run that cannot work
(e.g. PyTorch 1.13's CPU autocast has no float16, a package missing) prints {"error": ...} and exits 0, so the
caller shows it; a memory format that fails while the other runs is named in "errors".
"""
import argparse
import contextlib
import gc
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F


def small_cnn(image_size, classes=10):
    s = image_size // 4
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * s * s, 128), nn.ReLU(), nn.Linear(128, classes))


def classification(model, channels, image_size, classes, batch, device, memory_format):
    """(model, batch, loss_fn) for an image classifier on N(0,1) images and spread labels."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(batch, channels, image_size, image_size, generator=g)
    y = torch.tensor([(i * 379 + 11) % classes for i in range(batch)])
    model = model.to(device)
    x, y = x.to(device), y.to(device)
    if memory_format == "channels_last":
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    return model, (x, y), lambda m, b: F.cross_entropy(m(b[0]), b[1])


# The reference models of the parity goldens (scripts/gen_bert_golden.py, scripts/gen_yolo_golden.py): Hugging
# Face's BERT and Ultralytics' YOLOv8 restated in torch.nn, the definitions ampforge's parity tests compare with.
SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
BERT = {"bert-base": (12, 768, 12, 3072), "bert-mini": (4, 256, 4, 1024), "bert-tiny": (2, 128, 2, 512)}


def reference(module):
    if not (SCRIPTS / (module + ".py")).exists():
        raise ValueError(f"the reference models ({module}.py) are in the source tree's scripts/, not found at {SCRIPTS}")
    sys.path.insert(0, str(SCRIPTS))
    return __import__(module)


def masked_lm(name, a):
    """BERT masked LM: [CLS] ids [SEP], 15% of the positions masked, the head at the masked rows only (as
    ampforge's default and NVIDIA's recipe)."""
    ref = reference("gen_bert_golden")
    c = ref.Config(*BERT[name], dropout=0.1)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(104, c.vocab_size, (a.batch, a.seq_len), generator=g)
    ids[:, 0], ids[:, -1] = 101, 102
    sel = torch.rand(a.batch, a.seq_len, generator=g) < 0.15
    sel[:, 0] = sel[:, -1] = False
    labels = torch.where(sel, ids, torch.full_like(ids, -100))
    ids = torch.where(sel, torch.full_like(ids, 103), ids)
    mask = torch.ones_like(ids)
    model = ref.BertForMaskedLM(c).to(a.device)
    ids, mask, labels = ids.to(a.device), mask.to(a.device), labels.to(a.device)

    def loss_fn(m, b):
        seq = m.bert(b[0], b[1])
        pos = (b[2].view(-1) != -100).nonzero().squeeze(1)
        rows = seq.reshape(-1, c.hidden_size).index_select(0, pos)
        return F.cross_entropy(m.cls.predictions(rows).float(), b[2].view(-1)[pos])
    return model, (ids, mask, labels), loss_fn


def detection(name, a, memory_format):
    """YOLOv8 with the v8 detection loss: [0, 1) images, four boxes per image (as ampforge's workload)."""
    ref = reference("gen_yolo_golden")
    size = a.image_size or 640
    model = ref.DetectionModel(name[-1], 80, 3).to(a.device)
    g = torch.Generator().manual_seed(1)
    x = torch.rand(a.batch, 3, size, size, generator=g)
    u = torch.rand(a.batch, 4, 4, generator=g)
    cls = torch.tensor([(i * 7 + 3) % 80 for i in range(a.batch * 4)], dtype=torch.float32).view(a.batch, 4, 1)
    t = torch.cat([cls, 0.2 + 0.6 * u[..., :2], 0.05 + 0.3 * u[..., 2:]], -1)
    x, t = x.to(a.device), t.to(a.device)
    if memory_format == "channels_last":
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    strides = model.model[22].stride  # a plain attribute: stays on the CPU (read as Python numbers and a scalar)

    def loss_fn(m, b):
        feats = [f.float() for f in m(b[0])]
        return ref.detection_loss(feats, strides, b[1], 80, torch.float32)[0]
    return model, (x, t), loss_fn


def build(name, a, memory_format):
    """The reference model and its synthetic batch; image models only take a memory format."""
    if name in BERT:
        return masked_lm(name, a)
    if name.startswith("yolov8") and len(name) == 7:
        return detection(name, a, memory_format)
    if name == "cnn":
        size = a.image_size or 28
        return classification(small_cnn(size), 1, size, 10, a.batch, a.device, memory_format)
    if name.startswith("resnet") or name.startswith("resnext") or name.startswith("wide_resnet"):
        import torchvision
        size = a.image_size or 224
        return classification(getattr(torchvision.models, name)(), 3, size, 1000, a.batch, a.device, memory_format)
    raise ValueError(f"the peer has no reference model for '{name}'")


def prepare(a, memory_format):
    """The model, optimizer and one training step of `a` in `memory_format`: (step, parameters, losses, cuda)."""
    torch.manual_seed(0)
    model, batch, loss_fn = build(a.model, a, memory_format)
    model.train()
    params = sum(p.numel() for p in model.parameters())
    if a.optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    cuda = a.device.startswith("cuda")
    dev_type = "cuda" if cuda else "cpu"
    amp = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(a.precision)
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = a.precision == "tf32"
        torch.backends.cudnn.allow_tf32 = a.precision == "tf32"
        torch.backends.cudnn.benchmark = True
    elif a.precision == "tf32":
        raise RuntimeError("tf32 is a CUDA tensor-core mode")
    # torch.amp.GradScaler("cuda") from PyTorch 2.3 (torch.cuda.amp.GradScaler is deprecated there: a FutureWarning);
    # the same class under its old name before.
    fp16_scaling = cuda and a.precision == "fp16"
    if hasattr(torch.amp, "GradScaler"):
        scaler = torch.amp.GradScaler("cuda", enabled=fp16_scaling)
    else:
        scaler = torch.cuda.amp.GradScaler(enabled=fp16_scaling)
    if not cuda and a.precision == "fp16":
        # PyTorch 1.13's CPU autocast supports bfloat16 only; a newer one may accept float16.
        with torch.autocast("cpu", dtype=torch.float16):
            pass
    losses = []

    def step():
        opt.zero_grad(set_to_none=False)
        with torch.autocast(dev_type, dtype=amp) if amp is not None else contextlib.nullcontext():
            loss = loss_fn(model, batch)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        losses.append(loss.detach())
    return step, params, losses, cuda


def timed_cpu_step(step):
    t0, c0 = time.perf_counter(), time.process_time()
    step()
    return time.perf_counter() - t0, time.process_time() - c0


def summary(times, cpu, params, losses, batch):
    med = statistics.median(times)
    out = {"seconds": times, "median": med, "mean": statistics.fmean(times), "samples_per_sec": batch / med,
           "parameters": params, "last_loss": float(losses[-1].float().cpu())}
    if cpu:
        out["cpu_median"] = statistics.median(cpu)
    return out


def release_cached(device):
    """Gives the caching allocator's free blocks back and restarts its peaks, as ampforge's bench does for its own
    (src/ampforge/train/benchmark.cpp), so that both memory columns hold what the steps need."""
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)


def run(a, memory_format):
    if a.device.startswith("cuda"):
        gc.collect()  # the other memory format's model, optimizer and activations, then their cached blocks
        torch.cuda.empty_cache()
    step, params, losses, cuda = prepare(a, memory_format)
    # CUDA: the cache is emptied and the peaks restarted before the last warm-up step, as ampforge does: that step
    # pays the cudaMalloc calls (not the first timed one) and the first warm-up step's cuDNN algorithm search (its
    # trial workspaces) stays out of the peaks; with a single warm-up step, after it.
    release_before = a.warmup - 1 if cuda and a.warmup >= 2 else -1
    for i in range(a.warmup):
        if i == release_before:
            release_cached(a.device)
        step()
    times, cpu = [], []
    if cuda:
        torch.cuda.synchronize(a.device)
        if release_before < 0:
            release_cached(a.device)
        # Recorded on the current stream of the current device (main() selects a.device): the stream the steps use.
        events = [torch.cuda.Event(enable_timing=True) for _ in range(a.steps + 1)]
        events[0].record()
        for i in range(a.steps):
            step()
            events[i + 1].record()
        torch.cuda.synchronize(a.device)
        times = [events[i].elapsed_time(events[i + 1]) * 1e-3 for i in range(a.steps)]
    else:
        for _ in range(a.steps):
            t, c = timed_cpu_step(step)
            times.append(t)
            cpu.append(c)
    out = summary(times, cpu, params, losses, a.batch)
    if cuda:
        out["peak_allocated_bytes"] = torch.cuda.max_memory_allocated(a.device)
        out["peak_reserved_bytes"] = torch.cuda.max_memory_reserved(a.device)
    return out


def serve(a, formats, out):
    """--serve (CPU): one step per format for each "step" line on stdin, so that the caller can interleave its own
    steps with ours and both sides are timed in the same seconds of a machine whose speed drifts. Prints one JSON
    line when ready (after the warm-up steps), one per "step" ({"seconds": {format: s}}), and the usual result
    object (all formats' steps, "best") at "quit" or end of input."""
    if a.device != "cpu":
        raise ValueError("--serve is for the CPU (CUDA steps are timed with CUDA events, in one process)")
    sides = {}
    for fmt in formats:
        step, params, losses, _ = prepare(a, fmt)
        for _ in range(a.warmup):
            step()
        sides[fmt] = (step, params, losses, [], [])
    print(json.dumps({"ready": True, "formats": formats}), flush=True)
    for line in sys.stdin:
        if line.strip() != "step":
            break
        got = {}
        for fmt, (step, _, _, times, cpu) in sides.items():
            t, c = timed_cpu_step(step)
            times.append(t)
            cpu.append(c)
            got[fmt] = t
        print(json.dumps({"seconds": got}), flush=True)
    for fmt, (_, params, losses, times, cpu) in sides.items():
        if times:
            out["results"][fmt] = summary(times, cpu, params, losses, a.batch)


def reason(e):
    """An exception's first line, for the table; its type too where the message alone would not say what failed
    (ModuleNotFoundError: No module named 'torchvision')."""
    msg = (str(e).strip().splitlines() or [""])[0]
    if msg and isinstance(e, (RuntimeError, ValueError, AssertionError)):
        return msg
    return f"{type(e).__name__}: {msg}" if msg else type(e).__name__


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--precision", choices=["fp32", "tf32", "fp16", "bf16"], default="fp32")
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--image-size", type=int, default=0)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--optimizer", choices=["sgd", "adamw"], default="sgd")
    p.add_argument("--memory-format", choices=["nchw", "channels_last", "both"], default="both")
    p.add_argument("--serve", action="store_true",
                   help="CPU: after the warm-up, time one step per memory format for each 'step' line on stdin")
    a = p.parse_args()
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    out = {"torch": torch.__version__, "threads": torch.get_num_threads(), "device": a.device, "results": {}}
    formats = ["nchw", "channels_last"] if a.memory_format == "both" else [a.memory_format]
    if a.model in BERT:
        formats = ["default"]  # token ids: no memory format
    try:
        if a.device.startswith("cuda") and torch.cuda.is_available():
            dev = torch.device(a.device)
            # The current device is what the timing events, synchronize(), empty_cache() and the memory statistics
            # act on by default: for cuda:N it must be N, not 0.
            if dev.index is not None:
                torch.cuda.set_device(dev)
            out["gpu"] = torch.cuda.get_device_name(dev)
        if a.serve:
            serve(a, formats, out)
        else:
            for fmt in formats:
                try:
                    out["results"][fmt] = run(a, fmt)
                except Exception as e:  # e.g. out of memory in one format: the other may still run
                    out.setdefault("errors", {})[fmt] = reason(e)
        if not out["results"]:
            raise ValueError(next(iter(out.get("errors", {}).values()), "no step was timed"))
        out["best"] = min(out["results"], key=lambda k: out["results"][k]["median"])
    except Exception as e:  # a missing package (torchvision, numpy) too: the caller shows the reason
        out["error"] = reason(e)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
