#!/usr/bin/env python3
"""Generates the WordPiece goldens from Hugging Face's tokenizers (BertWordPieceTokenizer), cross-checked with
transformers' BertTokenizerFast (the same Rust tokenizer) and transformers' Python BertTokenizerLegacy (a second
implementation of BERT's rules, on Python's Unicode database).

usage: HF_HUB_OFFLINE=1 .venv-peer/bin/python scripts/gen_wordpiece_golden.py [--train-vocab] [--speed] [--show I..]
       (.venv-peer: `scripts/setup --peer`; Debian has no tokenizers/transformers. Offline: vocabularies are local
       files, nothing is downloaded; one thread: TOKENIZERS_PARALLELISM=false, RAYON_NUM_THREADS=1.)
Writes (commit them; src/ampforge/data/wordpiece_test.cpp compares and never runs Python):
  tests/data/models/wordpiece_golden.json   the edge cases, tests/data/text/wordpiece_sentences.txt and
                                            wordpiece_edge_cases.txt with tests/data/text/wordpiece_vocab.txt:
                                            per line the basic tokenizer's words (normalizer + pre-tokenizer), the
                                            pieces and the framed ids ([CLS] ... [SEP]).
  tests/data/models/wordpiece_unicode.json  every code point c (no surrogates) inside "a" c "b": what the basic
                                            tokenizer does with it (dropped, a word break, a word of its own, kept)
                                            and what it becomes (lower-casing, accent stripping), as ranges.
  tests/data/models/wordpiece_wordnet.json  the real corpus: WordNet's glosses (definitions and examples, read as
  + wordpiece_wordnet.safetensors           ampforge's --corpus wordnet reads them, data/text_corpus.cpp) with
                                            tests/data/text/wordnet_vocab.txt: the ids of every gloss as hashes
                                            (below), the full ids of every 1000th gloss, the counts.
  tests/data/text/wordnet_vocab.txt         (--train-vocab only) 8192 tokens learned from the glosses by
                                            tokenizers' WordPieceTrainer (min frequency 2, [PAD] [UNK] [CLS] [SEP]
                                            [MASK] first), so the corpus exercises the greedy longest match.
                                            The trainer learns the same 8192 tokens on every run but orders the
                                            single characters differently (a hash map's order): the committed
                                            file is the one the golden was made with; --train-vocab changes ids.
--speed prints the tokenisation speed of each Hugging Face tokenizer on the glosses (one thread, best of 3);
--show I... prints tokenizers' pieces and ids of glosses I... (what a failing wordpiece_test.cpp names).

Hashes (C++ recomputes them; x runs over 64-bit words, all arithmetic mod 2^64):
  fnv(xs)      h = 0xcbf29ce484222325; for x in xs: h = (h ^ x) * 0x100000001b3
  gloss i      s_i = fnv(its ids, no [CLS]/[SEP]); stored: (s ^ s>>16 ^ s>>32 ^ s>>48) & 0xffff  (U8 (N, 2), LE)
  block b      fnv over glosses 256b .. 256b+255 of (number of ids, then the ids)   (I64 (ceil(N/256)))
  corpus       fnv over the bytes of each gloss followed by 10 ('\\n'): the text the golden was made from
A changed gloss is found by its block hash (64 bits), then named by its 16-bit hash.

Reference settings: lowercase (uncased), strip_accents None (follows lowercase, as BERT), handle_chinese_chars,
clean_text; special tokens written in the text are not matched (tokenizers' encode_special_tokens = True,
transformers' split_special_tokens=True), because ampforge's tokenizer reads text as text; the ids with
Hugging Face's default (a literal "[MASK]" becomes the [MASK] token) are recorded beside, where they differ.

Where tokenizers and the legacy Python tokenizer disagree, each difference is explained in the golden
("reason"), with the side ampforge follows ("ampforge"): REASONS below. The test expects that side.
"""
import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import unicodedata
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread (also for encode_batch)
os.environ["RAYON_NUM_THREADS"] = "1"

import numpy as np  # noqa: E402
import tokenizers  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from tokenizers import BertWordPieceTokenizer  # noqa: E402
from transformers.models.bert.tokenization_bert_legacy import BasicTokenizer, BertTokenizerLegacy  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gen_golden import write_safetensors  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TEXT, MODELS = ROOT / "tests" / "data" / "text", ROOT / "tests" / "data" / "models"
EDGE_VOCAB = TEXT / "wordpiece_vocab.txt"
EDGE_FILES = [TEXT / "wordpiece_sentences.txt", TEXT / "wordpiece_edge_cases.txt"]
WORDNET_DIR = Path("/usr/share/wordnet")
WORDNET_VOCAB = TEXT / "wordnet_vocab.txt"
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
VOCAB_SIZE, BLOCK, SAMPLE_EVERY = 8192, 256, 1000
FNV_OFFSET, FNV_PRIME, M64 = 0xCBF29CE484222325, 0x100000001B3, (1 << 64) - 1

# Why tokenizers (Rust) and transformers' Python BertTokenizerLegacy disagree, and whom ampforge follows.
REASONS = {
    "unassigned": ("tokenizers", "code point unassigned in Unicode 14 (Cn): the legacy Python tokenizer drops every "
                   "category C* character; tokenizers keeps them (its control test covers Cc Cf Co, not Cn) and "
                   "isolates those inside BERT's CJK blocks, which are ranges; ampforge does as tokenizers"),
    "unassigned_then_lowercased": ("keep", "unassigned in Unicode 14 (ampforge's tables, Python 3.11's database), "
                                   "a letter in the newer Unicode of Rust's char::to_lowercase, which tokenizers "
                                   "lower-cases; ampforge keeps the unknown character as it is, the legacy "
                                   "tokenizer drops it (Cn)"),
    "cjk_range": ("legacy", "tokenizers' is_chinese_char starts CJK Extension B-C's block at U+2B920, BERT's "
                  "_is_chinese_char (and the legacy tokenizer, and ampforge) at U+2B820: U+2B820-U+2B91F are "
                  "ideographs that tokenizers leaves inside words"),
    "unicode_version": ("legacy", "the character's Unicode 14 category (Python 3.11's database, ampforge's tables) "
                        "differs from tokenizers' punctuation / mark / control tables (the unicode_categories crate, "
                        "older than Unicode 10: U+2E43, punctuation since 10.0, is a letter there): punctuation, "
                        "combining marks and format characters added since are letters to tokenizers; ampforge "
                        "follows Unicode 14, as the legacy tokenizer"),
    "special_tokens": ("tokenizers", "the text spells special tokens ([MASK], [UNK]): tokenizers with "
                       "encode_special_tokens = True tokenises them as text, as ampforge does; transformers' "
                       "BertTokenizerLegacy matches them as special tokens even with split_special_tokens=True, as "
                       "Hugging Face's tokenizers do by default (the case's ids_matching_special_tokens)"),
    "final_sigma": ("tokenizers", "Python's str.lower() turns a word-final capital sigma into final sigma (U+03C2), "
                    "tokenizers lower-cases per character (U+03C3); ampforge lower-cases per character (as "
                    "tokenizers)"),
}


def fnv(xs, h=FNV_OFFSET):
    for x in xs:
        h = ((h ^ x) * FNV_PRIME) & M64
    return h


def fold16(h):
    return (h ^ (h >> 16) ^ (h >> 32) ^ (h >> 48)) & 0xFFFF


def versions():
    return {"python": platform.python_version(), "tokenizers": tokenizers.__version__,
            "transformers": transformers.__version__, "numpy": np.__version__,
            "unicodedata": unicodedata.unidata_version}


def read_lines(path):
    """Lines split at '\\n' only (U+2028 and friends are inside lines), as C++ getline."""
    text = path.read_bytes().decode("utf-8")
    lines = text.split("\n")
    return lines[:-1] if lines and lines[-1] == "" else lines


def read_wordnet_glosses(d=WORDNET_DIR):
    """As data/text_corpus.cpp: data.noun/verb/adj/adv, licence lines (two leading spaces) skipped, the text after
    ' | ', trailing spaces and CR removed, empty glosses skipped."""
    docs = []
    for part in ("data.noun", "data.verb", "data.adj", "data.adv"):
        for line in (d / part).read_bytes().split(b"\n"):
            if line.startswith(b"  "):
                continue
            bar = line.find(b" | ")
            if bar < 0:
                continue
            gloss = line[bar + 3:].rstrip(b" \r")
            if gloss:
                docs.append(gloss.decode("utf-8"))
    return docs


def hf_tokenizer(vocab_path):
    """tokenizers' BertWordPieceTokenizer for an uncased vocab.txt; special tokens in the text are not matched."""
    tok = BertWordPieceTokenizer(str(vocab_path), clean_text=True, handle_chinese_chars=True, strip_accents=None,
                                 lowercase=True, wordpieces_prefix="##")
    tok._tokenizer.encode_special_tokens = True
    return tok


def hf_words(tok, text):
    return [w for w, _ in tok.pre_tokenizer.pre_tokenize_str(tok.normalizer.normalize_str(text))]


def legacy_tokenizer(vocab_path):
    return BertTokenizerLegacy(str(vocab_path), do_lower_case=True, split_special_tokens=True)


# ---- the edge cases -------------------------------------------------------------------------------------------
def reason_for_text(text, cp_reasons):
    found = set()
    for ch in text:
        r = cp_reasons.get(ord(ch))
        if r:
            found.add(r)
    if "\u03a3" in text:
        found.add("final_sigma")
    if any(t in text for t in SPECIALS):
        found.add("special_tokens")
    return sorted(found)


def edge_golden(cp_reasons):
    tok, legacy = hf_tokenizer(EDGE_VOCAB), legacy_tokenizer(EDGE_VOCAB)
    default = BertWordPieceTokenizer(str(EDGE_VOCAB), lowercase=True)  # special tokens matched (HF's default)
    fast = transformers.BertTokenizerFast(vocab=str(EDGE_VOCAB), do_lower_case=True, split_special_tokens=True)
    files, n_diff = [], 0
    for path in EDGE_FILES:
        cases = []
        for text in read_lines(path):
            enc = tok.encode(text)
            case = {"text": text, "basic": hf_words(tok, text), "tokens": enc.tokens[1:-1], "ids": enc.ids}
            assert fast(text)["input_ids"] == enc.ids, f"BertTokenizerFast differs from tokenizers on {text!r}"
            d = default.encode(text).ids
            if d != enc.ids:
                case["ids_matching_special_tokens"] = d
            leg_basic = legacy.basic_tokenizer.tokenize(text)
            leg_tokens = legacy.tokenize(text)
            leg_ids = legacy.convert_tokens_to_ids(["[CLS]"] + leg_tokens + ["[SEP]"])
            if (leg_basic, leg_tokens, leg_ids) != (case["basic"], case["tokens"], case["ids"]):
                reasons = reason_for_text(text, cp_reasons)
                assert len(reasons) == 1, f"unexplained difference with the legacy tokenizer on {text!r}: {reasons}"
                case["legacy"] = {"basic": leg_basic, "tokens": leg_tokens, "ids": leg_ids}
                case["reason"] = reasons[0]
                case["ampforge"] = REASONS[reasons[0]][0]
                n_diff += 1
            cases.append(case)
        files.append({"sentences": str(path.relative_to(ROOT)), "cases": cases})
    golden = {"generator": "scripts/gen_wordpiece_golden.py",
              "reference": "tokenizers.BertWordPieceTokenizer(vocab, lowercase=True), encode_special_tokens=True",
              **versions(), "date": datetime.date.today().isoformat(), "vocab": str(EDGE_VOCAB.relative_to(ROOT)),
              "reasons": {k: {"ampforge": v[0], "why": v[1]} for k, v in REASONS.items()}, "files": files}
    (MODELS / "wordpiece_golden.json").write_text(json.dumps(golden, indent=1, ensure_ascii=False) + "\n",
                                                  encoding="utf-8")
    return sum(len(f["cases"]) for f in files), n_diff


# ---- every code point -----------------------------------------------------------------------------------------
def probe_class(words, c):
    """What the basic tokenizer did with c in "a" c "b": (class, what c became)."""
    if words == ["ab"]:
        return "drop", ""
    if words == ["a", "b"]:
        return "space", ""
    if len(words) == 3 and words[0] == "a" and words[2] == "b":
        return "isolate", words[1]
    if len(words) == 1 and words[0].startswith("a") and words[0].endswith("b") and len(words[0]) > 2:
        return "keep", words[0][1:-1]
    raise AssertionError(f"U+{ord(c):04X}: unexpected words {words}")


def runs_of(items):
    """[(cp, value)] sorted -> [[lo, hi, value]] merging consecutive code points with equal values."""
    out = []
    for cp, v in items:
        if out and out[-1][2] == v and out[-1][1] == cp - 1:
            out[-1][1] = cp
        else:
            out.append([cp, cp, v])
    return out


def bert_cjk(cp):
    """BERT's _is_chinese_char ranges (Google's tokenization.py)."""
    return any(lo <= cp <= hi for lo, hi in ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
                                             (0x2B740, 0x2B81F), (0x2B820, 0x2CEAF), (0xF900, 0xFAFF),
                                             (0x2F800, 0x2FA1F)))


HANGUL = (0xAC00, 0xD7A3)  # what syllables become is checked by one hash: 11172 entries would be 300 kB


def unicode_golden():
    tok = hf_tokenizer(EDGE_VOCAB)
    legacy = BasicTokenizer(do_lower_case=True, tokenize_chinese_chars=True, strip_accents=None)
    classes, fold, overrides, override_fold, cp_reasons = [], {}, [], {}, {}
    hangul = FNV_OFFSET
    for cp in range(0x110000):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        c = chr(cp)
        s = "a" + c + "b"
        ref = probe_class(hf_words(tok, s), c)
        leg = probe_class(legacy.tokenize(s), c)
        classes.append((cp, ref[0]))
        if HANGUL[0] <= cp <= HANGUL[1]:
            hangul = fnv(ref[1].encode("utf-8"), hangul)
            hangul = fnv([0x0A], hangul)
        elif ref[1] and ref[1] != c:
            fold[cp] = ref[1]
        if leg == ref:
            continue
        cat = unicodedata.category(c)
        if 0x2B820 <= cp <= 0x2B91F:
            reason = "cjk_range"
        elif cat == "Cn":  # BERT's CJK blocks are ranges: their unassigned code points are isolated too
            kept = ("isolate", c) if bert_cjk(cp) else ("keep", c)
            reason = "unassigned" if ref == kept else "unassigned_then_lowercased"
        else:
            reason = "unicode_version"
        cp_reasons[cp] = reason
        follows = REASONS[reason][0]
        amp = ref if follows == "tokenizers" else leg if follows == "legacy" else ("keep", c)
        if amp != ref:
            overrides.append((cp, (amp[0], reason, cat)))
            if amp[1] and amp[1] != c:
                override_fold[cp] = amp[1]
    class_runs = [r for r in runs_of(classes) if r[2] != "keep"]
    ov = [[lo, hi, v[0], v[1], v[2]] for lo, hi, v in runs_of(overrides)]
    per_reason = {}
    for _, (_, reason, _) in overrides:
        per_reason[reason] = per_reason.get(reason, 0) + 1
    golden = {"generator": "scripts/gen_wordpiece_golden.py",
              "reference": "tokenizers' BertNormalizer(lowercase) + BertPreTokenizer on 'a' + chr(cp) + 'b'",
              **versions(), "date": datetime.date.today().isoformat(),
              "probe": "words of 'a' + c + 'b' for every code point c except surrogates: drop ['ab'], space "
                       "['a', 'b'], isolate ['a', f, 'b'], keep ['a' + f + 'b'] (the default), f = fold[c] or c",
              "classes": class_runs, "fold": {str(k): v for k, v in fold.items()},
              "hangul_syllables": {"first": HANGUL[0], "last": HANGUL[1], "fnv": f"{hangul:016x}",
                                   "how": "fnv over the UTF-8 bytes of f, then 10, for each syllable in order"},
              "reasons": {k: {"ampforge": v[0], "why": v[1]} for k, v in REASONS.items()},
              "ampforge_differs": ov, "ampforge_differs_fold": {str(k): v for k, v in override_fold.items()},
              "ampforge_differs_count": per_reason,
              "legacy_differs_count": {r: sum(1 for v in cp_reasons.values() if v == r) for r in REASONS}}
    (MODELS / "wordpiece_unicode.json").write_text(json.dumps(golden, ensure_ascii=False, separators=(",", ":"))
                                                   + "\n", encoding="utf-8")
    return cp_reasons, per_reason, golden["legacy_differs_count"]


# ---- the WordNet corpus ---------------------------------------------------------------------------------------
def train_vocab(docs):
    tok = BertWordPieceTokenizer(clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=True)
    tok.train_from_iterator(docs, vocab_size=VOCAB_SIZE, min_frequency=2, limit_alphabet=1000,
                            special_tokens=SPECIALS, show_progress=False, wordpieces_prefix="##")
    with tempfile.TemporaryDirectory() as d:
        path = tok.save_model(d)[0]
        WORDNET_VOCAB.write_bytes(Path(path).read_bytes())


def wordnet_golden(docs):
    tok, legacy = hf_tokenizer(WORDNET_VOCAB), legacy_tokenizer(WORDNET_VOCAB)
    vocab = read_lines(WORDNET_VOCAB)
    assert vocab[:5] == SPECIALS, vocab[:5]
    encs = tok.encode_batch(docs, add_special_tokens=False)
    ids = [e.ids for e in encs]
    fast = transformers.BertTokenizerFast(vocab=str(WORDNET_VOCAB), do_lower_case=True, split_special_tokens=True)
    fast_ids = fast(docs, add_special_tokens=False)["input_ids"]
    fast_diff = [i for i in range(len(docs)) if fast_ids[i] != ids[i]]
    assert not fast_diff, f"BertTokenizerFast differs from tokenizers on gloss {fast_diff[0]}"
    legacy_diff = []
    for i, d in enumerate(docs):
        if legacy.convert_tokens_to_ids(legacy.tokenize(d)) != ids[i]:
            legacy_diff.append(i)
    h16 = np.zeros((len(docs), 2), dtype=np.uint8)
    for i, x in enumerate(ids):
        f = fold16(fnv(x))
        h16[i] = (f & 0xFF, f >> 8)
    blocks = []
    for b in range(0, len(docs), BLOCK):
        h = FNV_OFFSET
        for x in ids[b:b + BLOCK]:
            h = fnv([len(x)] + x, h)
        blocks.append(h)
    blocks = np.array(blocks, dtype=np.uint64).view(np.int64)
    corpus = FNV_OFFSET
    for d in docs:
        corpus = fnv(d.encode("utf-8") + b"\n", corpus)
    unk = sum(x.count(1) for x in ids)
    samples = [{"index": i, "text": docs[i], "tokens": encs[i].tokens, "ids": ids[i]}
               for i in range(0, len(docs), SAMPLE_EVERY)]
    longest = max(range(len(docs)), key=lambda i: len(ids[i]))
    samples.append({"index": longest, "text": docs[longest], "tokens": encs[longest].tokens, "ids": ids[longest]})
    write_safetensors(MODELS / "wordpiece_wordnet.safetensors",
                      [("gloss_hash16", torch.from_numpy(h16)), ("block_hash", torch.from_numpy(blocks))],
                      {"generator": "scripts/gen_wordpiece_golden.py", "tokenizers": tokenizers.__version__})
    try:
        wn = subprocess.run(["dpkg-query", "-W", "-f=${Version}", "wordnet-base"], capture_output=True, text=True,
                            check=False).stdout.strip()
    except OSError:
        wn = "unknown"
    golden = {"generator": "scripts/gen_wordpiece_golden.py",
              "reference": "tokenizers.BertWordPieceTokenizer(vocab, lowercase=True), encode_special_tokens=True, "
                           "encode_batch(add_special_tokens=False)",
              **versions(), "date": datetime.date.today().isoformat(), "corpus": "WordNet glosses",
              "wordnet_dir": str(WORDNET_DIR), "wordnet_base": wn, "glosses": len(docs),
              "corpus_fnv": f"{corpus:016x}", "vocab": str(WORDNET_VOCAB.relative_to(ROOT)), "vocab_size": len(vocab),
              "vocab_trainer": f"tokenizers {tokenizers.__version__} WordPieceTrainer(vocab_size={VOCAB_SIZE}, "
                               "min_frequency=2, limit_alphabet=1000)",
              "tokens": sum(len(x) for x in ids), "unk_tokens": unk, "block": BLOCK,
              "bert_tokenizer_fast_differs": len(fast_diff), "legacy_differs": len(legacy_diff),
              "legacy_differs_first": legacy_diff[:20], "samples": samples}
    (MODELS / "wordpiece_wordnet.json").write_text(json.dumps(golden, indent=1, ensure_ascii=False) + "\n",
                                                   encoding="utf-8")
    return golden


def speed(docs):
    """Seconds (wall and process CPU) to tokenise every gloss (no framing), one thread, best of 3 (the Python
    tokenizer: one run), and glosses/s, tokens/s."""
    tok = hf_tokenizer(WORDNET_VOCAB)
    fast = transformers.BertTokenizerFast(vocab=str(WORDNET_VOCAB), do_lower_case=True, split_special_tokens=True)
    legacy = legacy_tokenizer(WORDNET_VOCAB)
    n_tokens = sum(len(e.ids) for e in tok.encode_batch(docs, add_special_tokens=False))
    runs = {
        "tokenizers BertWordPieceTokenizer.encode_batch": lambda: tok.encode_batch(docs, add_special_tokens=False),
        "tokenizers BertWordPieceTokenizer.encode, one call per gloss":
            lambda: [tok.encode(d, add_special_tokens=False) for d in docs],
        "transformers BertTokenizerFast(list of glosses)": lambda: fast(docs, add_special_tokens=False),
        "transformers BertTokenizerLegacy (Python), one call per gloss":
            lambda: [legacy.convert_tokens_to_ids(legacy.tokenize(d)) for d in docs],
    }
    out = {}
    for name, f in runs.items():
        ts, cpu = [], []
        for _ in range(3 if "Legacy" not in name else 1):
            t0, c0 = time.perf_counter(), time.process_time()
            f()
            ts.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
        best = min(range(len(ts)), key=lambda i: ts[i])
        out[name] = {"seconds": ts[best], "cpu_seconds": cpu[best], "all": ts, "glosses_per_s": len(docs) / ts[best],
                     "tokens_per_s": n_tokens / ts[best]}
    return {"glosses": len(docs), "tokens": n_tokens, "torch_threads": torch.get_num_threads(),
            "env": {k: os.environ.get(k) for k in ("TOKENIZERS_PARALLELISM", "RAYON_NUM_THREADS")}, "runs": out}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--train-vocab", action="store_true", help="re-learn tests/data/text/wordnet_vocab.txt")
    p.add_argument("--speed", action="store_true", help="only time the Hugging Face tokenizers on the glosses")
    p.add_argument("--show", type=int, nargs="+", metavar="INDEX", help="only print tokenizers' pieces and ids of "
                   "these glosses (0-based, as wordpiece_test.cpp names them)")
    a = p.parse_args()
    torch.set_num_threads(1)
    docs = read_wordnet_glosses()
    if a.show:
        tok = hf_tokenizer(WORDNET_VOCAB)
        for i in a.show:
            e = tok.encode(docs[i], add_special_tokens=False)
            print(json.dumps({"index": i, "text": docs[i], "tokens": e.tokens, "ids": e.ids}, ensure_ascii=False))
        return 0
    if a.speed:
        print(json.dumps(speed(docs), indent=1))
        return 0
    if a.train_vocab or not WORDNET_VOCAB.exists():
        train_vocab(docs)
    cp_reasons, per_reason, legacy_count = unicode_golden()
    print(f"every code point: ampforge expected to differ from tokenizers {per_reason}; legacy differs {legacy_count}")
    n, n_diff = edge_golden(cp_reasons)
    print(f"edge cases: {n} lines, {n_diff} where the legacy tokenizer differs (explained)")
    g = wordnet_golden(docs)
    print(f"WordNet: {g['glosses']} glosses, {g['tokens']} tokens ({g['unk_tokens']} [UNK]) with {g['vocab_size']} "
          f"tokens; BertTokenizerFast differs on {g['bert_tokenizer_fast_differs']}, legacy on {g['legacy_differs']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
