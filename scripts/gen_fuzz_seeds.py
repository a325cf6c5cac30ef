#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz harnesses: tests/fuzz/<harness>/seeds/ (committed; tests/fuzz/README.md).

usage: python3 scripts/gen_fuzz_seeds.py [AMPFORGE]
  rewrites every seeds/ directory (crashes/ are left alone). The snapshot seeds are real snapshots made by
  `AMPFORGE memory replay ... --snapshot` (default build/bin/ampforge); without that binary they are kept.

Seeds are small valid inputs (and a few near misses) that show libFuzzer each format's structure, so it
starts deep in the parser instead of at the magic number. Needs only Python's standard library, plus a C
compiler and libjpeg's headers (libjpeg62-turbo-dev, a build dependency anyway) for the JPEG seeds.
"""
import gzip
import json
import shutil
import struct
import subprocess
import sys
import tempfile
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "tests" / "fuzz"


def put(harness, name, data):
    d = ROOT / harness / "seeds"
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(data if isinstance(data, bytes) else data.encode())


def safetensors(tensors, metadata=None):
    header, blobs, pos = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [pos, pos + len(raw)]}
        blobs.append(raw)
        pos += len(raw)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(blobs)


def idx(shape, data):
    return struct.pack(">BBBB", 0, 0, 8, len(shape)) + b"".join(struct.pack(">I", d) for d in shape) + bytes(data)


def png(width, height, color_type, bit_depth, rows, palette=None, trns=None):
    def chunk(kind, body):
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xffffffff)
    out = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, bit_depth, color_type, 0, 0, 0))
    if palette:
        out += chunk(b"PLTE", palette)
    if trns:
        out += chunk(b"tRNS", trns)
    raw = b"".join(b"\x00" + r for r in rows)
    return out + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


JPEG_WRITER = r"""
#include <stdio.h>
#include <stdlib.h>
#include <jpeglib.h>
/* jpeg_writer OUT W H COMPONENTS QUALITY PROGRESSIVE */
int main(int argc, char** argv) {
  struct jpeg_compress_struct c; struct jpeg_error_mgr e;
  int w = atoi(argv[2]), h = atoi(argv[3]), n = atoi(argv[4]);
  FILE* f = fopen(argv[1], "wb");
  c.err = jpeg_std_error(&e); jpeg_create_compress(&c); jpeg_stdio_dest(&c, f);
  c.image_width = w; c.image_height = h; c.input_components = n;
  c.in_color_space = n == 1 ? JCS_GRAYSCALE : n == 3 ? JCS_RGB : JCS_CMYK;
  jpeg_set_defaults(&c); jpeg_set_quality(&c, atoi(argv[5]), TRUE);
  if (atoi(argv[6])) jpeg_simple_progression(&c);
  jpeg_start_compress(&c, TRUE);
  unsigned char* row = malloc(w * n);
  while (c.next_scanline < c.image_height) {
    for (int x = 0; x < w * n; ++x) row[x] = (unsigned char)(x * 7 + c.next_scanline * 13);
    jpeg_write_scanlines(&c, &row, 1);
  }
  jpeg_finish_compress(&c); fclose(f); return 0;
}
"""


def jpeg_seeds():
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = Path(tmp) / "w.c", Path(tmp) / "w"
        src.write_text(JPEG_WRITER)
        subprocess.run(["cc", "-O1", str(src), "-o", str(exe), "-ljpeg"], check=True)
        for name, args in {"rgb_9x7.jpg": "9 7 3 90 0", "gray_16x16.jpg": "16 16 1 75 0",
                           "progressive_17x5.jpg": "17 5 3 80 1", "cmyk_8x8.jpg": "8 8 4 85 0"}.items():
            out = Path(tmp) / name
            subprocess.run([str(exe), str(out)] + args.split(), check=True)
            data = out.read_bytes()
            put("image", name, b"\x00" + data)  # first byte: the scale selector (full size)
        put("image", "truncated_rgb.jpg", b"\x01" + (Path(tmp) / "rgb_9x7.jpg").read_bytes()[:200])


def snapshot_seeds(ampforge):
    trace = "# ampforge-memtrace v1\na 1 4096 0\na 2 3000000 1\ns\na 3 512 0\na 4 25165824 0\nf 1\ns\n"
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp) / "t.txt"
        t.write_text(trace)
        for policy in ("ampforge", "pytorch", "naive"):
            out = Path(tmp) / f"{policy}.json"
            subprocess.run([ampforge, "memory", "replay", str(t), "--policy", policy, "--snapshot", str(out)],
                           check=True, stdout=subprocess.DEVNULL)
            put("snapshot", f"{policy}.json", out.read_bytes())


def main():
    ampforge = sys.argv[1] if len(sys.argv) > 1 else str(ROOT.parent.parent / "build" / "bin" / "ampforge")
    for d in ROOT.glob("*/seeds"):
        if d.parent.name == "torch_snapshot":
            continue  # scripts/gen_torch_snapshots.py writes those
        if d.parent.name != "snapshot" or Path(ampforge).exists():
            shutil.rmtree(d)

    f32 = struct.pack("<4f", 1.0, -2.5, 0.0, 3.25)
    put("safetensors", "two_tensors.safetensors",
        safetensors([("w", "F32", [2, 2], f32), ("i", "I64", [2], struct.pack("<2q", 7, -1))], {"epoch": "3"}))
    put("safetensors", "all_dtypes.safetensors", safetensors([
        ("a", "F16", [2], b"\x00\x3c\x00\xc0"), ("b", "BF16", [1, 2], b"\x80\x3f\x00\x40"),
        ("c", "F64", [], struct.pack("<d", 0.5)), ("d", "I32", [1], struct.pack("<i", -3)),
        ("e", "U8", [3], b"\x01\x02\x03"), ("f", "BOOL", [2], b"\x00\x01"), ("g", "F32", [0, 3], b"")]))
    put("safetensors", "empty.safetensors", safetensors([]))

    img = bytes(range(2 * 3 * 4))
    put("idx", "images_2x3x4.idx", idx([2, 3, 4], img))
    put("idx", "labels_5.idx", idx([5], [0, 1, 2, 3, 4]))
    put("idx", "images_2x3x4.idx.gz", gzip.compress(idx([2, 3, 4], img), mtime=0))
    put("idx", "scalar.idx", idx([], [9]))

    put("memtrace", "small.txt", "# ampforge-memtrace v1\na 1 4096 0\na 2 1048576 1\ns\nf 1\na 3 512 0\nf 2\nf 3\ns\n")
    put("memtrace", "comments.txt", "# ampforge-memtrace v1\n# recorded by hand\n\na 10 3000000 0\nf 10\n")
    put("memtrace", "empty_cache.txt", "# ampforge-memtrace v1\na 1 8388608 0\nf 1\ne\na 2 8388608 0\ns\nf 2\ne\n")
    repo = Path(__file__).resolve().parent.parent / "tests" / "data" / "memtrace" / "cnn.txt"
    put("memtrace", "cnn_head.txt", "".join(repo.read_text().splitlines(True)[:120]))

    if Path(ampforge).exists():
        snapshot_seeds(ampforge)
    else:
        print(f"gen_fuzz_seeds: {ampforge} is missing: the snapshot seeds are kept as they are")

    for i, s in enumerate(["64MiB", "1GB", "0", "512", "3:10", "7", "cuda:1", "cpu", "bf16", "float32",
                           "18446744073709551615B", "1.5GiB", "-3:4"]):
        put("cli_units", f"u{i}.txt", s)

    put("vocab", "bert.txt", "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nthe\n##s\nrun\n##ning\n中\né\n!\n")
    put("vocab", "crlf.txt", "[PAD]\r\n[UNK]\r\n[CLS]\r\n[SEP]\r\n[MASK]\r\nhello\r\n")
    put("vocab", "duplicate.txt", "a\nb\na\n")

    for i, s in enumerate(["The runners' running, unaffable!", "Straße ÜBER été 中文字 привет",
                           "a\tb\nc\x00d\x7f\u200b", "x" * 120, "\xff\xfe broken utf8 \xc3",
                           "e\u0301 combining and \uac00 hangul"]):
        put("tokenizer", f"t{i}.txt", s.encode("utf-8", "surrogateescape") if i != 4 else
            b"\xff\xfe broken utf8 \xc3")

    put("yolo_labels", "two_boxes.txt", "0 0.5 0.5 0.2 0.3\n79 0.1 0.9 0.05 0.05\n")
    put("yolo_labels", "blank_lines.txt", "\n  3 0.25 0.75 1 1  \n\n")
    put("yolo_labels", "bad_class.txt", "80 0.5 0.5 0.1 0.1\n")

    put("data_yaml", "list.yaml", "path: ../datasets/fmd\ntrain: images/train\nval: images/val\nnc: 2\n"
                                  "names: ['shirt', \"boot\"]\n")
    put("data_yaml", "block.yaml", "train: /data/train  # absolute\nval: val\nnames:\n  0: person\n  1: car\n")
    put("data_yaml", "nc_only.yaml", "train: a\nval: b\nnc: 3\ndownload: ignored\n")

    rgb_rows = [bytes((x * 40 + y * 3) % 256 for x in range(3 * 4)) for y in range(3)]
    put("image", "rgb_4x3.png", b"\x00" + png(4, 3, 2, 8, rgb_rows))
    put("image", "gray16_2x2.png", b"\x00" + png(2, 2, 0, 16, [b"\x12\x34\xff\xff", b"\x00\x00\x80\x00"]))
    put("image", "palette_trns_3x1.png", b"\x00" + png(3, 1, 3, 2, [b"\x1b"], palette=b"\xff\x00\x00\x00\xff\x00\x00\x00\xff",
                                                        trns=b"\x80"))
    put("image", "rgba_1x2.png", b"\x00" + png(1, 2, 6, 8, [b"\x01\x02\x03\x04", b"\x05\x06\x07\x08"]))
    jpeg_seeds()

    # The ONNX harness builds graphs from bytes; a few byte patterns reach every attribute kind and dtype.
    for i in range(6):
        put("onnx_roundtrip", f"g{i}.bin", bytes((i * 37 + k * 11) % 256 for k in range(64 + 32 * i)))
    print(f"wrote {sum(1 for _ in ROOT.glob('*/seeds/*'))} seeds under {ROOT}")


if __name__ == "__main__":
    main()
