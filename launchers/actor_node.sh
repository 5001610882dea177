#!/usr/bin/env bash
# One actor node of a multi-node async_rl job: starts K vLLM actor processes (python -m async_rl.entrypoints.actor),
# one per GPU (or per GPUS_PER_ACTOR GPUs for tensor parallelism) via CUDA_VISIBLE_DEVICES, or a single one on a
# machine without GPUs, all pointed at the learner's coordinator. Start launchers/learner_node.sh on the learner nodes.
#
#   COORD_ADDR=learner0.cluster NODE_INDEX=0 CURVE_DIR=/shared/keys NUM_ACTORS=8 \
#   CONFIGS=configs/qwen2.5-0.5b_gsm8k_grpo.yaml bash launchers/actor_node.sh trainer.experiment_name=run1
#
# Arguments: dotted.key=value config overrides for every actor (the same ones the learner gets).
# Environment [default]:
#   COORD_ADDR       host of learner global rank 0, which runs the coordinator and weight-sync store (required)
#   COORD_PORT       coordinator port [29410]         WS_PORT  weight-sync TCPStore port [29420]
#   GPUS_PER_ACTOR   GPUs per actor = actor_rollout_ref.rollout.tensor_model_parallel_size [1]
#   ACTORS_PER_NODE  actors on this node [visible GPUs / GPUS_PER_ACTOR; 1 when no GPU is visible]
#   NODE_INDEX       this actor node's index 0.. [$SLURM_PROCID (one task per node), else 0]
#   ACTOR_ID_OFFSET  number of this node's first actor [NODE_INDEX x ACTORS_PER_NODE]; actors are named actor-N,
#                    which is also the name of their CURVE key pair, so N must stay below the --clients count
#   NUM_ACTORS       actors over all actor nodes (async_training.num_actors) [config's value]
#   CURVE_DIR        keys from `python -m async_rl.transport.keys DIR --clients NUM_ACTORS` (see learner_node.sh
#                    for the five curve_* config keys); required unless COORD_ADDR is loopback. This node needs
#                    DIR/server.key and DIR/clients/actor-N.key_secret for its own actors only.
#   CONFIGS          config files, space separated        PYTHON [python]
#   ACTOR_FLAGS      extra flags for every actor, e.g. '--emulate-tokens-per-s 256' (no vLLM: a fixed-rate
#                    emulated generator with the real client and weight sync, for pipeline and launcher tests) []
#   LOG_DIR          one log per actor, LOG_DIR/actor-N.log (appended to) [logs]
#   REWARD_SERVER    run a reward server on this node for its actors (a learned reward model,
#                    reward.reward_model with placement 'server'): auto = when the config asks for one ($PYTHON
#                    reads it), 1, or 0 [auto]. It listens on 127.0.0.1:REWARD_PORT (CURVE when CURVE_DIR is set:
#                    then this node also needs DIR/server.key_secret and DIR/authorized/), on the first actor's GPU,
#                    logs to LOG_DIR/reward-server-nodeNODE_INDEX.log and is restarted when it dies.
#   REWARD_PORT      its port [29430]
#   REWARD_SERVER_RESTARTS, REWARD_SERVER_BACKOFF_S  restarts allowed, and the seconds before the first (doubled
#                    each time) [the config's async_training.launcher.max_reward_server_restarts and
#                    restart_backoff_s; 3 and 5 with REWARD_SERVER=1]; then the node stops its actors and fails
#   STOP_GRACE_S     seconds between SIGTERM and SIGKILL when stopping actors [15]
#   DRY_RUN=1        print the commands instead of running them
#
# Supervision: each actor runs in its own process group (vLLM's helper processes included). An actor exiting 0 has
# been told to shut down by the coordinator; when all have, the script exits 0. If one fails, the others are stopped
# and the script exits with that actor's status, naming it and its log. SIGTERM/SIGINT are forwarded to every actor.
# The node's reward server (if any) is stopped with the actors; if it keeps dying past its restarts, the node fails.
set -euo pipefail

[[ -n "${COORD_ADDR:-}" ]] || {
  echo "actor_node.sh: COORD_ADDR must name the learner rank-0 host" >&2
  exit 2
}
COORD_PORT=${COORD_PORT:-29410}
WS_PORT=${WS_PORT:-29420}
GPUS_PER_ACTOR=${GPUS_PER_ACTOR:-1}
NODE_INDEX=${NODE_INDEX:-${SLURM_PROCID:-0}}
LOG_DIR=${LOG_DIR:-logs}
STOP_GRACE_S=${STOP_GRACE_S:-15}
PYTHON=${PYTHON:-python}
read -r -a configs <<<"${CONFIGS:-}"
read -r -a actor_flags <<<"${ACTOR_FLAGS:-}"

die() {
  echo "actor_node.sh: $*" >&2
  exit 2
}

is_loopback() {
  case "$1" in
    localhost | 127.* | ::1 | "[::1]") return 0 ;;
    *) return 1 ;;
  esac
}

gpus=()
if [[ -n "${CUDA_VISIBLE_DEVICES+set}" ]]; then # set, even empty: exactly these GPUs
  IFS=, read -r -a gpus <<<"$CUDA_VISIBLE_DEVICES"
elif command -v nvidia-smi >/dev/null 2>&1; then
  n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
  for ((g = 0; g < n; g++)); do gpus+=("$g"); done
fi

REWARD_PORT=${REWARD_PORT:-29430}
REWARD_SERVER=${REWARD_SERVER:-auto}
for var in COORD_PORT WS_PORT GPUS_PER_ACTOR NODE_INDEX STOP_GRACE_S REWARD_PORT; do
  [[ "${!var}" =~ ^[0-9]+$ ]] || die "$var must be a non-negative integer, got '${!var}'"
done
((GPUS_PER_ACTOR > 0)) || die "GPUS_PER_ACTOR must be >= 1"
if ((${#gpus[@]})); then
  ACTORS_PER_NODE=${ACTORS_PER_NODE:-$((${#gpus[@]} / GPUS_PER_ACTOR))}
  ((ACTORS_PER_NODE * GPUS_PER_ACTOR <= ${#gpus[@]})) ||
    die "ACTORS_PER_NODE=$ACTORS_PER_NODE x GPUS_PER_ACTOR=$GPUS_PER_ACTOR needs more than the ${#gpus[@]} GPUs visible"
else
  ACTORS_PER_NODE=${ACTORS_PER_NODE:-1}
fi
[[ "$ACTORS_PER_NODE" =~ ^[0-9]+$ ]] && ((ACTORS_PER_NODE > 0)) ||
  die "ACTORS_PER_NODE must be >= 1, got '$ACTORS_PER_NODE'"
ACTOR_ID_OFFSET=${ACTOR_ID_OFFSET:-$((NODE_INDEX * ACTORS_PER_NODE))}
if ! is_loopback "$COORD_ADDR" && [[ -z "${CURVE_DIR:-}" ]]; then
  die "the coordinator at $COORD_ADDR is not on loopback, so the connection must use CURVE: set CURVE_DIR to keys" \
    "made by '$PYTHON -m async_rl.transport.keys DIR --clients N' (N = total actors)"
fi

config_args=()
for f in "${configs[@]}"; do
  config_args+=(--config "$f")
done
ts=async_training.transport
wiring=(
  "$ts.host=$COORD_ADDR" "$ts.port=$COORD_PORT"
  "async_training.weight_sync.master_addr=$COORD_ADDR" "async_training.weight_sync.master_port=$WS_PORT"
)
if [[ -n "${NUM_ACTORS:-}" ]]; then
  wiring+=("async_training.num_actors=$NUM_ACTORS")
fi

# --- the node's reward server -----------------------------------------------------------------------------------------
rm_restarts=3
rm_backoff=5
case "$REWARD_SERVER" in
  auto)
    serving=$("$PYTHON" -m async_rl.entrypoints.reward_server --serving "${config_args[@]}" "$@") ||
      die "could not read the config with PYTHON=$PYTHON to see whether it needs a reward server; set PYTHON to" \
        "the job's interpreter, or REWARD_SERVER=0 or 1"
    read -r REWARD_SERVER rm_restarts rm_backoff <<<"$serving"
    ;;
  0 | 1) ;;
  *) die "REWARD_SERVER must be auto, 0 or 1, got '$REWARD_SERVER'" ;;
esac
rm_restarts=${REWARD_SERVER_RESTARTS:-$rm_restarts}
rm_backoff=${REWARD_SERVER_BACKOFF_S:-$rm_backoff}
[[ "$rm_restarts" =~ ^[0-9]+$ ]] || die "REWARD_SERVER_RESTARTS must be a non-negative integer, got '$rm_restarts'"
[[ "$rm_backoff" =~ ^[0-9]+([.][0-9]+)?$ ]] || die "REWARD_SERVER_BACKOFF_S must be a number, got '$rm_backoff'"
rm_cmd=()
rm_log="$LOG_DIR/reward-server-node$NODE_INDEX.log"
if ((REWARD_SERVER)); then
  rm_env=()
  if ((${#gpus[@]})); then
    rm_env=("CUDA_VISIBLE_DEVICES=${gpus[0]}") # shares the first actor's GPU
  fi
  rm_curve=()
  if [[ -n "${CURVE_DIR:-}" ]]; then # the actors' clients speak CURVE (their keys are set), so the server does too
    for f in "$CURVE_DIR/server.key_secret" "$CURVE_DIR/authorized"; do
      [[ -e "$f" || "${DRY_RUN:-0}" == 1 ]] || die "the reward server needs $f on this node (CURVE_DIR is set)"
    done
    rm_curve=(
      "$ts.curve_server_secret_key=$CURVE_DIR/server.key_secret" "$ts.curve_server_public_key=$CURVE_DIR/server.key"
      "$ts.curve_client_keys_dir=$CURVE_DIR/authorized"
    )
  fi
  rm_cmd=(
    env "${rm_env[@]}" "$PYTHON" -m async_rl.entrypoints.reward_server "${config_args[@]}" "$@"
    "$ts.host=127.0.0.1" "reward.reward_model.port=$REWARD_PORT" "${rm_curve[@]}"
  )
  wiring+=("reward.reward_model.server_host=127.0.0.1" "reward.reward_model.port=$REWARD_PORT")
fi

serve_rewards() { # the reward server, restarted when it dies; exits 1 when its restarts are spent
  local restarts=0 backoff=$rm_backoff rc
  while :; do
    rc=0
    "${rm_cmd[@]}" </dev/null >>"$rm_log" 2>&1 || rc=$?
    if ((restarts >= rm_restarts)); then
      echo "actor_node.sh: the reward server exited $rc after $restarts restart(s), the most allowed; log: $rm_log" >&2
      exit 1
    fi
    restarts=$((restarts + 1))
    echo "actor_node.sh: the reward server exited $rc; restart $restarts/$rm_restarts in ${backoff}s" >&2
    sleep "$backoff"
    backoff=$(awk -v b="$backoff" 'BEGIN { print b * 2 }')
  done
}

# --- start the actors ------------------------------------------------------------------------------------------------
[[ "${DRY_RUN:-0}" == 1 ]] || mkdir -p "$LOG_DIR"
set -m # job control: every background job gets its own process group, so `kill -- -PID` reaches its helpers
pids=()
names=()
rm_idx=""
if ((${#rm_cmd[@]})); then
  if [[ "${DRY_RUN:-0}" == 1 ]]; then
    printf '%q ' "${rm_cmd[@]}"
    echo
  else
    serve_rewards &
    rm_idx=0
    pids+=("$!")
    names+=("reward-server")
    echo "actor_node.sh: started the reward server on 127.0.0.1:$REWARD_PORT (pid $!); log: $rm_log" >&2
  fi
fi
# Several CPU actors on one node each get an even slice of the CPUs this script may use (its affinity, which SLURM
# sets to the job's CPUs): vLLM's own `auto` binding puts every engine's worker threads on the same cores. Left alone
# with one actor, GPUs, tensor parallelism (GPUS_PER_ACTOR > 1), or VLLM_CPU_OMP_THREADS_BIND set by the user.
cpus=()
if ((!${#gpus[@]} && ACTORS_PER_NODE > 1 && GPUS_PER_ACTOR == 1)) && [[ -z "${VLLM_CPU_OMP_THREADS_BIND+set}" ]]; then
  IFS=, read -r -a ranges <<<"$(awk '/^Cpus_allowed_list:/ {print $2}' /proc/self/status 2>/dev/null || true)"
  for range in "${ranges[@]}"; do
    for ((c = ${range%-*}; c <= ${range#*-}; c++)); do cpus+=("$c"); done
  done
fi
for ((i = 0; i < ACTORS_PER_NODE; i++)); do
  id="actor-$((ACTOR_ID_OFFSET + i))"
  env_args=()
  if ((${#gpus[@]})); then
    slice=("${gpus[@]:i*GPUS_PER_ACTOR:GPUS_PER_ACTOR}")
    env_args=("CUDA_VISIBLE_DEVICES=$(IFS=,; echo "${slice[*]}")")
  elif ((${#cpus[@]})); then
    width=$((${#cpus[@]} / ACTORS_PER_NODE > 0 ? ${#cpus[@]} / ACTORS_PER_NODE : 1))
    slice=("${cpus[@]:(i * width) % ${#cpus[@]}:width}")
    env_args=("VLLM_CPU_OMP_THREADS_BIND=$(IFS=,; echo "${slice[*]}")")
  fi
  curve=()
  if [[ -n "${CURVE_DIR:-}" ]]; then
    secret="$CURVE_DIR/clients/$id.key_secret"
    if [[ ! -f "$secret" || ! -f "$CURVE_DIR/server.key" ]]; then
      [[ "${DRY_RUN:-0}" == 1 ]] || die "CURVE files $secret and $CURVE_DIR/server.key must exist on this node for $id"
    fi
    curve=(
      "$ts.curve_server_secret_key=$CURVE_DIR/server.key_secret" "$ts.curve_server_public_key=$CURVE_DIR/server.key"
      "$ts.curve_client_keys_dir=$CURVE_DIR/authorized"
      "$ts.curve_client_secret_key=$secret" "$ts.curve_client_public_key=$CURVE_DIR/authorized/$id.key"
    )
  fi
  cmd=(
    env "${env_args[@]}" "$PYTHON" -m async_rl.entrypoints.actor "${actor_flags[@]}" "${config_args[@]}"
    --coordinator "tcp://$COORD_ADDR:$COORD_PORT" --actor-id "$id" "$@" "${wiring[@]}" "${curve[@]}"
  )
  if [[ "${DRY_RUN:-0}" == 1 ]]; then
    printf '%q ' "${cmd[@]}"
    echo
    continue
  fi
  "${cmd[@]}" </dev/null >>"$LOG_DIR/$id.log" 2>&1 & # appended: a requeued job keeps the earlier lines
  pids+=("$!")
  names+=("$id")
  echo "actor_node.sh: started $id (pid $!, ${env_args[*]:-CPU}); log: $LOG_DIR/$id.log" >&2
done
[[ "${DRY_RUN:-0}" == 1 ]] && exit 0

# --- supervise -------------------------------------------------------------------------------------------------------
live=() # indices of actors not yet seen exiting
for idx in "${!pids[@]}"; do
  [[ "$idx" == "$rm_idx" ]] || live+=("$idx")
done

group_alive() { kill -0 -- "-$1" 2>/dev/null; }

stop_all() { # stop_all SIGNAL: signal every group, wait STOP_GRACE_S, SIGKILL what is left
  local sig=$1 deadline idx busy
  for idx in "${!pids[@]}"; do kill -s "$sig" -- "-${pids[$idx]}" 2>/dev/null || true; done
  deadline=$((SECONDS + STOP_GRACE_S))
  while ((SECONDS < deadline)); do
    busy=0
    for idx in "${!pids[@]}"; do group_alive "${pids[$idx]}" && busy=1; done
    ((busy)) || break
    sleep 0.1
  done
  for idx in "${!pids[@]}"; do
    if group_alive "${pids[$idx]}"; then
      echo "actor_node.sh: ${names[$idx]} did not stop within ${STOP_GRACE_S}s; killing it" >&2
      kill -s KILL -- "-${pids[$idx]}" 2>/dev/null || true
    fi
  done
  wait 2>/dev/null || true
}

on_signal() {
  trap - TERM INT
  echo "actor_node.sh: received SIG$1; stopping every actor" >&2
  stop_all "$1"
  exit $((128 + $(kill -l "$1")))
}
trap 'on_signal TERM' TERM
trap 'on_signal INT' INT

while ((${#live[@]})); do
  sleep 0.2 &
  wait $! 2>/dev/null || true # a trap runs as soon as a signal arrives, not after a long sleep
  if [[ -n "$rm_idx" ]] && ! kill -0 "${pids[$rm_idx]}" 2>/dev/null; then
    echo "actor_node.sh: no reward server any more (see above); stopping the actors" >&2
    trap - TERM INT
    stop_all TERM
    exit 1
  fi
  still=()
  for idx in "${live[@]}"; do
    pid=${pids[$idx]}
    if kill -0 "$pid" 2>/dev/null; then
      still+=("$idx")
      continue
    fi
    rc=0
    wait "$pid" 2>/dev/null || rc=$?
    if ((rc != 0)); then
      echo "actor_node.sh: ${names[$idx]} failed with exit code $rc; log: $LOG_DIR/${names[$idx]}.log;" \
        "stopping the other actors" >&2
      trap - TERM INT
      stop_all TERM
      exit "$rc"
    fi
    echo "actor_node.sh: ${names[$idx]} exited 0" >&2
  done
  live=("${still[@]}")
done
stop_all TERM # nothing should be left; reaps stray helpers that outlived their actor
exit 0
