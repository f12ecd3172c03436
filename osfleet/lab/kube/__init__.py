"""``osfleet lab k8s``: a real Kubernetes cluster on this machine (control plane, this machine as a node, kwok)."""
