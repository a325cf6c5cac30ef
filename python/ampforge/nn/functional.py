"""Functions of the engine's differentiable API under torch.nn.functional's names and argument orders."""
from .._core import (  # noqa: F401
    adaptive_avg_pool2d,
    avg_pool2d,
    batch_norm,
    binary_cross_entropy_with_logits,
    conv2d,
    cross_entropy,
    dropout,
    embedding,
    gelu,
    layer_norm,
    linear,
    log_softmax,
    max_pool2d,
    relu,
    scaled_dot_product_attention,
    sigmoid,
    silu,
    softmax,
    tanh,
)


def mse_loss(input, target, reduction="mean"):
    """Mean (or sum, or none) of the squared differences."""
    d = (input - target) ** 2
    if reduction == "mean":
        return d.mean()
    if reduction == "sum":
        return d.sum()
    if reduction == "none":
        return d
    raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got '{reduction}'")


def flatten(input, start_dim=0, end_dim=-1):
    return input.flatten(start_dim, end_dim)
