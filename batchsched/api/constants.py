"""Names that cross the API boundary: labels, annotations, the CRD's group."""

GROUP = "scheduling.batchsched.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
PODGROUP_KIND = "PodGroup"
PODGROUP_PLURAL = "podgroups"

DEFAULT_SCHEDULER_NAME = "batchsched"

# A pod joins a gang with this label; its value is the PodGroup's name.
POD_GROUP_LABEL = f"{GROUP}/pod-group"
# Chosen GPU indices travel on the Binding and land in the pod's annotations.
GPU_IDS_ANNOTATION = f"{GROUP}/gpu-ids"
# A node's GPU interconnect, written by `batchsched topo parse --format annotation`.
GPU_TOPOLOGY_ANNOTATION = f"{GROUP}/gpu-topology"

# "false" on a pod or PodGroup: never a preemption victim.
PREEMPTIBLE_ANNOTATION = f"{GROUP}/preemptible"

GPU_RESOURCE = "nvidia.com/gpu"
