"""The brief's mixed-precision training loop, in Python, on ampforge: a CNN on Fashion-MNIST with AdamW (cosine
learning-rate decay), autocast and a GradScaler, written as a PyTorch user writes it.

    python examples/python/train_amp.py                      # float16 with the GradScaler, 3 epochs
    python examples/python/train_amp.py --precision bf16     # bfloat16 (no scaler needed: float32's exponent range)
    python examples/python/train_amp.py --device cuda        # on a GPU, when ampforge was built with CUDA

Fashion-MNIST comes from Debian's dataset-fashion-mnist (scripts/setup installs it), read and normalised as
`ampforge train` reads it. Prints progress during each epoch and the test accuracy after it; exits 1 when the final
accuracy is below --min-accuracy (0 by default).
"""
import argparse
import sys
import time

import ampforge as af
import ampforge.nn.functional as F
from ampforge import nn


class Net(nn.Module):
    """Two conv-BN-ReLU-pool stages and a two-layer classifier (the CLI's `cnn`, written in Python)."""

    def __init__(self, num_classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, padding=1, bias=False)   # (N, 32, 28, 28)
        self.bn1 = nn.BatchNorm2d(32)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1, bias=False)  # (N, 64, 14, 14)
        self.bn2 = nn.BatchNorm2d(64)
        self.fc1 = nn.Linear(64 * 7 * 7, 128)
        self.fc2 = nn.Linear(128, num_classes)

    def forward(self, x):                                          # (N, 1, 28, 28)
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)      # (N, 32, 14, 14)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)      # (N, 64, 7, 7)
        x = F.relu(self.fc1(x.flatten(1)))                         # (N, 128)
        return self.fc2(x)                                         # (N, 10)


def evaluate(model, loader, device, dtype):
    model.eval()
    correct = total = 0
    with af.no_grad(), af.autocast(device.type, dtype=dtype):
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            correct += (model(x).argmax(1) == y).sum().item()
            total += y.shape[0]
    model.train()
    return correct / total


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--precision", choices=["fp16", "bf16"], default="fp16")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--device", default="cpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-steps", type=int, default=-1, help="stop each epoch after this many steps (quick runs)")
    p.add_argument("--min-accuracy", type=float, default=0.0)
    args = p.parse_args()

    af.manual_seed(args.seed)
    device = af.device(args.device)
    dtype = af.float16 if args.precision == "fp16" else af.bfloat16
    train_set, test_set = af.data.FashionMNIST(train=True), af.data.FashionMNIST(train=False)
    # The loader normalises with the training set's mean and std, shuffles by (seed, epoch) and builds the next
    # batch on a worker thread; channels-last images are what the CPU's convolution kernels read fastest.
    loader = af.data.DataLoader(train_set, batch_size=args.batch_size, shuffle=True, num_workers=1,
                                seed=args.seed, channels_last=True)
    test_loader = af.data.DataLoader(test_set, batch_size=1000, num_workers=1, mean=train_set.normalization[0],
                                     std=train_set.normalization[1], channels_last=True)

    model = Net().to(device)
    optimizer = af.optim.AdamW(model.parameters(), lr=args.lr)
    steps = args.epochs * (len(loader) if args.max_steps < 0 else min(args.max_steps, len(loader)))
    scheduler = af.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=steps)  # per step, down to 0
    scaler = af.amp.GradScaler(enabled=dtype == af.float16)  # bf16 keeps float32's range: no loss scaling

    print(f"ampforge {af.__version__}: {sum(p.numel() for p in model.parameters())} parameters, {args.precision}, "
          f"{len(train_set)} training images, batch {args.batch_size}, {af.get_num_threads()} threads, {device}")
    accuracy = 0.0
    for epoch in range(args.epochs):
        start, seen = time.perf_counter(), 0
        for step, (x, y) in enumerate(loader):
            if step == args.max_steps:
                break
            x, y = x.to(device), y.to(device)
            with af.autocast(device.type, dtype=dtype):
                loss = F.cross_entropy(model(x), y)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
            scheduler.step()
            seen += y.shape[0]
            if step % 100 == 0 or step == len(loader) - 1:
                rate = seen / (time.perf_counter() - start)
                print(f"  epoch {epoch + 1} step {step + 1:4d}/{len(loader)}  loss {loss.item():.4f}  "
                      f"{rate:7.0f} images/s  scale {scaler.get_scale():g}", flush=True)
        accuracy = evaluate(model, test_loader, device, dtype)
        print(f"epoch {epoch + 1}: test accuracy {accuracy:.4f} ({time.perf_counter() - start:.1f} s)", flush=True)
    print(f"final test accuracy {accuracy:.4f} ({args.precision}, {args.epochs} epochs)")
    return 0 if accuracy >= args.min_accuracy else 1


if __name__ == "__main__":
    sys.exit(main())
