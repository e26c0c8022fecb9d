#!/usr/bin/env bash
# Sets up, builds and runs every test (CTest labels: unit, multiproc, integration, chaos, gpu).
# Extra arguments go to ctest, e.g. scripts/test.sh -L unit
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
ctest --test-dir build --output-on-failure -j "$(nproc)" --timeout 900 "$@"
