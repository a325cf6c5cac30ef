#!/usr/bin/env python3
"""Where a step's time goes on each side: `ampforge bench --profile --json` output, ampforge's operators and the
peer's (torch.profiler) put into the same kinds of work, and the kinds sorted by how much longer ampforge takes.

    build/bin/ampforge bench --models resnet50 --precisions bf16 --profile --json > cell.json
    python3 bench/compare_profiles.py cell.json [--top 5] [--json]

Both profiles are of one more step after the timed ones, so each side's total is its own profiled step (ampforge:
its profiler's wall time of the step; PyTorch: the step's wall time under torch.profiler, which adds its own
overhead per operator; on a CPU it also times the step's forward, backward and optimizer parts, printed beside
ampforge's phases). Self times are compared: an operator's own time, without the operators it called. A kind's
names are regular expressions over both sides' operator names; what no kind matches is listed as "other" with its
names, so that a reader sees what was not classified.
"""
import argparse
import json
import re
import sys

# (kind, ampforge operator names, PyTorch operator names): full-match regular expressions.
KINDS = [
    ("convolution forward", r"conv2d", r"aten::(mkldnn_convolution|_convolution|convolution|_mkldnn_convolution|"
                                       r"mkldnn_convolution_pointwise)"),
    ("convolution backward", r"conv2d_backward.*", r"aten::(convolution_backward|mkldnn_convolution_backward.*)"),
    ("batch norm forward", r"batch_norm(_act|_silu|_relu)?", r"aten::(native_batch_norm|_native_batch_norm_legit.*|"
                                                             r"batch_norm|_batch_norm_impl_index)"),
    ("batch norm backward", r"batch_norm.*backward.*", r"aten::(native_batch_norm_backward|batch_norm_backward)"),
    ("layer norm", r"layer_norm.*", r"aten::(native_layer_norm.*|layer_norm)"),
    ("matrix products", r"(matmul|linear|bmm|addmm|mm)(_backward.*)?", r"aten::(mm|addmm|bmm|matmul|linear|baddbmm|"
                                                                      r"_addmm_activation)"),
    ("attention", r"(scaled_dot_product_attention|attention|softmax)(_backward.*)?",
     r"aten::(_scaled_dot_product.*|scaled_dot_product_attention|_softmax|_softmax_backward_data|softmax)"),
    ("activations", r"(relu|silu|gelu|sigmoid|tanh)(_backward)?",
     r"aten::(relu_?|clamp_min_?|threshold_backward|silu_?|silu_backward|gelu|gelu_backward|sigmoid_?|"
     r"sigmoid_backward|tanh|tanh_backward)"),
    ("pooling", r"(max_pool2d|avg_pool2d|adaptive_avg_pool2d|global_avg_pool)(_backward)?",
     r"aten::(max_pool2d_with_indices(_backward)?|avg_pool2d(_backward)?|adaptive_avg_pool2d|mean|"
     r"_adaptive_avg_pool2d(_backward)?)"),
    ("optimizer", r"(sgd|adamw|adam)_step.*|zero_grad", r"aten::(_foreach_.*|_fused_(sgd|adamw?)_?)|Optimizer\..*"),
    ("dropout", r"dropout(_backward)?", r"aten::(bernoulli_|native_dropout(_backward)?|dropout)"),
    ("element-wise and reductions", r"(add|sub|mul|div|sum|neg|exp|log|pow|sqrt|rsqrt|where|clamp|masked_fill|"
                                    r"sum_to|reduce.*|broadcast.*|max|min|mean|abs|sign|eq|ne|gt|lt|ge|le|isinf|"
                                    r"isnan|isfinite|minimum|maximum)(_scalar|_tensor|_inplace|_)?",
     r"aten::(add|add_|sub|sub_|mul|mul_|div|div_|sum|neg|exp|log|pow|sqrt|rsqrt|where|clamp|masked_fill_?|"
     r"clone|cat|stack|index.*|gather|scatter.*|embedding.*|nonzero|any|all|eq|ne|gt|lt|ge|le|max|min|topk|sort|"
     r"argmax|cumsum|ones_like|zeros_like|arange|linspace)"),
    ("copies, casts, layout", r"(copy|to|cast|contiguous|transpose|permute|reshape|view|pad|cat|concat|split|slice|"
                              r"chunk|upsample.*|interpolate.*|embedding.*)(_backward)?",
     r"aten::(copy_|to|_to_copy|contiguous|clone|upsample_nearest2d(_backward)?|constant_pad_nd|slice_backward|"
     r"_unsafe_view|split.*|narrow|embedding_dense_backward)"),
    ("fills", r"(fill|zero|zeros|ones|empty)_?", r"aten::(fill_|zero_|zeros|ones|empty.*|full)"),
    ("loss", r"(cross_entropy|nll_loss|log_softmax|bce.*|binary_cross_entropy.*|detection_loss|mse_loss|"
             r"smooth_l1)(_backward)?",
     r"aten::(cross_entropy_loss|nll_loss.*|_log_softmax(_backward_data)?|log_softmax|"
     r"binary_cross_entropy_with_logits(_backward)?|mse_loss(_backward)?)"),
]
COMPILED = [(k, re.compile(a), re.compile(t)) for k, a, t in KINDS]


def kind_of(name, side):
    for kind, a, t in COMPILED:
        if (a if side == 0 else t).fullmatch(name):
            return kind
    return "other"


def classify(row):
    """{kind: [ampforge ms, PyTorch ms, {unmatched names: ms}]} and both profiled steps' ms."""
    ours, peer = row["ampforge"].get("profile"), (row.get("peer") or {}).get("profile")
    if not ours or not peer:
        raise ValueError(f"{row['model']} {row['precision']}: run `ampforge bench --profile --json` with a peer "
                         "(both cells need a \"profile\")")
    kinds = {}
    for op in ours["ops"]:
        k = kind_of(op["name"], 0)
        e = kinds.setdefault(k, [0.0, 0.0, {}])
        e[0] += op["self_ns"] / 1e6
        if k == "other":
            e[2]["ampforge " + op["name"]] = op["self_ns"] / 1e6
    for op in peer["ops"]:
        k = kind_of(op["name"], 1)
        e = kinds.setdefault(k, [0.0, 0.0, {}])
        e[1] += op["self_ms"]
        if k == "other":
            e[2]["torch " + op["name"]] = op["self_ms"]
    phases = {}
    if "phases_ms" in peer:
        for ph in ("forward", "backward", "optimizer"):
            phases[ph] = (ours["step"].get(ph + "_ns", 0) / 1e6, peer["phases_ms"].get(ph, 0.0))
    return kinds, ours["step"]["step_ns"] / 1e6, peer["step_ms"], phases


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("bench_json", help="`ampforge bench --profile --json` output")
    p.add_argument("--top", type=int, default=5, help="kinds listed in the summary line (default 5)")
    p.add_argument("--json", action="store_true", help="print the comparison as JSON")
    a = p.parse_args()
    try:
        with open(a.bench_json) as f:
            rows = json.load(f)["rows"]
    except (OSError, ValueError, KeyError) as e:
        print(f"compare_profiles: {a.bench_json}: not `ampforge bench --json` output ({e})", file=sys.stderr)
        return 2
    out = []
    for row in rows:
        try:
            kinds, ours_ms, peer_ms, phases = classify(row)
        except ValueError as e:
            print(f"compare_profiles: {e}", file=sys.stderr)
            return 2
        order = sorted(kinds.items(), key=lambda kv: kv[1][0] - kv[1][1], reverse=True)
        cell = {"model": row["model"], "precision": row["precision"], "ampforge_step_ms": ours_ms,
                "peer_step_ms": peer_ms, "peer_memory_format": row["peer"].get("memory_format"),
                "phases": {ph: {"ampforge_ms": o, "peer_ms": t} for ph, (o, t) in phases.items()},
                "kinds": [{"kind": k, "ampforge_ms": v[0], "peer_ms": v[1], "difference_ms": v[0] - v[1],
                           **({"names": v[2]} if v[2] else {})} for k, v in order]}
        out.append(cell)
        if a.json:
            continue
        print(f"\n{row['model']} {row['precision']} batch {row['batch']} {row['input']}: one profiled step, ampforge "
              f"{ours_ms:.1f} ms, PyTorch {peer_ms:.1f} ms ({row['peer'].get('memory_format', '?')}); self time "
              f"per kind, ampforge - PyTorch, largest first")
        if phases:
            print("  phases, ms (ampforge / PyTorch): " +
                  ", ".join(f"{ph} {o:.1f} / {t:.1f}" for ph, (o, t) in phases.items()))
        print(f"  {'kind':<30} {'ampforge ms':>12} {'PyTorch ms':>11} {'difference':>11}")
        for c in cell["kinds"]:
            print(f"  {c['kind']:<30} {c['ampforge_ms']:>12.1f} {c['peer_ms']:>11.1f} {c['difference_ms']:>+11.1f}")
            for n, ms in sorted(c.get("names", {}).items(), key=lambda kv: -kv[1])[:8]:
                if ms >= 0.05:
                    print(f"      {n} {ms:.1f}")
        behind = [c for c in cell["kinds"] if c["difference_ms"] > 0][:a.top]
        print("  ampforge slower in: " + (", ".join(f"{c['kind']} (+{c['difference_ms']:.1f} ms)" for c in behind)
                                          or "nothing"))
    if a.json:
        print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
