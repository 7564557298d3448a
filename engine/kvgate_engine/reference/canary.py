"""The reference engine's KV canary (``--kv-canary log``): SGLang 0.5.23's log lines, real checks.

SGLang paints each KV slot with a token/position chain and verifies it on every forward. The
reference model's keys already carry their position (``k = [p, p², 1, 1]``, model.py), so every
decode step can check, for real, that each slot it reads holds the position it should: a slot
that was never written for the request, or was overwritten, fails ``verify_position``.

The lines are SGLang's, byte for byte (tests/conformance/test_kv_canary_format.py runs SGLang's
own formatter from the 0.5.23 source and compares):
- a violation: ``srt/kv_canary/runner/violation_reporter.py:_format_violation`` (WARNING);
- stats: ``srt/kv_canary/runner/stats_logger.py`` every STATS_EVERY_N_STEPS (INFO).

``POST /kvgate/canary/corrupt`` (reference engine only) overwrites the position of the next
decode's first slot, so a test can make the canary fire on demand.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from enum import IntEnum, IntFlag

log = logging.getLogger("sglang.srt.kv_canary.runner.violation_reporter")
stats_log = logging.getLogger("sglang.srt.kv_canary.runner.stats_logger")
STATS_EVERY_N_STEPS = 64
U64 = (1 << 64) - 1


class FailReason(IntFlag):  # sglang/kernels/ops/kv_canary/consts.py
    VERIFY_CHAIN_HASH_MISMATCH = 1 << 0
    VERIFY_POSITION_MISMATCH = 1 << 1
    VERIFY_REAL_KV_HASH_MISMATCH = 1 << 2
    WRITE_TOKEN_MISMATCH = 1 << 3
    WRITE_POSITION_MISMATCH = 1 << 4
    VERIFY_TOKEN_MISMATCH = 1 << 5


class CanaryLaunchTag(IntEnum):  # sglang/kernels/ops/kv_canary/verify.py
    HEAD_K_FULL = 0
    HEAD_V_FULL = 1
    TAIL_K_FULL = 2
    TAIL_V_FULL = 3
    SWEEP_K_FULL = 4
    SWEEP_V_FULL = 5
    HEAD_K_SWA = 6
    HEAD_V_SWA = 7
    TAIL_K_SWA = 8
    TAIL_V_SWA = 9
    SWEEP_K_SWA = 10
    SWEEP_V_SWA = 11


_WRITE_BITS = FailReason.WRITE_TOKEN_MISMATCH | FailReason.WRITE_POSITION_MISMATCH
_TOKEN_BITS = FailReason.WRITE_TOKEN_MISMATCH | FailReason.VERIFY_TOKEN_MISMATCH
_SWEEPS = (
    CanaryLaunchTag.SWEEP_K_FULL,
    CanaryLaunchTag.SWEEP_V_FULL,
    CanaryLaunchTag.SWEEP_K_SWA,
    CanaryLaunchTag.SWEEP_V_SWA,
)


def _reason_label(bit: FailReason) -> str:
    return str(bit.name).lower().removesuffix("_mismatch")


def _kind_label(tag: CanaryLaunchTag) -> str:
    name = tag.name.lower()
    return name if tag in _SWEEPS else f"per_forward_{name}"


def format_violation(
    *, row: list[int], total: int, ring_overflow: bool, step_when_pumped: int
) -> str:
    """SGLang 0.5.23's ``_format_violation``, same arguments, same text."""
    (kind, slot_idx, position, stored, expected, chain_hash, aux, bits) = row
    try:
        tag_label = CanaryLaunchTag(int(kind)).name
        canary_kind = _kind_label(CanaryLaunchTag(int(kind)))
    except ValueError:
        tag_label = f"unknown({int(kind)})"
        canary_kind = tag_label
    bits_int = int(bits)
    reasons = [_reason_label(bit) for bit in FailReason if bits_int & int(bit)]
    is_write = bool(bits_int & int(_WRITE_BITS))
    structured = (
        f"kv_canary violation: "
        f"launch_tag={tag_label} "
        f"fail_reason={'+'.join(reasons) if reasons else 'none'} "
        f"slot_idx={int(slot_idx)} "
        f"position={int(position)} "
        f"stored_token={int(stored)} "
        f"expected_token={int(expected)} "
        f"stored_chain_hash={int(chain_hash) & U64:#018x} "
        f"expected_aux={int(aux) & U64:#018x}"
    )
    header = (
        f"KV cache canary violation detected (kernel_kind={tag_label}, "
        f"slot_idx={int(slot_idx)}, position={int(position)})"
    )
    kind_line = f"canary_kind:       {canary_kind}"
    reasons_line = f"  fail_reasons: {' '.join(reasons) if reasons else 'none'}"
    footer = (
        f"  total_violations={total} ring_overflow={ring_overflow} "
        f"step_when_pumped={step_when_pumped}"
    )
    if is_write:
        body = [
            f"  actual:   token_id={int(stored)}   position={int(position)} "
            f"prev_hash={int(chain_hash) & U64:#018x}",
            f"  expected: token_id={int(expected)}   position={int(aux)}",
        ]
    else:
        stored_body = (
            f"  stored:   token_id={int(stored)}   position={int(position)} "
            f"prev_hash={int(chain_hash) & U64:#018x}"
        )
        expected_body = (
            f"  expected: token_id={int(expected)} prev_hash={int(aux) & U64:#018x}"
            if bits_int & int(_TOKEN_BITS)
            else f"  expected: prev_hash={int(aux) & U64:#018x}"
        )
        body = [stored_body, expected_body]
    return "\n".join([structured, header, kind_line, reasons_line, *body, footer])


STATS_FORMAT = (
    "[canary] step=%d protected_tokens=%d sweep_passes=%d violations=%d launch_tags_active=%d/%d"
)


@dataclass
class KvCanary:
    """Per-engine canary state: steps, protected tokens, violations, the corruption switch."""

    step: int = 0
    protected_tokens: int = 0
    violations: int = 0
    corrupt_next: bool = False

    def check(self, slots: list[int], stored_positions: list[int], stored_tokens: list[int]) -> int:
        """Verify that slot i holds position i; log each violation as SGLang does. Returns the
        number found on this step."""
        self.step += 1
        self.protected_tokens = max(self.protected_tokens, len(slots))
        found = 0
        for expected, (slot, stored, token) in enumerate(
            zip(slots, stored_positions, stored_tokens, strict=True)
        ):
            if stored == expected:
                continue
            found += 1
            self.violations += 1
            row = [
                int(CanaryLaunchTag.HEAD_K_FULL),
                slot,
                stored,
                token,
                token,
                0,
                expected,
                int(FailReason.VERIFY_POSITION_MISMATCH),
            ]
            log.warning(
                "%s",
                format_violation(
                    row=row, total=self.violations, ring_overflow=False, step_when_pumped=self.step
                ),
            )
        if self.step % STATS_EVERY_N_STEPS == 0 or found:
            stats_log.info(
                STATS_FORMAT,
                self.step,
                self.protected_tokens,
                0,
                self.violations,
                2,
                len(CanaryLaunchTag),
            )
        return found
