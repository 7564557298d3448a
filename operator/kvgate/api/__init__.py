"""The ModelDeployment API: the pydantic models, label and annotation names, revisions."""
