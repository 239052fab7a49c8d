"""Nodes in the watch cache: those the node selector picks, each one's GPU
topology checked (counting its DRA GPUs) and a problem reported once."""
from __future__ import annotations

import logging

from batchsched.api import constants
from batchsched.core.model import NodeInfo, annotated_topology
from batchsched.core.readers import node_from_json
from batchsched.shell.handlers.dra import DRA

log = logging.getLogger(__name__)


class NodeHandlers:
    """The cache's nodes (its ``state``, ``node_selector``, ``topology_reported``)."""

    def _selected(self, obj: dict) -> bool:
        labels = (obj.get("metadata") or {}).get("labels") or {}
        return all(labels.get(k) == v for k, v in self.node_selector.items())

    def _convert_node(self, obj: dict) -> NodeInfo | None:
        try:
            node = node_from_json(obj)
        except Exception as exc:  # noqa: BLE001 - whatever a node holds, it alone is skipped
            log.warning("ignoring node %s: %r", (obj.get("metadata") or {}).get("name"), exc)
            self.on_bad_object("Node", obj, f"node not used: {type(exc).__name__}: {exc}")
            return None
        return node

    def _check_topology(self, name: str, obj: dict) -> None:
        """Report the node's topology problem, counting its DRA GPUs; once
        per new problem, not on every status update of the node.  A count
        that does not match waits for the DRA collections to be listed."""
        given = self.state.given_node(name)
        if (len(self._dra_listed) < len(DRA) and given is not None and given.topology_error
                and annotated_topology(given) is not None):
            self._unchecked_topology[name] = obj
            return
        node = self.nodes.get(name)
        error = node.topology_error if node is not None else ""
        if error and self.topology_reported.get(name) != error:
            log.warning("%s; treating its GPUs as flat", error)
            self.on_bad_object("Node", obj, error)
        if error:
            self.topology_reported[name] = error
        elif self.topology_reported.pop(name, None) and node is not None:
            # an Event of its own, so the latest one about the node is not the old problem
            if node.topology is not None:
                reason, message = "GpuTopologyAccepted", "its GPU topology is used"
            else:
                reason, message = "GpuTopologyRemoved", "GPUs are treated as flat"
            message = f"annotation {constants.GPU_TOPOLOGY_ANNOTATION} of node {node.name}: {message}"
            log.info("%s", message)
            self.on_fixed_object("Node", obj, reason, message)

    def _node_entry(self, obj: dict) -> tuple[str, NodeInfo] | None:
        """A listed node of ours; one equal to the node held is the held object."""
        if not self._selected(obj):
            return None
        held = self.state.given_node((obj.get("metadata") or {}).get("name", ""))
        node = self._convert_node(obj)
        if node is None:
            return None
        meta = obj.get("metadata") or {}
        self._listed_node_refs[node.name] = {"metadata": {"name": node.name, "uid": meta.get("uid", "")}}
        return node.name, held if held == node else node

    def _replace_nodes(self, listed: dict[str, NodeInfo]) -> None:
        for name in [name for name in self.nodes if name not in listed]:
            self.state.remove_node(name)
            self.topology_reported.pop(name, None)
        refs, self._listed_node_refs = self._listed_node_refs, {}
        for node in listed.values():
            self._put_node(node)
            self._check_topology(node.name, refs.get(node.name, {"metadata": {"name": node.name}}))
        self._notify()

    def _apply_node(self, event_type: str, obj: dict) -> None:
        name = (obj.get("metadata") or {}).get("name", "")
        if event_type == "DELETED" or not self._selected(obj):
            self.state.remove_node(name)
            self.topology_reported.pop(name, None)
        else:
            node = self._convert_node(obj)
            if node is None:
                self.state.remove_node(name)  # what it held before is no longer known to be true
            else:
                self._put_node(node)
                self._check_topology(name, obj)
        self._notify()

    def _put_node(self, node: NodeInfo) -> None:
        if self.state.given_node(node.name) != node:
            self.capacity_freed = True
        self.state.put_node(node)
