#!/usr/bin/env python3
"""Generates the BERT parity goldens from Hugging Face transformers' own BertForMaskedLM and BertModel.

usage: HF_HUB_OFFLINE=1 .venv-peer/bin/python scripts/gen_bert_golden.py OUT_DIR      (OUT_DIR: tests/data/models)
       (.venv-peer: `scripts/setup --peer`, requirements/peer.txt: torch, transformers; Debian has no transformers)
Writes
  bert_parity.safetensors   transformers' numbers for bert-tiny (below), well under 1 MB
  bert_parity.json          what was generated, how, with which versions (python, torch, transformers,
                            safetensors, numpy); transformers' state-dict keys and shapes for bert-base
                            (BertModel with pooler, BertForMaskedLM) and its parameter counts
The C++ test (src/ampforge/models/bert_parity_test.cpp) never runs Python. The WordPiece goldens have their own
generator (scripts/gen_wordpiece_golden.py). Offline: the models are built from a BertConfig (no pretrained
weights, nothing downloaded), one thread (torch.set_num_threads(1)).

The reference is transformers.BertForMaskedLM(BertConfig(...)) itself, with its default attention
implementation ("sdpa"; its "eager" path is run too and its distance recorded in the manifest): post-LN layers,
LayerNorm eps 1e-12, exact GELU, the decoder tied to the word embeddings and its bias to cls.predictions.bias,
loss CrossEntropyLoss (-100 ignored). BF16 and F16 are torch.autocast("cpu", dtype) as transformers users run
it: on the CPU, PyTorch's autocast keeps layer_norm, GELU and softmax in the 16-bit type (outputs rounded to it),
where ampforge's policy (as PyTorch's CUDA autocast) runs layer_norm in F32; both round their GEMM outputs.

Weights: the integer hash of scripts/gen_resnet_golden.py (its docstring has the formula), stream = 1 + the
tensor's index in transformers' state_dict() without tied duplicates (= the keys save_pretrained writes, and
ampforge's state_dict()). Rules: 2-D weights (linear and embeddings) c 0, a 1/sqrt(in); a bias beside a 2-D
weight c 0, a 1/sqrt(in); other 1-D weights (LayerNorm) c 0.25, a 0.05; other biases c 0.1, a 0.05
(cls.predictions.bias, LayerNorm). They reach transformers the way a user's checkpoint does: written as
model.safetensors + config.json into a temporary directory and loaded with BertForMaskedLM.from_pretrained
(local files only); the script fails unless transformers reports no missing, unexpected or mismatched key,
every loaded tensor equals its hashed value, and the ties hold. Dropout is 0 (train-mode numbers must not depend
on random draws); the rest is bert-tiny (2 x 128, 2 heads, intermediate 512, vocabulary 30522, 512 positions).

Input (stored): input_ids (2, 16) from splitmix64 (ids in [1000, 30522)), [CLS] = 101 first, [SEP] = 102
last; sequence 1 has 5 padding tokens (id 0, attention_mask 0); five positions are masked ([MASK] = 103)
with their original ids as labels, -100 elsewhere.

Recorded, in F32, under torch.autocast("cpu", torch.bfloat16) ("bf16") and torch.autocast("cpu", torch.float16)
("f16"); F64 (model.double()) only to measure how far each precision's rounding alone moves each quantity
(printed and kept in the manifest as rounding_vs_f64, the tolerances' basis):
  bert_tiny.<prec>.logits_sample   (M, V/8) prediction scores at the masked positions, every 8th vocab column
  bert_tiny.<prec>.logits_rows     (M, 3) per masked row over all V columns: logsumexp, max, sum
  bert_tiny.<prec>.loss            masked-LM loss
  bert_tiny.<prec>.grad_sum / grad_abs_sum / grad_l2 / grad_absmax   (P,) F64 per parameter
  bert_tiny.<prec>.grad_index / grad_sample   (P, 32) positions (as gen_resnet_golden.py) and values
  bert_tiny.weight_sum, input_ids, attention_mask, labels

Also kept for bench/peer/torch_bert_peer.py (bench/bert_bench.cpp's peer), which imports this file: Config(...)
and BertForMaskedLM(config), transformers' model behind the two calls it makes (model.bert(ids, mask) -> the last
hidden state, model.cls.predictions(rows)); it needs an interpreter with transformers
(AMPFORGE_PEER_PYTHON=.venv-peer/bin/python). `ampforge bench`'s peer (torch_bench_peer.py) builds transformers'
model itself.
"""
import copy
import datetime
import json
import math
import os
import platform
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is downloaded: configs and weights are local
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np  # noqa: E402
import safetensors  # noqa: E402
import safetensors.torch  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import transformers  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gen_golden import write_safetensors  # noqa: E402
from gen_resnet_golden import U64, grad_record, hashed, init_rule, splitmix64  # noqa: E402

BATCH, SEQ, PAD_TAIL = 2, 16, 5
MASKED = [(0, 3), (0, 7), (0, 12), (1, 2), (1, 8)]
CLS, SEP, MASK = 101, 102, 103
INPUT_STREAM = 1 << 20
COL_STEP = 8
ATTENTION = "sdpa"  # transformers' default for BERT; "eager" is measured against it (manifest: eager_vs_sdpa)
PRECISIONS = {"f64": None, "f32": None, "bf16": torch.bfloat16, "f16": torch.float16}


def config(layers, hidden, heads, inter, vocab=30522, positions=512, dropout=0.0):
    return transformers.BertConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
                                   num_attention_heads=heads, intermediate_size=inter, hidden_act="gelu",
                                   hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout,
                                   max_position_embeddings=positions, type_vocab_size=2, layer_norm_eps=1e-12,
                                   pad_token_id=0, initializer_range=0.02)


def saved_state(model):
    """(key, tensor) in state_dict() order without tied duplicates (a tensor seen under an earlier key)."""
    seen, out, tied = {}, [], {}
    for k, v in model.state_dict(keep_vars=True).items():
        if id(v) in seen:
            tied[k] = seen[id(v)]
            continue
        seen[id(v)] = k
        out.append((k, v))
    return out, tied


def saved_keys_of(model):
    """The keys save_pretrained writes (read back from the file it wrote)."""
    with tempfile.TemporaryDirectory() as d:
        model.save_pretrained(d)
        with safetensors.safe_open(os.path.join(d, "model.safetensors"), "pt") as f:
            return set(f.keys())


def hashed_state(model):
    """The hashed weights, by key, in the order that numbers the streams; plus each tensor's F64 sum."""
    sd, tied = saved_state(model)
    shapes = {k: list(v.shape) for k, v in sd}
    values, sums = {}, []
    for idx, (name, t) in enumerate(sd):
        v = hashed(idx + 1, list(t.shape), *init_rule(name, list(t.shape), shapes))
        values[name] = torch.from_numpy(v)
        sums.append(float(v.astype(np.float64).sum()))
    return values, np.array(sums, dtype=np.float64), tied


def load_reference(c):
    """transformers' BertForMaskedLM holding the hashed weights, loaded by from_pretrained as a user's checkpoint.
    Returns the model, the F64 weight sums, the key list and a record of the loading."""
    fresh = transformers.BertForMaskedLM(c)
    keys = [k for k, _ in saved_state(fresh)[0]]
    values, sums, tied = hashed_state(fresh)
    expected_tied = dict(getattr(fresh, "_tied_weights_keys", {}) or {})
    assert tied == expected_tied, f"tied duplicates {tied} differ from transformers' _tied_weights_keys {expected_tied}"
    saved = saved_keys_of(fresh)
    assert saved == set(keys), f"save_pretrained writes {sorted(saved ^ set(keys))} differently from state_dict()"
    with tempfile.TemporaryDirectory() as d:
        c.save_pretrained(d)
        safetensors.torch.save_file(values, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
        model, info = transformers.BertForMaskedLM.from_pretrained(
            d, local_files_only=True, output_loading_info=True, attn_implementation=ATTENTION, dtype=torch.float32)
    problems = {k: sorted(map(str, v)) for k, v in info.items() if v}
    assert not problems, f"transformers did not load the hashed checkpoint cleanly: {problems}"
    state = model.state_dict()
    for k in keys:
        assert torch.equal(state[k], values[k]), f"{k} was changed while loading"
    for k, src in tied.items():
        assert state[k].data_ptr() == state[src].data_ptr(), f"{k} is no longer tied to {src}"
    record = {"checkpoint_keys": len(keys), "tied_keys": tied, "loading_info": {k: [] for k in info},
              "attn_implementation": model.config._attn_implementation}
    return model, sums, keys, record


def make_input(vocab):
    n = BATCH * SEQ
    h = splitmix64(U64(INPUT_STREAM << 40) + np.arange(n, dtype=np.uint64))
    ids = (U64(1000) + h % U64(vocab - 1000)).astype(np.int64).reshape(BATCH, SEQ)
    mask = np.ones((BATCH, SEQ), dtype=np.int64)
    ids[:, 0] = CLS
    ids[0, SEQ - 1] = SEP
    ids[1, SEQ - PAD_TAIL - 1] = SEP
    ids[1, SEQ - PAD_TAIL:] = 0
    mask[1, SEQ - PAD_TAIL:] = 0
    labels = np.full((BATCH, SEQ), -100, dtype=np.int64)
    for b, t in MASKED:
        labels[b, t] = ids[b, t]
        ids[b, t] = MASK
    return torch.from_numpy(ids), torch.from_numpy(mask), torch.from_numpy(labels)


def run(base_model, keys, prec, attention=ATTENTION):
    model = copy.deepcopy(base_model)
    model.set_attn_implementation(attention)
    if prec == "f64":
        model = model.double()
    V = model.config.vocab_size
    ids, mask, labels = make_input(V)
    model.train()
    dtype = PRECISIONS[prec]
    ctx = torch.autocast("cpu", dtype=dtype) if dtype is not None else torch.autocast("cpu", enabled=False)
    with ctx:
        out = model(input_ids=ids, attention_mask=mask, labels=labels)
    out.loss.backward()
    scores, loss = out.logits, out.loss
    sel = labels.view(-1) != -100
    rows = scores.detach().double().view(-1, V)[sel]  # (M, V)
    res = {"logits_sample": rows[:, ::COL_STEP].float(),
           "logits_rows": torch.stack([torch.logsumexp(rows, 1), rows.max(1).values, rows.sum(1)], 1),
           "loss": loss.detach().double().reshape(())}
    params = list(model.named_parameters())  # tied duplicates are not repeated
    res.update(grad_record(model, keys, "", torch.float64))
    info = {"parameters": [n for n, _ in params], "loss": loss.item(), "logits_dtype": str(scores.dtype)}
    return res, (ids, mask, labels), info


def rounding_sensitivity(a, ref):
    """How far a run moves each quantity from the F64 run, in units of the quantity's scale."""
    res = {}
    s = max(1.0, ref["logits_sample"].abs().max().item())
    res["logits"] = ((a["logits_sample"].double() - ref["logits_sample"].double()).abs().max() / s).item()
    res["loss"] = abs(a["loss"].item() - ref["loss"].item()) / max(1.0, abs(ref["loss"].item()))
    # attention.self.key.bias has an exact gradient of 0 (softmax ignores a constant per query row), so
    # both sides return rounding noise (~1e-20) for it; it is excluded here and checked against 0 instead.
    gmax = ref["grad_absmax"]
    live = gmax > 1e-12 * gmax.max()
    err = (a["grad_sample"] - ref["grad_sample"]).abs() / gmax[:, None].clamp_min(1e-300)
    res["grad_sample_over_max"] = err[live].max().item()
    res["zero_gradient_tensors"] = int((~live).sum().item())
    return res


def bert_base_record():
    """transformers' bert-base state dicts (save_pretrained's keys, in state_dict() order) and parameter counts,
    built on the meta device (shapes only, no memory)."""
    c = config(12, 768, 12, 3072)
    out, counts = {}, {}
    with torch.device("meta"):
        models = {"BertModel": transformers.BertModel(c, add_pooling_layer=True),
                  "BertForMaskedLM": transformers.BertForMaskedLM(c)}
    for name, m in models.items():
        sd, _ = saved_state(m)
        out[name] = [{"key": k, "shape": list(v.shape)} for k, v in sd]
        counts[name] = sum(math.prod(e["shape"]) for e in out[name])
        assert counts[name] == m.num_parameters(), f"{name}: {counts[name]} vs num_parameters() {m.num_parameters()}"
    out["counts"] = counts
    return out


# ---- the bench peers' entry points (see the docstring) ------------------------------------------------------
def Config(layers, hidden, heads, inter, vocab=30522, positions=512, dropout=0.0):  # noqa: N802 (their name)
    return config(layers, hidden, heads, inter, vocab, positions, dropout)


class BertForMaskedLM(nn.Module):
    """transformers.BertForMaskedLM(c) with the calls the bench peers make: bert(ids, mask) returns the last
    hidden state (B, T, H); cls.predictions(x) is transformers' MLM head."""

    def __init__(self, c):
        super().__init__()
        self.hf = transformers.BertForMaskedLM(c)
        self.cls = self.hf.cls

    def bert(self, ids, mask):
        return self.hf.bert(input_ids=ids, attention_mask=mask).last_hidden_state


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    out_dir = Path(sys.argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    transformers.utils.logging.disable_progress_bar()
    c = config(2, 128, 2, 512)
    model, weight_sum, keys, load_record = load_reference(c)
    results = {p: run(model, keys, p) for p in PRECISIONS}
    eager = {p: run(model, keys, p, "eager")[0] for p in ("f64", "f32")}
    tensors = []
    for prec in ("f32", "bf16", "f16"):
        for k, v in results[prec][0].items():
            tensors.append((f"bert_tiny.{prec}.{k}", v))
    _, (ids, mask, labels), info = results["f32"]
    tensors += [("bert_tiny.weight_sum", torch.from_numpy(weight_sum)), ("bert_tiny.input_ids", ids),
                ("bert_tiny.attention_mask", mask), ("bert_tiny.labels", labels)]
    versions = {"python": platform.python_version(), "torch": torch.__version__,
                "transformers": transformers.__version__, "safetensors": safetensors.__version__,
                "numpy": np.__version__}
    write_safetensors(out_dir / "bert_parity.safetensors", tensors,
                      {"generator": "scripts/gen_bert_golden.py", "reference": "transformers.BertForMaskedLM",
                       **versions})
    sens = {p: rounding_sensitivity(results[p][0], results["f64"][0]) for p in ("f32", "bf16", "f16")}
    # The eager path (matmul, additive mask (1 - mask) * finfo.min, softmax) against the sdpa F64 run: the two
    # implementations agree to F64 rounding, and eager F32 moves as far from F64 as sdpa F32 does.
    eager_vs_sdpa = {"f64": rounding_sensitivity(eager["f64"], results["f64"][0]),
                     "f32_vs_sdpa_f64": rounding_sensitivity(eager["f32"], results["f64"][0])}
    manifest = {"generator": "scripts/gen_bert_golden.py",
                "reference": "transformers.BertForMaskedLM(BertConfig(...)) loaded with from_pretrained",
                **versions, "threads": torch.get_num_threads(), "date": datetime.date.today().isoformat(),
                "config": {k: getattr(c, k) for k in ("vocab_size", "hidden_size", "num_hidden_layers",
                                                      "num_attention_heads", "intermediate_size", "hidden_act",
                                                      "layer_norm_eps", "hidden_dropout_prob",
                                                      "attention_probs_dropout_prob", "max_position_embeddings",
                                                      "type_vocab_size", "pad_token_id")},
                "loading": load_record, "batch": BATCH, "seq": SEQ, "masked": MASKED, "col_step": COL_STEP,
                "autocast": {p: str(d) for p, d in PRECISIONS.items() if d is not None},
                "logits_dtype": {p: results[p][2]["logits_dtype"] for p in results},
                "parameters": results["f32"][2]["parameters"], "state_dict": keys,
                "loss": {p: results[p][2]["loss"] for p in results}, "rounding_vs_f64": sens,
                "eager_vs_sdpa": eager_vs_sdpa, "bert_base": bert_base_record()}
    (out_dir / "bert_parity.json").write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"transformers {transformers.__version__}, torch {torch.__version__}: bert-tiny loss "
          + ", ".join(f"{p} {manifest['loss'][p]:.9f}" for p in PRECISIONS))
    print(f"rounding vs f64: {json.dumps(sens)}")
    print(f"eager vs sdpa: {json.dumps(eager_vs_sdpa)}")
    print(f"bert-base counts {manifest['bert_base']['counts']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
