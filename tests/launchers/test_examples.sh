#!/usr/bin/env bash
# Runs the job scripts of launchers/examples/ with the demo workload: mpirun.sh under the real
# Open MPI; slurm_job.sh and torchrun.sh under stand-ins for srun and torchrun that start the
# ranks with the variables those launchers set (no Slurm or PyTorch here).
#   test_examples.sh MEMSNAP FSDP_SIM SOURCE_DIR
set -euo pipefail
memsnap="$1" sim="$2" src="$3"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
mkdir -p "$work/bin"

# srun: NTASKS processes with Slurm's per-task variables; a gathering step runs as one task.
cat > "$work/bin/srun" <<'SH'
#!/usr/bin/env bash
n="${SLURM_NTASKS:-4}"
case " $* " in *" aggregate "*) n=1 ;; esac
pids=()
for ((r = 0; r < n; r++)); do
  SLURM_PROCID=$r SLURM_LOCALID=$((r % 2)) SLURM_NTASKS=$n SLURM_NTASKS_PER_NODE=2 SLURM_NODEID=$((r / 2)) "$@" &
  pids+=($!)
done
code=0
for p in "${pids[@]}"; do wait "$p" || code=$?; done
exit $code
SH
# torchrun --nproc-per-node N --no-python CMD...: N processes with torchrun's variables.
cat > "$work/bin/torchrun" <<'SH'
#!/usr/bin/env bash
n=1
while [ $# -gt 0 ]; do
  case "$1" in
    --nproc-per-node) n="$2"; shift 2 ;;
    --no-python) shift ;;
    *) break ;;
  esac
done
pids=()
for ((r = 0; r < n; r++)); do
  RANK=$r LOCAL_RANK=$r WORLD_SIZE=$n LOCAL_WORLD_SIZE=$n GROUP_RANK=0 TORCHELASTIC_RUN_ID=fake-1 "$@" &
  pids+=($!)
done
code=0
for p in "${pids[@]}"; do wait "$p" || code=$?; done
exit $code
SH
chmod +x "$work/bin/srun" "$work/bin/torchrun"
export PATH="$work/bin:$PATH"
printf 'run_name: ex\nskip_batches: 1\ninterval: 2\nstacks: native\n' > "$work/cfg.yaml"
train="$sim --step-us 0 --batches 4 --layers 2 --hidden 256 --leak-rank 1 --leak-mib 32"

check() {  # check NAME FOLDER RANKS
  local summary="$2/report/summary.json"
  [ -f "$summary" ] || { echo "FAIL $1: no $summary"; exit 1; }
  python3 - "$summary" "$3" "$1" <<'PY'
import json, sys
s = json.load(open(sys.argv[1])); ranks = int(sys.argv[2])
assert len(s["ranks"]) == ranks, (sys.argv[3], len(s["ranks"]))
assert [(f["kind"], f["rank"]) for f in s["findings"]] == [("leak", 1)], s["findings"]
print("ok", sys.argv[3], ranks, "ranks, finding:", s["findings"][0]["detail"][:60])
PY
}

MEMSNAP_FOLDER="$work/mpi" NP=3 CONFIG="$work/cfg.yaml" MEMSNAP="$memsnap" TRAIN="$train" "$src/launchers/examples/mpirun.sh"
check mpirun.sh "$work/mpi" 3

(cd "$work" && SLURM_NTASKS=4 SLURM_JOB_ID=77 SLURM_SUBMIT_DIR="$src" MEMSNAP_FOLDER="$work/slurm" CONFIG="$work/cfg.yaml" \
   MEMSNAP="$memsnap" TRAIN="$train" "$src/launchers/examples/slurm_job.sh")
check slurm_job.sh "$work/slurm" 4

MEMSNAP_FOLDER="$work/torch" NPROC=2 CONFIG="$work/cfg.yaml" MEMSNAP="$memsnap" TRAIN="$train" "$src/launchers/examples/torchrun.sh"
check torchrun.sh "$work/torch" 2
echo "3 passed, 0 failed"
