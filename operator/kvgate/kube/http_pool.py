"""The operator's file-descriptor headroom: with 1,000 ModelDeployments it holds watch streams,
probe and audit connections for thousands of pods at once, over a typical soft limit of 1,024.

(Connections to engines are deliberately not kept alive between reads: across an engine restart
at the same pod address a kept-alive connection can outlive the engine process in a child that
inherited it, and the next read hangs; the fresh-clone run with kept-alive probes failed both
engine-restart scenarios.)
"""

from __future__ import annotations

import resource


def raise_open_files_limit() -> int:
    """Raise the soft open-files limit to the hard one. Returns the limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):
            return soft
    return hard
