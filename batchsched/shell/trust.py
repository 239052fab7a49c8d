"""Which GPU ids of a bound pod the scheduler believes, and whether it bound
the pod (docs/binding.md, docs/node-agent.md "Trust"): tenants write the
gpu-ids annotation and may create pods already bound, so the cache overlays
what it witnessed on every pod it holds.  A part of :class:`ClusterCache`."""
from __future__ import annotations

from batchsched.core.model import PodInfo, pod_with


class GpuIdTrust:
    """The cache's pods as the cycle must see them (its ``assumed``,
    ``witnessed``, ``pods_listed``, ``pods`` and ``nodes``)."""

    def _as_seen(self, pod: PodInfo) -> PodInfo:
        """The pod as the cycle must see it: with the GPU ids believed, and
        bound where we bound it until the API says so."""
        pod = self._trusted(pod)
        assumed = self.assumed.get(pod.uid)
        if assumed:
            if pod.node_name or pod.terminal:
                del self.assumed[pod.uid]  # confirmed (or finished): stop assuming
            else:
                pod = pod_with(pod, node_name=assumed[0], gpu_ids=assumed[1], bound_by_scheduler=True)
        return pod

    def _trusted(self, pod: PodInfo) -> PodInfo:
        """The pod with the GPU ids this scheduler believes, and whether it bound it.

        The gpu-ids annotation is tenant-writable, and a tenant can create a
        pod already bound (spec.nodeName).  So ids are believed only for a
        binding this scheduler made (an assumption the watch now confirms),
        saw happen (the pod was unbound, now it is bound: only pods/binding
        does that), or found at its first list after a start (nothing else
        to go by then; docs/binding.md).  Once believed, they stay what they
        were: editing or removing the annotation later changes nothing.
        Every other pod's GPUs count by number only.

        Bound by this scheduler (which may give its gang precedence) are only
        the pods whose binding this process made or saw, while they stay in
        the gang they were in then: a pod moved to another gang by its label
        proves nothing there.  Whether one found bound at a start was ours
        is the PodGroup's status to say (core/gangs.py ``bound_by_us``).

        On such a pod, the node agent's gpu-ids-actual (what the kubelet
        really gave it) wins over the plan when it names as many GPUs and an
        agent reports on the node (its BatchschedGPUReady condition: nodes
        are not tenant-writable, and the agent's component installs the
        policy that lets only agents write gpu-ids-actual): the agent
        corrects where, never how many (docs/node-agent.md, "Trust").
        """
        if not pod.node_name or pod.scheduler_name != self.scheduler_name:
            self.witnessed.pop(pod.uid, None)
            return pod_with(pod, gpu_ids=()) if pod.gpu_ids else pod
        witnessed = self.witnessed.get(pod.uid)
        if witnessed is None:
            assumed = self.assumed.get(pod.uid)
            before = self.pods.get(pod.uid)
            if assumed is not None and assumed[0] == pod.node_name:
                witnessed = (assumed[1], pod.gang_key)  # ours: the API copied the ids from our Binding
            elif before is not None and not before.node_name:
                witnessed = (pod.gpu_ids, pod.gang_key)
            elif not self.pods_listed:
                witnessed = (pod.gpu_ids, "")
            else:
                return pod_with(pod, gpu_ids=()) if pod.gpu_ids else pod
            self.witnessed[pod.uid] = witnessed
        ids, gang = witnessed
        if pod.gpu_ids_actual and len(pod.gpu_ids_actual) == len(ids) and self._agent_on(pod.node_name):
            ids = pod.gpu_ids_actual
        ours = gang == pod.gang_key
        if pod.gpu_ids == ids and pod.bound_by_scheduler == ours:
            return pod
        return pod_with(pod, gpu_ids=ids, bound_by_scheduler=ours)

    def _agent_on(self, node_name: str) -> bool:
        node = self.nodes.get(node_name)
        return node is not None and bool(node.gpu_agent)
