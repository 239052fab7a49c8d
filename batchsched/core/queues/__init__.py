"""Queues: tenants' quotas, fair share and admission (docs/queues.md)."""
