# Sourced by scripts that need a local coordinator.
#   start_coordinator [flags...]  starts build/bin/baton-coordinator on a free
#                                 loopback port; sets COORDINATOR_PID and
#                                 COORDINATOR_ADDRESS (host:port).
#   stop_coordinator              SIGTERM, then wait for it to exit.

start_coordinator() {
  local root log
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
  log=$(mktemp -t baton-coordinator.XXXXXX)
  "$root/build/bin/baton-coordinator" --listen 127.0.0.1:0 "$@" >"$log" 2>"$log.err" &
  COORDINATOR_PID=$!
  COORDINATOR_LOG="$log.err"
  for _ in $(seq 100); do
    COORDINATOR_ADDRESS=$(sed -n 's/^baton-coordinator listening on //p' "$log")
    [ -n "$COORDINATOR_ADDRESS" ] && return 0
    if ! kill -0 "$COORDINATOR_PID" 2>/dev/null; then
      echo "baton-coordinator exited at start:" >&2
      cat "$log.err" >&2
      return 1
    fi
    sleep 0.1
  done
  echo "baton-coordinator did not start listening within 10 s; its log:" >&2
  cat "$log.err" >&2
  return 1
}

stop_coordinator() {
  [ -n "${COORDINATOR_PID:-}" ] || return 0
  kill -TERM "$COORDINATOR_PID" 2>/dev/null || true
  wait "$COORDINATOR_PID" 2>/dev/null || true
  COORDINATOR_PID=
}
