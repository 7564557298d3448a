"""Command-line entry points: the `kvgate` CLI, its subcommands and the guard sidecar."""
