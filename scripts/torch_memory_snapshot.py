#!/usr/bin/env python3
"""Records a PyTorch memory snapshot of a real training run, for `ampforge memory replay` / `memory explain`.

usage: python3 scripts/torch_memory_snapshot.py OUT.pickle [--model resnet50] [--batch 256] [--steps 6]
                                                 [--image-size 224] [--expandable] [--ampforge-alloc LIB.so]

Trains torchvision's MODEL with automatic mixed precision (float16 autocast + GradScaler, SGD with momentum,
channels-last) on random data for STEPS steps on cuda:0, recording every allocation the way a user would
(docs/MEMORY.md, "PyTorch snapshots"):

    torch.cuda.memory._record_memory_history(max_entries=...)
    ... train ...
    torch.cuda.memory._dump_snapshot(OUT)

An out-of-memory error is caught and recorded (the snapshot then holds its `oom` entry) and the script still
writes the snapshot and exits 0; a machine without CUDA or torchvision exits 2 with a message. Prints one JSON line:
the versions, the run's peak allocated/reserved as PyTorch counts them, steps done, whether it ran out of memory.
--expandable sets PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True before CUDA starts. --ampforge-alloc LIB.so trains
with ampforge's caching allocator instead (libampforge_torch_alloc.so through CUDAPluggableAllocator, installed before
the first CUDA allocation): PyTorch records no snapshot then (unsupported under a pluggable allocator), and the JSON
line carries the allocator's own figures (af_torch_stats_json) instead. scripts/gpu-check runs it.
"""
import argparse
import json
import os
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--expandable", action="store_true")
    ap.add_argument("--max-entries", type=int, default=1_000_000)
    ap.add_argument("--ampforge-alloc", default="")
    a = ap.parse_args()
    if a.expandable:
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    try:
        import torch
        import torchvision
    except ImportError as e:
        print(f"torch_memory_snapshot: {e} (needs torch and torchvision)", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("torch_memory_snapshot: no CUDA device", file=sys.stderr)
        return 2
    lib = None
    if a.ampforge_alloc:
        import ctypes
        alloc = torch.cuda.memory.CUDAPluggableAllocator(a.ampforge_alloc, "af_torch_malloc", "af_torch_free")
        torch.cuda.memory.change_current_allocator(alloc)
        lib = ctypes.CDLL(a.ampforge_alloc)
        lib.af_torch_stats_json.restype = ctypes.c_char_p
    dev = torch.device("cuda", 0)
    torch.manual_seed(0)
    if lib is None:
        torch.cuda.memory._record_memory_history(max_entries=a.max_entries)
    model = getattr(torchvision.models, a.model)(num_classes=1000).to(dev, memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scaler = torch.amp.GradScaler("cuda")
    x = torch.randn(a.batch, 3, a.image_size, a.image_size, device=dev).to(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (a.batch,), device=dev)
    oom = None
    steps = 0
    t0 = time.time()
    try:
        for _ in range(a.steps):
            with torch.autocast("cuda", dtype=torch.float16):
                loss = torch.nn.functional.cross_entropy(model(x), y)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad(set_to_none=True)
            steps += 1
        torch.cuda.synchronize()
    except torch.cuda.OutOfMemoryError as e:
        oom = str(e).splitlines()[0][:300]
    if lib is not None:
        stats = json.loads(lib.af_torch_stats_json(0).decode())
        print(json.dumps({"torch": torch.__version__, "model": a.model, "batch": a.batch, "steps_done": steps,
                          "seconds": round(time.time() - t0, 2), "oom": oom, "allocator": "ampforge",
                          "peak_requested": stats.get("requested_bytes", {}).get("peak"),
                          "peak_reserved": stats.get("reserved_bytes", {}).get("peak"), "stats": stats}))
        return 0
    torch.cuda.memory._dump_snapshot(a.out)
    torch.cuda.memory._record_memory_history(enabled=None)
    print(json.dumps({
        "torch": torch.__version__, "torchvision": torchvision.__version__, "gpu": torch.cuda.get_device_name(0),
        "model": a.model, "batch": a.batch, "steps_done": steps, "seconds": round(time.time() - t0, 2),
        "expandable_segments": a.expandable, "oom": oom,
        "max_memory_allocated": torch.cuda.max_memory_allocated(dev),
        "max_memory_reserved": torch.cuda.max_memory_reserved(dev),
        "snapshot": a.out, "snapshot_bytes": os.path.getsize(a.out)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
