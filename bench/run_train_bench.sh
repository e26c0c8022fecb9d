#!/usr/bin/env bash
# Single-rank training throughput: troupe (troupe_train_single) against the same model in
# PyTorch 1.13 (torch_gpt.py), both on one thread, run alternately ROUNDS times each in
# this session. Prints each run, the medians and the ratio troupe/torch, for wall-clock
# tokens/s and for tokens per CPU second (the steadier figure on a shared machine).
#
# usage: bench/run_train_bench.sh [BUILD_DIR [CORPUS [ROUNDS]]]
#   defaults: build, BUILD_DIR/data/kjv.txt, 5; STEPS (30) and SKIP (5) from the environment.
# OPENBLAS_CORETYPE, if set, is passed through unchanged to both.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-build}
corpus=${2:-$build/data/kjv.txt}
rounds=${3:-5}
steps=${STEPS:-30}
skip=${SKIP:-5}
troupe_bin=$build/bench/troupe_train_single
python=/usr/bin/python3  # Debian's python3-torch; not a pyenv python on PATH

[ -x "$troupe_bin" ] || { echo "run_train_bench: build $troupe_bin first (cmake --build $build --target troupe_train_single)" >&2; exit 1; }
[ -r "$corpus" ] || { echo "run_train_bench: no corpus at $corpus (scripts/make_corpus.sh $corpus)" >&2; exit 1; }
"$python" -c 'import torch' 2>/dev/null || { echo "run_train_bench: $python cannot import torch (apt-get install python3-torch)" >&2; exit 1; }

# One BLAS thread and one intra-op thread for both; each also sets this itself.
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "model: defaults (4 layers, 4 heads, d_model 128, context 64), batch 16 in micro-batches of 4"
echo "each run: $steps steps, the first $skip untimed; $rounds rounds; corpus $corpus"
echo "OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-<unset>}"
for ((r = 1; r <= rounds; r++)); do
  line=$("$troupe_bin" --data "$corpus" --steps "$steps" --throughput "$skip" --print-every 0 | grep '^tokens_per_s')
  echo "round $r troupe: $line"
  echo "$line" | awk '{print $2}' >> "$tmp/troupe_wall"
  echo "$line" | sed -E 's/.* ([0-9.]+) tokens per CPU s.*/\1/' >> "$tmp/troupe_cpu"
  line=$("$python" "$here/torch_gpt.py" --data "$corpus" --steps "$steps" --skip "$skip" | grep '^tokens_per_s')
  echo "round $r torch:  $line"
  echo "$line" | awk '{print $2}' >> "$tmp/torch_wall"
  echo "$line" | sed -E 's/.* ([0-9.]+) tokens per CPU s.*/\1/' >> "$tmp/torch_cpu"
done

median() { sort -g "$1" | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
for kind in wall cpu; do
  t=$(median "$tmp/troupe_$kind")
  p=$(median "$tmp/torch_$kind")
  label=$([ "$kind" = wall ] && echo "tokens/s (wall)" || echo "tokens per CPU second")
  awk -v t="$t" -v p="$p" -v l="$label" \
    'BEGIN {printf "median %-22s troupe %8.0f  torch %8.0f  ratio troupe/torch %.2f\n", l, t, p, t / p}'
done
