#!/usr/bin/env bash
# Configures and builds troupe into ./build (warnings are errors when CI=true).
set -euo pipefail
cd "$(dirname "$0")/.."
werror=OFF; [[ "${CI:-}" == "true" ]] && werror=ON
generator=(); command -v ninja >/dev/null && generator=(-G Ninja)
cmake -S . -B build "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTROUPE_WERROR=$werror >/dev/null
cmake --build build -j "$(nproc)"
