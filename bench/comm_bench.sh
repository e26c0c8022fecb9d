#!/usr/bin/env bash
# Collectives bandwidth: troupe's data plane (comm_bench) on both CPU transports (shared
# memory and gloo over loopback TCP) against PyTorch 1.13's gloo backend and Open MPI's
# MPI_Allreduce, same sizes (4 KiB .. 256 MiB, x4), same rank counts (real processes on this
# host), same timing rule (median of BATCHES timed batches, time averaged over ranks) and
# nccl-tests' algbw/busbw formulas. Prints each table, then one markdown table of busbw with
# the ratios shm / tcp and shm / torch-gloo and shm's busbw as a fraction of memcpy bandwidth
# (measured by comm_bench in the same session).
#
# usage: bench/comm_bench.sh [BUILD_DIR [RANKS [MAX_BYTES [TRANSPORTS]]]]
#   defaults: build, "2,4", 256M, "tcp,shm". BATCHES (5) and BATCH_SECONDS (0.2) from the
#   environment.
set -euo pipefail
build=${1:-build}
ranks=${2:-2,4}
max_bytes=${3:-256M}
transports=${4:-tcp,shm}
batches=${BATCHES:-5}
batch_seconds=${BATCH_SECONDS:-0.2}
bench_bin=$build/bench/comm_bench
python=/usr/bin/python3  # Debian's python3-torch; not a pyenv python on PATH

[ -x "$bench_bin" ] || { echo "comm_bench.sh: build $bench_bin first (cmake --build $build --target comm_bench)" >&2; exit 1; }
"$python" -c 'import torch.distributed' 2>/dev/null || { echo "comm_bench.sh: $python cannot import torch (apt-get install python3-torch)" >&2; exit 1; }
command -v mpicc >/dev/null && command -v mpirun >/dev/null || { echo "comm_bench.sh: no Open MPI (apt-get install openmpi-bin libopenmpi-dev)" >&2; exit 1; }

# One thread per rank everywhere: the ranks already share this machine's cores.
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
to_bytes() { "$python" -c "import sys; s=sys.argv[1]; m={'K':1<<10,'M':1<<20,'G':1<<30}; print(int(s[:-1])*m[s[-1]] if s[-1] in m else int(s))" "$1"; }
max=$(to_bytes "$max_bytes")

echo "# machine: $(nproc --all) cores; load before: $(cut -d' ' -f1-3 /proc/loadavg)"
"$bench_bin" --ranks "$ranks" --max-bytes "$max_bytes" --batches "$batches" \
  --batch-seconds "$batch_seconds" --transport "$transports" | tee "$tmp/troupe.txt"

# ---- PyTorch gloo (reduce_scatter is not implemented by its gloo backend in 1.13) ----
cat > "$tmp/torch_bench.py" <<'EOF'
import socket, statistics, sys, time
import torch, torch.distributed as dist, torch.multiprocessing as mp

def rank_main(rank, size, port, max_bytes, batches, batch_seconds):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size)
    top = max_bytes // 4 + 4 * size
    a = torch.zeros(top)
    b = torch.zeros(top)
    for op in ("all_reduce", "all_gather", "all_to_all"):
        if rank == 0:
            print(f"\n# {op}, {size} ranks (torch {torch.__version__} gloo)", flush=True)
        nbytes = 4096
        while nbytes <= max_bytes:
            per = max(1, nbytes // 4 // size)
            count = nbytes // 4 if op == "all_reduce" else per * size
            if op == "all_reduce":
                t = a[:count]
                once = lambda: dist.all_reduce(t)
            elif op == "all_gather":
                src = a[:per]
                outs = list(b[:count].split(per))
                once = lambda: dist.all_gather(outs, src)
            else:
                src, dst = a[:count], b[:count]
                once = lambda: dist.all_to_all_single(dst, src)
            once()
            t0 = time.perf_counter(); once(); probe = time.perf_counter() - t0
            it = torch.tensor([int(min(max(batch_seconds / max(probe, 1e-7), 1), 1e5))])
            dist.broadcast(it, 0)
            iters = int(it.item())
            secs = []
            for _ in range(batches):
                dist.barrier()
                t0 = time.perf_counter()
                for _ in range(iters):
                    once()
                s = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64)
                dist.all_reduce(s)
                secs.append(s.item() / size)
            sec = statistics.median(secs)
            factor = 2 * (size - 1) / size if op == "all_reduce" else (size - 1) / size
            algbw = count * 4 / sec / 1e9
            if rank == 0:
                print(f"  {count*4:12d} {count:12d} {sec*1e6:10.1f} {algbw:8.3f} {algbw*factor:8.3f}", flush=True)
            nbytes *= 4
    dist.destroy_process_group()

if __name__ == "__main__":
    ranks, max_bytes, batches, batch_seconds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    for size in (int(r) for r in ranks.split(",")):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        mp.spawn(rank_main, args=(size, port, max_bytes, batches, batch_seconds), nprocs=size, join=True)
EOF
"$python" "$tmp/torch_bench.py" "$ranks" "$max" "$batches" "$batch_seconds" | tee "$tmp/torch.txt"

# ---- Open MPI all-reduce (its shared-memory transport: a ceiling, not a like-for-like peer) ----
cat > "$tmp/mpi_bench.c" <<'EOF'
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
static int cmp(const void* a, const void* b) { double x = *(double*)a, y = *(double*)b; return (x > y) - (x < y); }
int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  size_t max_bytes = strtoull(argv[1], 0, 10);
  int batches = atoi(argv[2]);
  double batch_seconds = atof(argv[3]);
  float* a = calloc(max_bytes / 4 + 1, sizeof(float));
  if (rank == 0) printf("\n# all_reduce, %d ranks (Open MPI MPI_Allreduce)\n", size);
  for (size_t bytes = 4096; bytes <= max_bytes; bytes *= 4) {
    int count = (int)(bytes / 4);
    MPI_Allreduce(MPI_IN_PLACE, a, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    MPI_Allreduce(MPI_IN_PLACE, a, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    double probe = MPI_Wtime() - t0;
    int iters = (int)(batch_seconds / (probe > 1e-7 ? probe : 1e-7));
    if (iters < 1) iters = 1;
    if (iters > 100000) iters = 100000;
    MPI_Bcast(&iters, 1, MPI_INT, 0, MPI_COMM_WORLD);
    double secs[64];
    for (int b = 0; b < batches && b < 64; ++b) {
      MPI_Barrier(MPI_COMM_WORLD);
      t0 = MPI_Wtime();
      for (int i = 0; i < iters; ++i) MPI_Allreduce(MPI_IN_PLACE, a, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      double s = (MPI_Wtime() - t0) / iters;
      MPI_Allreduce(MPI_IN_PLACE, &s, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
      secs[b] = s / size;
    }
    qsort(secs, batches, sizeof(double), cmp);
    double sec = secs[batches / 2], algbw = bytes / sec / 1e9;
    if (rank == 0) printf("  %12zu %12d %10.1f %8.3f %8.3f\n", bytes, count, sec * 1e6, algbw, algbw * 2.0 * (size - 1) / size);
    fflush(stdout);
  }
  free(a);
  MPI_Finalize();
  return 0;
}
EOF
mpicc -O2 -o "$tmp/mpi_bench" "$tmp/mpi_bench.c"
for n in ${ranks//,/ }; do
  mpirun --allow-run-as-root --oversubscribe -np "$n" "$tmp/mpi_bench" "$max" "$batches" "$batch_seconds" | tee -a "$tmp/mpi.txt"
done
echo "# machine load after: $(cut -d' ' -f1-3 /proc/loadavg)"

# ---- one table: busbw (GB/s) per op, size and rank count, each transport and the ratios ----
"$python" - "$tmp/troupe.txt" "$tmp/torch.txt" "$tmp/mpi.txt" <<'EOF'
import re, sys
memcpy = None
def parse(path):
    global memcpy
    rows, key = {}, None
    for line in open(path):
        m = re.match(r"# memcpy bandwidth .*: ([0-9.]+) GB/s", line)
        if m:
            memcpy = float(m.group(1))
        m = re.match(r"# (\w+), (\d+) ranks \((\w+)", line)
        if m:
            key = (m.group(1), int(m.group(2)), m.group(3))
            continue
        f = line.split()
        if key and len(f) >= 5 and f[0].isdigit():
            rows[key + (int(f[0]),)] = float(f[4])
    return rows
troupe, torch, mpi = (parse(p) for p in sys.argv[1:4])
def fmt(v):
    return f"{v:.3f}" if v is not None else "n/a"
def ratio(a, b):
    return f"**{a / b:.2f}**" if a is not None and b else "n/a"
print(f"\nmemcpy bandwidth (1 thread, 64 MiB): {memcpy} GB/s")
print("\n| op | ranks | size | shm busbw | tcp busbw | torch-gloo busbw | shm / tcp | shm / torch | shm busbw / memcpy | MPI busbw |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for op, n, b in sorted({(op, n, b) for (op, n, kind, b) in troupe}):
    shm, tcp = troupe.get((op, n, "shm", b)), troupe.get((op, n, "gloo", b))
    t, m = torch.get((op, n, "torch", b)), mpi.get((op, n, "Open", b))
    size = f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"
    frac = f"{shm * 1e9 / (memcpy * 1e9):.2f}" if shm is not None and memcpy else "n/a"
    print(f"| {op} | {n} | {size} | {fmt(shm)} | {fmt(tcp)} | {fmt(t)} | {ratio(shm, tcp)} | {ratio(shm, t)} | {frac} | {fmt(m) if m else ''} |")
EOF
