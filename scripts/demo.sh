#!/usr/bin/env bash
# The main job (`make demo`): a local control plane, the wasmop host and the example modules,
# visibly reconciling. The scripted scenario:
#   1. build the host and the example modules, start the control plane (cached binaries)
#   2. install the WasmReconciler CRD, push the modules with `wasmop push`, start the host
#   3. image-updater: an App becomes a Deployment + Service whose pods become Ready (kwok nodes)
#   4. a new image rolls the Deployment out; the App's status follows
#   5. an unsupported transition (changing spec.track) is refused at admission by the module
#   6. hot swap: v2 of the module is pushed and re-annotates the children, no restart
#   7. primary-replica: a Database becomes a StatefulSet; an upgrade rolls replicas, then the
#      primary; a downgrade is refused
#   8. configmap-propagator: a ConfigMap is copied into matching namespaces, pruned from one
#      that stops matching
# Then it keeps running until Ctrl-C. With DEMO_ONCE=1 it exits after the scenario: 0 only if
# every step was observed.
#
# Every wait is on what the cluster keeps (a spec or status field that stays, a condition, the
# StatefulSet's watch history from a resourceVersion read before the change), never on a passing
# state that a loaded machine may miss; DEMO_WAIT (seconds, default 300) bounds each wait.
set -Eeuo pipefail
cd "$(dirname "$0")/.."
CARGO=${CARGO:-cargo}
TESTENV=${TESTENV:-target/debug/testenv}
TARGET_DIR=$("$CARGO" metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
WASMOP="$TARGET_DIR/debug/wasmop"
MODULES="$TARGET_DIR/wasm32-wasip2/release"
WAIT_S=${DEMO_WAIT:-300}
WAIT_S=${WAIT_S%s}
WAIT="${WAIT_S}s"
step() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }
fail() { printf '\n\033[31mdemo: %s\033[0m\n' "$*" >&2; exit 1; }

step "building the host and the example modules (the first time takes minutes)"
"$CARGO" build -p wasmop --bin wasmop
"$CARGO" build --release --target wasm32-wasip2 -p image-updater --features revision-annotation
cp "$MODULES/image_updater.wasm" "$MODULES/image_updater_v2.wasm"
"$CARGO" build --release --target wasm32-wasip2 -p image-updater -p primary-replica -p configmap-propagator

step "providing the control-plane binaries (built from Go modules the first time)"
"$TESTENV" provision >/dev/null
KUBECTL=$("$TESTENV" which kubectl)
work=$(mktemp -d)
"$TESTENV" cluster --kubeconfig-out "$work/kubeconfig-path" &
cluster_pid=$!
host_pid=
cleanup() {
  [ -n "$host_pid" ] && { kill -TERM "$host_pid" 2>/dev/null || true; wait "$host_pid" 2>/dev/null || true; }
  kill -TERM "$cluster_pid" 2>/dev/null || true
  wait "$cluster_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
for _ in $(seq 1 $((WAIT_S * 10))); do
  [ -s "$work/kubeconfig-path" ] && break
  kill -0 "$cluster_pid" 2>/dev/null || fail "the control plane failed to start (see above)"
  sleep 0.1
done
[ -s "$work/kubeconfig-path" ] || fail "the control plane did not start in $WAIT_S s"
export KUBECONFIG; KUBECONFIG=$(cat "$work/kubeconfig-path")
k() { "$KUBECTL" "$@"; }
host_log() { echo "--- last lines of the host's log ($work/host.log) ---" >&2; tail -n 40 "$work/host.log" >&2 || true; }
trap 'host_log' ERR

step "kwok nodes"
k get nodes

step "installing the WasmReconciler CRD and the examples' CRDs and RBAC"
k apply -f deploy/crds/
for ex in image-updater primary-replica configmap-propagator; do
  k apply -f "examples/$ex/k8s/crd.yaml"
  k apply -f "examples/$ex/k8s/rbac.yaml"
done
k wait --for=condition=Established crd --all --timeout=30s >/dev/null

step "pushing the modules (wasmop push validates each one first)"
"$WASMOP" push "$MODULES/image_updater.wasm" --name image-updater -n demo
"$WASMOP" push "$MODULES/primary_replica.wasm" --name primary-replica -n demo
"$WASMOP" push "$MODULES/configmap_propagator.wasm" --name configmap-propagator -n wasmop-examples

step "starting the host (log: $work/host.log)"
# A compiled-module cache of this run's own: the demo stops its host at the end, maybe during
# the background compile of the module it swapped in, and the host counts a compile it did not
# finish as a crash (its quarantine marker stays); two such runs quarantined v2 for every later
# demo sharing ~/.cache/wasmop (the sixth and seventh stops' failures at the hot-swap step).
"$WASMOP" run --cache-dir "$work/compiled" \
  --metrics-addr 127.0.0.1:0 --webhook-addr 127.0.0.1:0 \
  >"$work/host.log" 2>&1 &
host_pid=$!
for ex in image-updater primary-replica configmap-propagator; do
  k apply -f "examples/$ex/k8s/wasmreconciler.yaml"
done
k wait wasmreconciler --all --for=condition=ModuleLoaded --timeout="$WAIT"
k get wasmreconcilers

step "image-updater: an App becomes a Deployment and a Service"
k apply -f examples/image-updater/k8s/app.yaml
k -n demo wait deployment/web --for=create --timeout="$WAIT" >/dev/null
k -n demo rollout status deployment/web --timeout="$WAIT"
k -n demo wait app/web --for=condition=Available --timeout="$WAIT"
k -n demo get apps,deployments,services,pods

step "a new image rolls the Deployment out"
k -n demo patch app web --type merge -p '{"spec":{"image":"nginx:1.28"}}'
k -n demo wait deployment/web --for=jsonpath='{.spec.template.spec.containers[0].image}'=nginx:1.28 --timeout="$WAIT"
# The rollout of the Deployment's current generation: done now or later, never missed.
k -n demo rollout status deployment/web --timeout="$WAIT"
k -n demo get replicasets
k -n demo wait app/web --for=jsonpath='{.status.observedGeneration}'="$(k -n demo get app web -o jsonpath='{.metadata.generation}')" --timeout="$WAIT"
k -n demo get app web

step "an unsupported transition is refused at admission, with the module's reason"
if out=$(k -n demo patch app web --type merge -p '{"spec":{"track":"canary"}}' 2>&1); then
  fail "changing spec.track was accepted: $out"
fi
echo "$out"
grep -q "spec.track" <<<"$out" || fail "the refusal does not name the field: $out"

step "hot swap: v2 of image-updater annotates its children, no restart"
"$WASMOP" push "$MODULES/image_updater_v2.wasm" --name image-updater -n demo
k -n demo wait deployment/web --for=jsonpath='{.metadata.annotations.example\.wasmop\.dev/module-revision}'=2 --timeout="$WAIT"
k get wasmreconciler image-updater -o jsonpath='{.status.activeModule}{"\n"}'

step "primary-replica: a Database becomes a StatefulSet, a headless Service and a role map"
# The local cluster has no volume provisioner: three static volumes for the members' claims.
for i in 0 1 2; do
  k apply -f - >/dev/null <<EOF
apiVersion: v1
kind: PersistentVolume
metadata: {name: demo-orders-$i}
spec:
  capacity: {storage: 1Gi}
  accessModes: [ReadWriteOnce]
  storageClassName: ""
  persistentVolumeReclaimPolicy: Delete
  hostPath: {path: $work/volumes/$i}
EOF
done
k apply -f examples/primary-replica/k8s/database.yaml
k -n demo wait statefulset/orders --for=create --timeout="$WAIT" >/dev/null
k -n demo rollout status statefulset/orders --timeout="$WAIT"
k -n demo wait database/orders --for=condition=Ready --timeout="$WAIT"
k -n demo get databases,statefulsets,services,configmaps,pods
k -n demo get configmap orders-roles -o jsonpath='{.data}{"\n"}'

step "primary-replica: an upgrade rolls the replicas first and the primary last"
# The order is read from what the API server records: the StatefulSet's watch history from the
# resourceVersion read just before the change (a watch delivers every committed change, in
# order), never from a wait for a partition that may have passed before the wait began.
rv=$(k -n demo get statefulset orders -o jsonpath='{.metadata.resourceVersion}')
# kubectl itself in the background (not the k function's subshell), so that kill ends the watch.
"$KUBECTL" get --raw "/apis/apps/v1/namespaces/demo/statefulsets?watch=true&fieldSelector=metadata.name%3Dorders&resourceVersion=$rv&timeoutSeconds=$((WAIT_S * 2))" \
  >"$work/orders.watch" &
watch_pid=$!
k -n demo patch database orders --type merge -p '{"spec":{"version":"15.3"}}'
k -n demo wait database/orders --for=jsonpath='{.status.currentVersion}'=15.3 --timeout="$WAIT"
k -n demo rollout status statefulset/orders --timeout="$WAIT"
# The partitions the StatefulSet went through on the 15.3 template, without repeats.
partitions() {
  python3 - "$work/orders.watch" <<'PY'
import json, sys
text, seen, at = open(sys.argv[1]).read(), [], 0
decoder = json.JSONDecoder()
while True:
    while at < len(text) and text[at].isspace():
        at += 1
    try:
        event, at = decoder.raw_decode(text, at)
    except ValueError:
        break
    sts = event.get("object", {})
    spec = sts.get("spec", {})
    image = (spec.get("template", {}).get("spec", {}).get("containers") or [{}])[0].get("image")
    p = spec.get("updateStrategy", {}).get("rollingUpdate", {}).get("partition")
    if image == "postgres:15.3" and p is not None and (not seen or seen[-1] != p):
        seen.append(p)
print(*seen)
PY
}
seen=
for _ in $(seq 1 "$WAIT_S"); do
  seen=$(partitions)
  [ "${seen##* }" = 0 ] && break
  sleep 1
done
kill "$watch_pid" 2>/dev/null || true
[ "$seen" = "1 0" ] || fail "the StatefulSet's partitions on 15.3 were [$seen], not [1 0] (replicas first, then the primary)"
echo "partitions on 15.3, from the StatefulSet's watch history: $seen"
echo "partition=1: the replicas (orders-1, orders-2) updated while the primary (orders-0) waited"
echo "partition=0: then the primary updated, last"
k -n demo get database orders

step "primary-replica: a downgrade is refused at admission"
if out=$(k -n demo patch database orders --type merge -p '{"spec":{"version":"15.2"}}' 2>&1); then
  fail "the downgrade was accepted: $out"
fi
echo "$out"
grep -q "spec.version" <<<"$out" || fail "the refusal does not name the field: $out"

step "configmap-propagator: a ConfigMap copied into every matching namespace"
for ns in team-a team-b team-c; do k create namespace "$ns" --dry-run=client -o yaml | k apply -f - >/dev/null; done
k label namespace team-a team-b team-config=shared --overwrite
k apply -f examples/configmap-propagator/k8s/propagation.yaml
k wait configmappropagation/shared-settings --for=condition=Ready --timeout="$WAIT"
k -n team-a wait configmap/shared-settings --for=create --timeout="$WAIT" >/dev/null
k -n team-b wait configmap/shared-settings --for=create --timeout="$WAIT" >/dev/null
k get configmaps -A -l wasmop.dev/reconciler
if k -n team-c get configmap shared-settings >/dev/null 2>&1; then fail "team-c does not match but got a copy"; fi
k label namespace team-a team-config-
k -n team-a wait configmap/shared-settings --for=delete --timeout="$WAIT"
echo "team-a stopped matching: its copy was pruned"
k get configmappropagations

step "demo scenario complete: every step was observed"
if [ "${DEMO_ONCE:-}" = 1 ]; then exit 0; fi
echo "Everything stays up. In another shell:"
echo "  export KUBECONFIG=$KUBECONFIG"
echo "  $KUBECTL -n demo edit app web          # and watch the Deployment follow"
echo "  tail -f $work/host.log"
echo "Press Ctrl-C to stop."
wait "$host_pid"
