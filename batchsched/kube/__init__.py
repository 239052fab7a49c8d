"""The generic Kubernetes client, shared by the scheduler shell and the node
agent: ``client`` (the one adapter over kubernetes.aio, raw JSON) and
``events`` (Kubernetes Events, paced and never stale)."""
