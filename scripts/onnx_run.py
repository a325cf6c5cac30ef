#!/usr/bin/env python3
"""Runs an ONNX file in ONNX Runtime (CPU execution provider) on the tensors of a safetensors file and writes the
outputs to another: the runtime side of the export tests (src/ampforge/cli/export_cli_test.cpp,
src/ampforge/export/export_test.cpp).

    .venv/bin/python scripts/onnx_run.py MODEL.onnx IN.safetensors OUT.safetensors

Inputs are matched to the model's inputs by name ("images", "input_ids", ...). onnxruntime and numpy come from the
project's virtual environment (.venv/, made by scripts/setup). Prints one JSON line: runtime, version, output shapes,
milliseconds of the run. Exit 2 for usage, 1 for any other failure, with one line on stderr.

safetensors layout (https://github.com/huggingface/safetensors): 8-byte little-endian header length, JSON header,
then the data; read and written here with numpy so that the runner needs nothing beyond onnxruntime.
"""
import json
import struct
import sys
import time

# safetensors dtype <-> numpy dtype (little-endian)
DTYPES = {"F32": "<f4", "F16": "<f2", "F64": "<f8", "I64": "<i8", "I32": "<i4", "U8": "u1", "BOOL": "?"}


def read_safetensors(path, np):
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise ValueError(f"{path}: not a safetensors file ({len(raw)} bytes)")
    (n,) = struct.unpack("<Q", raw[:8])
    if n > len(raw) - 8:
        raise ValueError(f"{path}: header length {n} exceeds the file")
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    data = memoryview(raw)[8 + n:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dt = DTYPES.get(info["dtype"])
        if dt is None:
            raise ValueError(f"{path}: tensor {name} has unsupported dtype {info['dtype']}")
        b, e = info["data_offsets"]
        out[name] = np.frombuffer(data[b:e], dtype=dt).reshape(info["shape"]).copy()
    return out


def write_safetensors(path, tensors, np):
    names = {np.dtype(v): k for k, v in DTYPES.items()}
    header, chunks, off = {}, [], 0
    for name, arr in tensors.items():
        arr = np.ascontiguousarray(arr)
        if arr.dtype.byteorder == ">":
            arr = arr.byteswap().view(arr.dtype.newbyteorder("<"))
        key = names.get(np.dtype(arr.dtype.str.replace("=", "<")))
        if key is None:
            raise ValueError(f"output {name} has dtype {arr.dtype}, which safetensors here does not carry")
        b = arr.tobytes()
        header[name] = {"dtype": key, "shape": list(arr.shape), "data_offsets": [off, off + len(b)]}
        chunks.append(b)
        off += len(b)
    h = json.dumps(header).encode("utf-8")
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for c in chunks:
            f.write(c)


def main(argv):
    if len(argv) != 4 or argv[1] in ("-h", "--help"):
        print("usage: onnx_run.py MODEL.onnx IN.safetensors OUT.safetensors", file=sys.stderr)
        return 2
    model, inp, outp = argv[1:]
    try:
        import numpy as np
        import onnxruntime as ort
    except ImportError as e:
        print(f"onnx_run.py: {e.name} is not installed in {sys.executable} (run scripts/setup)", file=sys.stderr)
        return 1
    try:
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 2
        opts.inter_op_num_threads = 1
        session = ort.InferenceSession(model, sess_options=opts, providers=["CPUExecutionProvider"])
        inputs = read_safetensors(inp, np)
        feeds = {}
        input_names = [i.name for i in session.get_inputs()]
        for name in input_names:
            if name not in inputs:
                raise ValueError(f"{inp} has no tensor '{name}' (model inputs: {', '.join(input_names)})")
            feeds[name] = inputs[name]
        output_names = [o.name for o in session.get_outputs()]
        t0 = time.perf_counter()
        results = session.run(output_names, feeds)
        ms = (time.perf_counter() - t0) * 1e3
        out = dict(zip(output_names, results))
        write_safetensors(outp, out, np)
    except Exception as e:  # one line for the test's message, never a traceback
        print(f"onnx_run.py: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    print(json.dumps({"runtime": "onnxruntime", "version": ort.__version__,
                      "outputs": {k: list(v.shape) for k, v in out.items()}, "ms": ms}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
