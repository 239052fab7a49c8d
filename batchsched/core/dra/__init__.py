"""Dynamic Resource Allocation (resource.k8s.io/v1): DeviceClasses,
ResourceSlices and ResourceClaims as the core sees them (``model``), and
each node's DRA GPUs mapped onto its topology, with those in use
(``inventory``).  docs/dra.md says what is done and what is not yet."""
