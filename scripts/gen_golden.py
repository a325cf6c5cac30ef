#!/usr/bin/env python3
"""Generates the parity harness's golden file from PyTorch (Debian's python3-torch 1.13 on the CPU).

usage: /usr/bin/python3 scripts/gen_golden.py DUMP_DIR OUT_DIR
  DUMP_DIR  output of ampforge_parity_dump: manifest.json + inputs.safetensors
  OUT_DIR   tests/parity/golden: writes golden.safetensors and golden.json

For each case of the manifest, the op name + attrs are mapped to the PyTorch call (OPS below), the inputs
are rebuilt exactly as the C++ side builds them (dtype, layout, requires_grad), and the outputs and the
input gradients for the case's grad_output (torch.autograd.grad) are recorded in F32, and in F16/BF16.
Where PyTorch 1.13's CPU kernels cannot run the op in 16 bits (no Half kernel for conv, matmul, softmax,
exp, ...; BF16 batch_norm refuses its F32 weight), the 16-bit golden is a reference computed instead of
PyTorch's 16-bit kernel: the inputs rounded to the 16-bit dtype (as the C++ side gets them), then the op
and its backward in F64, then each output and gradient rounded once to the dtype PyTorch would have given
it (output 0: the 16-bit dtype; further outputs such as batch_norm's running statistics: F32; a gradient:
its input's dtype). That is the correctly rounded answer an ideal 16-bit kernel gives; the cases made this
way are listed under "f64_reference" in golden.json.
The golden file embeds the manifest it was made from; the C++ test refuses a golden whose manifest
differs from the current sample list. Python-side dependencies: torch and numpy only (the safetensors
reader/writer below is ~40 lines, so no safetensors package is needed).
"""
import datetime
import json
import struct
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

# ---- safetensors (numpy) -------------------------------------------------------------------------------
NP_DTYPES = {"F32": "<f4", "F16": "<f2", "F64": "<f8", "I32": "<i4", "I64": "<i8", "U8": "u1", "BOOL": "?",
             "BF16": "<i2"}  # BF16 travels as raw 16-bit words (numpy has no bfloat16)
TORCH_TO_ST = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.float64: "F64",
               torch.int32: "I32", torch.int64: "I64", torch.uint8: "U8", torch.bool: "BOOL"}


def read_safetensors(path):
    data = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {})
    base = 8 + n
    out = {}
    for name, e in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        b, end = e["data_offsets"]
        arr = np.frombuffer(data[base + b:base + end], dtype=NP_DTYPES[e["dtype"]]).reshape(e["shape"]).copy()
        t = torch.from_numpy(arr)
        if e["dtype"] == "BF16":
            t = t.view(torch.bfloat16)
        out[name] = t
    return out, meta


def write_safetensors(path, tensors, metadata):
    header, blobs, pos = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    for name, t in tensors:
        t = t.detach().contiguous()
        st = TORCH_TO_ST[t.dtype]
        raw = (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy().tobytes()
        header[name] = {"dtype": st, "shape": list(t.shape), "data_offsets": [pos, pos + len(raw)]}
        blobs.append(raw)
        pos += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    tmp = Path(str(path) + ".tmp")
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
    tmp.replace(path)


# ---- op name + attrs -> torch ------------------------------------------------------------------------------
def _dims(a, x):
    return list(a["dims"]) if a["dims"] else list(range(x.dim()))


def _red(a):
    return a["reduction"]


def _batch_norm(a, x, w, b, rm=None, rv=None):
    y = F.batch_norm(x, rm, rv, w, b, training=a["training"], momentum=a["momentum"], eps=a["eps"])
    return [y, rm, rv] if (rm is not None and a["training"]) else [y]


def _dropout(a, x, mask=None):
    if mask is None:
        return [F.dropout(x, a["p"], a["training"])]
    # PyTorch's CPU dropout (ATen _dropout_impl): noise = bernoulli mask in x's dtype, noise /= (1 - p),
    # out = x * noise. The mask is ampforge's (an input), so only the arithmetic is PyTorch's.
    noise = mask.to(x.dtype)
    noise.div_(1 - a["p"])
    return [x * noise]


def _sdpa(a, q, k, v, mask=None):
    # torch 1.13 has no F.scaled_dot_product_attention: the definition, as ampforge composes it.
    scale = a["scale"] if a["scale"] != 0 else 1.0 / (q.shape[-1] ** 0.5)
    s = torch.matmul(q, k.transpose(-2, -1)) * scale
    if a["causal"]:
        tq, tk = s.shape[-2], s.shape[-1]
        keep = torch.ones(tq, tk, dtype=torch.bool).tril()
        s = s.masked_fill(~keep, float("-inf"))
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    return [torch.matmul(torch.softmax(s, -1), v)]


def _slice(a, x):
    idx = [slice(None)] * x.dim()
    idx[a["dim"]] = slice(a["start"], a["end"], a["step"])
    return [x[tuple(idx)]]


OPS = {
    "neg": lambda a, x: [torch.neg(x)],
    "abs": lambda a, x: [torch.abs(x)],
    "exp": lambda a, x: [torch.exp(x)],
    "log": lambda a, x: [torch.log(x)],
    "sqrt": lambda a, x: [torch.sqrt(x)],
    "rsqrt": lambda a, x: [torch.rsqrt(x)],
    "relu": lambda a, x: [torch.relu(x)],
    "silu": lambda a, x: [F.silu(x)],
    "sigmoid": lambda a, x: [torch.sigmoid(x)],
    "tanh": lambda a, x: [torch.tanh(x)],
    "atan": lambda a, x: [torch.atan(x)],
    "gelu": lambda a, x: [F.gelu(x, approximate=a["approximate"])],
    "add_scalar": lambda a, x: [x + a["scalar"]],
    "mul_scalar": lambda a, x: [x * a["scalar"]],
    "pow_scalar": lambda a, x: [torch.pow(x, a["exponent"])],
    "clamp": lambda a, x: [torch.clamp(x, a["min"], a["max"])],
    "add": lambda a, x, y: [torch.add(x, y)],
    "sub": lambda a, x, y: [torch.sub(x, y)],
    "mul": lambda a, x, y: [torch.mul(x, y)],
    "div": lambda a, x, y: [torch.div(x, y)],
    "pow": lambda a, x, y: [torch.pow(x, y)],
    "maximum": lambda a, x, y: [torch.maximum(x, y)],
    "minimum": lambda a, x, y: [torch.minimum(x, y)],
    "where": lambda a, c, x, y: [torch.where(c, x, y)],
    "sum": lambda a, x: [torch.sum(x, dim=_dims(a, x), keepdim=a["keepdim"])],
    "mean": lambda a, x: [torch.mean(x, dim=_dims(a, x), keepdim=a["keepdim"])],
    "amax": lambda a, x: [torch.amax(x, dim=_dims(a, x), keepdim=a["keepdim"])],
    "amin": lambda a, x: [torch.amin(x, dim=_dims(a, x), keepdim=a["keepdim"])],
    "var": lambda a, x: [torch.var(x, dim=_dims(a, x), correction=a["correction"], keepdim=a["keepdim"])],
    "max_dim": lambda a, x: [torch.max(x, a["dim"], keepdim=a["keepdim"]).values],
    "min_dim": lambda a, x: [torch.min(x, a["dim"], keepdim=a["keepdim"]).values],
    "reshape": lambda a, x: [x.reshape(a["shape"]) * x.sum()],
    "permute": lambda a, x: [torch.exp(x.permute(a["dims"]))],
    "transpose": lambda a, x: [torch.tanh(x.transpose(a["dim0"], a["dim1"]))],
    "narrow": lambda a, x: [x.narrow(a["dim"], a["start"], a["length"])],
    "slice": _slice,
    "select": lambda a, x: [x.select(a["dim"], a["index"])],
    "expand": lambda a, x: [x.expand(a["shape"]) * 1.5],
    "squeeze_unsqueeze": lambda a, x: [x.squeeze(a["squeeze"]).unsqueeze(a["unsqueeze"])],
    "flatten": lambda a, x: [torch.flatten(x, a["start_dim"], a["end_dim"])],
    "contiguous": lambda a, x: [torch.sigmoid(x.contiguous(memory_format=torch.channels_last))],
    "clone": lambda a, x: [x.clone()],
    "cat": lambda a, *xs: [torch.cat(xs, a["dim"])],
    "stack": lambda a, *xs: [torch.stack(xs, a["dim"])],
    "split": lambda a, x: [torch.split(x, a["split_size"], a["dim"])[a["piece"]]],
    "chunk": lambda a, x: [torch.chunk(x, a["chunks"], a["dim"])[a["piece"]]],
    "matmul": lambda a, x, y: [torch.matmul(x, y)],
    "linear": lambda a, x, w, b=None: [F.linear(x, w, b)],
    "conv2d": lambda a, x, w, b=None: [F.conv2d(x, w, b, a["stride"], a["padding"], a["dilation"], a["groups"])],
    "max_pool2d": lambda a, x: [F.max_pool2d(x, a["kernel"], a["stride"], a["padding"], a["dilation"],
                                             ceil_mode=a["ceil_mode"])],
    "avg_pool2d": lambda a, x: [F.avg_pool2d(x, a["kernel"], a["stride"], a["padding"], ceil_mode=a["ceil_mode"],
                                             count_include_pad=a["count_include_pad"])],
    "adaptive_avg_pool2d": lambda a, x: [F.adaptive_avg_pool2d(x, a["output_size"])],
    "upsample_nearest2d": lambda a, x: [F.interpolate(x, scale_factor=(float(a["scale_h"]), float(a["scale_w"])),
                                                      mode="nearest")],
    "batch_norm": _batch_norm,
    "layer_norm": lambda a, x, w=None, b=None: [F.layer_norm(x, a["normalized_shape"], w, b, a["eps"])],
    "softmax": lambda a, x: [F.softmax(x, a["dim"])],
    "log_softmax": lambda a, x: [F.log_softmax(x, a["dim"])],
    "cross_entropy": lambda a, x, t: [F.cross_entropy(x, t, ignore_index=a["ignore_index"], reduction=_red(a),
                                                      label_smoothing=a["label_smoothing"])],
    "bce_with_logits": lambda a, x, t: [F.binary_cross_entropy_with_logits(x, t.to(x.dtype), reduction=_red(a))],
    "embedding": lambda a, i, w: [F.embedding(i, w, padding_idx=None if a["padding_idx"] < 0 else a["padding_idx"])],
    "dropout": _dropout,
    "scaled_dot_product_attention": _sdpa,
    "attention": _sdpa,  # the fused op behind scaled_dot_product_attention: same definition
}

DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


def apply_layout(t, layout):
    if layout == "contiguous":
        return t.clone()
    if layout == "channels_last":
        return t.contiguous(memory_format=torch.channels_last)
    if layout == "transposed":
        return t.transpose(-1, -2).contiguous().transpose(-1, -2)
    if layout == "strided":
        wide = list(t.shape)
        wide[-1] *= 2
        buf = torch.zeros(wide, dtype=t.dtype)
        v = buf[..., ::2]
        v.copy_(t)
        return v
    raise ValueError(f"unknown layout {layout}")


def forward_backward(case, values, to_input, g_out):
    """The op on inputs made by to_input(value, spec), then the gradients of output 0 against g_out for the
    inputs that require them: (outputs, [(input index, input tensor, gradient or None)])."""
    ins = []
    for spec, v in zip(case["inputs"], values):
        if v.is_floating_point():
            v = to_input(v, spec)
        with torch.no_grad():
            t = apply_layout(v, spec["layout"])
        if spec["requires_grad"]:
            t.requires_grad_(True)
        ins.append(t)
    outs = OPS[case["op"]](case["attrs"], *ins)
    leaves = [(i, t) for i, t in enumerate(ins) if case["inputs"][i]["requires_grad"]]
    if not leaves:
        return outs, []
    gs = torch.autograd.grad([outs[0]], [t for _, t in leaves], [g_out(outs[0])], allow_unused=True)
    return outs, [(i, t, g) for (i, t), g in zip(leaves, gs)]


def run_case(case, values, grad_out, dtype):
    outs, leaf_grads = forward_backward(case, values,
                                        lambda v, spec: v.to(dtype if spec["cast16"] else torch.float32),
                                        lambda out0: grad_out.to(out0.dtype))
    grads = [(i, torch.zeros_like(t) if g is None else g) for i, t, g in leaf_grads]
    return [o.detach().clone() for o in outs], grads


def run_case_f64_reference(case, values, grad_out, dtype):
    """The 16-bit golden of an op PyTorch cannot run in `dtype` on the CPU: F64 arithmetic on the rounded
    inputs, each result rounded once (module docstring)."""
    outs, leaf_grads = forward_backward(
        case, values,
        lambda v, spec: (v.to(dtype) if spec["cast16"] else v.to(torch.float32)).to(torch.float64),
        # the C++ side casts grad_out to output 0's dtype
        lambda out0: grad_out.to(dtype).to(torch.float64))
    grads = []
    for i, t, g in leaf_grads:
        want = dtype if case["inputs"][i]["cast16"] else torch.float32
        grads.append((i, (torch.zeros_like(t) if g is None else g).to(want)))
    rounded = []
    for k, o in enumerate(outs):
        o = o.detach()
        if o.is_floating_point():
            o = o.to(dtype if k == 0 else torch.float32)
        rounded.append(o.clone())
    return rounded, grads


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    dump, out_dir = Path(sys.argv[1]), Path(sys.argv[2])
    manifest = json.loads((dump / "manifest.json").read_text())
    inputs, _ = read_safetensors(dump / "inputs.safetensors")
    torch.manual_seed(0)  # nothing here is random; fixed anyway
    tensors, generated, f64_reference = [], {}, {}
    for case in manifest["cases"]:
        name = case["name"]
        if case["op"] not in OPS:
            raise SystemExit(f"gen_golden.py: case {name}: no PyTorch mapping for op '{case['op']}' (add it to OPS)")
        values = [inputs[f"{name}/in/{i}"] for i in range(len(case["inputs"]))]
        grad_out = inputs[f"{name}/grad_out"]
        tensors += [(f"{name}/in/{i}", v) for i, v in enumerate(values)] + [(f"{name}/grad_out", grad_out)]
        generated[name] = {}
        for dn, dt in DTYPES.items():
            try:
                outs, grads = run_case(case, values, grad_out, dt)
            except RuntimeError as e:
                if dn == "f32":
                    raise SystemExit(f"gen_golden.py: case {name} fails in PyTorch F32: {e}")
                # No CPU kernel in this dtype: the F64 reference, rounded once (module docstring).
                outs, grads = run_case_f64_reference(case, values, grad_out, dt)
                f64_reference.setdefault(name, {})[dn] = str(e).splitlines()[0][:160]
            tensors += [(f"{name}/{dn}/out/{k}", o) for k, o in enumerate(outs)]
            tensors += [(f"{name}/{dn}/grad/{i}", g) for i, g in grads]
            generated[name][dn] = "ok"
    out_dir.mkdir(parents=True, exist_ok=True)
    meta = {
        "manifest": json.dumps(manifest, separators=(",", ":")),
        "generated": json.dumps(generated, separators=(",", ":")),
        "f64_reference": json.dumps(f64_reference, separators=(",", ":")),
        "torch_version": torch.__version__,
        "numpy_version": np.__version__,
        "date": datetime.date.today().isoformat(),
        "generator": "scripts/gen_golden.py",
    }
    write_safetensors(out_dir / "golden.safetensors", tensors, meta)
    by_op = {}
    for case in manifest["cases"]:
        ok = [d for d, s in generated[case["name"]].items() if s == "ok"]
        prev = by_op.setdefault(case["op"], set(ok))
        prev &= set(ok)  # dtypes available for every case of the op
    summary = {
        "torch_version": torch.__version__,
        "date": meta["date"],
        "cases": len(manifest["cases"]),
        "dtypes_for_every_case_of_op": {op: sorted(d) for op, d in sorted(by_op.items())},
        "generated": generated,
        "f64_reference": f64_reference,
    }
    (out_dir / "golden.json").write_text(json.dumps(summary, indent=1) + "\n")
    size = (out_dir / "golden.safetensors").stat().st_size
    print(f"wrote {out_dir / 'golden.safetensors'} ({size} bytes, {len(tensors)} tensors, {len(manifest['cases'])} cases)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
