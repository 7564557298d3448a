"""What the shipped image costs: `make image` cold (no archive cache; Debian packages and wheels
already downloaded) and warm (inputs unchanged), and a container's start on this machine's
containerd and runc, median over N runs.

    .venv/bin/python tests/benchmarks/bench_image.py [--builds 2] [--runs 5]    (root)

A start is `ctr run --rm` of the image to the end of its command, with the restrictions the
tests use (the image's user 65532, read-only root, no capabilities, seccomp): `true` is the
runtime's own cost (snapshot, runc, cgroups, teardown); `kvgate --version` adds Python's start
and kvgate's imports, what every kvgate container pays before its first line.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS))

from image.conftest import (  # noqa: E402
    image_cache,
    load_build,
    makefile_uv,
    running_containerd,
)
from image.test_image import RESTRICTED  # noqa: E402


def timed(step: object) -> float:
    start = time.monotonic()
    step()  # type: ignore[operator]
    return time.monotonic() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--builds", type=int, default=2, help="builds without the archive cache")
    parser.add_argument("--runs", type=int, default=5, help="container starts per command")
    args = parser.parse_args()
    build = load_build()
    cache = image_cache()
    uv = makefile_uv()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        digests: set[str] = set()
        cold = []
        for _ in range(args.builds):
            start = time.monotonic()
            digests.add(build.build(out, cache, uv, build.DEFAULT_IMAGE, use_cache=False).digest)
            cold.append(time.monotonic() - start)
        start = time.monotonic()
        built = build.build(out, cache, uv, build.DEFAULT_IMAGE)
        warm = time.monotonic() - start
        digests.add(built.digest)
        size = built.archive.stat().st_size
        with running_containerd() as ctrd:
            imported = timed(lambda: ctrd.ctr("images", "import", str(built.archive)))
            starts: dict[str, list[float]] = {}
            for label, argv in (("true", ["true"]), ("kvgate --version", ["kvgate", "--version"])):
                for n in range(args.runs):
                    name = f"bench-{os.getpid()}-{n}"
                    starts.setdefault(label, []).append(
                        timed(
                            lambda a=argv, c=name: ctrd.ctr(
                                "run", "--rm", *RESTRICTED, built.ref, c, *a
                            )
                        )
                    )
    print(f"image {built.ref} {', '.join(sorted(digests))} ({size / 2**20:.1f} MiB)")
    print(
        f"make image without the archive cache: median {statistics.median(cold):.1f} s",
        [round(x, 1) for x in cold],
    )
    print(f"make image, inputs unchanged: {warm:.2f} s")
    print(f"ctr images import: {imported:.1f} s")
    for label, seconds in starts.items():
        print(
            f"container run, {label}: median {statistics.median(seconds):.2f} s",
            [round(x, 2) for x in seconds],
        )
    return 0 if len(digests) == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
