#!/usr/bin/env python3
"""Generates the BERT parity goldens (model and WordPiece tokenizer) with PyTorch 1.13 (Debian's python3-torch).

usage: /usr/bin/python3 scripts/gen_bert_golden.py OUT_DIR        (OUT_DIR: tests/data/models)
Writes
  bert_parity.safetensors   the reference's numbers for bert-tiny (below), well under 1 MB
  bert_parity.json          what was generated, how, with which versions; the reference's state-dict keys
                            and shapes for bert-base (BertModel with pooler and BertForMaskedLM)
  wordpiece_golden.json     the reference tokenizer's output for tests/data/text/wordpiece_sentences.txt with
                            the vocabulary tests/data/text/wordpiece_vocab.txt (written by tokenizer_golden())
The C++ tests (src/ampforge/models/bert_parity_test.cpp, src/ampforge/data/wordpiece_test.cpp) never run Python.

Debian has no `transformers`, so the reference model is written here with torch.nn modules that follow
Hugging Face's modeling_bert.py structure and names (../shared/docs/specs/MODELS.md §B): post-LN layers,
LayerNorm eps 1e-12, exact GELU, the additive attention mask (1 - mask) * finfo(float32).min, the decoder
tied to the word embeddings with its own bias, loss CrossEntropyLoss(ignore_index=-100).

Weights: the integer hash of scripts/gen_resnet_golden.py (its docstring has the formula), stream = 1 + the
tensor's index in the state dict without tied duplicates (HF's save_pretrained set, ampforge's state_dict()).
Rules: 2-D weights (linear and embeddings) c 0, a 1/sqrt(in); a bias beside a 2-D weight c 0, a 1/sqrt(in);
other 1-D weights (LayerNorm) c 0.25, a 0.05; other biases c 0.1, a 0.05 (cls.predictions.bias, LayerNorm).
Dropout is 0 (train-mode numbers must not depend on random draws); the rest is bert-tiny (2 x 128, 2 heads,
intermediate 512, vocabulary 30522, 512 positions).

Input (stored): input_ids (2, 16) from splitmix64 (ids in [1000, 30522)), [CLS] = 101 first, [SEP] = 102
last; sequence 1 has 5 padding tokens (id 0, attention_mask 0); five positions are masked ([MASK] = 103)
with their original ids as labels, -100 elsewhere.

Recorded, in F32 and under torch.autocast("cpu", torch.bfloat16) ("bf16"); F64 only to measure how far F32
rounding alone moves each quantity (printed and kept in the manifest, the tolerances' basis):
  bert_tiny.<prec>.logits_sample   (M, V/8) prediction scores at the masked positions, every 8th vocab column
  bert_tiny.<prec>.logits_rows     (M, 3) per masked row over all V columns: logsumexp, max, sum
  bert_tiny.<prec>.loss            masked-LM loss
  bert_tiny.<prec>.grad_sum / grad_abs_sum / grad_l2 / grad_absmax   (P,) F64 per parameter
  bert_tiny.<prec>.grad_index / grad_sample   (P, 32) positions (as gen_resnet_golden.py) and values
  bert_tiny.weight_sum, input_ids, attention_mask, labels
CPU autocast in PyTorch 1.13 has no float16, so there is no F16 golden.
"""
import datetime
import json
import math
import sys
import unicodedata
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gen_golden import write_safetensors  # noqa: E402
from gen_resnet_golden import U64, hashed, init_rule, sample_index, splitmix64  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
BATCH, SEQ, PAD_TAIL = 2, 16, 5
MASKED = [(0, 3), (0, 7), (0, 12), (1, 2), (1, 8)]
CLS, SEP, MASK = 101, 102, 103
INPUT_STREAM = 1 << 20
COL_STEP = 8


class Config:
    def __init__(self, layers, hidden, heads, inter, vocab=30522, positions=512, dropout=0.0):
        self.vocab_size, self.hidden_size, self.num_hidden_layers = vocab, hidden, layers
        self.num_attention_heads, self.intermediate_size = heads, inter
        self.max_position_embeddings, self.type_vocab_size = positions, 2
        self.layer_norm_eps, self.hidden_dropout_prob, self.attention_probs_dropout_prob = 1e-12, dropout, dropout


# ---- the reference model: Hugging Face's module tree, written with torch.nn ---------------------------------
class LayerNorm(nn.LayerNorm):
    """nn.LayerNorm run in F32 under autocast, as PyTorch's CUDA autocast lists layer_norm (and ampforge's op
    list does). PyTorch 1.13's CPU autocast leaves it out and then fails on a BF16 input with F32 weights (the
    MLM transform's GELU output), so the reference states the policy explicitly."""

    def forward(self, x):
        with torch.autocast("cpu", enabled=False):
            return super().forward(x.to(self.weight.dtype))


class BertEmbeddings(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.word_embeddings = nn.Embedding(c.vocab_size, c.hidden_size, padding_idx=0)
        self.position_embeddings = nn.Embedding(c.max_position_embeddings, c.hidden_size)
        self.token_type_embeddings = nn.Embedding(c.type_vocab_size, c.hidden_size)
        self.LayerNorm = LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.dropout = nn.Dropout(c.hidden_dropout_prob)

    def forward(self, ids):
        pos = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0)
        x = self.word_embeddings(ids) + self.token_type_embeddings(torch.zeros_like(ids))
        x = x + self.position_embeddings(pos)
        return self.dropout(self.LayerNorm(x))


class BertSelfAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.h, self.d = c.num_attention_heads, c.hidden_size // c.num_attention_heads
        self.query = nn.Linear(c.hidden_size, c.hidden_size)
        self.key = nn.Linear(c.hidden_size, c.hidden_size)
        self.value = nn.Linear(c.hidden_size, c.hidden_size)
        self.dropout = nn.Dropout(c.attention_probs_dropout_prob)

    def split(self, x):
        b, t, _ = x.shape
        return x.view(b, t, self.h, self.d).permute(0, 2, 1, 3)

    def forward(self, x, ext_mask):
        q, k, v = self.split(self.query(x)), self.split(self.key(x)), self.split(self.value(x))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.d) + ext_mask
        probs = self.dropout(F.softmax(scores, dim=-1))
        ctx = torch.matmul(probs, v).permute(0, 2, 1, 3).contiguous()
        return ctx.view(x.shape[0], x.shape[1], self.h * self.d)


class BertSelfOutput(nn.Module):
    def __init__(self, c, inp):
        super().__init__()
        self.dense = nn.Linear(inp, c.hidden_size)
        self.LayerNorm = LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.dropout = nn.Dropout(c.hidden_dropout_prob)

    def forward(self, x, residual):
        return self.LayerNorm(self.dropout(self.dense(x)) + residual)


class BertAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.self = BertSelfAttention(c)
        self.output = BertSelfOutput(c, c.hidden_size)

    def forward(self, x, m):
        return self.output(self.self(x, m), x)


class BertIntermediate(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.dense = nn.Linear(c.hidden_size, c.intermediate_size)

    def forward(self, x):
        return F.gelu(self.dense(x))  # exact erf GELU (HF "gelu")


class BertLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.attention = BertAttention(c)
        self.intermediate = BertIntermediate(c)
        self.output = BertSelfOutput(c, c.intermediate_size)  # HF's BertOutput: the same three modules

    def forward(self, x, m):
        a = self.attention(x, m)
        return self.output(self.intermediate(a), a)


class BertEncoder(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.layer = nn.ModuleList([BertLayer(c) for _ in range(c.num_hidden_layers)])

    def forward(self, x, m):
        for layer in self.layer:
            x = layer(x, m)
        return x


class BertPooler(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.dense = nn.Linear(c.hidden_size, c.hidden_size)
        self.activation = nn.Tanh()

    def forward(self, x):
        return self.activation(self.dense(x[:, 0]))


class BertModel(nn.Module):
    def __init__(self, c, add_pooling_layer=True):
        super().__init__()
        self.embeddings = BertEmbeddings(c)
        self.encoder = BertEncoder(c)
        self.pooler = BertPooler(c) if add_pooling_layer else None

    def forward(self, ids, mask):
        ext = (1.0 - mask[:, None, None, :].to(torch.float32)) * torch.finfo(torch.float32).min
        return self.encoder(self.embeddings(ids), ext)


class BertPredictionHeadTransform(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.dense = nn.Linear(c.hidden_size, c.hidden_size)
        self.LayerNorm = LayerNorm(c.hidden_size, eps=c.layer_norm_eps)

    def forward(self, x):
        return self.LayerNorm(F.gelu(self.dense(x)))


class BertLMPredictionHead(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.transform = BertPredictionHeadTransform(c)
        self.decoder = nn.Linear(c.hidden_size, c.vocab_size, bias=False)
        self.bias = nn.Parameter(torch.zeros(c.vocab_size))
        self.decoder.bias = self.bias

    def forward(self, x):
        return self.decoder(self.transform(x))


class BertOnlyMLMHead(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.predictions = BertLMPredictionHead(c)


class BertForMaskedLM(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.bert = BertModel(c, add_pooling_layer=False)
        self.cls = BertOnlyMLMHead(c)
        self.cls.predictions.decoder.weight = self.bert.embeddings.word_embeddings.weight  # tie_weights()

    def forward(self, ids, mask, labels):
        scores = self.cls.predictions(self.bert(ids, mask))
        loss = F.cross_entropy(scores.view(-1, scores.shape[-1]), labels.view(-1), ignore_index=-100)
        return scores, loss


def saved_state(model):
    """state_dict() without tied duplicates: what HF's save_pretrained writes (and ampforge's state_dict())."""
    seen, out = set(), []
    for k, v in model.state_dict(keep_vars=True).items():
        if id(v) in seen:
            continue
        seen.add(id(v))
        out.append((k, v))
    return out


def set_hashed_weights(model):
    sd = saved_state(model)
    shapes = {k: list(v.shape) for k, v in sd}
    sums = []
    with torch.no_grad():
        for idx, (name, t) in enumerate(sd):
            v = hashed(idx + 1, list(t.shape), *init_rule(name, list(t.shape), shapes))
            t.copy_(torch.from_numpy(v))
            sums.append(float(v.astype(np.float64).sum()))
    return np.array(sums, dtype=np.float64), [k for k, _ in sd]


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


def run(prec):
    c = Config(2, 128, 2, 512)
    model = BertForMaskedLM(c)
    weight_sum, sd_names = set_hashed_weights(model)
    if prec == "f64":
        model = model.double()
    ids, mask, labels = make_input(c.vocab_size)
    model.train()
    ctx = torch.autocast("cpu", dtype=torch.bfloat16) if prec == "bf16" else torch.autocast("cpu", enabled=False)
    with ctx:
        scores, loss = model(ids, mask, labels)
    loss.backward()
    sel = labels.view(-1) != -100
    rows = scores.detach().double().view(-1, c.vocab_size)[sel]  # (M, V)
    out = {"logits_sample": rows[:, ::COL_STEP].float(),
           "logits_rows": torch.stack([torch.logsumexp(rows, 1), rows.max(1).values, rows.sum(1)], 1),
           "loss": loss.detach().double().reshape(())}
    params = list(model.named_parameters())
    sums, abs_sums, l2s, maxes, idxs, samples = [], [], [], [], [], []
    for name, p in params:
        g = p.grad.detach().double().reshape(-1)
        sums.append(g.sum().item())
        abs_sums.append(g.abs().sum().item())
        l2s.append(g.norm().item())
        maxes.append(g.abs().max().item())
        ix = sample_index(sd_names.index(name) + 1, g.numel())
        idxs.append(ix)
        samples.append(g[torch.from_numpy(ix)])
    out["grad_sum"] = torch.tensor(sums, dtype=torch.float64)
    out["grad_abs_sum"] = torch.tensor(abs_sums, dtype=torch.float64)
    out["grad_l2"] = torch.tensor(l2s, dtype=torch.float64)
    out["grad_absmax"] = torch.tensor(maxes, dtype=torch.float64)
    out["grad_index"] = torch.from_numpy(np.stack(idxs))
    out["grad_sample"] = torch.stack(samples)
    info = {"parameters": [n for n, _ in params], "state_dict": sd_names, "loss": loss.item()}
    return out, weight_sum, (ids, mask, labels), info


def rounding_sensitivity(a, ref):
    """How far F32 (or BF16) moves each quantity from F64, in units of the quantity's scale."""
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


def state_keys(model):
    return [{"key": k, "shape": list(v.shape)} for k, v in saved_state(model)]


# ---- WordPiece reference tokenizer (BERT's BasicTokenizer + WordpieceTokenizer, written from its rules) ---------
def _is_whitespace(ch):
    return ch in " \t\n\r" or unicodedata.category(ch) == "Zs"


def _is_control(ch):
    if ch in "\t\n\r":
        return False
    return unicodedata.category(ch) in ("Cc", "Cf")


def _is_punctuation(ch):
    cp = ord(ch)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(ch).startswith("P")


def _is_cjk(cp):
    return (0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2A6DF or 0x2A700 <= cp <= 0x2B73F
            or 0x2B740 <= cp <= 0x2B81F or 0x2B820 <= cp <= 0x2CEAF or 0xF900 <= cp <= 0xFAFF
            or 0x2F800 <= cp <= 0x2FA1F)


def basic_tokenize(text, lower=True):
    cleaned = []
    for ch in text:
        cp = ord(ch)
        if cp == 0 or cp == 0xFFFD or _is_control(ch):
            continue
        cleaned.append(" " if _is_whitespace(ch) else ch)
    spaced = []
    for ch in "".join(cleaned):
        spaced.append(f" {ch} " if _is_cjk(ord(ch)) else ch)
    out = []
    for tok in "".join(spaced).split():
        if lower:
            tok = "".join(ch for ch in unicodedata.normalize("NFD", tok.lower()) if unicodedata.category(ch) != "Mn")
        cur = []
        for ch in tok:
            if _is_punctuation(ch):
                if cur:
                    out.append("".join(cur))
                    cur = []
                out.append(ch)
            else:
                cur.append(ch)
        if cur:
            out.append("".join(cur))
    return out


def wordpiece(word, vocab, max_chars=100):
    if len(word) > max_chars:
        return ["[UNK]"]
    pieces, start = [], 0
    while start < len(word):
        end, cur = len(word), None
        while start < end:
            sub = word[start:end] if start == 0 else "##" + word[start:end]
            if sub in vocab:
                cur = sub
                break
            end -= 1
        if cur is None:
            return ["[UNK]"]
        pieces.append(cur)
        start = end
    return pieces


def tokenizer_golden(out_dir):
    text_dir = ROOT / "tests" / "data" / "text"
    vocab_list = [l.rstrip("\n") for l in (text_dir / "wordpiece_vocab.txt").open(encoding="utf-8")]
    vocab = {t: i for i, t in enumerate(vocab_list)}
    cases = []
    for line in (text_dir / "wordpiece_sentences.txt").open(encoding="utf-8"):
        s = line.rstrip("\n")
        words = basic_tokenize(s)
        toks = [p for w in words for p in wordpiece(w, vocab)]
        ids = [vocab["[CLS]"]] + [vocab[t] for t in toks] + [vocab["[SEP]"]]
        cases.append({"text": s, "basic": words, "tokens": toks, "ids": ids})
    (out_dir / "wordpiece_golden.json").write_text(
        json.dumps({"generator": "scripts/gen_bert_golden.py", "vocab": "tests/data/text/wordpiece_vocab.txt",
                    "cases": cases}, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return len(cases)


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    out_dir = Path(sys.argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    results = {p: run(p) for p in ("f64", "f32", "bf16")}
    tensors = []
    for prec in ("f32", "bf16"):
        for k, v in results[prec][0].items():
            tensors.append((f"bert_tiny.{prec}.{k}", v))
    _, weight_sum, (ids, mask, labels), info = results["f32"]
    tensors += [("bert_tiny.weight_sum", torch.from_numpy(weight_sum)), ("bert_tiny.input_ids", ids),
                ("bert_tiny.attention_mask", mask), ("bert_tiny.labels", labels)]
    write_safetensors(out_dir / "bert_parity.safetensors", tensors,
                      {"generator": "scripts/gen_bert_golden.py", "torch": torch.__version__})
    sens = {p: rounding_sensitivity(results[p][0], results["f64"][0]) for p in ("f32", "bf16")}
    base = Config(12, 768, 12, 3072)
    manifest = {"generator": "scripts/gen_bert_golden.py", "torch": torch.__version__, "numpy": np.__version__,
                "date": datetime.date.today().isoformat(), "batch": BATCH, "seq": SEQ, "masked": MASKED,
                "col_step": COL_STEP, "parameters": info["parameters"], "state_dict": info["state_dict"],
                "loss": {p: results[p][3]["loss"] for p in results}, "rounding_vs_f64": sens,
                "bert_base": {"BertModel": state_keys(BertModel(base, True)),
                              "BertForMaskedLM": state_keys(BertForMaskedLM(base))}}
    manifest["bert_base"]["counts"] = {k: sum(math.prod(e["shape"]) for e in v)
                                       for k, v in manifest["bert_base"].items()}
    (out_dir / "bert_parity.json").write_text(json.dumps(manifest, indent=1) + "\n")
    n = tokenizer_golden(out_dir)
    print(f"bert-tiny loss f64 {manifest['loss']['f64']:.9f} f32 {manifest['loss']['f32']:.9f} "
          f"bf16 {manifest['loss']['bf16']:.6f}; rounding vs f64: {json.dumps(sens)}")
    print(f"bert-base counts {manifest['bert_base']['counts']}; {n} tokenizer cases")
    return 0


if __name__ == "__main__":
    sys.exit(main())
