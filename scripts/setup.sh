#!/usr/bin/env bash
# Installs the Debian packages troupe needs; does nothing when they are all present.
#   scripts/setup.sh           what building troupe and running a job need
#   scripts/setup.sh --test    also what the tests need (scripts/test.sh passes it)
#   scripts/setup.sh --bench   also the peers bench/ compares against (PyTorch, Open MPI)
set -euo pipefail
packages=(
  build-essential cmake ninja-build pkg-config
  ccache                # rebuilds of unchanged files are nearly free
  libcaf-dev            # actors: the control plane (CAF 0.17)
  libssl-dev            # the job's credentials and TLS on the control plane
  libgloo-dev           # data plane on CPUs
  libopenblas-dev       # sgemm
  libcereal-dev         # format 1 checkpoint shards (still read)
  libboost-dev libboost-system-dev   # Asio/Beast: metrics endpoint, key-value store, etcd client
  nlohmann-json3-dev    # config files, events.jsonl, manifests
  prometheus-cpp-dev    # metrics registry and text format (core only; /metrics is troupe's own)
  libxxhash-dev         # checkpoint chunks: names (XXH3-128)
  libcli11-dev          # the command line of every subcommand
  cppzmq-dev libzmq3-dev   # checkpoint replicas in a peer's memory
  libsentencepiece-dev sentencepiece   # troupe tokenize; spm_encode, its peer in bench/
  bible-kjv             # renders the default corpus (King James Bible, public domain)
  python3
  python3-dev pybind11-dev   # the troupe Python module (python/): a worker in a PyTorch script
)
test_packages=(
  libgtest-dev
  clang libclang-rt-14-dev    # libFuzzer + sanitizers: scripts/fuzz.sh, checkpoint_fuzz_smoke
  clang-format clang-tidy     # the format check (format_check_test) and scripts/tidy.sh
  prometheus            # promtool + the real server the tests scrape with
  etcd-server etcd-client   # a real etcd 3.4 (coordinator HA tests; also `--etcd local`)
  slurmctld slurmd slurm-client munge   # a real Slurm for tests/integration/slurm_test.py
  chromium              # headless browser: tests/integration/report_test.py renders `troupe report`
  tmux                  # a terminal of a chosen size: tests/integration/top_screen_test.py
  python3-torch         # PyTorch 1.13 for the Python frontend's tests (tests/python)
)
for arg in "$@"; do
  case "$arg" in
    --test) packages+=("${test_packages[@]}") ;;
    --bench) packages+=(python3-torch openmpi-bin libopenmpi-dev hyperfine
                        zstd                 # the CLI bench/delta_estimate.py compresses with
                        python3-etcd) ;;     # torchrun's etcd rendezvous (bench/torchrun_takeover.py)
    *) echo "setup: unknown option '$arg' (options: --test, --bench)" >&2; exit 2 ;;
  esac
done
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  sudo_cmd=(); [[ $(id -u) -eq 0 ]] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -q
  "${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
# The distribution's prometheus package enables its own service; the tests start their
# own servers on free ports, so it is not needed (and may not even run in a container).
# So do munge, slurmctld and slurmd: tests/integration/slurm_test.py starts daemons of its own
# (its own munge key and socket, slurm.conf, spool and state in a temporary directory) and
# leaves the system's alone.
