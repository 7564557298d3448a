"""Generated artefacts: the CRD, the chart's CRD template and the RBAC, from one source each."""
