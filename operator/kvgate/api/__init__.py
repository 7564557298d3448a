"""The ModelDeployment API and what its fields mean: the pydantic models, label and annotation
names, revisions, what a revision's engines must prove, ownership, timestamps."""
