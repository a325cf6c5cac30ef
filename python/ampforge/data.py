"""Data: Fashion-MNIST (Debian's dataset-fashion-mnist, read as `ampforge train` reads it), MNIST, synthetic images,
the CLI's data sets by name, and the DataLoader. A Python data set is any object with __len__ and __getitem__
returning (example, label); the example may be an ampforge Tensor or anything NumPy can read, of one shape for all.
"""
from . import _core
from ._core import DataLoader, Dataset, SyntheticDataset, default_fashion_mnist_dir  # noqa: F401


class FashionMNIST(_core._MnistDataset):
    """Fashion-MNIST: 60,000 training / 10,000 test 1x28x28 images in [0, 1], 10 classes. root defaults to
    $AMPFORGE_FASHION_MNIST_DIR, else /usr/share/datasets/fashion-mnist (Debian's package). A DataLoader normalises
    it with the data set's mean and std, as the CLI does."""

    def __init__(self, root=None, train=True):
        super().__init__(root or default_fashion_mnist_dir(), train, "fashion-mnist")


class MNIST(_core._MnistDataset):
    """MNIST from a folder holding its four IDX files (optionally .gz)."""

    def __init__(self, root, train=True):
        super().__init__(root, train, "mnist")


def dataset_splits(name="fashion-mnist", *, data_dir="", image_size=0, channels=1, seed=0):
    """(train, test) data sets by the name `ampforge train --dataset` takes (fashion-mnist, mnist, image-folder,
    synthetic, ...)."""
    return _core.dataset_splits(name, data_dir, image_size, channels, seed)


__all__ = ["Dataset", "DataLoader", "FashionMNIST", "MNIST", "SyntheticDataset", "dataset_splits",
           "default_fashion_mnist_dir"]
