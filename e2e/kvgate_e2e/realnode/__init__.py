"""A real node in the e2e world: Kubernetes' own kubelet on containerd, runc and CNI plugins."""
