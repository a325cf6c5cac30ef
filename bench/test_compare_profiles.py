"""bench/compare_profiles.py on a made-up `ampforge bench --profile --json` row: operators of both sides land in the
same kinds, the kinds are ordered by how much longer ampforge takes, and unclassified names are listed."""
import json
import pathlib
import subprocess
import sys

SCRIPT = pathlib.Path(__file__).with_name("compare_profiles.py")


def ours(name, ms):
    return {"name": name, "self_ns": int(ms * 1e6), "calls": 1}


def theirs(name, ms):
    return {"name": name, "self_ms": ms, "calls": 1, "total_ms": ms}


ROW = {"model": "resnet50", "precision": "bf16", "batch": 8, "input": "224x224",
       "ampforge": {"profile": {"step": {"step_ns": 100_000_000, "forward_ns": 40_000_000, "backward_ns": 55_000_000,
                                         "optimizer_ns": 5_000_000},
                                "ops": [ours("conv2d", 30), ours("conv2d_backward_input", 20),
                                        ours("conv2d_backward_weight", 25), ours("batch_norm", 5),
                                        ours("sgd_step", 2), ours("mystery_op", 2.5)]}},
       "peer": {"memory_format": "channels_last",
                "profile": {"step_ms": 90.0, "phases_ms": {"forward": 30.0, "backward": 57.0, "optimizer": 3.0},
                            "ops": [theirs("aten::mkldnn_convolution", 20), theirs("aten::convolution_backward", 50),
                                    theirs("aten::native_batch_norm", 6), theirs("aten::_foreach_add_", 1),
                                    theirs("aten::lerp_", 0.5)]}}}


def run(tmp_path, rows, *args):
    f = tmp_path / "bench.json"
    f.write_text(json.dumps({"rows": rows}))
    return subprocess.run([sys.executable, str(SCRIPT), str(f), *args], capture_output=True, text=True)


def test_kinds_are_matched_across_frameworks_and_ordered_by_difference(tmp_path):
    r = run(tmp_path, [ROW], "--json")
    assert r.returncode == 0, r.stderr
    (cell,) = json.loads(r.stdout)
    kinds = {k["kind"]: k for k in cell["kinds"]}
    assert kinds["convolution forward"]["ampforge_ms"] == 30 and kinds["convolution forward"]["peer_ms"] == 20
    assert kinds["convolution backward"]["ampforge_ms"] == 45 and kinds["convolution backward"]["peer_ms"] == 50
    assert kinds["batch norm forward"]["difference_ms"] == -1
    assert kinds["optimizer"]["ampforge_ms"] == 2 and kinds["optimizer"]["peer_ms"] == 1
    assert kinds["other"]["names"] == {"ampforge mystery_op": 2.5, "torch aten::lerp_": 0.5}
    diffs = [k["difference_ms"] for k in cell["kinds"]]
    assert diffs == sorted(diffs, reverse=True) and cell["kinds"][0]["kind"] == "convolution forward"
    assert cell["ampforge_step_ms"] == 100 and cell["peer_step_ms"] == 90
    assert cell["phases"]["backward"] == {"ampforge_ms": 55, "peer_ms": 57}


def test_text_names_the_kinds_where_ampforge_is_slower(tmp_path):
    r = run(tmp_path, [ROW], "--top", "2")
    assert r.returncode == 0, r.stderr
    assert "ampforge slower in: convolution forward (+10.0 ms), other (+2.0 ms)" in r.stdout, r.stdout
    assert "phases, ms (ampforge / PyTorch): forward 40.0 / 30.0, backward 55.0 / 57.0, optimizer 5.0 / 3.0" in r.stdout


def test_a_row_without_profiles_or_a_file_that_is_not_bench_output_is_exit_2(tmp_path):
    r = run(tmp_path, [{**ROW, "peer": {"memory_format": "nchw"}}])
    assert r.returncode == 2 and "--profile" in r.stderr
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2")
    r = subprocess.run([sys.executable, str(SCRIPT), str(bad)], capture_output=True, text=True)
    assert r.returncode == 2 and "not `ampforge bench --json` output" in r.stderr
