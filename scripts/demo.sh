#!/usr/bin/env bash
# The main job: start the local control plane and show it working. With DEMO_ONCE=1 the scripted
# scenario runs once and the script exits 0 only if every step was observed.
set -euo pipefail
cd "$(dirname "$0")/.."
TESTENV=${TESTENV:-target/debug/testenv}
step() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }

step "providing the control-plane binaries (built from Go modules the first time)"
"$TESTENV" provision >/dev/null
KUBECTL=$("$TESTENV" which kubectl)
work=$(mktemp -d)
"$TESTENV" cluster --kubeconfig-out "$work/kubeconfig-path" &
cluster_pid=$!
cleanup() { kill -TERM "$cluster_pid" 2>/dev/null || true; wait "$cluster_pid" 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
trap 'exit 130' INT TERM
for _ in $(seq 1 1200); do
  [ -s "$work/kubeconfig-path" ] && break
  kill -0 "$cluster_pid" 2>/dev/null || { echo "demo: the control plane failed to start (see above)" >&2; exit 1; }
  sleep 0.1
done
[ -s "$work/kubeconfig-path" ] || { echo "demo: the control plane did not start in 120 s" >&2; exit 1; }
export KUBECONFIG; KUBECONFIG=$(cat "$work/kubeconfig-path")
k() { "$KUBECTL" "$@"; }

step "kwok nodes"
k get nodes -o wide
step "a Deployment of 3 replicas: scheduled on kwok nodes, Running and Ready"
k create namespace demo
k -n demo create deployment hello --image=nginx:1.27 --replicas=3
k -n demo rollout status deployment/hello --timeout=90s
k -n demo get pods -o wide
step "rolling update to a new image"
k -n demo set image deployment/hello nginx=nginx:1.28
k -n demo rollout status deployment/hello --timeout=90s
k -n demo get replicasets
step "demo scenario complete"
if [ "${DEMO_ONCE:-}" = 1 ]; then exit 0; fi
echo "The cluster stays up; in another shell: export KUBECONFIG=$KUBECONFIG; $KUBECTL get pods -A"
echo "Press Ctrl-C to stop."
wait "$cluster_pid"
