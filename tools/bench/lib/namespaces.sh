# shellcheck shell=bash
# Network namespaces for the benchmarks that run one baton-agent per
# "machine" on this one (tools/bench/scheduling/run,
# tools/bench/negotiation/namespaces). Source it; it defines functions only.
#
# A benchmark picks a PREFIX (two letters, e.g. "bl") and a SUBNET (the
# first three octets, e.g. 10.77.0): namespace PREFIX-sw holds the bridge
# PREFIX-br at SUBNET.254 (the coordinator runs there), namespaces
# PREFIX-n1..PREFIX-nN each have an eth0 at SUBNET.K, joined to the bridge
# by the veth PREFIX-vK. Needs root.

# The namespaces of PREFIX that exist now.
ns_list() {  # prefix
  ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$1-(sw|n[0-9]+)\$" || true
}

# Every process that runs in a namespace of PREFIX.
ns_pids() {  # prefix
  local ns
  for ns in $(ns_list "$1"); do ip netns pids "$ns" 2>/dev/null || true; done
}

# Ends every process in the namespaces of PREFIX (TERM, then KILL after 5
# s), then deletes the namespaces.
ns_teardown() {  # prefix
  local pid ns left
  for pid in $(ns_pids "$1"); do kill "$pid" 2>/dev/null || true; done
  for _ in $(seq 50); do
    left=$(ns_pids "$1")
    [ -z "$left" ] && break
    sleep 0.1
  done
  for pid in $(ns_pids "$1"); do kill -9 "$pid" 2>/dev/null || true; done
  for ns in $(ns_list "$1"); do ip netns del "$ns" 2>/dev/null || true; done
}

# Creates the switch and NODES node namespaces. Prints the reason and
# returns 1 when namespaces cannot be made here.
ns_setup() {  # prefix subnet nodes
  local p=$1 subnet=$2 nodes=$3 k err
  err=$(ip netns add "$p-sw" 2>&1) || { echo "cannot create network namespaces (ip netns add: $err)"; return 1; }
  err=$({ ip -n "$p-sw" link set lo up &&
    ip -n "$p-sw" link add "$p-br" type bridge &&
    ip -n "$p-sw" addr add "$subnet.254/24" dev "$p-br" &&
    ip -n "$p-sw" link set "$p-br" up; } 2>&1) || { echo "cannot make the bridge: $err"; return 1; }
  for k in $(seq "$nodes"); do
    err=$({ ip netns add "$p-n$k" &&
      ip -n "$p-n$k" link set lo up &&
      ip -n "$p-sw" link add "$p-v$k" type veth peer name eth0 netns "$p-n$k" &&
      ip -n "$p-sw" link set "$p-v$k" master "$p-br" up &&
      ip -n "$p-n$k" addr add "$subnet.$k/24" dev eth0 &&
      ip -n "$p-n$k" link set eth0 up; } 2>&1) || { echo "cannot make node namespace $p-n$k: $err"; return 1; }
  done
}

# Shapes every node's link, both directions, to RATE Mbit/s with tbf (a
# queue of QUEUE_MS). Prints the reason and returns 1 where tbf is not
# permitted.
ns_shape() {  # prefix nodes rate_mbit queue_ms
  local p=$1 nodes=$2 rate=$3 queue_ms=$4 burst k err
  # tbf needs a burst of at least 1 mbit here (smaller ones split every
  # segment and burn the CPU); a millisecond's worth at higher rates.
  burst=$(awk -v r="$rate" 'BEGIN { printf "%dkbit", (r > 1000 ? r : 1000) }')
  for k in $(seq "$nodes"); do
    err=$(tc -n "$p-n$k" qdisc replace dev eth0 root tbf rate "${rate}mbit" burst "$burst" \
      latency "${queue_ms}ms" 2>&1) || { echo "tc tbf is not permitted here ($err)"; return 1; }
    tc -n "$p-sw" qdisc replace dev "$p-v$k" root tbf rate "${rate}mbit" burst "$burst" \
      latency "${queue_ms}ms"
  done
  echo "tbf burst $burst, queue $queue_ms ms"
}

# Starts baton-coordinator (plaintext: the benchmarks measure the data
# plane) in PREFIX-sw on SUBNET.254, logs in LOGDIR; prints its address, or
# returns 1 when it did not start within 10 s.
ns_start_coordinator() {  # prefix subnet bin logdir [flags...]
  local p=$1 subnet=$2 bin=$3 logs=$4
  shift 4
  ip netns exec "$p-sw" "$bin/baton-coordinator" --listen="$subnet.254:0" --insecure "$@" \
    >"$logs/coordinator.out" 2>"$logs/coordinator.log" &
  for _ in $(seq 200); do
    grep -q "listening on" "$logs/coordinator.out" 2>/dev/null && break
    sleep 0.05
  done
  sed -n 's/^baton-coordinator listening on //p' "$logs/coordinator.out" | grep . || return 1
}
