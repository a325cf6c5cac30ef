#!/usr/bin/env python3
"""Reads an ampforge checkpoint (a safetensors file) with nothing but json and numpy - no ampforge code,
no safetensors package - to show that the files are standard safetensors that Python tools can load.

    check_checkpoint.py CHECKPOINT                    list tensors (name, dtype, shape) and the metadata
    check_checkpoint.py CHECKPOINT --expect FILE      also compare with a JSON of expected tensors:
        {"name": {"dtype": "F32", "shape": [..], "numel": n, "head": [...], "tail": [...], "sum": s}}
Exit status: 0 on success, 1 when a check fails, 2 when the file is not valid safetensors.
"""
import argparse
import json
import struct
import sys

import numpy as np

DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": np.uint16, "I64": np.int64,
          "I32": np.int32, "U8": np.uint8, "BOOL": np.bool_}


def load(path):
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise ValueError("file shorter than the 8-byte header length")
    (n,) = struct.unpack("<Q", raw[:8])
    if 8 + n > len(raw):
        raise ValueError(f"header length {n} runs past the end of the file ({len(raw)} bytes)")
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    meta = header.pop("__metadata__", {})
    data = raw[8 + n:]
    tensors = {}
    for name, info in header.items():
        dt = info["dtype"]
        if dt not in DTYPES:
            raise ValueError(f"{name}: unknown dtype {dt}")
        b, e = info["data_offsets"]
        if not (0 <= b <= e <= len(data)):
            raise ValueError(f"{name}: data offsets {b}..{e} outside the data ({len(data)} bytes)")
        arr = np.frombuffer(data[b:e], dtype=DTYPES[dt]).copy()
        if dt == "BF16":  # numpy has no bfloat16: widen the bits to float32
            arr = (arr.astype(np.uint32) << 16).view(np.float32)
        shape = info["shape"]
        if arr.size != int(np.prod(shape, dtype=np.int64)):
            raise ValueError(f"{name}: {arr.size} elements for shape {shape}")
        tensors[name] = (dt, shape, arr.reshape(shape))
    return tensors, meta


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint")
    p.add_argument("--expect")
    a = p.parse_args()
    try:
        tensors, meta = load(a.checkpoint)
    except (OSError, ValueError, KeyError, json.JSONDecodeError) as e:
        print(f"{a.checkpoint}: not a valid safetensors file: {e}", file=sys.stderr)
        return 2
    for name, (dt, shape, _) in tensors.items():
        print(f"{name:50s} {dt:5s} {shape}")
    print("metadata:", json.dumps(meta, sort_keys=True)[:400])
    if not a.expect:
        return 0
    with open(a.expect) as f:
        expect = json.load(f)
    bad = 0
    for name, e in expect.items():
        if name not in tensors:
            print(f"MISSING {name}")
            bad += 1
            continue
        dt, shape, arr = tensors[name]
        flat = arr.reshape(-1).astype(np.float64)
        problems = []
        if dt != e["dtype"]:
            problems.append(f"dtype {dt} != {e['dtype']}")
        if list(shape) != e["shape"]:
            problems.append(f"shape {shape} != {e['shape']}")
        if flat.size != e["numel"]:
            problems.append(f"numel {flat.size} != {e['numel']}")
        k = len(e["head"])
        if flat.size >= k and (list(flat[:k]) != e["head"] or list(flat[flat.size - len(e["tail"]):]) != e["tail"]):
            problems.append("values differ")
        if not np.isclose(flat.sum(), e["sum"], rtol=1e-9, atol=1e-9):
            problems.append(f"sum {flat.sum()} != {e['sum']}")
        if problems:
            print(f"MISMATCH {name}: {'; '.join(problems)}")
            bad += 1
    extra = set(tensors) - set(expect)
    for name in sorted(extra):
        print(f"UNEXPECTED {name}")
    bad += len(extra)
    print(f"checked {len(expect)} tensors: {'OK' if bad == 0 else str(bad) + ' problems'}")
    return 0 if bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
