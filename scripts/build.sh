#!/usr/bin/env bash
# Configures and builds troupe into ./build (warnings are errors when CI=true).
#   scripts/build.sh           the `troupe` binary and its default corpus: what a job needs
#   scripts/build.sh --tests   everything, the tests included (scripts/test.sh)
# TROUPE_NATIVE=ON in the environment tunes for this machine's CPU (-march=native): faster,
# but the binary then runs only on CPUs with the same instruction sets.
set -euo pipefail
cd "$(dirname "$0")/.."
tests=OFF
for arg in "$@"; do
  case "$arg" in
    --tests) tests=ON ;;
    *) echo "build: unknown option '$arg' (options: --tests)" >&2; exit 2 ;;
  esac
done
werror=OFF; [[ "${CI:-}" == "true" ]] && werror=ON
generator=(); command -v ninja >/dev/null && generator=(-G Ninja)
# Once a build directory builds the tests, a plain build keeps them configured (and only
# builds the binary): switching them off would only make the next test build reconfigure.
if [[ $tests == OFF && -f build/CMakeCache.txt ]] && grep -q '^TROUPE_BUILD_TESTS:BOOL=ON' build/CMakeCache.txt; then
  tests=ON
  target=(--target troupe)
elif [[ $tests == OFF ]]; then
  target=(--target troupe)
else
  target=()
fi
cmake -S . -B build "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTROUPE_WERROR=$werror \
  -DTROUPE_BUILD_TESTS=$tests -DTROUPE_NATIVE="${TROUPE_NATIVE:-OFF}" >/dev/null
# The Python module (python/) comes with the binary when CMake found python3-dev and pybind11.
if [[ ${#target[@]} -gt 0 && -e build/python/troupe/__init__.py ]]; then
  target+=(--target troupe_python_native)
fi
cmake --build build -j "$(nproc)" "${target[@]}"
