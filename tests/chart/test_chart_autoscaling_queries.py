"""The PromQL of docs/autoscaling.md's KEDA examples, evaluated by promtool on the chart's own
recording rules and synthetic series: each query returns the one value the doc says it scales
on, and only verified engines count. (The ModelDeployment of the series is `llama`; the doc's is
`llama-8b`.)"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from helm_runner import ROOT
from test_chart_promtool import (  # noqa: F401  (fixtures)
    engine,
    groups,
    promtool,
    recording_input,
    run,
    series,
    write_tests,
)

DOC = (ROOT / "docs" / "autoscaling.md").read_text()
# SGLang 0.5.23's buckets of sglang:time_to_first_token_seconds.
TTFT_BUCKETS = ["0.1", "0.2", "0.4", "0.6", "0.8", "1", "2", "4", "6", "8", "10", "20", "40"]
TTFT_BUCKETS += ["60", "80", "100", "200", "400", "+Inf"]


def doc_queries() -> dict[str, str]:
    """Every KEDA trigger's query in the doc, by trigger name, and the decode one in the text."""
    queries = {}
    for block in re.findall(r"```yaml\n(.*?)```", DOC, flags=re.S):
        parsed = yaml.safe_load(block)
        if isinstance(parsed, dict) and parsed.get("kind") == "ScaledObject":
            for trigger in parsed["spec"]["triggers"]:
                queries[trigger["name"]] = trigger["metadata"]["query"]
    (decode,) = re.findall(r"`(sum\(namespace_deployment_role:kvgate_kv_usage:ratio\{[^`]*)`", DOC)
    queries["kv-usage-decode"] = decode
    return {name: q.replace('"llama-8b"', '"llama"') for name, q in queries.items()}


def ttft(pod: str, seconds_bucket: str, per_minute: int) -> list[dict[str, str]]:
    """A decode engine whose every first token took a time in the bucket ending at
    ``seconds_bucket``: that bucket and every wider one count ``per_minute`` a minute."""
    labels = {**engine(pod), "engine_type": "decode", "is_streaming": "true"}
    first = TTFT_BUCKETS.index(seconds_bucket)
    return [
        series(
            "sglang:time_to_first_token_seconds_bucket",
            {**labels, "le": le},
            f"0+{per_minute}x10" if index >= first else "0x10",
        )
        for index, le in enumerate(TTFT_BUCKETS)
    ]


def expect(query: str, value: float) -> dict[str, Any]:
    return {"expr": query, "eval_time": "5m", "exp_samples": [{"labels": "{}", "value": value}]}


def test_the_doc_queries_scale_on_verified_engines_only(
    promtool: Path,  # noqa: F811  (the fixture imported above)
    groups: list[dict[str, Any]],  # noqa: F811
    tmp_path: Path,
) -> None:
    queries = doc_queries()
    assert set(queries) == {"queued-per-prefill", "ttft-p90", "kv-usage-decode"}
    inputs = recording_input()
    # Two verified decode engines answer their first token in 0.8-1 s; an engine kvgate never
    # verified (no kvgate_engine_verified series) in 20-40 s, which must not move the p90.
    inputs += ttft("llama-r1-decode-0", "1", 60) + ttft("llama-r1-decode-1", "1", 30)
    inputs += ttft("llama-r9-decode-0", "40", 600)
    tests = {
        "interval": "1m",
        "input_series": inputs,
        "promql_expr_test": [
            # Queued on the verified prefill (5); the unverified prefill's 7 are not counted.
            expect(queries["queued-per-prefill"], 5),
            # p90 inside the 0.8-1 s bucket: 0.8 + 0.2 × 0.9.
            expect(queries["ttft-p90"], 0.98),
            # 150,000 tokens in use of 220,000 verified on decode.
            expect(queries["kv-usage-decode"], 150_000 / 220_000),
        ],
    }
    write_tests(tmp_path, groups, [tests])
    result = run(promtool, "test", "rules", "tests.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
