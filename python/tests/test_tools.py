"""The tools as functions returning dicts: doctor, bench, memory.fit, memory.replay; safetensors files; models."""
import pathlib

import numpy as np
import pytest

import ampforge as af

DATA = pathlib.Path(__file__).resolve().parents[2] / "tests" / "data"


def test_doctor_returns_the_json_document():
    report = af.doctor(bandwidth=False, python_timeout=2.0)
    assert isinstance(report, dict) and report["schema"].startswith("ampforge.doctor/")
    assert {c["status"] for c in report["checks"]} <= {"PASS", "WARN", "FAIL", "SKIP"}
    assert any(c["id"] == "host.blas_kernels" for c in report["checks"])


def test_bench_times_training_steps():
    r = af.bench("cnn", batch=8, steps=2, warmup=1)
    assert r["model"] == "cnn" and len(r["step_seconds"]) == 2 and r["samples_per_sec"] > 0
    assert np.isfinite(r["last_loss"]) and r["parameters"] > 0
    with pytest.raises(ValueError):
        af.bench("cnn", precision="fp8")


def test_memory_fit_on_the_meta_device():
    r = af.memory.fit("cnn", "64MiB", device="meta", stands_for="cuda", max_batch=4096)
    assert r["fits"] and r["batch"] > 0 and r["first_failing_batch"] == r["batch"] + 1
    assert r["peak_reserved"] <= r["budget"] == 64 << 20 and r["breakdown"]["activations"] > 0
    small = af.memory.fit("cnn", 1 << 26, device="meta", max_batch=4096)
    assert small["batch"] == r["batch"]  # bytes or a size string


def test_memory_replay_memtrace_and_torch_snapshot():
    r = af.memory.replay(str(DATA / "memtrace" / "cnn.txt"))
    assert [x["policy"] for x in r["results"]] == ["naive", "pytorch", "ampforge"]
    assert all(x["peak_reserved_bytes"] >= x["peak_live_bytes"] > 0 for x in r["results"])
    s = af.memory.replay(str(DATA / "torch_snapshots" / "new_basic.pickle"))
    assert s["peak_live_bytes"] > 0 and s["results"]
    with pytest.raises(ValueError, match="GLOBAL|refuse|global"):
        af.memory.replay(str(DATA / "torch_snapshots" / "bad_global.pickle"))
    # Device 0 recorded nothing: the default is device 1, where the backward pass's sites are autograd nodes.
    two = af.memory.replay(str(DATA / "torch_snapshots" / "second_device.pickle"), policy="pytorch")
    assert two["device"] == 1
    assert [s["site"] for s in two["top_sites"]] == ["MmBackward0 (autograd backward)", "autograd engine (backward)"]
    with pytest.raises(ValueError, match="device 0 recorded no trace entries"):
        af.memory.replay(str(DATA / "torch_snapshots" / "second_device.pickle"), device=0)
    with pytest.raises(ValueError, match="no allocation history"):
        af.memory.replay(str(DATA / "torch_snapshots" / "no_history.pickle"))


def test_safetensors_files(tmp_path):
    tensors = {"a": af.arange(6).reshape(2, 3), "b": af.ones(2, dtype=af.bfloat16), "c": np.eye(2, dtype=np.float32)}
    af.save_file(tensors, str(tmp_path / "t.safetensors"), metadata={"who": "test"})
    back = af.load_file(str(tmp_path / "t.safetensors"))
    assert list(back) == ["a", "b", "c"]
    assert back["a"].tolist() == [[0, 1, 2], [3, 4, 5]] and back["b"].dtype == af.bfloat16
    assert back["c"].tolist() == [[1.0, 0.0], [0.0, 1.0]]
    assert af._core.load_file_metadata(str(tmp_path / "t.safetensors"))["who"] == "test"


def test_threads():
    n = af.get_num_threads()
    af.set_num_threads(1)
    assert af.get_num_threads() == 1
    af.set_num_threads(n)
