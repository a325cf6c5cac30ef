#!/usr/bin/env python3
"""Converts a torchvision model's state dict (or a .pth file) to safetensors that ampforge loads by name.

usage:
  /usr/bin/python3 scripts/torchvision_to_safetensors.py --model resnet50 [--weights DEFAULT] OUT.safetensors
  /usr/bin/python3 scripts/torchvision_to_safetensors.py --pth resnet50-0676ba61.pth OUT.safetensors
options:
  --model NAME       a torchvision.models builder (resnet18, resnet50, ...)
  --weights W        torchvision weights enum entry for --model ("DEFAULT", "IMAGENET1K_V2"); torchvision
                     downloads them (or finds them in $TORCH_HOME). Without it: torchvision's random init
                     (torch.manual_seed(--seed) first), for checking structures on a machine without weights.
  --num-classes N    with --model and no --weights: the classifier size (default 1000)
  --pth FILE         a file saved with torch.save: a state dict, or a checkpoint holding one under
                     "state_dict", "model" or "model_state_dict"
  --strip-prefix P   drop P from the keys that start with it (DistributedDataParallel's "module.")
  --dtype D          f32 (default), f16 or bf16: floating tensors are stored in D; integer tensors
                     (num_batches_tracked) stay I64
Keys, their order and shapes are kept exactly (ampforge's ResNets use torchvision's names), so
  ampforge models resnet50 --load OUT.safetensors
prints nothing missing, unexpected or mis-shaped (and nn::load_safetensors(model, path) loads it in C++).
Needs torch and numpy (+ torchvision for --model); no safetensors package.
"""
import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gen_golden import write_safetensors  # noqa: E402  (numpy-only safetensors writer)

DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


def from_model(name, weights, num_classes, seed):
    import torchvision
    builder = getattr(torchvision.models, name, None)
    if builder is None or not callable(builder):
        raise SystemExit(f"torchvision.models has no model '{name}'")
    if weights:
        model = builder(weights=weights)
        source = f"torchvision.models.{name}(weights={weights})"
    else:
        torch.manual_seed(seed)
        model = builder(num_classes=num_classes)
        source = f"torchvision.models.{name}(num_classes={num_classes}), random init, torch.manual_seed({seed})"
    return model.state_dict(), source, torchvision.__version__


def from_pth(path):
    obj = torch.load(path, map_location="cpu")
    if isinstance(obj, torch.nn.Module):
        obj = obj.state_dict()
    if isinstance(obj, dict):
        for key in ("state_dict", "model", "model_state_dict"):
            if key in obj and isinstance(obj[key], dict):
                obj = obj[key]
                break
    if not isinstance(obj, dict) or not all(torch.is_tensor(v) for v in obj.values()):
        raise SystemExit(f"{path}: not a state dict (a dict of tensors) nor a checkpoint holding one")
    return obj, f"torch.load({path})", None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--model")
    src.add_argument("--pth")
    ap.add_argument("--weights")
    ap.add_argument("--num-classes", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--strip-prefix", default="")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="f32")
    ap.add_argument("out")
    a = ap.parse_args()
    if a.pth and a.weights:
        ap.error("--weights goes with --model")
    state, source, tv_version = from_model(a.model, a.weights, a.num_classes, a.seed) if a.model else from_pth(a.pth)
    tensors = []
    for key, t in state.items():
        if a.strip_prefix and key.startswith(a.strip_prefix):
            key = key[len(a.strip_prefix):]
        t = t.detach().cpu()
        if t.is_floating_point():
            t = t.to(DTYPES[a.dtype])
        tensors.append((key, t))
    meta = {"source": source, "converter": "scripts/torchvision_to_safetensors.py", "torch": torch.__version__}
    if tv_version:
        meta["torchvision"] = tv_version
    write_safetensors(a.out, tensors, meta)
    n = sum(t.numel() for _, t in tensors if not (t.dtype == torch.int64 and t.dim() == 0))
    print(f"{a.out}: {len(tensors)} tensors, {n:,} values ({source})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
