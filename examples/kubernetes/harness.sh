#!/bin/sh
# One task, the harness's side, with kubectl exec: the agent's turn as the sandbox user, a
# freeze, then the verifier as root only if the signed marker proves no agent process is left.
# Needs kubectl, a cluster and, here, quiesce (for keygen; QUIESCE_LOCAL names it); POD_FILE
# picks pod.yaml (default) or pod-shared-pid.yaml.
set -eu
cd "$(dirname "$0")"
POD_FILE=${POD_FILE:-pod.yaml}
POD=$(sed -n 's/^  name: //p' "$POD_FILE" | head -n 1)
Q=/usr/local/bin/quiesce    # in the pod
LOCAL_Q=${QUIESCE_LOCAL:-quiesce}
AGENT_USER=1000            # QUIESCE_SANDBOX_USER in the pod
AGENT_SECONDS=${AGENT_SECONDS:-600}
NONCE=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')

# Once per cluster: the signing key, root's and 0400 in the pod (defaultMode in the pod file).
if ! kubectl get secret quiesce-signing-key >/dev/null 2>&1; then
    keys=$(mktemp -d)
    "$LOCAL_Q" keygen --out "$keys"
    kubectl create secret generic quiesce-signing-key \
        --from-file=signing.key="$keys/signing.key" --from-file=signing.pub="$keys/signing.pub"
    rm -rf "$keys"
fi

kubectl apply -f "$POD_FILE"
kubectl wait --for=condition=Ready "pod/$POD" --timeout=300s

# The agent's turn. kubectl exec runs as root with the container's capabilities; quiesce exec
# drops to the sandbox user and tags the launch, so whatever the agent starts is tracked.
kubectl exec "pod/$POD" -- timeout "$AGENT_SECONDS" "$Q" exec --user "$AGENT_USER" -- \
    sh -c 'cd /work && ./agent' || echo "harness: the agent ended with $?"

# Freeze: every agent process stopped, killed, proven gone; exit 0 only when quiescent.
kubectl exec "pod/$POD" -- "$Q" freeze --wait --json --nonce "$NONCE" > freeze.json || {
    echo "harness: the freeze did not certify: see freeze.json; score nothing" >&2
    exit 1
}

# Verify against the key the harness holds (the Secret's public half), then score as root.
kubectl exec "pod/$POD" -- "$Q" verify --public-key /var/run/quiesce-key/signing.pub \
    --nonce "$NONCE" -- sh -c 'cd /work && ./run-tests'

kubectl delete pod "$POD" --wait=false
