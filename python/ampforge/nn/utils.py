"""torch.nn.utils' clip_grad_norm_."""
from .._core import clip_grad_norm_  # noqa: F401
