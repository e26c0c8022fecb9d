#!/usr/bin/env bash
# torchrun's recovery from a kill -9, measured the way bench/recovery_bench.py measures troupe's.
#
# Each trial trains bench/torch_elastic.py (DDP over gloo, CPU, one thread per worker) on 4
# local workers for 20 steps with a checkpoint every 5; rank 1 SIGKILLs itself just before
# step 10. torchrun (PyTorch 1.13, --max_restarts 3) must notice, stop the other workers and
# start a new group, which resumes from the step-5 checkpoint. Two launcher modes:
#   standalone  torchrun --standalone (c10d store on localhost:29400)
#   c10d        torchrun --rdzv_backend c10d --rdzv_endpoint 127.0.0.1:<free port> --nnodes 1
# From the trial's event log:
#   recover     kill -> first step committed by the restarted group
#   respawn     kill -> the new rank 0's interpreter running (detection + teardown + relaunch)
#   ready       kill -> the new rank 0 has joined the process group and loaded the checkpoint
#   steps lost  committed steps computed again: (kill step - 1) - step restored
# torchrun's --monitor_interval is left at its default (5 s) unless --monitor-interval is given.
# Everything stays on loopback: rendezvous on 127.0.0.1/localhost, gloo on lo.
#
# Debian's torch 1.13 under Python 3.11: torchrun's default "--redirects 0 --tee 0" crashes
# (Std.from_str("0") returns None, since 3.11 no longer iterates the zero IntFlag member), so
# each run passes "--redirects 9:1 --tee 9:1": a mapping for a local rank that does not exist,
# which leaves ranks 0-3 at Std.NONE, i.e. torchrun's intended default behaviour.
#
# usage: bench/torchrun_recovery.sh [--trials N] [--data CORPUS] [--timeout SECONDS]
#                                   [--monitor-interval SECONDS] [--modes standalone,c10d]
#   defaults: 10 trials, build/data/kjv.txt, 180 s per trial, both modes.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
python=/usr/bin/python3   # Debian's python3-torch
torchrun=/usr/bin/torchrun

trials=10
data=build/data/kjv.txt
trial_timeout=180
monitor_interval=
modes=standalone,c10d
while (($#)); do
  case $1 in
    --trials) trials=$2; shift 2 ;;
    --data) data=$2; shift 2 ;;
    --timeout) trial_timeout=$2; shift 2 ;;
    --monitor-interval) monitor_interval=$2; shift 2 ;;
    --modes) modes=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "torchrun_recovery: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

steps=20 kill_rank=1 kill_step=10 checkpoint_every=5 nproc=4 max_restarts=3

[ -r "$data" ] || { echo "torchrun_recovery: no corpus at $data (scripts/make_corpus.sh $data)" >&2; exit 1; }
[ -x "$torchrun" ] || { echo "torchrun_recovery: no $torchrun (apt-get install python3-torch)" >&2; exit 1; }
"$python" -c 'import torch' 2>/dev/null || { echo "torchrun_recovery: $python cannot import torch" >&2; exit 1; }
data=$(cd "$(dirname "$data")" && pwd)/$(basename "$data")

# One thread per worker; gloo on the loopback interface only.
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 GLOO_SOCKET_IFNAME=lo

work=$(mktemp -d -t torchrun-recovery.XXXXXX)
group=  # process group of the torchrun now running, if any
cleanup() {
  if [ -n "$group" ]; then kill -KILL -- "-$group" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() {
  "$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# run_trial MODE TRIAL: one torchrun job in its own session; appends a row to $work/results.
run_trial() {
  local mode=$1 trial=$2
  local dir=$work/$mode-$trial
  mkdir -p "$dir/ckpt"
  local launch=(--nproc_per_node "$nproc" --max_restarts "$max_restarts" --redirects 9:1 --tee 9:1)
  if [ -n "$monitor_interval" ]; then launch+=(--monitor_interval "$monitor_interval"); fi
  case $mode in
    standalone) launch+=(--standalone) ;;
    c10d) launch+=(--rdzv_backend c10d --rdzv_endpoint "127.0.0.1:$(free_port)" --nnodes 1
                   --rdzv_id "job$trial") ;;
  esac

  # setsid from a non-interactive shell does not fork: $! leads the new session and process
  # group, which holds torchrun and its workers, so one kill of the group removes leftovers.
  setsid "$torchrun" "${launch[@]}" "$here/torch_elastic.py" \
    --data "$data" --steps "$steps" --checkpoint-every "$checkpoint_every" \
    --ckpt-dir "$dir/ckpt" --log "$dir/events.jsonl" \
    --kill-rank "$kill_rank" --kill-step "$kill_step" >"$dir/torchrun.out" 2>&1 &
  group=$!
  local deadline=$((SECONDS + trial_timeout)) timed_out=0 rc=0
  while kill -0 "$group" 2>/dev/null; do
    if ((SECONDS >= deadline)); then timed_out=1; break; fi
    sleep 0.5
  done
  kill -KILL -- "-$group" 2>/dev/null || true
  wait "$group" 2>/dev/null || rc=$?  # 2>: no "Killed" job notice
  group=

  if ((timed_out)) || ((rc != 0)); then
    echo "torchrun $mode trial $trial: FAILED ($( ((timed_out)) && echo "timed out after ${trial_timeout} s" || echo "exit $rc")); torchrun output ends:" >&2
    tail -n 30 "$dir/torchrun.out" >&2
    return 1
  fi
  "$python" - "$dir/events.jsonl" "$mode" "$trial" "$steps" >>"$work/results" <<'EOF'
import json, sys
log, mode, trial, steps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
events = [json.loads(line) for line in open(log) if line.strip()]
kill = next(e for e in events if e["event"] == "kill")
start = next(e for e in events if e["event"] == "start" and e["restart"] >= 1)
first = next(e for e in events if e["event"] == "step" and e["restart"] >= 1)
last = max(e["step"] for e in events if e["event"] == "step")
if last != steps:
    sys.exit(f"{mode} trial {trial}: the job stopped at step {last} of {steps}")
sec = lambda ms: (ms - kill["unix_ms"]) / 1000
row = dict(mode=mode, trial=int(trial), recover=sec(first["unix_ms"]),
           respawn=sec(start["proc_unix_ms"]), ready=sec(start["unix_ms"]),
           lost=(kill["step"] - 1) - start["resume_step"], resume=start["resume_step"],
           restarts=max(e["restart"] for e in events if e["event"] == "start"))
print(json.dumps(row))
print(f"torchrun {mode} trial {trial}: recover {row['recover']:.2f} s (respawn {row['respawn']:.2f} s, "
      f"ready {row['ready']:.2f} s), steps lost {row['lost']} (resumed after step {row['resume']}), "
      f"restarts {row['restarts']}", file=sys.stderr)
EOF
}

echo "torchrun recovery: $nproc workers, $steps steps, checkpoint every $checkpoint_every, kill -9 of rank $kill_rank before step $kill_step"
echo "torch $("$python" -c 'import torch; print(torch.__version__)'), $(getconf _NPROCESSORS_ONLN) CPUs, $trials trials per mode, corpus $data, monitor_interval ${monitor_interval:-default}"
IFS=, read -r -a mode_list <<<"$modes"
for mode in "${mode_list[@]}"; do
  case $mode in standalone|c10d) ;; *) echo "torchrun_recovery: unknown mode $mode" >&2; exit 2 ;; esac
  for ((t = 1; t <= trials; t++)); do
    run_trial "$mode" "$t" 2>&1 || exit 1
  done
done

"$python" - "$work/results" <<'EOF'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
for mode in dict.fromkeys(r["mode"] for r in rows):
    mine = [r for r in rows if r["mode"] == mode]
    med = lambda key: statistics.median(r[key] for r in mine)
    print(f"torchrun {mode}: recover median {med('recover'):.2f} s max {max(r['recover'] for r in mine):.2f} s "
          f"({len(mine)} trials), steps lost median {med('lost'):g}")
    print(f"torchrun {mode}: median kill -> workers respawned {med('respawn'):.2f} s, "
          f"-> ready {med('ready'):.2f} s, -> first step {med('recover'):.2f} s")
EOF
