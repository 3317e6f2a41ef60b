#!/usr/bin/env bash
#SBATCH --job-name=memsnap-fsdp
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=8
#SBATCH --gpus-per-node=8
#SBATCH --time=01:00:00
# Record every rank of a Slurm job (srun starts the ranks; Slurm's variables give rank and node),
# then gather the record in a second step and render the report.
#   sbatch launchers/examples/slurm_job.sh        (TRAIN, CONFIG, MEMSNAP override the defaults)
set -euo pipefail
here="${SLURM_SUBMIT_DIR:-$(cd "$(dirname "$0")" && pwd)}"
MEMSNAP="${MEMSNAP:-memsnap}"
CONFIG="${CONFIG:-$here/launchers/examples/memsnap.yaml}"
read -r -a train <<< "${TRAIN:-python train.py}"
export MEMSNAP_RUN_NAME="${MEMSNAP_RUN_NAME:-job-${SLURM_JOB_ID:-local}}"
export MEMSNAP_FOLDER="${MEMSNAP_FOLDER:-$PWD/memsnap/$MEMSNAP_RUN_NAME}"

srun "$MEMSNAP" run --no-aggregate --config "$CONFIG" -- "${train[@]}"
# A job step of its own: MPI_Init is free again in every slot.
srun "$MEMSNAP" aggregate --keep-going "$MEMSNAP_FOLDER"
"$MEMSNAP" report --overwrite "$MEMSNAP_FOLDER/memsnap.h5"
echo "report: $MEMSNAP_FOLDER/report/index.html"
