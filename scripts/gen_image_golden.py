#!/usr/bin/env python3
"""Generates the resampling golden files from PIL (Debian's python3-pil), the reference torchvision's
transforms use on PIL images.

usage: /usr/bin/python3 scripts/gen_image_golden.py tests/data/images

Writes source.png (a fixed 64 x 48 RGB picture: smooth waves plus hashed noise, no random module), one raw
RGB file per case (<name>.rgb, height x width x 3 bytes) and cases.json. Cases follow torchvision's
functional semantics on PIL images: resize = img.resize((w, h), BILINEAR); resized_crop = crop, then
resize; the eval pipeline = Resize(size) (shorter side, the longer int(size * long / short)) then
CenterCrop (top = int(round((h - ch) / 2)), as torchvision computes it). data/transforms_test.cpp decodes
source.png and checks every case within one 8-bit level (PIL rounds between its two passes).
"""
import json
import math
import sys
from pathlib import Path

from PIL import Image

W, H = 64, 48


def source():
    img = Image.new("RGB", (W, H))
    px = img.load()
    for y in range(H):
        for x in range(W):
            noise = ((x * 73856093) ^ (y * 19349663)) % 61 - 30
            r = 128 + 90 * math.sin(x / 5.0) * math.cos(y / 7.0) + noise
            g = 40 + 3 * x + 2 * y
            b = ((x * 7 + y * 13) * 5) % 256
            px[x, y] = (max(0, min(255, int(r))), g % 256, b)
    return img


def main(out):
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    img = source()
    img.save(out / "source.png")
    cases = []

    def add(name, result, **desc):
        (out / f"{name}.rgb").write_bytes(result.tobytes())
        cases.append(dict(name=name, height=result.size[1], width=result.size[0], **desc))

    for w, h in [(32, 24), (23, 17), (100, 75), (64, 48), (7, 60)]:
        add(f"resize_{w}x{h}", img.resize((w, h), Image.BILINEAR), op="resize")
    for top, left, bh, bw, size in [(5, 7, 30, 20, 16), (0, 0, 48, 64, 40), (11, 3, 9, 50, 24)]:
        crop = img.crop((left, top, left + bw, top + bh))
        add(f"resized_crop_{top}_{left}_{bh}_{bw}_{size}", crop.resize((size, size), Image.BILINEAR),
            op="resized_crop", box=[top, left, bh, bw])
    for resize, crop in [(20, 16), (37, 32)]:
        short, long = min(W, H), max(W, H)
        new_long = int(resize * long / short)
        rw, rh = (resize, new_long) if W <= H else (new_long, resize)
        r = img.resize((rw, rh), Image.BILINEAR)
        top, left = int(round((rh - crop) / 2.0)), int(round((rw - crop) / 2.0))
        add(f"eval_{resize}_{crop}", r.crop((left, top, left + crop, top + crop)), op="eval", resize=resize, crop=crop)
    (out / "cases.json").write_text(json.dumps({"generator": "scripts/gen_image_golden.py", "pil": Image.__version__,
                                                "cases": cases}, indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/data/images")
