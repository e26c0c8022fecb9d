#!/usr/bin/env bash
# Fails (exit 1) naming every tracked C++ file that clang-format (.clang-format) would change;
# exit 77 where clang-format is not installed (scripts/setup.sh --test installs it).
#   scripts/check_format.sh          check
#   scripts/check_format.sh --fix    format them in place
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v clang-format >/dev/null; then
  echo "check_format: clang-format is not installed (apt-get install clang-format)" >&2
  exit 77
fi
mapfile -t files < <(git ls-files '*.cpp' '*.hpp' '*.h' '*.cc' 2>/dev/null ||
                     find . -name '*.cpp' -o -name '*.hpp' | grep -v '^./build')
if [[ ${1:-} == --fix ]]; then
  clang-format -i "${files[@]}"
  exit 0
fi
unformatted=()
for f in "${files[@]}"; do
  clang-format --dry-run --Werror "$f" >/dev/null 2>&1 || unformatted+=("$f")
done
if ((${#unformatted[@]})); then
  echo "check_format: ${#unformatted[@]} file(s) are not formatted as .clang-format says:"
  printf '  %s\n' "${unformatted[@]}"
  echo "fix: scripts/check_format.sh --fix (or clang-format -i FILE)"
  exit 1
fi
echo "check_format: ${#files[@]} files formatted"
