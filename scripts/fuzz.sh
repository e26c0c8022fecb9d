#!/usr/bin/env bash
# Builds the libFuzzer targets of fuzz/ with clang++ (AddressSanitizer + UBSan) and runs each
# for SECONDS (default 300) on a copy of its seed corpus; exits non-zero if any target finds
# a crash, a sanitizer report, a leak or an out-of-memory. Exits 77 (skipped) when clang++ or
# its libFuzzer runtime is missing.
#
#   scripts/fuzz.sh [SECONDS]
#   FUZZ_BUILD_DIR=DIR   build and work there instead of ./build-fuzz (the ctest keeps one in
#                        the main build directory, so that reruns build incrementally)
#   FUZZ_TARGETS="manifest chunk pieces store_frame config"   the targets to run
#
# The corpus grows in $FUZZ_BUILD_DIR/corpus/<target> (fuzz/corpus is never written);
# crashing inputs land in $FUZZ_BUILD_DIR/artifacts/<target>-crash-*. Reproduce one with
# $FUZZ_BUILD_DIR/<target>_fuzz FILE.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
seconds="${1:-300}"
if ! [[ "$seconds" =~ ^[0-9]+$ ]] || ((seconds < 1)); then
  echo "usage: scripts/fuzz.sh [SECONDS]" >&2
  exit 2
fi
build="${FUZZ_BUILD_DIR:-$root/build-fuzz}"
targets=(${FUZZ_TARGETS:-manifest chunk pieces store_frame config})
cxx="${FUZZ_CXX:-clang++}"

skip() {
  echo "fuzz: SKIPPED: $*" >&2
  exit 77
}
command -v "$cxx" >/dev/null || skip "$cxx not found (scripts/setup.sh installs clang)"
# Can clang++ link a libFuzzer binary? (libclang_rt.fuzzer comes with libclang-rt-14-dev.)
probe="$(mktemp -d)"
trap 'rm -rf "$probe"' EXIT
printf '%s\n' '#include <cstddef>' '#include <cstdint>' \
  'extern "C" int LLVMFuzzerTestOneInput(const uint8_t*, size_t) { return 0; }' >"$probe/p.cpp"
"$cxx" -fsanitize=fuzzer,address,undefined "$probe/p.cpp" -o "$probe/p" >"$probe/log" 2>&1 ||
  skip "$cxx cannot link a libFuzzer binary (install libclang-rt-14-dev): $(head -c 400 "$probe/log")"

generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
if [[ ! -f "$build/CMakeCache.txt" ]]; then
  cmake -S "$root/fuzz" -B "$build" "${generator[@]}" -DCMAKE_CXX_COMPILER="$cxx" >/dev/null
fi
cmake --build "$build" -j "$(nproc)" -- "${targets[@]/%/_fuzz}"

mkdir -p "$build/artifacts"
failed=()
for t in "${targets[@]}"; do
  corpus="$build/corpus/$t"
  mkdir -p "$corpus"
  cp -f "$root/fuzz/corpus/$t/"* "$corpus/"  # seeds (refreshed each run, never written back)
  log="$build/$t.log"
  echo "fuzz: $t for ${seconds}s (corpus $corpus, log $log)"
  rc=0
  (cd "$build" && ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1}" \
    UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1}" \
    "./${t}_fuzz" -max_total_time="$seconds" -rss_limit_mb=2048 -max_len=65536 -timeout=25 -error_exitcode=1 \
    -print_final_stats=1 -artifact_prefix="$build/artifacts/$t-" "$corpus") >"$log" 2>&1 || rc=$?
  grep -E '^#[0-9]+[[:space:]]+DONE|stat::number_of_executed_units|stat::average_exec_per_sec' "$log" |
    sed "s/^/fuzz: $t: /" || true
  if ((rc != 0)); then
    echo "fuzz: $t FAILED (exit $rc); the end of $log:" >&2
    tail -n 60 "$log" >&2
    failed+=("$t")
  fi
done
if ((${#failed[@]})); then
  echo "fuzz: findings in: ${failed[*]} (inputs in $build/artifacts)" >&2
  exit 1
fi
echo "fuzz: no findings"
