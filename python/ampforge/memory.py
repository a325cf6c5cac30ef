"""Memory tools as functions returning dicts (the `ampforge memory ... --json` documents)."""
from . import _core


def fit(model, budget, *, device="cpu", stands_for="cuda", precision="fp32", optimizer="adamw", max_batch=65536,
        steps=2, image_size=0):
    """The largest batch whose training step of registry model `model` fits `budget` (bytes, or '16GiB'), and where
    the memory goes. device 'meta' plans for a GPU (stands_for='cuda') in seconds, without data."""
    return _core.memory_fit(model, budget, device, stands_for, precision, optimizer, max_batch, steps, image_size)


def replay(path, *, policy="all", budget=None, device=None):
    """Replays an ampforge memtrace or a PyTorch memory snapshot pickle under allocator policies (naive, pytorch,
    ampforge; and pytorch-expandable for snapshots): peak live and reserved bytes, fragmentation, failures.
    device: the snapshot's device; None, the lowest that recorded trace entries. A memtrace records one device."""
    return _core.memory_replay(path, policy, budget, device)
