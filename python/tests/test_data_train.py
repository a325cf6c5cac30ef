"""Data sets, the DataLoader, the Trainer over Python objects, and Ctrl-C (real signals)."""
import json
import pathlib
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import ampforge as af
import ampforge.nn.functional as F
from ampforge import nn


def test_fashion_mnist_as_the_cli_reads_it():
    train, test = af.data.FashionMNIST(train=True), af.data.FashionMNIST(train=False)
    assert len(train) == 60000 and len(test) == 10000
    x, y = train[0]
    assert x.shape == (1, 28, 28) and 0 <= y < 10 and 0.0 <= x.min().item() and x.max().item() <= 1.0
    mean, std = train.normalization
    loader = af.data.DataLoader(train, batch_size=256, shuffle=True)
    xb, yb = next(iter(loader))
    assert xb.shape == (256, 1, 28, 28) and yb.dtype == af.int64
    assert abs(xb.mean().item()) < 0.2  # normalised with the set's own mean and std
    assert len(loader) == 235


class Squares(object):
    """A Python data set: x in R^2, label = which quadrant."""

    num_classes = 4

    def __init__(self, n=256):
        rng = np.random.default_rng(0)
        self.x = rng.normal(size=(n, 2)).astype(np.float32)
        self.y = (self.x[:, 0] > 0).astype(np.int64) * 2 + (self.x[:, 1] > 0)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], int(self.y[i])


def test_python_dataset_through_the_loader():
    ds = Squares(100)
    loader = af.data.DataLoader(ds, batch_size=32, shuffle=False)
    batches = list(loader)
    assert [b[0].shape for b in batches] == [(32, 2), (32, 2), (32, 2), (4, 2)]
    np.testing.assert_allclose(batches[0][0].numpy(), ds.x[:32])
    assert batches[0][1].tolist() == ds.y[:32].tolist()
    threaded = af.data.DataLoader(ds, batch_size=32, shuffle=True, num_workers=2, seed=3)
    first = [b[1].tolist() for b in threaded]
    again = af.data.DataLoader(ds, batch_size=32, shuffle=True, num_workers=0, seed=3)
    assert [b[1].tolist() for b in again] == first  # the order depends on (seed, epoch) only


class SquaresSubclass(af.data.Dataset):
    """torch.utils.data.Dataset's pattern: subclass the base, define __len__ and __getitem__."""

    def __init__(self):
        self.inner = Squares(40)

    def __len__(self):
        return len(self.inner)

    def __getitem__(self, i):
        return self.inner[i]


def test_dataset_subclass_in_python():
    xb, yb = next(iter(af.data.DataLoader(SquaresSubclass(), batch_size=40)))
    assert xb.shape == (40, 2) and yb.tolist() == SquaresSubclass().inner.y.tolist()


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(2, 16)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


def test_trainer_over_python_model_data_and_loss(tmp_path):
    model = Mlp()
    trainer = af.train.Trainer(model, lambda out, y: F.cross_entropy(out, y), optimizer="adamw", lr=1e-2, epochs=5,
                               batch_size=32, progress=False, verbose=False, channels_last=False,
                               save=str(tmp_path / "ckpt.safetensors"))
    result = trainer.fit(Squares(512), Squares(128))
    assert result["epochs_completed"] == 5 and result["steps"] == 5 * 16
    assert result["eval"]["accuracy"] > 0.9 and result["primary_metric"] == "loss"
    assert result["losses"][-1] < result["losses"][0]
    ckpt = af.load_file(str(tmp_path / "ckpt.safetensors"))
    assert "model.fc1.weight" in ckpt


def test_trainer_classification_task_on_fashion_mnist_subset():
    model = af.models.create("cnn")
    trainer = af.train.Trainer(model, epochs=1, max_steps=20, batch_size=64, progress=False, verbose=False,
                               precision="bf16")
    result = trainer.fit(af.data.FashionMNIST(train=True))
    assert result["steps"] == 20 and result["precision"] in ("bf16", "BF16", "bfloat16")
    assert np.isfinite(result["losses"]).all()


# A child started from a shell's background job (`scripts/test &`, some CI runners) inherits SIGINT ignored, and
# Python then installs no KeyboardInterrupt handler: the children install it, as an interactive shell leaves it.
RESTORE_SIGINT = "import signal; signal.signal(signal.SIGINT, signal.default_int_handler)\n"


def communicate_or_kill(proc, timeout=60):
    """The child's output; a child that outlives the timeout is killed (a looping child left behind would load the
    machine for the rest of the run), and the test fails with what it printed."""
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"the child ignored SIGINT for {timeout} s and was killed; stdout: {out!r} stderr: {err!r}")


CHILD = RESTORE_SIGINT + textwrap.dedent("""
    import sys, time
    import ampforge as af
    import ampforge.nn.functional as F
    from ampforge import nn

    class Slow(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(64, 4)
            self.calls = 0
        def forward(self, x):
            self.calls += 1
            if self.calls == 3:
                print("TRAINING", flush=True)
            time.sleep(0.05)  # a step long enough for the signal to land inside one
            return self.fc(x)

    class Data:
        num_classes = 4
        def __len__(self):
            return 100000
        def __getitem__(self, i):
            return [float((i * 7 + k) % 5) for k in range(64)], i % 4

    model = Slow()
    trainer = af.train.Trainer(model, epochs=1, batch_size=8, progress=False, verbose=False, channels_last=False,
                               save=sys.argv[1])
    try:
        trainer.fit(Data())
    except KeyboardInterrupt:
        print("INTERRUPTED", model.calls, flush=True)
        sys.exit(3)
    print("FINISHED", flush=True)
""")


def test_ctrl_c_during_trainer_fit_raises_after_the_step_with_the_checkpoint(tmp_path):
    ckpt = tmp_path / "stopped.safetensors"
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(ckpt)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    line = proc.stdout.readline()
    if line.strip() != "TRAINING":
        proc.kill()
        pytest.fail(line + proc.stderr.read())
    proc.send_signal(signal.SIGINT)
    out, err = communicate_or_kill(proc)
    assert proc.returncode == 3, out + err
    assert out.startswith("INTERRUPTED"), out + err
    state = af.load_file(str(ckpt))  # written after the step the signal interrupted
    assert "model.fc.weight" in state
    position = json.loads(af._core.load_file_metadata(str(ckpt))["position"])
    calls = int(out.split()[1])
    # The stop came after a finished step: the checkpoint holds every step the model ran (one forward each).
    assert position["global_step"] == calls >= 3


def test_ctrl_c_during_a_long_engine_call_raises_keyboard_interrupt():
    child = RESTORE_SIGINT + textwrap.dedent("""
        import ampforge as af
        a = af.randn(768, 768)
        print("READY", flush=True)
        n = 0
        try:
            while True:
                a = (a @ a).tanh()  # oneDNN GEMMs: the signal waits until the call returns
                n += 1
        except KeyboardInterrupt:
            print("CAUGHT", n, flush=True)
    """)
    proc = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if proc.stdout.readline().strip() != "READY":
        proc.kill()
        pytest.fail(proc.stderr.read())
    time.sleep(1.0)
    for _ in range(5):  # several, so that some arrive during products
        proc.send_signal(signal.SIGINT)
        time.sleep(0.05)
    out, err = communicate_or_kill(proc)
    assert proc.returncode == 0 and out.startswith("CAUGHT"), out + err


def test_train_by_name_runs_the_cli_recipe():
    result = af.train.train(model="cnn", dataset="synthetic", epochs=1, max_steps=3, batch_size=16, verbose=False,
                            synthetic_size=64)
    assert result["steps"] == 3 and result["model"] == "cnn"
    with pytest.raises(TypeError, match="unknown option"):
        af.train.train(bogus=1)


def test_train_save_to_a_directory_fails_before_training(tmp_path):
    # The message names the path, not the CLI's --save flag.
    with pytest.raises(ValueError, match=r"cannot save checkpoints to '.*': it is a directory") as e:
        af.train.train(model="cnn", dataset="synthetic", epochs=1, max_steps=3, batch_size=16, verbose=False,
                       synthetic_size=64, save=str(tmp_path))
    assert "--save" not in str(e.value)


def test_train_step_is_the_trainers_step():
    model = af.models.create("cnn")
    step = af.train.TrainStep(model, "fp16", "adamw", 1e-3)
    x, y = af.randn(16, 1, 28, 28), af.tensor(np.arange(16) % 10)
    losses = [step(x, y) for _ in range(5)]
    assert all(np.isfinite(losses)) and losses[-1] < losses[0]


def test_the_training_example_runs():
    example = pathlib.Path(__file__).resolve().parents[2] / "examples" / "python" / "train_amp.py"
    for precision in ("fp16", "bf16"):
        r = subprocess.run([sys.executable, str(example), "--precision", precision, "--epochs", "1", "--max-steps", "30"],
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "final test accuracy" in r.stdout and "step   31" not in r.stdout
