"""The loopback kubelet: runs a node's pods as local processes for the e2e world."""
