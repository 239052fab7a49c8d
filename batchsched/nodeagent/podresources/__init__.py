"""The kubelet PodResources API (gRPC v1): modules generated from the
kubelet's api.proto by tools/gen_podresources.py."""
