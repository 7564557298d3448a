"""Kubernetes objects from a ModelDeployment spec (pure): plain dicts, no I/O."""
