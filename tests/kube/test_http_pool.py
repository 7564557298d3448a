"""The operator raises its soft open-files limit to the hard one (kvgate.kube.http_pool, issue
16)."""

from __future__ import annotations

import resource

from kvgate.kube import http_pool


def test_the_soft_open_files_limit_is_raised_to_the_hard_one() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        if hard > 64:
            resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
        assert http_pool.raise_open_files_limit() == hard
        assert resource.getrlimit(resource.RLIMIT_NOFILE) == (hard, hard)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
