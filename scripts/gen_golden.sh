#!/usr/bin/env bash
# Regenerates the parity goldens from PyTorch:
#   1. builds ampforge_parity_dump (in $BUILD_DIR, default build-parity),
#   2. dumps the sample manifest and inputs (ampforge's Philox generator, deterministic),
#   3. runs scripts/gen_golden.py with an interpreter that has torch + numpy ($PYTHON, default
#      /usr/bin/python3: Debian's python3-torch 1.13) -> tests/parity/golden/,
#   4. runs scripts/gen_resnet_golden.py (torchvision's ResNet-18/50) -> tests/data/models/, once per reference:
#      with $PYTHON (Debian's python3-torchvision 0.14) -> resnet_parity.*, torchvision_state_dicts.json;
#      with the peer interpreter ($AMPFORGE_PEER_PYTHON, default .venv-peer/bin/python when present, made by
#      `scripts/setup --peer`: PyTorch 2.14 + torchvision 0.29) -> resnet_parity_tv029.* (skipped, with a
#      warning, when there is no peer: the committed files stay),
#   5. with the peer only (offline: HF_HUB_OFFLINE=1, YOLO_OFFLINE=true): scripts/gen_bert_golden.py (transformers),
#      scripts/gen_wordpiece_golden.py (tokenizers) and scripts/gen_yolo_golden.py (Ultralytics) -> tests/data/.
# The peer interpreter is exported as AMPFORGE_PEER_PYTHON (the bench's name for it) to every generator.
# Commit tests/parity/golden/golden.{safetensors,json} and tests/data/models/* afterwards.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BUILD_DIR:-$root/build-parity}"
python="${PYTHON:-/usr/bin/python3}"
"$python" -c 'import torch, torchvision, numpy' 2>/dev/null || {
  echo "gen_golden.sh: $python cannot import torch, torchvision and numpy (set PYTHON=...)" >&2; exit 2; }
peer="${AMPFORGE_PEER_PYTHON:-}"
if [[ -z "$peer" && -x "$root/.venv-peer/bin/python" ]]; then peer="$root/.venv-peer/bin/python"; fi
if [[ -n "$peer" ]]; then
  "$peer" -c 'import torch, torchvision, numpy' 2>/dev/null || {
    echo "gen_golden.sh: the peer $peer cannot import torch, torchvision and numpy" \
         "(set AMPFORGE_PEER_PYTHON=...)" >&2; exit 2; }
  export AMPFORGE_PEER_PYTHON="$peer"
else
  echo "gen_golden.sh: no peer interpreter (.venv-peer/bin/python: scripts/setup --peer, or AMPFORGE_PEER_PYTHON):" \
       "the torchvision 0.29 ResNet goldens (resnet_parity_tv029.*) are not regenerated" >&2
fi
if [[ ! -f "$build/build.ninja" && ! -f "$build/Makefile" ]]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release
fi
cmake --build "$build" --target ampforge_parity_dump -j"${JOBS:-2}"
dump="$(mktemp -d)"
trap 'rm -rf "$dump"' EXIT
"$build/tests/ampforge_parity_dump" "$dump"
"$python" "$root/scripts/gen_golden.py" "$dump" "$root/tests/parity/golden"
"$python" "$root/scripts/gen_resnet_golden.py" "$root/tests/data/models"
if [[ -n "$peer" ]]; then
  tv="$("$peer" -c 'import torchvision; print(torchvision.__version__)')"
  [[ "$tv" == 0.29.* ]] || echo "gen_golden.sh: the peer has torchvision $tv, not 0.29: its ResNet goldens get" \
    "their own name, which resnet_parity_test.cpp's kGoldenSets does not list yet" >&2
  "$peer" "$root/scripts/gen_resnet_golden.py" "$root/tests/data/models"
fi
# The real libraries' goldens (transformers, tokenizers, Ultralytics): the peer only, offline.
if [[ -n "$peer" ]]; then
  export HF_HUB_OFFLINE=1 YOLO_OFFLINE=true
  "$peer" "$root/scripts/gen_bert_golden.py" "$root/tests/data/models"
  "$peer" "$root/scripts/gen_wordpiece_golden.py"
  "$peer" "$root/scripts/gen_yolo_golden.py" "$root/tests/data/models"
else
  echo "gen_golden.sh: no peer: the BERT, WordPiece and YOLOv8 goldens (transformers, tokenizers, Ultralytics) are" \
       "not regenerated" >&2
fi
