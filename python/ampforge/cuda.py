"""torch.cuda's basic queries: whether this build and machine have a CUDA device, how many, and waiting for one."""
from . import _core


def device_count():
    """CUDA devices the engine sees (0 without a GPU, a driver, or a CUDA build)."""
    return _core.cuda_device_count()


def is_available():
    return device_count() > 0


def synchronize(device=None):
    """Waits until every queued operation on the device (default cuda:0) has finished."""
    _core.synchronize(device)
