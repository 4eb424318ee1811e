#!/usr/bin/env bash
# Runs the three images together on this machine the way deploy/k8s runs
# them on a cluster, with podman and no cluster: a coordinator, two agents
# ("nodes" n1 and n2) each with its own socket directory and shared-memory
# directory (the DaemonSet's hostPath volumes), prepared by the agent's init
# commands, and on each node a trainer container that mounts both (the
# socket directory read-only) and runs the example job through batonrun
# --coordinator. Every container runs as in the manifests: uid 10001,
# read-only root filesystem, all capabilities dropped. Flags come from
# deploy/k8s/base/*.env, as the ConfigMaps carry them. Host networking on
# loopback stands in for the pod network.
#
#   deploy/images/smoke.sh [--registry PREFIX] [--tag TAG] [--steps N]
#
# Exit 0 when both trainers finish the job (and `batonctl status` run in the
# coordinator's image shows it finished). Uses loopback ports 47051, 47100,
# 47101 and 47102; removes its containers and directories at the end.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
registry=localhost
tag=dev
steps=60
while [ $# -gt 0 ]; do
  case "$1" in
    --registry) registry=$2; shift 2 ;;
    --tag) tag=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    *) echo "smoke.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
runtime=$(command -v runc) || { echo "smoke.sh: needs runc (apt-get install runc)" >&2; exit 1; }
run_id=baton-smoke-$$
work=/dev/shm/$run_id  # memory-backed, like the nodes' /dev/shm/baton
nofile=$(ulimit -Hn)
nproc=$(ulimit -Hu)
[ "$nofile" = unlimited ] && nofile=1048576
if [ "$nproc" = unlimited ] || [ "$nproc" -gt 32768 ]; then nproc=32768; fi
common=(--runtime "$runtime" --network host --read-only --cap-drop all
        --security-opt no-new-privileges
        --ulimit "nofile=$nofile:$nofile" --ulimit "nproc=$nproc:$nproc")
containers=()

cleanup() {
  for c in "${containers[@]}"; do podman rm -f "$c" >/dev/null 2>&1 || true; done
  rm -rf "$work"
}
trap cleanup EXIT
say() { echo "smoke.sh: $*" >&2; }

say "coordinator"
containers+=("$run_id-coordinator")
podman run -d --name "$run_id-coordinator" "${common[@]}" --user 10001:10001 \
  --env-file "$root/deploy/k8s/base/coordinator.env" \
  -e BATON_LISTEN=127.0.0.1:47051 -e BATON_METRICS_LISTEN=127.0.0.1:47100 \
  "$registry/baton-coordinator:$tag" >/dev/null

for n in 1 2; do
  node=n$n
  mkdir -p "$work/$node/run" "$work/$node/shm"
  # The DaemonSet's init containers: chown as root with CAP_CHOWN only, then
  # the stale shared memory removed as the agent's user.
  podman run --rm "${common[@]}" --user 0:0 --cap-add CHOWN \
    -v "$work/$node/run:/run/baton" -v "$work/$node/shm:/dev/shm" \
    --entrypoint /usr/bin/chown "$registry/baton-agent:$tag" 10001:10001 /run/baton /dev/shm
  touch "$work/$node/shm/baton.999999.stale.0" && chown 10001:10001 "$work/$node/shm/baton.999999.stale.0"
  podman run --rm "${common[@]}" --user 10001:10001 -v "$work/$node/shm:/dev/shm" \
    --entrypoint /usr/bin/find "$registry/baton-agent:$tag" /dev/shm -maxdepth 1 -name 'baton.*' -type f -delete
  [ ! -e "$work/$node/shm/baton.999999.stale.0" ] || { say "the stale shared memory was not removed"; exit 1; }
  say "agent $node"
  containers+=("$run_id-agent-$node")
  podman run -d --name "$run_id-agent-$node" "${common[@]}" --user 10001:10001 \
    --env-file "$root/deploy/k8s/base/agent.env" \
    -e BATON_COORDINATOR=127.0.0.1:47051 -e BATON_NODE="$node" -e BATON_DATA_HOST=127.0.0.1 \
    -e BATON_METRICS_LISTEN="127.0.0.1:4710$n" \
    -v "$work/$node/run:/run/baton" -v "$work/$node/shm:/dev/shm" \
    "$registry/baton-agent:$tag" >/dev/null
done

for i in $(seq 100); do
  [ -S "$work/n1/run/agent.sock" ] && [ -S "$work/n2/run/agent.sock" ] && break
  sleep 0.1
done
[ -S "$work/n2/run/agent.sock" ] || { say "the agents did not serve their sockets"; podman logs "$run_id-agent-n1" >&2; exit 1; }

pids=()
for n in 1 2; do
  node=n$n
  say "trainers on $node (batonrun --coordinator, 2 trainers)"
  containers+=("$run_id-trainer-$node")
  podman run --name "$run_id-trainer-$node" "${common[@]}" --user 10001:10001 \
    --tmpfs /tmp -e HOME=/tmp -e WORLD_SIZE=4 -e MASTER_ADDR=127.0.0.1 -e MASTER_PORT=47051 \
    -v "$work/$node/run:/run/baton:ro" -v "$work/$node/shm:/dev/shm" \
    "$registry/baton-trainer:$tag" \
    --coordinator=127.0.0.1:47051 --socket=/run/baton/agent.sock --job=smoke \
    --nodes=2 --procs-per-node=2 -- /usr/bin/python3 /opt/baton/examples/train_synthetic.py \
    --steps="$steps" 2>&1 | sed "s/^/[$node] /" &
  pids+=($!)
done
failed=0
for p in "${pids[@]}"; do wait "$p" || failed=1; done
for n in 1 2; do
  code=$(podman inspect --format '{{.State.ExitCode}}' "$run_id-trainer-n$n")
  [ "$code" = 0 ] || { say "the trainers on n$n exited with $code"; failed=1; }
done
say "batonctl jobs (in the coordinator's image)"
podman exec "$run_id-coordinator" batonctl --coordinator 127.0.0.1:47051 jobs >&2 || failed=1
if [ "$failed" != 0 ]; then
  for c in "$run_id-coordinator" "$run_id-agent-n1" "$run_id-agent-n2"; do
    say "log of $c:"; podman logs "$c" 2>&1 | tail -20 >&2
  done
  say "FAILED"
  exit 1
fi
say "ok: the job ran on 2 nodes x 2 trainers from the images"
