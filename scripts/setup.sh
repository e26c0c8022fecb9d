#!/usr/bin/env bash
# Installs every Debian package troupe's build and tests need; does nothing when they are
# all present. Usage: scripts/setup.sh [--bench]   (--bench adds the peers that
# bench/ compares against: PyTorch and Open MPI)
set -euo pipefail
packages=(
  build-essential cmake ninja-build pkg-config
  libcaf-dev            # actors: the control plane (CAF 0.17)
  libssl-dev            # the job's credentials and TLS on the control plane
  libgloo-dev           # data plane on CPUs
  libopenblas-dev       # sgemm
  libcereal-dev         # format 1 checkpoint shards (still read)
  libboost-dev libboost-system-dev   # Asio/Beast: metrics endpoint, key-value store
  nlohmann-json3-dev    # config files, events.jsonl, manifests
  libxxhash-dev         # checkpoint chunks: names (XXH3-128)
  clang libclang-rt-14-dev    # libFuzzer + sanitizers: scripts/fuzz.sh, checkpoint_fuzz_smoke
  cppzmq-dev libzmq3-dev
  libgtest-dev
  prometheus            # promtool + the real server the tests scrape with
  etcd-server etcd-client   # a real etcd 3.4 for tests/runtime/etcd (coordinator HA)
  slurmctld slurmd slurm-client munge   # a real Slurm for tests/integration/slurm_test.py
  bible-kjv             # renders the default corpus (King James Bible, public domain)
  chromium              # headless browser: tests/integration/report_test.py renders `troupe report`
  tmux                  # a terminal of a chosen size: tests/integration/top_screen_test.py
  python3
)
if [[ "${1:-}" == "--bench" ]]; then
  packages+=(python3-torch openmpi-bin libopenmpi-dev hyperfine
             zstd                 # the CLI bench/delta_estimate.py compresses with
             python3-etcd)        # torchrun's etcd rendezvous (bench/torchrun_takeover.py)
fi
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
