"""ampforge.nn: Python subclasses of Module (registration, names, state dicts, train/eval, to()), the built-in layers,
Sequential, registry models, and a Python model's state dict loading in `ampforge predict`."""
import subprocess

import numpy as np
import pytest

import ampforge as af
import ampforge.nn.functional as F
from ampforge import nn


class Block(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(cout)

    def forward(self, x):
        return F.relu(self.bn(self.conv(x)))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = Block(1, 4)
        self.head = nn.Linear(4 * 4 * 4, 3)
        self.gain = nn.Parameter(af.ones(1))
        self.register_buffer("steps", af.zeros(1))
        self.not_registered = af.ones(2)  # a plain tensor attribute, as in PyTorch

    def forward(self, x):
        return self.head(self.features(x).flatten(1)) * self.gain


def test_registration_names_and_order():
    net = Net()
    assert [n for n, _ in net.named_parameters()] == [
        "gain", "features.conv.weight", "features.bn.weight", "features.bn.bias", "head.weight", "head.bias"]
    assert list(net.state_dict()) == [
        "gain", "steps", "features.conv.weight", "features.bn.weight", "features.bn.bias", "features.bn.running_mean",
        "features.bn.running_var", "features.bn.num_batches_tracked", "head.weight", "head.bias"]
    assert len(net.parameters()) == 6 and all(p.requires_grad for p in net.parameters())
    assert [n for n, _ in net.named_children()] == ["features", "head"]
    assert [n for n, _ in net.named_modules()] == ["", "features", "features.conv", "features.bn", "head"]
    assert net.get_submodule("features.bn").num_features == 4
    assert isinstance(net.gain, nn.Parameter) and isinstance(net.head, nn.Linear)
    assert net.num_parameters() == 1 + 4 * 9 + 8 + 64 * 3 + 3
    assert "Net(" in repr(net) and "(features): Block(" in repr(net)
    frozen = nn.Parameter(af.ones(2), requires_grad=False)
    net.extra = frozen
    assert "extra" in dict(net.named_parameters()) and not net.extra.requires_grad


def test_forward_runs_from_python_and_from_cpp_containers():
    net = Net()
    x = af.randn(2, 1, 4, 4)
    y = net(x)
    assert y.shape == (2, 3)
    seq = nn.Sequential(net, nn.ReLU())  # the C++ Sequential calls the Python forward
    np.testing.assert_allclose(seq(x).detach().numpy(), np.maximum(net(x).detach().numpy(), 0), rtol=1e-6)
    assert len(seq) == 2 and seq[0] is net and isinstance(seq[-1], nn.ReLU)


def test_train_eval_and_to():
    net = Net()
    assert net.training and net.features.bn.training
    assert net.eval() is net and not net.features.bn.training
    net.train()
    net.to(af.float64)
    assert net.head.weight.dtype == af.float64 and net.features.bn.running_mean.dtype == af.float32
    net.to(af.float32)
    x = af.randn(3, 1, 4, 4)
    net(x)  # training mode: running statistics move
    assert net.features.bn.num_batches_tracked.item() == 1


def test_state_dict_round_trip_and_errors(tmp_path):
    a, b = Net(), Net()
    missing, unexpected = b.load_state_dict(a.state_dict())
    assert missing == [] and unexpected == []
    for k, v in a.state_dict().items():
        np.testing.assert_array_equal(v.numpy(), b.state_dict()[k].numpy(), err_msg=k)
    af.save_file(a.state_dict(), str(tmp_path / "net.safetensors"))
    c = Net()
    c.load_state_dict(af.load_file(str(tmp_path / "net.safetensors")))
    np.testing.assert_array_equal(c.head.weight.detach().numpy(), a.head.weight.detach().numpy())
    state = a.state_dict()
    del state["head.bias"]
    state["extra"] = af.ones(1)
    with pytest.raises(ValueError, match="head.bias"):
        c.load_state_dict(state)
    missing, unexpected = c.load_state_dict(state, strict=False)
    assert missing == ["head.bias"] and unexpected == ["extra"]
    bad = a.state_dict()
    bad["head.weight"] = af.ones(2, 2)
    with pytest.raises(ValueError, match="head.weight"):
        c.load_state_dict(bad)
    numpy_state = {k: v.numpy() for k, v in a.state_dict().items()}  # any DLPack / buffer producer works
    Net().load_state_dict(numpy_state)


def test_builtin_layers_and_models():
    assert nn.Linear(3, 2, bias=False).bias is None
    lin = nn.Linear(3, 2)
    lin.weight = af.zeros(2, 3)  # rebinds the data; the registered parameter follows
    assert dict(lin.named_parameters())["weight"].sum().item() == 0
    assert nn.LayerNorm(8)(af.randn(2, 8)).shape == (2, 8)
    assert nn.Embedding(10, 4)(af.tensor([[1, 2]])).shape == (1, 2, 4)
    assert nn.MaxPool2d(2)(af.randn(1, 1, 4, 4)).shape == (1, 1, 2, 2)
    assert nn.AdaptiveAvgPool2d(1)(af.randn(1, 3, 5, 5)).shape == (1, 3, 1, 1)
    assert nn.GELU(approximate="tanh")(af.ones(2)).shape == (2,)
    assert nn.Dropout(0.5).eval()(af.ones(4)).tolist() == [1.0] * 4
    assert nn.CrossEntropyLoss()(af.zeros(2, 4), af.tensor([0, 3])).item() == pytest.approx(np.log(4), rel=1e-6)
    assert "resnet18" in af.models.names()
    m = af.models.resnet_small(num_classes=10)
    assert m(af.randn(2, 1, 28, 28)).shape == (2, 10)
    assert m.fc.weight.shape == (10, 64)  # children and parameters of C++ models by attribute
    assert af.models.info("cnn")["task"] == "classification"


class Stacked(nn.Module):
    """The registry's `cnn` written in Python: children '0', '1', ... as torch's Sequential names them."""

    def __init__(self):
        super().__init__()
        layers = [nn.Conv2d(1, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
                  nn.Conv2d(32, 64, 3, padding=1, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
                  nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10)]
        for i, layer in enumerate(layers):
            self.add_module(str(i), layer)

    def forward(self, x):
        for layer in self.children():
            x = layer(x)
        return x


def test_state_dict_from_python_loads_in_ampforge_predict(cli, tmp_path):
    model = Stacked()
    opt = af.optim.AdamW(model.parameters(), lr=1e-3)
    x = af.randn(8, 1, 28, 28)
    y = af.tensor([0, 1, 2, 3, 4, 5, 6, 7])
    for _ in range(3):  # train a little: running statistics and weights move away from their initial values
        F.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    model.eval()
    with af.no_grad():
        expected = model(x).numpy()
    af.save_file(model.state_dict(), str(tmp_path / "model.safetensors"))
    af.save_file({"images": x}, str(tmp_path / "in.safetensors"))
    subprocess.run([cli, "predict", "--model", "cnn", "--checkpoint", str(tmp_path / "model.safetensors"), "--input",
                    str(tmp_path / "in.safetensors"), "--output", str(tmp_path / "out.safetensors")], check=True,
                   capture_output=True)
    got = af.load_file(str(tmp_path / "out.safetensors"))["output0"].numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_module_list_and_apply():
    class Tower(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])

        def forward(self, x):
            for layer in self.layers:
                x = F.relu(layer(x))
            return x

    t = Tower()
    assert len(t.layers) == 3 and isinstance(t.layers[1], nn.Linear)
    assert [n for n, _ in t.named_parameters()][:2] == ["layers.0.weight", "layers.0.bias"]
    assert t(af.ones(2, 4)).shape == (2, 4)
    seen = []
    assert t.apply(lambda m: seen.append(m.type_name)) is t
    assert seen == ["Linear", "Linear", "Linear", "ModuleList", "Tower"]

    def zero_linear(m):
        if isinstance(m, nn.Linear):
            m.weight = af.zeros(4, 4)

    t.apply(zero_linear)
    assert all(layer.weight.sum().item() == 0 for layer in t.layers)
