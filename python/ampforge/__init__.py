"""ampforge: a mixed-precision training engine (C++20/CUDA) with PyTorch's names.

    import ampforge as af
    model = MyNet()                                   # a subclass of af.nn.Module
    opt = af.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = af.amp.GradScaler()
    for x, y in af.data.DataLoader(af.data.FashionMNIST(), batch_size=128, shuffle=True):
        with af.autocast("cpu", dtype=af.float16):
            loss = af.nn.functional.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()

Everything runs in the C++ engine (ampforge._core, bound with nanobind); this package only arranges the names.
See docs/PYTHON.md.
"""
from . import _core
from ._core import (  # noqa: F401  (re-exported)
    OutOfMemoryError,
    Tensor,
    __version__,
    abs,
    arange,
    argmax,
    bfloat16,
    bool,
    cat,
    channels_last,
    clamp,
    contiguous_format,
    device,
    double,
    dtype,
    empty,
    exp,
    flatten,
    float,
    float16,
    float32,
    float64,
    full,
    full_like,
    get_num_threads,
    half,
    int32,
    int64,
    is_autocast_enabled,
    is_grad_enabled,
    load_file,
    log,
    log_softmax,
    long,
    manual_seed,
    matmul,
    maximum,
    mean,
    memory_format,
    minimum,
    ones,
    ones_like,
    preserve_format,
    rand,
    rand_like,
    randn,
    randn_like,
    relu,
    save_file,
    set_num_threads,
    sigmoid,
    softmax,
    sqrt,
    stack,
    sum,
    tanh,
    uint8,
    where,
    zeros,
    zeros_like,
)
from ._tensor import from_dlpack, from_numpy, tensor  # noqa: F401
from .autograd import enable_grad, no_grad, set_grad_enabled  # noqa: F401
from . import amp, cuda, data, memory, models, nn, optim, train  # noqa: F401
from .amp import autocast  # noqa: F401


def doctor(*, bandwidth=True, python_timeout=6.0):
    """`ampforge doctor --json` as a dict: driver, CUDA libraries, GPUs, host, Python frameworks, and every check
    (PASS / WARN / FAIL / SKIP with a fix). Schema ampforge.doctor/2 (docs/DOCTOR.md)."""
    return _core.doctor(bandwidth, python_timeout)


def bench(model="cnn", *, batch=128, precision="fp32", steps=5, warmup=2, optimizer="sgd", image_size=0,
          device=None, channels_last=True):
    """Timed training steps of a registry model on a synthetic batch (one cell of `ampforge bench`): a dict with
    step_seconds, median_seconds, samples_per_sec, peak memory, the last loss. precision: fp32 | fp16 | bf16 (| tf32
    on CUDA)."""
    return _core.bench(model, batch, precision, steps, warmup, optimizer, image_size, device, channels_last)
