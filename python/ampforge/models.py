"""The model registry (`ampforge models`): cnn, resnet-small, resnet18..152, resnext, wide_resnet, yolov8n..x,
bert-base/mini/tiny. create("resnet18", num_classes=10), or the name as a function: models.resnet18(num_classes=10)
('-' becomes '_': models.resnet_small(), models.bert_tiny()). The models are C++ nn.Module trees with
torchvision's / Hugging Face's / Ultralytics' state-dict names."""
import functools

from . import _core


def names():
    """Every registered model name, in registration order."""
    return _core.model_names()


def info(name):
    """name, task, description and default input of a registry entry."""
    return _core.model_info(name)


def create(name, *, in_channels=None, num_classes=None, image_size=None):
    """A randomly initialised model of the registry (defaults: the entry's own input channels, classes and size)."""
    return _core.create_model(name, in_channels, num_classes, image_size)


def __getattr__(attr):
    for n in _core.model_names():
        if n.replace("-", "_") == attr:
            return functools.partial(create, n)
    raise AttributeError(f"module 'ampforge.models' has no attribute '{attr}' (models: {', '.join(names())})")
