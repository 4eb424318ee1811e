#!/usr/bin/env bash
# deploy/k8s/overlays/tls/make-secrets makes certificates baton accepts:
# a coordinator serving with the coordinator's (its Secret's files) takes
# an agent with a node's file (as on the node's /etc/baton/tls) and batonctl
# with the trainers' client certificate; an agent given another node's file
# refuses to start. Real processes on loopback; no cluster.
#
#   tests/deploy/make_secrets_test.sh BIN_DIR
#
# Exit 77 (skipped) without openssl or kubectl, which the script needs.
set -euo pipefail
bin=$(cd "${1:?usage: $0 BIN_DIR}" && pwd)
root=$(cd "$(dirname "$0")/../.." && pwd)
for tool in openssl kubectl; do
  command -v "$tool" >/dev/null 2>&1 || { echo "skipped: $tool is not installed"; exit 77; }
done

work=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*" >&2
  for log in "$work"/*.log; do [ -f "$log" ] && { echo "--- $log" >&2; tail -n 20 "$log" >&2; }; done
  exit 1
}

"$root/deploy/k8s/overlays/tls/make-secrets" "$work/certs" node-a node-b >"$work/make-secrets.out" ||
  fail "make-secrets exited $?"
certs=$work/certs
for f in ca.crt secrets.yaml nodes/node-a.pem nodes/node-b.pem coordinator.crt coordinator.key client.crt client.key; do
  [ -s "$certs/$f" ] || fail "make-secrets made no $f"
done
grep -q 'name: baton-coordinator-tls' "$certs/secrets.yaml" || fail "secrets.yaml lacks baton-coordinator-tls"
grep -q 'name: baton-client-tls' "$certs/secrets.yaml" || fail "secrets.yaml lacks baton-client-tls"
grep -q "/etc/baton/tls/node-a.pem" "$work/make-secrets.out" || fail "make-secrets did not say where node-a's file goes"

# A free port on loopback: the coordinator picks one and says which.
"$bin/baton-coordinator" --listen 127.0.0.1:0 --tls_cert "$certs/coordinator.crt" \
  --tls_key "$certs/coordinator.key" --tls_ca "$certs/ca.crt" >"$work/coordinator.log" 2>&1 &
pids+=($!)
port=""
for _ in $(seq 1 100); do
  port=$(sed -n 's/^baton-coordinator listening on 127.0.0.1:\([0-9]*\)$/\1/p' "$work/coordinator.log")
  [ -n "$port" ] && break
  sleep 0.1
done
[ -n "$port" ] || fail "the coordinator did not start with make-secrets' certificate"

"$bin/baton-agent" --node node-a --coordinator "127.0.0.1:$port" --socket "$work/node-a.sock" \
  --tls_cert "$certs/nodes/node-a.pem" --tls_key "$certs/nodes/node-a.pem" --tls_ca "$certs/ca.crt" \
  >"$work/agent-a.log" 2>&1 &
pids+=($!)
accepted=false
for _ in $(seq 1 100); do
  if grep -q 'node=node-a session .* opened' "$work/coordinator.log"; then accepted=true; break; fi
  sleep 0.1
done
$accepted || fail "the coordinator did not open node-a's session"

# The trainers' client certificate (batonrun and batonctl take the same flags).
out=$(timeout 20 "$bin/batonctl" --coordinator "127.0.0.1:$port" --tls_cert "$certs/client.crt" \
  --tls_key "$certs/client.key" --tls_ca "$certs/ca.crt" jobs 2>&1) || fail "batonctl with client.crt: $out"
echo "batonctl with the client certificate: $out"

# node-b's file on node-a: the agent refuses to start (exit 2) and says why.
set +e
out=$(timeout 20 "$bin/baton-agent" --node node-a --coordinator "127.0.0.1:$port" --socket "$work/x.sock" \
  --tls_cert "$certs/nodes/node-b.pem" --tls_key "$certs/nodes/node-b.pem" --tls_ca "$certs/ca.crt" 2>&1)
rc=$?
set -e
[ "$rc" -eq 2 ] || fail "an agent with another node's certificate exited $rc, not 2: $out"
grep -q 'does not name this node "node-a"' <<<"$out" || fail "unexpected refusal: $out"
echo "an agent with node-b's certificate as node-a: refused: $out"

# Running it again keeps the CA (a rotation): the old node file still verifies.
cp "$certs/nodes/node-a.pem" "$work/node-a.old.pem"
"$root/deploy/k8s/overlays/tls/make-secrets" "$work/certs" node-a >/dev/null || fail "second make-secrets run"
openssl verify -CAfile "$certs/ca.crt" "$work/node-a.old.pem" >/dev/null || fail "a second run replaced the CA"
cmp -s "$work/node-a.old.pem" "$certs/nodes/node-a.pem" && fail "a second run did not re-issue node-a's certificate"
echo "ok: make-secrets' certificates work with baton"
