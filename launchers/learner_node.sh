#!/usr/bin/env bash
# One learner node of a multi-node async_rl job: runs torchrun, which starts this node's FSDP2 learner ranks
# (python -m async_rl.entrypoints.train). Run it once on every learner node with the same settings except NODE_RANK;
# start launchers/actor_node.sh on the actor nodes. launchers/slurm_hetjob.sbatch does both under SLURM.
#
#   NNODES=2 NODE_RANK=0 MASTER_ADDR=learner0.cluster CURVE_DIR=/shared/keys NUM_ACTORS=8 \
#   CONFIGS=configs/qwen2.5-0.5b_gsm8k_grpo.yaml bash launchers/learner_node.sh trainer.experiment_name=run1
#
# Arguments: dotted.key=value config overrides for the learner (give the actors the same ones).
# Environment [default]:
#   NNODES          learner nodes in the job [1]
#   NODE_RANK       this node's index 0..NNODES-1 [$SLURM_PROCID (one task per node), else 0]; only
#                   RDZV_BACKEND=static honours it (see 'Which node is global rank 0' below)
#   NPROC_PER_NODE  learner ranks on this node [GPUs in CUDA_VISIBLE_DEVICES / nvidia-smi -L, else 1]
#   MASTER_ADDR     rendezvous host, reachable from every learner node [127.0.0.1]
#   RDZV_PORT       rendezvous port on MASTER_ADDR [29400]
#   RDZV_ID         rendezvous id, the same on every node of one job [$SLURM_JOB_ID, else async_rl]
#   RDZV_BACKEND    c10d | static [c10d]
#   COORD_ADDR      address actors use to reach global rank 0 (coordinator and weight-sync store) [MASTER_ADDR]
#   COORD_BIND      address the coordinator binds [127.0.0.1 when COORD_ADDR is loopback, else 0.0.0.0]
#   COORD_PORT      coordinator (ZeroMQ ROUTER) port [29410]
#   WS_PORT         weight-sync TCPStore port [29420]
#   NUM_ACTORS      actors over all actor nodes (async_training.num_actors) [config's value]
#   CURVE_DIR       keys from `python -m async_rl.transport.keys DIR --clients NUM_ACTORS`; required unless
#                   COORD_ADDR is loopback, because the rollout plane is then reachable from the network
#   CONFIGS         config files, space separated [none: built-in defaults]
#   PYTHON [python], TORCHRUN [torchrun] (may be several words, e.g. "python -m torch.distributed.run")
#   DRY_RUN=1       print the command instead of running it
#
# Which node is global rank 0: torchrun's c10d rendezvous ignores --node_rank and numbers nodes by sorting their
# fully-qualified host names (socket.getfqdn()), so rank 0 (coordinator + weight-sync store) runs on the learner node
# whose FQDN sorts first, and COORD_ADDR must name that node (slurm_hetjob.sbatch computes it). With
# RDZV_BACKEND=static rank 0 is the node with NODE_RANK=0, which must then be MASTER_ADDR. The coordinator binds
# COORD_BIND (0.0.0.0 = every interface) on whichever node is rank 0, so the other learner nodes need no address.
#
# CURVE (encryption + actor authentication; mandatory off loopback). `python -m async_rl.transport.keys DIR
# --clients N` writes DIR/server.key, DIR/server.key_secret, DIR/clients/actor-I.key_secret and
# DIR/authorized/actor-I.key. The config keys (all five must be set, on learners and actors alike):
#   async_training.transport.curve_server_secret_key = DIR/server.key_secret       (used by the coordinator)
#   async_training.transport.curve_server_public_key = DIR/server.key              (used by actors)
#   async_training.transport.curve_client_keys_dir   = DIR/authorized              (coordinator: who may connect)
#   async_training.transport.curve_client_secret_key = DIR/clients/actor-I.key_secret  (used by actor I)
#   async_training.transport.curve_client_public_key = DIR/authorized/actor-I.key      (actor I's public key)
# This script sets them from CURVE_DIR (the learner does not use the client pair; actor-0's paths fill the slots).
# A learner node needs server.key, server.key_secret and authorized/; delete authorized/actor-I.key to revoke one.
set -euo pipefail

NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-${SLURM_PROCID:-0}}
MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}
RDZV_PORT=${RDZV_PORT:-29400}
RDZV_ID=${RDZV_ID:-${SLURM_JOB_ID:-async_rl}}
RDZV_BACKEND=${RDZV_BACKEND:-c10d}
COORD_ADDR=${COORD_ADDR:-$MASTER_ADDR}
COORD_PORT=${COORD_PORT:-29410}
WS_PORT=${WS_PORT:-29420}
PYTHON=${PYTHON:-python}
read -r -a torchrun <<<"${TORCHRUN:-torchrun}"
read -r -a configs <<<"${CONFIGS:-}"

die() {
  echo "learner_node.sh: $*" >&2
  exit 2
}

is_loopback() {
  case "$1" in
    localhost | 127.* | ::1 | "[::1]") return 0 ;;
    *) return 1 ;;
  esac
}

count_gpus() {
  if [[ -n "${CUDA_VISIBLE_DEVICES:-}" ]]; then
    local ids
    IFS=, read -r -a ids <<<"$CUDA_VISIBLE_DEVICES"
    echo "${#ids[@]}"
  elif command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true
  else
    echo 0
  fi
}

if [[ -z "${NPROC_PER_NODE:-}" ]]; then
  NPROC_PER_NODE=$(count_gpus)
  ((NPROC_PER_NODE > 0)) || NPROC_PER_NODE=1
fi
for var in NNODES NODE_RANK NPROC_PER_NODE RDZV_PORT COORD_PORT WS_PORT; do
  [[ "${!var}" =~ ^[0-9]+$ ]] || die "$var must be a non-negative integer, got '${!var}'"
done
((NODE_RANK < NNODES)) || die "NODE_RANK ($NODE_RANK) must be < NNODES ($NNODES)"
[[ "$RDZV_BACKEND" == c10d || "$RDZV_BACKEND" == static ]] || die "RDZV_BACKEND must be c10d or static"
if ((NNODES > 1)) && is_loopback "$MASTER_ADDR"; then
  die "NNODES=$NNODES but MASTER_ADDR=$MASTER_ADDR is loopback; set MASTER_ADDR to a host every node can reach"
fi
if is_loopback "$COORD_ADDR"; then
  COORD_BIND=${COORD_BIND:-127.0.0.1}
else
  COORD_BIND=${COORD_BIND:-0.0.0.0}
fi

config_args=()
for f in "${configs[@]}"; do
  config_args+=(--config "$f")
done

ts=async_training.transport
wiring=(
  "$ts.host=$COORD_BIND" "$ts.port=$COORD_PORT"
  "async_training.weight_sync.master_addr=$COORD_ADDR" "async_training.weight_sync.master_port=$WS_PORT"
  "trainer.nnodes=$NNODES" "trainer.n_gpus_per_node=$NPROC_PER_NODE"
)
if [[ -n "${NUM_ACTORS:-}" ]]; then
  wiring+=("async_training.num_actors=$NUM_ACTORS")
fi
if [[ -n "${CURVE_DIR:-}" ]]; then
  for f in "$CURVE_DIR/server.key" "$CURVE_DIR/server.key_secret" "$CURVE_DIR/authorized"; do
    if [[ ! -e "$f" ]]; then
      [[ "${DRY_RUN:-0}" == 1 ]] ||
        die "CURVE key file $f is missing; make keys with: $PYTHON -m async_rl.transport.keys $CURVE_DIR --clients N"
      echo "learner_node.sh: warning: $f does not exist yet" >&2
    fi
  done
  wiring+=(
    "$ts.curve_server_secret_key=$CURVE_DIR/server.key_secret" "$ts.curve_server_public_key=$CURVE_DIR/server.key"
    "$ts.curve_client_keys_dir=$CURVE_DIR/authorized"
    "$ts.curve_client_secret_key=$CURVE_DIR/clients/actor-0.key_secret"
    "$ts.curve_client_public_key=$CURVE_DIR/authorized/actor-0.key"
  )
elif ! is_loopback "$COORD_BIND"; then
  die "the coordinator would bind $COORD_BIND (not loopback) without encryption; set CURVE_DIR to keys made by" \
    "'$PYTHON -m async_rl.transport.keys DIR --clients N' (N = total actors)"
fi

cmd=(
  "${torchrun[@]}" --nnodes "$NNODES" --node_rank "$NODE_RANK" --nproc_per_node "$NPROC_PER_NODE"
  --rdzv_backend "$RDZV_BACKEND" --rdzv_endpoint "$MASTER_ADDR:$RDZV_PORT" --rdzv_id "$RDZV_ID"
  -m async_rl.entrypoints.train "${config_args[@]}" "$@" "${wiring[@]}"
)
if [[ "${DRY_RUN:-0}" == 1 ]]; then
  printf '%q ' "${cmd[@]}"
  echo
  exit 0
fi
echo "learner_node.sh: node $NODE_RANK/$NNODES, $NPROC_PER_NODE ranks, coordinator $COORD_ADDR:$COORD_PORT" >&2
if [[ -z "${SLURM_STEP_ID:-}" ]]; then
  exec "${cmd[@]}"
fi
# Under srun, Slurm signals every process of the step itself (scancel, preemption, --signal=TERM@<s>), so each rank
# gets the SIGTERM directly and stops at a step boundary with a checkpoint. torchrun must stay out of it: acting on the
# signal it sends the ranks another, a second SIGTERM to torchrun makes it exit before they have finished, and the
# step's end then kills what is left. So torchrun runs with SIGTERM ignored (each rank installs its own handler), and this
# script, seeing the signal, exits 128 + SIGTERM like the ranks rather than torchrun's 1 for "a worker failed".
export PET_SIGNALS_TO_HANDLE=SIGINT,SIGHUP,SIGQUIT # torchrun --signals-to-handle (torch >= 2.8; older: ignored)
stopped=0
trap 'stopped=1' TERM
(
  trap '' TERM
  exec "${cmd[@]}"
) &
torchrun_pid=$!
while :; do
  rc=0
  wait "$torchrun_pid" || rc=$?
  kill -0 "$torchrun_pid" 2>/dev/null || break # a trapped signal only interrupted the wait
done
if ((rc != 0 && stopped)); then
  echo "learner_node.sh: stopped by SIGTERM (torchrun exited $rc)" >&2
  exit 143
fi
exit "$rc"
