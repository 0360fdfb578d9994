#!/usr/bin/env bash
# End-to-end test on a real (kind) cluster: the way to test the chart, the operator and the
# model server together before a release. Needs Docker, kind, kubectl, helm and python3 with
# `onnx` (the project's .venv has it); needs no GPU: the kind node advertises fake amd.com/gpu
# capacity and the model server runs ONNX Runtime on the CPU.
#
#   bash e2e/run.sh                 # create cluster, test, delete cluster
#   KEEP_CLUSTER=1 bash e2e/run.sh  # leave the cluster up to look around
#
# Steps: build the operator, CPU model-server and model images; create a kind cluster; patch
# the node's status with 8 amd.com/gpu; load the images; helm install the chart (2 operator
# replicas with peering); apply an InferenceService asking for 1 GPU; wait for Ready; send an
# inference request; scale it to 2 through the scale subresource; kill the active operator
# replica and check the standby takes over; delete it and check its objects are collected;
# helm uninstall.
set -euo pipefail

cd "$(dirname "$0")/.."

CLUSTER="${CLUSTER:-rocm-inference-e2e}"
RELEASE="${RELEASE:-rio}"
OPERATOR_NAMESPACE="${OPERATOR_NAMESPACE:-inference-system}"
NAMESPACE="${NAMESPACE:-e2e}"
FAKE_GPUS="${FAKE_GPUS:-8}"
TAG="${TAG:-e2e}"
OPERATOR_IMAGE="rocm-inference/operator:${TAG}"
SERVER_IMAGE="rocm-inference/model-server:${TAG}"
MODEL_IMAGE="rocm-inference/e2e-model:${TAG}"
PYTHON="${PYTHON:-}"
if [[ -z "${PYTHON}" ]]; then
    if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
WORK="$(mktemp -d)"
FULLNAME="${RELEASE}-rocm-inference-operator"

log() { printf '\n==> %s\n' "$*" >&2; }
fail() { printf 'FAILED: %s\n' "$*" >&2; exit 1; }

cleanup() {
    local rc=$?
    if [[ ${rc} -ne 0 ]]; then
        log "diagnostics"
        kubectl get all,inferenceservices -A 2>/dev/null || true
        kubectl -n "${OPERATOR_NAMESPACE}" logs -l "app.kubernetes.io/instance=${RELEASE}" --tail=100 --prefix 2>/dev/null || true
    fi
    rm -rf "${WORK}"
    if [[ "${KEEP_CLUSTER:-0}" != "1" ]]; then
        kind delete cluster --name "${CLUSTER}" >/dev/null 2>&1 || true
    fi
    exit "${rc}"
}

# Poll a command until it succeeds, for at most $1 seconds.
retry() {
    local seconds=$1 what=$2
    shift 2
    local deadline=$((SECONDS + seconds))
    until "$@" >/dev/null 2>&1; do
        if ((SECONDS >= deadline)); then fail "timed out after ${seconds}s: ${what}"; fi
        sleep 2
    done
}

jsonpath() { kubectl get "$@" -o jsonpath="${JSONPATH}"; }

equals() {  # equals EXPECTED kubectl-get-args... (with JSONPATH set)
    local expected=$1
    shift
    [[ "$(jsonpath "$@")" == "${expected}" ]]
}

for tool in docker kind kubectl helm; do
    command -v "${tool}" >/dev/null || fail "${tool} is not installed"
done
"${PYTHON}" -c 'import onnx' 2>/dev/null || fail "${PYTHON} cannot import onnx (bash scripts/setup.sh, or PYTHON=...)"

log "building images"
docker build -q -f operator/Dockerfile -t "${OPERATOR_IMAGE}" .
# The shipped model-server Dockerfile, its CPU variant (kind nodes have no GPU): the same
# build arguments the real-pods tier (`pytest -m pods`) uses with podman.
docker build -q -f server/Dockerfile -t "${SERVER_IMAGE}" \
    --build-arg BASE_IMAGE=python:3.11-slim-bookworm --build-arg SYSTEM_PACKAGES= \
    --build-arg ORT_PACKAGE=onnxruntime --build-arg ORT_VERSION= \
    --build-arg ORT_PROVIDER=CPUExecutionProvider .
"${PYTHON}" e2e/make_model.py "${WORK}/model" >/dev/null
printf 'FROM busybox:1.36\nCOPY . /models/\n' >"${WORK}/model/Dockerfile"
docker build -q -t "${MODEL_IMAGE}" "${WORK}/model"

log "creating kind cluster ${CLUSTER}"
trap cleanup EXIT
kind create cluster --name "${CLUSTER}" --wait 180s
kubectl config use-context "kind-${CLUSTER}" >/dev/null
for image in "${OPERATOR_IMAGE}" "${SERVER_IMAGE}" "${MODEL_IMAGE}"; do
    kind load docker-image --name "${CLUSTER}" "${image}"
done

log "advertising ${FAKE_GPUS} fake amd.com/gpu on the node"
NODE="$(kubectl get nodes -o jsonpath='{.items[0].metadata.name}')"
kubectl patch node "${NODE}" --subresource=status --type=json \
    -p "[{\"op\": \"add\", \"path\": \"/status/capacity/amd.com~1gpu\", \"value\": \"${FAKE_GPUS}\"}]"
kubectl label node "${NODE}" --overwrite amd.com/gpu.product-name=AMD_Instinct_MI300X_OAM
JSONPATH='{.status.allocatable.amd\.com/gpu}' retry 60 "allocatable amd.com/gpu" \
    equals "${FAKE_GPUS}" node "${NODE}"

log "helm install ${RELEASE}"
helm install "${RELEASE}" charts/rocm-inference-operator \
    --namespace "${OPERATOR_NAMESPACE}" --create-namespace \
    --set image.repository="${OPERATOR_IMAGE%:*}" --set image.tag="${TAG}" --set image.pullPolicy=Never \
    --set ha.peeringLifetimeSeconds=10 \
    --wait --timeout 5m
kubectl get crd inferenceservices.inference.rocm.dev clusterkopfpeerings.kopf.dev >/dev/null
kubectl -n "${OPERATOR_NAMESPACE}" rollout status "deployment/${FULLNAME}" --timeout=180s
retry 60 "both replicas in the peering" \
    bash -c "kubectl get clusterkopfpeering ${FULLNAME} -o json | ${PYTHON} -c 'import json,sys; assert len(json.load(sys.stdin).get(\"status\") or {}) >= 2'"

log "applying an InferenceService (1 fake GPU, ONNX on CPU)"
kubectl create namespace "${NAMESPACE}"
kubectl apply -f - <<YAML
apiVersion: inference.rocm.dev/v1alpha1
kind: InferenceService
metadata:
  name: e2e
  namespace: ${NAMESPACE}
spec:
  replicas: 1
  model:
    uri: oci://${MODEL_IMAGE}
    format: onnx
  runtime:
    image: ${SERVER_IMAGE}
    imagePullPolicy: Never
    executionProviders: [CPUExecutionProvider]
    batching: {maxBatchSize: 8, maxDelayMs: 2}
  resources:
    gpu: {count: 1, productName: AMD_Instinct_MI300X_OAM}
    cpu: 500m
    memory: 1Gi
    shmSize: 64Mi
YAML
kubectl -n "${NAMESPACE}" wait inferenceservice/e2e --for=condition=Ready --timeout=10m
JSONPATH='{.spec.template.spec.containers[0].resources.limits.amd\.com/gpu}' \
    equals 1 -n "${NAMESPACE}" deployment/e2e || fail "the Deployment does not request 1 amd.com/gpu"
JSONPATH='{.status.url}' equals "http://e2e.${NAMESPACE}.svc.cluster.local" -n "${NAMESPACE}" inferenceservice/e2e \
    || fail "status.url is wrong"

log "inference request through the Service"
kubectl -n "${NAMESPACE}" port-forward service/e2e 18080:80 >"${WORK}/port-forward.log" 2>&1 &
FORWARD=$!
retry 30 "port-forward" curl -sf http://127.0.0.1:18080/health/ready
curl -sf -X POST http://127.0.0.1:18080/v2/models/e2e/infer -H 'Content-Type: application/json' \
    -d '{"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 4], "data": [1, 2, 3, 4, 5, 6, 7, 8]}]}' \
    | "${PYTHON}" -c 'import json,sys; out = json.load(sys.stdin)["outputs"][0]; assert out["shape"] == [2, 3], out'
kill "${FORWARD}"

log "scaling to 2 replicas through the scale subresource"
kubectl -n "${NAMESPACE}" scale inferenceservice/e2e --replicas=2
JSONPATH='{.status.readyReplicas}' retry 300 "2 ready replicas" equals 2 -n "${NAMESPACE}" inferenceservice/e2e
JSONPATH='{.spec.replicas}' equals 2 -n "${NAMESPACE}" deployment/e2e || fail "Deployment not scaled"
kubectl -n "${NAMESPACE}" get poddisruptionbudget e2e >/dev/null || fail "no PodDisruptionBudget at 2 replicas"

log "killing the active operator replica: the standby takes over"
ACTIVE="$(kubectl get clusterkopfpeering "${FULLNAME}" -o json | "${PYTHON}" -c \
    'import json,sys; s = json.load(sys.stdin)["status"]; print(max(s, key=lambda k: s[k]["priority"]))')"
kubectl -n "${OPERATOR_NAMESPACE}" delete pod "${ACTIVE}" --grace-period=0 --force
kubectl -n "${NAMESPACE}" patch inferenceservice e2e --type=merge -p '{"spec": {"replicas": 1}}'
JSONPATH='{.spec.replicas}' retry 120 "the standby scaling the Deployment back to 1" \
    equals 1 -n "${NAMESPACE}" deployment/e2e
JSONPATH='{.status.readyReplicas}' retry 300 "1 ready replica" equals 1 -n "${NAMESPACE}" inferenceservice/e2e

log "deleting the InferenceService: its objects are garbage-collected"
kubectl -n "${NAMESPACE}" delete inferenceservice e2e --wait=true --timeout=120s
retry 120 "owned objects gone" bash -c \
    "[[ -z \"\$(kubectl -n ${NAMESPACE} get deployment,service,poddisruptionbudget,pods -l inference.rocm.dev/inference-service=e2e -o name)\" ]]"

log "helm uninstall"
helm uninstall "${RELEASE}" --namespace "${OPERATOR_NAMESPACE}" --wait --timeout 2m
if kubectl -n "${OPERATOR_NAMESPACE}" get deployment "${FULLNAME}" >/dev/null 2>&1; then
    fail "the operator Deployment is still there after helm uninstall"
fi

log "e2e passed"
