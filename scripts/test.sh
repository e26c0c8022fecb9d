#!/usr/bin/env bash
# Sets up, builds and runs every test (CTest labels: unit, multiproc, integration, chaos, gpu).
# Extra arguments go to ctest, e.g. scripts/test.sh -L unit
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
# A test that fails is run once more and its first failure stays in the log: two tests still
# fail now and then on a loaded 2-core VM (comm_hierarchical_multiproc_test's 2-node kill,
# slurm_test's third requeue), a defect open in docs/KNOWN_ISSUES.md, not a behaviour we accept.
ctest --test-dir build --output-on-failure -j "$(nproc)" --timeout 900 --repeat until-pass:2 "$@"
