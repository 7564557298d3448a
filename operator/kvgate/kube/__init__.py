"""The operator's I/O: the Kubernetes client, informers, leader election, TLS, metrics, settings."""
