"""Names that cross the API boundary: labels, annotations, the CRD's group."""

GROUP = "scheduling.batchsched.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
PODGROUP_KIND = "PodGroup"
PODGROUP_PLURAL = "podgroups"
QUEUE_KIND = "Queue"
QUEUE_PLURAL = "queues"
# The node label whose value names a node's GPU type (GPU feature discovery),
# by which a Queue's spec.gpuTypes quotas count GPUs.
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"

DEFAULT_SCHEDULER_NAME = "batchsched"

# A pod joins a gang with this label; its value is the PodGroup's name.
POD_GROUP_LABEL = f"{GROUP}/pod-group"
# Chosen GPU indices travel on the Binding and land in the pod's annotations.
GPU_IDS_ANNOTATION = f"{GROUP}/gpu-ids"
# A node condition the node agent sets: its side of the GPU checklist (docs/node-agent.md).
GPU_READY_CONDITION = "BatchschedGPUReady"
# The GPU ids a pod really holds, per the kubelet, written by the node agent (docs/node-agent.md).
GPU_IDS_ACTUAL_ANNOTATION = f"{GROUP}/gpu-ids-actual"
# A node's GPU interconnect, written by `batchsched topo parse --format annotation`.
GPU_TOPOLOGY_ANNOTATION = f"{GROUP}/gpu-topology"
# The kubelet's Topology Manager policy, declared on a node (single-numa-node is enforced).
TOPOLOGY_MANAGER_POLICY_LABEL = f"{GROUP}/topology-manager-policy"

# Labels of NVIDIA GPU feature discovery that say a node's GPUs are shared or split.
GPU_SHARING_STRATEGY_LABEL = "nvidia.com/gpu.sharing-strategy"  # none | time-slicing | mps
GPU_REPLICAS_LABEL = "nvidia.com/gpu.replicas"
MIG_STRATEGY_LABEL = "nvidia.com/mig.strategy"  # single: nvidia.com/gpu are MIG devices
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
# The NVLink domain (NVL72 rack, ...) of a node, by GPU feature discovery.
GPU_CLIQUE_LABEL = "nvidia.com/gpu.clique"

# "false" on a pod or PodGroup: never a preemption victim.
PREEMPTIBLE_ANNOTATION = f"{GROUP}/preemptible"
# When the pod last saved its work (RFC3339): evicting it loses only what it
# did since (docs/preemption.md, "Least work lost").
CHECKPOINT_TIME_ANNOTATION = f"{GROUP}/checkpoint-time"

GPU_RESOURCE = "nvidia.com/gpu"
