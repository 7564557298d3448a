"""`kvgate fetch-model`: download a model snapshot from a Hugging Face Hub into a directory.

The init container of spec.model.source.download runs it (kvgate.objects.model_source) before the
engine starts; the work is kvgate.modelfetch. It prints what it does, one line per file, and at
the end the size, the time and the rate (the figure to size rollout.verifyTimeoutSeconds with);
never the token.

Exit codes: 0 the snapshot is in place (downloaded, or found complete); 1 it is not, with one
line saying why and what to fix (the kubelet retries the init container with its back-off);
2 a usage error.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Callable
from pathlib import Path

DEFAULT_ENDPOINT = "https://huggingface.co"
ENDPOINT_ENV = "HF_ENDPOINT"
TOKEN_ENV = "HF_TOKEN"
EXIT_FAILED = 1


def _bounded(low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = int(text)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be between {low} and {high} (got {value})")
        return value

    return parse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The subcommand's flags (cli.py builds the parser)."""
    parser.add_argument("--repo", required=True, help="repository id, e.g. org/model")
    parser.add_argument("--revision", default="main", help="branch, tag or commit (main)")
    parser.add_argument(
        "--endpoint",
        default=None,
        help=f"the hub's base URL (default: ${ENDPOINT_ENV}, else {DEFAULT_ENDPOINT})",
    )
    parser.add_argument("--dest", required=True, help="the directory the snapshot goes into")
    parser.add_argument(
        "--exclude",
        action="append",
        default=[],
        metavar="PATTERN",
        help="skip files matching this fnmatch pattern (repeatable), e.g. 'original/*'",
    )
    parser.add_argument(
        "--token-env",
        default=TOKEN_ENV,
        help=f"the environment variable holding the hub token ({TOKEN_ENV}); empty: none",
    )
    parser.add_argument("--token-secret-name", default=None, help="named in errors only")
    parser.add_argument("--token-secret-key", default=None, help="named in errors only")
    parser.add_argument(
        "--concurrency",
        type=_bounded(1, 32),
        default=4,
        help="files downloaded at once (4)",
    )
    parser.add_argument(
        "--attempts",
        type=_bounded(1, 100),
        default=6,
        help="tries per request before giving up (6; back-off 1, 2, 4, ... 30 s)",
    )


def _say(message: str) -> None:
    print(f"kvgate fetch-model: {message}", file=sys.stderr, flush=True)


def main(args: argparse.Namespace) -> int:
    # Imported here: the rest of the CLI never pays for the HTTP client.
    from kvgate.modelfetch.download import FetchOptions, fetch_model
    from kvgate.modelfetch.hub import HubError, TokenSource

    endpoint = args.endpoint or os.environ.get(ENDPOINT_ENV) or DEFAULT_ENDPOINT
    token = os.environ.get(args.token_env) if args.token_env else None
    options = FetchOptions(
        endpoint=endpoint.rstrip("/"),
        repo=args.repo,
        revision=args.revision,
        dest=Path(args.dest),
        token=token or None,
        token_source=TokenSource(
            secret_name=args.token_secret_name,
            secret_key=args.token_secret_key,
            sent=bool(token),
        ),
        exclude=tuple(args.exclude),
        concurrency=args.concurrency,
        attempts=args.attempts,
    )
    _say(
        f"{options.repo} at revision {options.revision} from {options.endpoint} into "
        f"{options.dest} ({'with' if options.token else 'without'} a token)"
    )
    try:
        result = asyncio.run(fetch_model(options, _say))
    except HubError as error:
        _say(str(error))
        return EXIT_FAILED
    except OSError as error:
        _say(
            f"cannot write the download into {options.dest}: "
            f"{error.strerror or type(error).__name__}"
            f"{f' ({error.filename})' if error.filename else ''}; a full volume needs a larger "
            "emptyDir sizeLimit or claim"
        )
        return EXIT_FAILED
    except KeyboardInterrupt:
        _say("interrupted")
        return 130
    _say(result.describe())
    return 0
