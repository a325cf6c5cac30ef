"""The PyTorch peer of `ampforge bench` run as the bench runs it: one JSON object, every memory format timed, and
--max-seconds bounding the slow cells (a memory format whose warm-up step was over the bound and the slower one is
not timed; the timed steps stop at the bound after one).

Needs torch: scripts/test runs this file with Debian's PyTorch and with .venv-peer's PyTorch 2.14 when present.
"""
import json
import pathlib
import subprocess
import sys

SCRIPT = pathlib.Path(__file__).with_name("torch_bench_peer.py")


def peer(*args):
    r = subprocess.run([sys.executable, str(SCRIPT), "--model", "cnn", "--batch", "4", "--image-size", "16",
                        "--threads", "1", "--warmup", "1", "--steps", "2", *args],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_both_memory_formats_are_timed_without_a_bound():
    out = peer("--max-seconds", "0")
    assert "error" not in out, out
    assert set(out["results"]) == {"nchw", "channels_last"}
    assert all(len(r["seconds"]) == 2 for r in out["results"].values())
    assert "skipped" not in out
    assert out["best"] == min(out["results"], key=lambda k: out["results"][k]["median"])


def test_a_format_slower_to_warm_up_than_the_bound_is_not_timed():
    out = peer("--max-seconds", "1e-9")
    assert "error" not in out, out
    assert len(out["results"]) == 1 and len(out["skipped"]) == 1, out
    (timed, result), = out["results"].items()
    (skipped, why), = out["skipped"].items()
    assert {timed, skipped} == {"nchw", "channels_last"}
    assert out["best"] == timed
    assert len(result["seconds"]) == 1  # the timed steps stop at the bound, after one
    assert why.startswith("not timed: its warm-up step took ") and f"{timed}'s " in why, why


def test_an_unknown_model_is_an_error_object_not_a_crash():
    out = peer("--model", "no-such-model")
    assert "error" in out and "results" in out and not out["results"]


def test_profile_is_one_more_step_of_the_best_format_by_operator():
    out = peer("--profile")
    assert "error" not in out, out
    for fmt, result in out["results"].items():
        assert ("profile" in result) == (fmt == out["best"]), result.keys()
        assert len(result["seconds"]) == 2  # the profiled step is not a timed one
    prof = out["results"][out["best"]]["profile"]
    assert prof["step_ms"] > 0 and prof["ops"]
    assert all(op["calls"] >= 1 and op["self_ms"] > 0 for op in prof["ops"])
    assert [op["self_ms"] for op in prof["ops"]] == sorted((op["self_ms"] for op in prof["ops"]), reverse=True)
    assert any("conv" in op["name"] for op in prof["ops"]), [op["name"] for op in prof["ops"]]
    # The optimizer's element-wise updates count under its own range, not as the model's aten::add_.
    assert any(op["name"].startswith("Optimizer.step#SGD.step") for op in prof["ops"]), [op["name"] for op in prof["ops"]]
    assert set(prof["phases_ms"]) == {"forward", "backward", "optimizer"}
    assert 0 < sum(prof["phases_ms"].values()) <= prof["step_ms"] * 1.01


def test_a_missing_package_is_one_message_naming_it_and_the_setup_command():
    # Each model family's package hidden from the interpreter (None in sys.modules makes its import fail as a
    # missing one does), so the test means the same with both PyTorches, whatever else they have installed.
    for model, package in (("yolov8n", "ultralytics"), ("bert-tiny", "transformers")):
        code = (f"import runpy, sys; sys.modules[{package!r}] = None; "
                f"sys.argv = [{str(SCRIPT)!r}, '--model', {model!r}, '--batch', '1', '--threads', '1', "
                f"'--image-size', '32', '--seq-len', '8', '--warmup', '0', '--steps', '1']; "
                f"runpy.run_path({str(SCRIPT)!r}, run_name='__main__')")
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout.strip().splitlines()[-1])
        assert not out.get("results"), out
        assert out["error"].startswith(f"{package} is not installed in {sys.executable}"), out["error"]
        assert "scripts/setup --peer" in out["error"], out["error"]
