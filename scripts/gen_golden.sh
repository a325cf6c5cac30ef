#!/usr/bin/env bash
# Regenerates the parity goldens from PyTorch:
#   1. builds ampforge_parity_dump (in $BUILD_DIR, default build-parity),
#   2. dumps the sample manifest and inputs (ampforge's Philox generator, deterministic),
#   3. runs scripts/gen_golden.py with an interpreter that has torch + numpy ($PYTHON, default
#      /usr/bin/python3: Debian's python3-torch 1.13) -> tests/parity/golden/,
#   4. runs scripts/gen_resnet_golden.py (torchvision's ResNet-18/50, needs python3-torchvision)
#      -> tests/data/models/,
#   5. runs scripts/gen_bert_golden.py (bert-tiny and the WordPiece tokenizer) -> tests/data/models/.
# Commit tests/parity/golden/golden.{safetensors,json} and tests/data/models/* afterwards.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BUILD_DIR:-$root/build-parity}"
python="${PYTHON:-/usr/bin/python3}"
"$python" -c 'import torch, torchvision, numpy' 2>/dev/null || {
  echo "gen_golden.sh: $python cannot import torch, torchvision and numpy (set PYTHON=...)" >&2; exit 2; }
if [[ ! -f "$build/build.ninja" && ! -f "$build/Makefile" ]]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release
fi
cmake --build "$build" --target ampforge_parity_dump -j"${JOBS:-2}"
dump="$(mktemp -d)"
trap 'rm -rf "$dump"' EXIT
"$build/tests/ampforge_parity_dump" "$dump"
"$python" "$root/scripts/gen_golden.py" "$dump" "$root/tests/parity/golden"
"$python" "$root/scripts/gen_resnet_golden.py" "$root/tests/data/models"
"$python" "$root/scripts/gen_bert_golden.py" "$root/tests/data/models"
