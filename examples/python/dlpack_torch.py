"""A batch moves from PyTorch to ampforge and back through DLPack, without a copy: PyTorch prepares the batch,
ampforge runs the model on the very same memory, PyTorch reads the logits and the input gradient ampforge computed.

    .venv-peer/bin/python examples/python/dlpack_torch.py     # any interpreter with torch and ampforge importable

Both sides see one buffer: the data pointers printed are equal, and a write through one is read through the other.
"""
import torch

import ampforge as af
import ampforge.nn.functional as F
from ampforge import nn


def main():
    torch.manual_seed(0)
    af.manual_seed(0)
    images = torch.rand(16, 1, 28, 28)                 # PyTorch makes the batch
    labels = torch.randint(0, 10, (16,))

    x = af.from_dlpack(images)                         # ampforge views PyTorch's memory
    y = af.from_dlpack(labels)
    assert x.data_ptr() == images.data_ptr() and y.dtype == af.int64
    print(f"batch {tuple(images.shape)} shared: torch {images.data_ptr():#x} == ampforge {x.data_ptr():#x}")

    model = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Flatten(), nn.Linear(8 * 14 * 14, 10))
    x.requires_grad_()                                 # an ampforge leaf over PyTorch's memory
    with af.autocast("cpu", dtype=af.bfloat16):
        logits = model(x)
        loss = F.cross_entropy(logits, y)
    loss.backward()

    out = torch.from_dlpack(logits.detach())           # PyTorch views ampforge's memory
    grad = torch.from_dlpack(x.grad)
    assert out.data_ptr() == logits.data_ptr() and out.dtype == torch.bfloat16
    print(f"logits {tuple(out.shape)} {out.dtype} back in torch, no copy; loss {loss.item():.4f}")
    print(f"input gradient norm, read by torch: {grad.norm().item():.6f}")

    # One buffer: torch writes, ampforge reads; ampforge writes, torch reads.
    images[0, 0, 0, 0] = 42.0
    assert x[0, 0, 0, 0].item() == 42.0
    with af.no_grad():
        x[1, 0, 0, 0] = -7.0
    assert images[1, 0, 0, 0].item() == -7.0
    print("writes cross over both ways: ok")


if __name__ == "__main__":
    main()
