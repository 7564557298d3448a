"""Model weights from a hub: `kvgate fetch-model`, the download init container's work (I/O)."""
