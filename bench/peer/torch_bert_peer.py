#!/usr/bin/env python3
"""PyTorch peer of bench/bert_bench.cpp: one BERT masked-LM training step on the CPU, timed per step, as JSON.

    python3 torch_bert_peer.py --threads T --precision fp32|bf16 --config base|mini|tiny --batch 4 --seq 128
                               --steps N --warmup W --head masked|full
The model is Hugging Face transformers' own BertForMaskedLM (dropout 0.1, its default sdpa attention), built by the
Config / BertForMaskedLM helpers of scripts/gen_bert_golden.py, the generator of the parity goldens: run it with the
peer venv's interpreter (.venv-peer/bin/python, `scripts/setup --peer`), offline. The step is the one
ampforge times: zero_grad, forward under torch.autocast("cpu", bfloat16) for bf16, masked-LM cross-entropy
(head at the masked positions only with --head masked, gathering the rows before the decoder as NVIDIA's
recipe does; every position with --head full), backward, AdamW (lr 1e-4). Synthetic token ids with 15% of
the positions masked (fixed), T threads; warm-up steps are not timed.
"""
import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import gen_bert_golden as ref  # noqa: E402

CONFIGS = {"base": (12, 768, 12, 3072), "mini": (4, 256, 4, 1024), "tiny": (2, 128, 2, 512)}


def run(a):
    torch.manual_seed(0)
    c = ref.Config(*CONFIGS[a.config], dropout=0.1)
    model = ref.BertForMaskedLM(c)
    model.train()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, c.vocab_size, (a.batch, a.seq), generator=g)
    ids[:, 0], ids[:, -1] = 101, 102
    mask = torch.ones_like(ids)
    sel = torch.rand(a.batch, a.seq, generator=g) < 0.15
    sel[:, 0] = sel[:, -1] = False
    labels = torch.where(sel, ids, torch.full_like(ids, -100))
    ids = torch.where(sel, torch.full_like(ids, 103), ids)
    pos = (labels.view(-1) != -100).nonzero().squeeze(1)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    bf16 = a.precision == "bf16"

    def step():
        opt.zero_grad(set_to_none=False)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            seq = model.bert(ids, mask)
            if a.head == "masked":
                rows = seq.reshape(-1, c.hidden_size).index_select(0, pos)
                loss = F.cross_entropy(model.cls.predictions(rows).float(), labels.view(-1)[pos])
            else:
                scores = model.cls.predictions(seq)
                loss = F.cross_entropy(scores.float().view(-1, c.vocab_size), labels.view(-1))
        loss.backward()
        opt.step()

    for _ in range(a.warmup):
        step()
    times, cpu = [], []
    for _ in range(a.steps):
        t0, c0 = time.perf_counter(), time.process_time()
        step()
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return {"seconds": times, "median": statistics.median(times), "mean": statistics.fmean(times),
            "cpu_seconds": cpu, "cpu_median": statistics.median(cpu), "masked": int(pos.numel())}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, required=True)
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--config", choices=list(CONFIGS), default="base")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--head", choices=["masked", "full"], default="masked")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    out = {"torch": torch.__version__, "threads": torch.get_num_threads()}
    try:
        out["result"] = run(a)
    except RuntimeError as e:
        out["error"] = str(e).splitlines()[0]
    print(json.dumps(out))


if __name__ == "__main__":
    sys.exit(main())
