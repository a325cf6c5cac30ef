"""Training loops in C++: Trainer (your model, loss and data sets) and train() (`ampforge train` by names)."""
from . import _core
from ._core import Trainer, TrainStep  # noqa: F401


def train(**options):
    """`ampforge train` as a function: model, dataset, epochs, batch_size, lr, optimizer, precision, schedule, save,
    resume, seed, device, ... (the CLI's flags with '_' for '-'). Returns the run's summary as a dict."""
    return _core.train_by_name(**options)


__all__ = ["Trainer", "TrainStep", "train"]
