#!/usr/bin/env bash
# Sets up (with the test-only packages), builds everything and runs every test (CTest labels:
# unit, multiproc, integration, chaos, gpu, netns, slurm).
# Extra arguments go to ctest, e.g. scripts/test.sh -L unit
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --test
scripts/build.sh --tests
ctest --test-dir build --output-on-failure -j "$(nproc)" --timeout 900 "$@"
