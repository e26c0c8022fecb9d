#!/usr/bin/env bash
# Runs clang-tidy with the project's profile (.clang-tidy) on the C++ files a change touches:
#   scripts/tidy.sh              the files changed since HEAD~1 (the last commit), and uncommitted
#   scripts/tidy.sh BASE         the files changed since BASE (e.g. origin/main)
#   scripts/tidy.sh -- FILE...   these files
# Needs build/compile_commands.json (scripts/build.sh --tests writes it). Exit 1 on a finding,
# 77 without clang-tidy.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v clang-tidy >/dev/null; then
  echo "tidy: clang-tidy is not installed (apt-get install clang-tidy)" >&2
  exit 77
fi
if [[ ! -f build/compile_commands.json ]]; then
  echo "tidy: build/compile_commands.json is missing; run scripts/build.sh --tests first" >&2
  exit 2
fi
if [[ ${1:-} == -- ]]; then
  shift
  files=("$@")
else
  base=${1:-HEAD~1}
  mapfile -t files < <({ git diff --name-only "$base" -- '*.cpp'; git ls-files --others --exclude-standard -- '*.cpp'; } | sort -u)
fi
# Only translation units the build compiles (a header is checked through them).
units=()
for f in "${files[@]}"; do
  [[ -f $f ]] && grep -q "\"file\": \"$PWD/$f\"" build/compile_commands.json && units+=("$f")
done
if ((${#units[@]} == 0)); then
  echo "tidy: no compiled C++ file changed"
  exit 0
fi
echo "tidy: ${#units[@]} file(s): ${units[*]}"
status=0
for f in "${units[@]}"; do
  clang-tidy -p build --quiet "$f" 2>/dev/null || status=1
done
exit $status
