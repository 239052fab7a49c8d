"""``batchsched node-agent``: runs on every GPU node, reports the node's real
GPU topology and checks which GPUs each container got (docs/node-agent.md)."""
