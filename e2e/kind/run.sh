#!/usr/bin/env bash
# batchsched on kind, then the e2e suite against that cluster (e2e/README.md).
#
#   e2e/kind/run.sh                  create, install, check the examples, run the suite, delete
#   KEEP_CLUSTER=1 e2e/kind/run.sh   ... and keep the cluster (KUBECONFIG=.e2e-work/kind/kubeconfig)
#   PYTEST_ARGS='-k gang' e2e/kind/run.sh
#
# Needs docker, kind >= 0.20, kubectl, Go (kwok is built from source like the
# local control plane) and the project's venv (`make install`).
set -euo pipefail
cd "$(dirname "$0")/../.."

CLUSTER=${KIND_CLUSTER_NAME:-batchsched-e2e}
WORK=$PWD/.e2e-work/kind
PY=${PYTHON:-.venv/bin/python}
mkdir -p "$WORK"
export KUBECONFIG=$WORK/kubeconfig
KWOK_PID=

step() { printf '\n== %s\n' "$*"; }
cleanup() {
  if [ -n "$KWOK_PID" ]; then kill "$KWOK_PID" 2>/dev/null || true; fi
  if [ -z "${KEEP_CLUSTER:-}" ]; then kind delete cluster --name "$CLUSTER"; fi
}
trap cleanup EXIT

step "cluster $CLUSTER: one control plane, five workers"
kind create cluster --name "$CLUSTER" --config e2e/kind/kind-config.yaml --kubeconfig "$KUBECONFIG" --wait 180s

step "simulated GPUs on the workers (nodes/status), topology annotations, pool label"
"$PY" e2e/kind/simulate_gpus.py --selector batchsched.io/gpu-node=true --gpus 8 \
  --topology e2e/kind/hgx-8gpu-topo.txt --pool kind-hgx

step "the image, as deploy/ names it, built and loaded into the nodes"
IMAGE=$(kubectl kustomize deploy | awk '$1 == "image:" {print $2; exit}')
docker build --tag "$IMAGE" .
kind load docker-image "$IMAGE" --name "$CLUSTER"

step "the CRD and batchsched (deploy/): two replicas, one leader"
kubectl apply -k deploy/
kubectl -n batchsched-system rollout status deployment/batchsched --timeout=180s
kubectl -n batchsched-system get lease batchsched -o jsonpath='leader: {.spec.holderIdentity}{"\n"}'

step "the examples, scheduled by the deployed batchsched (real Job and Deployment controllers)"
kubectl apply -k e2e/kind/examples
kubectl -n batchsched-examples wait podgroup.scheduling.batchsched.io/llama-finetune --for=condition=Scheduled --timeout=120s
kubectl -n batchsched-examples rollout status deployment/llm-inference --timeout=180s
kubectl -n batchsched-examples get podgroups.scheduling.batchsched.io,pods -o wide
kubectl delete -k e2e/kind/examples --wait=false

step "the e2e suite, against kind"
# The suite starts its own batchsched processes (restricted to the nodes each
# test makes), so the deployed one steps aside; its Lease is released on stop.
kubectl -n batchsched-system scale deployment/batchsched --replicas=0
kubectl -n batchsched-system rollout status deployment/batchsched --timeout=60s
# The tests' nodes are API objects that kwok (on this machine) keeps Ready and
# whose pods it "runs"; keep kind's DaemonSets off them.
for ds in kindnet kube-proxy; do
  kubectl -n kube-system patch daemonset "$ds" --type=strategic --patch \
    '{"spec":{"template":{"spec":{"affinity":{"nodeAffinity":{"requiredDuringSchedulingIgnoredDuringExecution":{"nodeSelectorTerms":[{"matchExpressions":[{"key":"batchsched.io/simulated","operator":"DoesNotExist"}]}]}}}}}}}'
done
python3 e2e/localcluster.py kwok --kubeconfig "$KUBECONFIG" >"$WORK/kwok.log" 2>&1 &
KWOK_PID=$!
# kind runs kube-scheduler, so the side-by-side test runs too.
BATCHSCHED_E2E_KUBE_SCHEDULER=1 "$PY" -m pytest -q -p no:cacheprovider -m e2e ${PYTEST_ARGS:-}
