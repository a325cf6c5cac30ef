#!/usr/bin/env python3
"""Generates the ResNet parity goldens from torchvision, one set per reference version.

usage: /usr/bin/python3 scripts/gen_resnet_golden.py OUT_DIR          (Debian's PyTorch 1.13 + torchvision 0.14)
       .venv-peer/bin/python scripts/gen_resnet_golden.py OUT_DIR     (PyTorch 2.14 + torchvision 0.29)
       (OUT_DIR: tests/data/models)
Writes, with STEM = resnet_parity for torchvision 0.14 (the continuity set) and resnet_parity_tv<MAJOR><MINOR>
for any other torchvision (resnet_parity_tv029 for 0.29):
  STEM.safetensors            torchvision's numbers for ResNet-18 and ResNet-50 (below), ~0.9 MB
  STEM.json                   what was generated, how, and with which versions (python, torch, torchvision,
                              numpy, oneDNN, CPU capability, threads, the measured BF16 conv error: below)
  torchvision_state_dicts.json  (torchvision 0.14 only) torchvision's exact state-dict keys, shapes and dtypes,
                              in order, for resnet18, resnet50 and resnext50_32x4d (ampforge's resnet_test.cpp
                              compares). Other versions compare theirs with that file and record the result in
                              STEM.json ("state_dicts"); where they differ, they also write
                              torchvision_state_dicts_tv<MAJOR><MINOR>.json.
Called by scripts/gen_golden.sh (both interpreters); commit the files. The C++ test (src/ampforge/models/
resnet_parity_test.cpp) never runs Python and checks every set. Runs offline (weights=None: no download) on one
thread (torch.set_num_threads(1)).

BF16 depends on the CPU as well as on the version: PyTorch 1.13 runs BF16 convolutions through oneDNN only on
CPUs with AVX-512 (BW/VL/DQ); without it (AVX2) its fallback convolution is 7-15 BF16 ulps of the max off for a
3x3 convolution with 64 channels where 2.14 (and 1.13 with AVX-512) are within 1 ulp, and ResNet-50's BF16
train-mode logits move by 18% of their max. The committed 0.14 set was made with AVX-512 (its BF16 is as
accurate as 2.14's); STEM.json records the probe ("bf16_conv_error_ulps") and the script warns above 2 ulps: such
a set is a much weaker BF16 reference (resnet_parity_test.cpp checks ampforge's BF16 accuracy relative to it).

The two sets (0.14 made with AVX-512, 0.29 on an AVX2 EPYC, 2026-12): torchvision's ResNet code is the same (type
hints aside), as are the state dicts (keys, order, shapes, dtypes) and the hashed weights, input and labels. F32
agrees to rounding (logits 4.4e-6 of their max, eval-mode gradient samples 6e-7 of the largest), F64 to 1e-14.
BF16 differs by noise: ResNet-50's train-mode logits by 3.2% of their max (4 BF16 eps), its gradient samples by
up to 53% of the largest, while both are equally far from the F32 / F64 answers (logits 0.0143 vs 0.0148 RMS of
the max, gradient samples 0.200 vs 0.196). Autocast casts the same modules (conv, linear to BF16; BN, ReLU, pooling
follow their BF16 input; the loss in F32) in both versions.

Weights are not stored (ResNet-50's are 100 MB). Both sides compute them, and the input, from one integer
formula that numpy (uint64 arithmetic) and C++ evaluate bit-identically:

  splitmix64(z):  z += 0x9E3779B97F4A7C15; z = (z ^ z>>30) * 0xBF58476D1CE4E5B9;
                  z = (z ^ z>>27) * 0x94D049BB133111EB; return z ^ z>>31          (mod 2^64)
  u(s, i)      =  (2 * (splitmix64(s * 2^40 + i) >> 40) + 1 - 2^24) / 2^24  in (-1, 1), exact in F32
  value        =  float32(c + a * u(s, i)) computed in float64 (c, a per tensor, below)

  s = 1 + the tensor's index in state_dict() order; i = the element's row-major index.
  conv weight (4-D)           c 0, a = sqrt(6 / fan_in)         (Kaiming-uniform variance 2 / fan_in)
  linear weight (2-D)         c 0, a = 1 / sqrt(in_features)    (nn.Linear's bound)
  bias beside a 2-D weight    c 0, a = 1 / sqrt(in_features)
  BN weight / bias            c 0.25, a 0.05 / c 0.1, a 0.05 (why: below)
  BN running_mean / _var      c 0, a 0.1  / c 1, a 0.5
  num_batches_tracked         0
  input x (2, 3, 64, 64)      s = 2^20, c 0, a 1
  labels y (2)                splitmix64((2^20 + 1) * 2^40 + i) mod 1000

Why BN weights around 0.25 and biases around +0.1 (not torchvision's 1 and 0): with weights ~1 and biases
~0 the problem itself is ill-conditioned at this size: PyTorch's own F32 gradients of ResNet-50 differ from
its F64 gradients by up to 8% of a tensor's largest gradient (train-mode BN over few positions cancels,
ReLUs near 0 flip under rounding), so no two F32 implementations could agree to a rounding-derived
tolerance. With 0.25 / +0.1 (small residual-branch scales, as trained ResNets have) PyTorch's F32 gradients
match its F64 ones to 6.4e-5 (ResNet-50) and 1.5e-5 (ResNet-18) of the tensor's max, while the network is
the same code. BF16 gradients stay noise-dominated on both sides (PyTorch's BF16 vs F64: errors around
1x the tensor's max gradient), which is why resnet_parity_test.cpp checks BF16 gradients for accuracy
against the F32 answer relative to PyTorch's BF16, not elementwise.

That match holds for rounding-level differences only: a relative perturbation of 1e-5 of one layer1
convolution's output (5e-7: none) moves PyTorch's own train-mode F32 gradients of ResNet-18 by up to 28% of a
tensor's max (scripts measured in the 2026-12-02 session; batch statistics over few positions amplify it), and
other correct F32 paths differ by that much: oneDNN's Winograd kernels (their transform rounds at ~1e-5), or
OpenBLAS's Haswell SGEMM instead of its SkylakeX one under the im2col path for ResNet-50. Hence the test pins
train-mode gradients in F64 (ampforge's model in F64 against torchvision's in F64, where rounding is 1e-16)
and checks F32 gradients in eval mode (running statistics: PyTorch's gradients move by 1e-5 of the max under
the same 1e-5 perturbation), on every convolution path.

Recorded per model, in F32, under torch.autocast("cpu", torch.bfloat16) ("bf16") and in F64 ("f64"; values in
F64):
  <model>.<prec>.logits_eval    eval-mode logits of the initial weights (no grad)
  <model>.<prec>.logits_train   train-mode logits (batch statistics)
  <model>.<prec>.loss           cross-entropy of logits_train and y (mean)
  <model>.<prec>.grad_sum / grad_abs_sum / grad_l2 / grad_absmax   (P,) F64 per parameter, named_parameters order
  <model>.<prec>.grad_index     (P, 32) I64 sample positions (splitmix64(s * 2^40 + 2^39 + k) mod numel)
  <model>.<prec>.grad_sample    (P, 32) F32 the gradient at those positions
  <model>.<prec>.running_mean / running_var   every BN's statistics after the train-mode forward, concatenated
  <model>.<prec>.num_batches_tracked          every BN's counter (I64)
  <model>.f32.eval_grad_*       the grad_* records of an eval-mode forward + backward after the train step
                                (positions: grad_index)
  <model>.f64.*                 logits_train, loss and the grad_* records but grad_index (F64 samples)
  <model>.weight_sum            (S,) F64 sum of each state tensor's hashed values (checks the formula)
  <model>.x_sum                 () F64 sum of the input
"""
import datetime
import json
import math
import platform
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
import torchvision

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gen_golden import write_safetensors  # noqa: E402  (the same ~20-line numpy writer)

U64 = np.uint64
M64 = (1 << 64) - 1
INPUT_STREAM = 1 << 20
LABEL_STREAM = INPUT_STREAM + 1
SAMPLE_OFFSET = 1 << 39
SAMPLES = 32
BATCH, CHANNELS, SIZE, CLASSES = 2, 3, 64, 1000
MODELS = ["resnet18", "resnet50"]
SHAPE_MODELS = ["resnet18", "resnet50", "resnext50_32x4d"]
CONTINUITY_TORCHVISION = (0, 14)   # the set named plain resnet_parity (Debian's python3-torchvision)
SHAPES_FILE = "torchvision_state_dicts.json"


def torchvision_version():
    major, minor = torchvision.__version__.split("+")[0].split(".")[:2]
    return int(major), int(minor)


def golden_stem():
    """resnet_parity for torchvision 0.14, resnet_parity_tv029 for 0.29."""
    v = torchvision_version()
    return "resnet_parity" if v == CONTINUITY_TORCHVISION else f"resnet_parity_tv{v[0]}{v[1]:02d}"


def splitmix64(z):
    """z: np.uint64 array; wraps mod 2^64 like the C++ side."""
    z = z + U64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> U64(30))) * U64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> U64(27))) * U64(0x94D049BB133111EB)
    return z ^ (z >> U64(31))


def hash_unit(stream, n):
    i = np.arange(n, dtype=np.uint64)
    h = splitmix64(U64(stream << 40) + i)
    return (2.0 * (h >> U64(40)).astype(np.float64) + 1.0 - 2.0 ** 24) / 2.0 ** 24


def hashed(stream, shape, c, a):
    n = int(np.prod(shape)) if len(shape) else 1
    return (c + a * hash_unit(stream, n)).astype(np.float32).reshape(shape)


def init_rule(name, shape, state_shapes):
    """(c, a) for a state tensor, or None for num_batches_tracked. Mirrors resnet_parity_test.cpp."""
    prefix, leaf = name.rsplit(".", 1) if "." in name else ("", name)
    if leaf == "num_batches_tracked":
        return None
    if len(shape) == 4:
        return 0.0, math.sqrt(6.0 / (shape[1] * shape[2] * shape[3]))
    if len(shape) == 2:
        return 0.0, 1.0 / math.sqrt(shape[1])
    w = state_shapes.get(prefix + ".weight")
    if leaf == "bias" and w is not None and len(w) == 2:
        return 0.0, 1.0 / math.sqrt(w[1])
    return {"weight": (0.25, 0.05), "bias": (0.1, 0.05), "running_mean": (0.0, 0.1), "running_var": (1.0, 0.5)}[leaf]


def set_hashed_weights(model):
    sd = model.state_dict()
    shapes = {k: list(v.shape) for k, v in sd.items()}
    sums = []
    with torch.no_grad():
        for idx, (name, t) in enumerate(sd.items()):
            rule = init_rule(name, list(t.shape), shapes)
            if rule is None:
                t.zero_()
                sums.append(0.0)
                continue
            v = hashed(idx + 1, list(t.shape), *rule)
            t.copy_(torch.from_numpy(v))
            sums.append(float(v.astype(np.float64).sum()))
    return np.array(sums, dtype=np.float64)


def make_input():
    x = hashed(INPUT_STREAM, [BATCH, CHANNELS, SIZE, SIZE], 0.0, 1.0)
    h = splitmix64(U64(LABEL_STREAM << 40) + np.arange(BATCH, dtype=np.uint64))
    y = (h % U64(CLASSES)).astype(np.int64)
    return torch.from_numpy(x), torch.from_numpy(y)


def sample_index(stream, numel):
    h = splitmix64(U64(stream << 40) + U64(SAMPLE_OFFSET) + np.arange(SAMPLES, dtype=np.uint64))
    return (h % U64(numel)).astype(np.int64)


def bn_layers(model):
    return [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]


def grad_record(model, sd_names, prefix, sample_dtype):
    """Per-parameter gradient summaries and samples (the layout documented above), keys prefixed; parameters without
    gradients (frozen: YOLOv8's DFL bins) are left out. Shared by gen_bert_golden.py and gen_yolo_golden.py."""
    out = {}
    sums, abs_sums, l2s, maxes, idxs, samples = [], [], [], [], [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        g = p.grad.detach().double().reshape(-1)
        sums.append(g.sum().item())
        abs_sums.append(g.abs().sum().item())
        l2s.append(g.norm().item())
        maxes.append(g.abs().max().item())
        ix = sample_index(sd_names.index(name) + 1, g.numel())
        idxs.append(ix)
        samples.append(p.grad.detach().reshape(-1)[torch.from_numpy(ix)].to(sample_dtype))
    out[prefix + "grad_sum"] = torch.tensor(sums, dtype=torch.float64)
    out[prefix + "grad_abs_sum"] = torch.tensor(abs_sums, dtype=torch.float64)
    out[prefix + "grad_l2"] = torch.tensor(l2s, dtype=torch.float64)
    out[prefix + "grad_absmax"] = torch.tensor(maxes, dtype=torch.float64)
    out[prefix + "grad_index"] = torch.from_numpy(np.stack(idxs))
    out[prefix + "grad_sample"] = torch.stack(samples)
    return out


def run(model_name, prec):
    """prec: "f32", "bf16" (autocast) or "f64" (model and input in float64)."""
    model = getattr(torchvision.models, model_name)(weights=None, num_classes=CLASSES)
    weight_sum = set_hashed_weights(model)
    x, y = make_input()
    f64 = prec == "f64"
    if f64:
        model = model.double()
        x = x.double()
    sample_dtype = torch.float64 if f64 else torch.float32
    sd_names = list(model.state_dict().keys())
    ctx = torch.autocast("cpu", dtype=torch.bfloat16) if prec == "bf16" else torch.autocast("cpu", enabled=False)
    model.eval()
    with torch.no_grad(), ctx:
        logits_eval = model(x).to(sample_dtype)
    model.train()
    with ctx:
        logits = model(x)
        loss = F.cross_entropy(logits, y)
    loss.backward()
    out = {"logits_eval": logits_eval, "logits_train": logits.detach().to(sample_dtype),
           "loss": loss.detach().to(sample_dtype)}
    out.update(grad_record(model, sd_names, "", sample_dtype))
    bns = bn_layers(model)
    out["running_mean"] = torch.cat([m.running_mean.detach().to(sample_dtype) for m in bns])
    out["running_var"] = torch.cat([m.running_var.detach().to(sample_dtype) for m in bns])
    out["num_batches_tracked"] = torch.stack([m.num_batches_tracked.detach() for m in bns])
    if f64:
        # Only what F32 cannot pin: the train-mode loss, logits and gradients (forward values and running
        # statistics are well conditioned and checked in F32; sample positions are the F32 record's).
        out = {k: v for k, v in out.items() if k in ("logits_train", "loss") or
               (k.startswith("grad_") and k != "grad_index")}
    if prec == "f32":
        # Eval-mode gradients (running statistics, as updated by the train step above): well conditioned in
        # F32, unlike the train-mode ones (module docstring), so they pin every convolution path's gradients.
        model.zero_grad(set_to_none=True)
        model.eval()
        F.cross_entropy(model(x), y).backward()
        out.update({k: v for k, v in grad_record(model, sd_names, "eval_", sample_dtype).items()
                    if k != "eval_grad_index"})
    info = {"parameters": [n for n, _ in model.named_parameters()], "state_dict": sd_names,
            "loss": loss.item(), "labels": y.tolist(),
            "logits_train_absmax": logits.detach().abs().max().item(),
            "logits_eval_absmax": logits_eval.abs().max().item()}
    return out, weight_sum, float(x.double().sum().item()), info


def state_dict_shapes(model_name):
    model = getattr(torchvision.models, model_name)(weights=None)
    return [{"key": k, "shape": list(v.shape), "dtype": str(v.dtype).replace("torch.", "")}
            for k, v in model.state_dict().items()]


def build_config():
    """The lines of torch.__config__.show() that say which kernels ran (oneDNN version, CPU capability)."""
    keep = ("MKL-DNN", "oneDNN", "CPU capability")
    return [line.strip(" -") for line in torch.__config__.show().splitlines() if any(k in line for k in keep)]


def bf16_conv_error_ulps():
    """Max error of one BF16 3x3 convolution (64 channels) vs F64 on the same BF16 inputs, in BF16 ulps (2^-8) of
    the result's max |value|: ~1 for a kernel that accumulates in F32 and rounds once; PyTorch 1.13 without
    AVX-512 (no oneDNN BF16) gives 7-15 (module docstring)."""
    x = torch.from_numpy(hashed(3 << 20, [2, 64, 16, 16], 0.0, 1.0)).bfloat16()
    w = torch.from_numpy(hashed((3 << 20) + 1, [64, 64, 3, 3], 0.0, math.sqrt(6.0 / 576))).bfloat16()
    y = F.conv2d(x, w, padding=1).double()
    ref = F.conv2d(x.double(), w.double(), padding=1)
    return float((y - ref).abs().max() / ref.abs().max()) * 2.0 ** 8


def compare_state_dict_shapes(out_dir, shapes):
    """For a non-continuity torchvision: are its state dicts the ones in torchvision_state_dicts.json?"""
    try:
        ref = json.loads((out_dir / SHAPES_FILE).read_text())
    except FileNotFoundError:
        return {"file": SHAPES_FILE, "equal": None, "note": "no such file to compare with"}
    equal = ref["models"] == shapes["models"]
    rec = {"file": SHAPES_FILE, "torchvision": ref.get("torchvision"), "equal": equal}
    if not equal:
        v = torchvision_version()
        own = f"torchvision_state_dicts_tv{v[0]}{v[1]:02d}.json"
        (out_dir / own).write_text(json.dumps(shapes, indent=0) + "\n")
        rec["differs_see"] = own
        print(f"warning: torchvision {torchvision.__version__}'s state dicts differ from {SHAPES_FILE}; "
              f"wrote {own}", file=sys.stderr)
    return rec


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    out_dir = Path(sys.argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    stem = golden_stem()
    conv_ulps = bf16_conv_error_ulps()
    if conv_ulps > 2:
        print(f"warning: PyTorch {torch.__version__}'s BF16 convolution is {conv_ulps:.1f} BF16 ulps off on this CPU "
              f"(1 expected): the BF16 goldens will be a weak reference (docstring)", file=sys.stderr)
    tensors, manifest = [], {"generator": "scripts/gen_resnet_golden.py", "torch": torch.__version__,
                             "torchvision": torchvision.__version__, "numpy": np.__version__,
                             "python": platform.python_version(), "torch_build": build_config(),
                             "threads": torch.get_num_threads(), "bf16_conv_error_ulps": round(conv_ulps, 3),
                             "date": datetime.date.today().isoformat(),
                             "input": [BATCH, CHANNELS, SIZE, SIZE], "classes": CLASSES, "samples": SAMPLES,
                             "models": {}}
    for name in MODELS:
        entry = {}
        for prec in ("f32", "bf16", "f64"):
            out, weight_sum, x_sum, info = run(name, prec)
            for k, v in out.items():
                tensors.append((f"{name}.{prec}.{k}", v))
            entry[prec] = {k: info[k] for k in ("loss", "labels", "logits_train_absmax", "logits_eval_absmax")}
            entry["parameters"] = info["parameters"]
            entry["state_dict"] = info["state_dict"]
        tensors.append((f"{name}.weight_sum", torch.from_numpy(weight_sum)))
        tensors.append((f"{name}.x_sum", torch.tensor(x_sum, dtype=torch.float64)))
        manifest["models"][name] = entry
    shapes = {"generator": "scripts/gen_resnet_golden.py", "torchvision": torchvision.__version__,
              "models": {m: state_dict_shapes(m) for m in SHAPE_MODELS}}
    if stem == "resnet_parity":
        (out_dir / SHAPES_FILE).write_text(json.dumps(shapes, indent=0) + "\n")
    else:
        manifest["state_dicts"] = compare_state_dict_shapes(out_dir, shapes)
    write_safetensors(out_dir / f"{stem}.safetensors", tensors,
                      {"generator": "scripts/gen_resnet_golden.py", "torch": torch.__version__,
                       "torchvision": torchvision.__version__})
    (out_dir / f"{stem}.json").write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"{out_dir / stem}.*: torch {torch.__version__}, torchvision {torchvision.__version__}")
    for name in MODELS:
        print(f"{name}: f32 loss {manifest['models'][name]['f32']['loss']:.6f}, "
              f"bf16 loss {manifest['models'][name]['bf16']['loss']:.6f}, "
              f"f64 loss {manifest['models'][name]['f64']['loss']:.9f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
