"""The GPU memory an engine never sees as free, per role: which figure the estimate takes, and
where it came from.

SGLang subtracts no fixed reserve: it sizes the KV pool from the free memory it measures after
the CUDA context and NCCL are up (the minimum across ranks). kvgate's estimate has no GPU to
measure, so it takes a reserve off each GPU first. In order:

1. ``spec.<role>.gpuReservedGiB``, when the spec sets it;
2. the cluster's measured reserve for the role's GPU product (the chart value
   ``estimator.gpuReservedGiBByProduct``, keyed by the ``nvidia.com/gpu.product`` value the
   role pins: its ``nodeSelector``, else its required node affinity when every
   ``nodeSelectorTerms`` entry has ``nvidia.com/gpu.product In [one value]``, the same one), set
   from the drift kvgate reports between its estimate and the
   live pools (docs/planning.md);
3. kvgate's own assumption, 1 GiB (``DEFAULT_GPU_RESERVED_GIB``): not SGLang's, not measured.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvgate.api.models import DEFAULT_GPU_RESERVED_GIB, RoleSpec

GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"  # GPU Feature Discovery's node label
RESERVES_SETTING = "estimator.gpuReservedGiBByProduct"  # the chart value
RESERVES_ENV = "KVGATE_GPU_RESERVED_GIB_BY_PRODUCT"  # JSON {product: GiB}, from the chart value
MAX_RESERVE_GIB = 64.0  # a reserve above this is a typo (GiB for MiB), not a measurement
DEFAULT_SOURCE = "kvgate's assumption, not a measurement: SGLang subtracts no fixed reserve"


@dataclass(frozen=True)
class GpuReserve:
    """The reserve one role's estimate took per GPU, and where it came from."""

    gib: float
    source: str  # the spec field, the chart value and product, or kvgate's assumption

    def describe(self) -> str:
        return f"gpuReservedGiB {self.gib:g} from {self.source}"


def _product_of_term(term: Any) -> str | None:
    """The one product a nodeSelectorTerm requires (``In`` with a single value), else None."""
    expressions = term.get("matchExpressions") if isinstance(term, dict) else None
    for expression in expressions if isinstance(expressions, list) else []:
        if (
            isinstance(expression, dict)
            and expression.get("key") == GPU_PRODUCT_LABEL
            and expression.get("operator") == "In"
            and isinstance(expression.get("values"), list)
            and len(expression["values"]) == 1
            and isinstance(expression["values"][0], str)
            and expression["values"][0]
        ):
            return str(expression["values"][0])
    return None


def affinity_product(affinity: Mapping[str, Any] | None) -> str | None:
    """The GPU product a pod's required node affinity pins: every nodeSelectorTerm (they are
    ORed) requires ``nvidia.com/gpu.product In [x]`` with the same single x. A preferred term, two
    values, NotIn, or a term without the product leaves the product open (None)."""
    node_affinity = (affinity or {}).get("nodeAffinity")
    required = (
        node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
        if isinstance(node_affinity, dict)
        else None
    )
    terms = required.get("nodeSelectorTerms") if isinstance(required, dict) else None
    if not isinstance(terms, list) or not terms:
        return None
    products = {_product_of_term(term) for term in terms}
    if len(products) != 1 or None in products:
        return None
    return products.pop()


def gpu_product(role_spec: RoleSpec) -> str | None:
    """The GPU product the role pins: its nodeSelector's, else its required node affinity's
    (None: the role's pods may land on any product)."""
    return role_spec.node_selector.get(GPU_PRODUCT_LABEL) or affinity_product(role_spec.affinity)


def measured_source(product: str) -> str:
    """Where a reserve from the chart value came from (status.<role>.poolEstimate.reserveSource
    says it; ``product_of_source`` reads it back)."""
    return (
        f"the cluster's measured reserve for {GPU_PRODUCT_LABEL}={product} "
        f"(chart value {RESERVES_SETTING})"
    )


_MEASURED_SOURCE = re.compile(
    rf"the cluster's measured reserve for {re.escape(GPU_PRODUCT_LABEL)}=(?P<product>\S+) "
    rf"\(chart value {re.escape(RESERVES_SETTING)}\)"
)


def product_of_source(source: str) -> str | None:
    """The GPU product a ``measured_source`` names (None: another source)."""
    match = _MEASURED_SOURCE.fullmatch(source)
    return match.group("product") if match else None


def reserves_in_status(status: Mapping[str, Any] | None) -> dict[str, float]:
    """The chart value's reserves the operator applied, as it wrote them in the status (written
    only through the status subresource, by kvgate): status.<role>.poolEstimate's gpuReservedGiB
    for each role whose reserveSource is the measured reserve of a product."""
    table: dict[str, float] = {}
    for role in ("prefill", "decode"):
        role_status = (status or {}).get(role)
        estimate = role_status.get("poolEstimate") if isinstance(role_status, dict) else None
        if not isinstance(estimate, dict):
            continue
        product = product_of_source(str(estimate.get("reserveSource") or ""))
        gib = estimate.get("gpuReservedGiB")
        if (
            product is not None
            and isinstance(gib, int | float)
            and not isinstance(gib, bool)
            and math.isfinite(gib)
            and 0 <= gib <= MAX_RESERVE_GIB
        ):
            table[product] = float(gib)
    return table


def resolve_reserve(
    role: str, role_spec: RoleSpec, reserves_by_product: Mapping[str, float]
) -> GpuReserve:
    """The reserve the estimate takes for ``role`` (spec, then measured per product, then 1 GiB)."""
    if role_spec.gpu_reserved_gi_b is not None:
        return GpuReserve(role_spec.gpu_reserved_gi_b, f"spec.{role}.gpuReservedGiB")
    product = gpu_product(role_spec)
    if product is not None and product in reserves_by_product:
        return GpuReserve(reserves_by_product[product], measured_source(product))
    return GpuReserve(DEFAULT_GPU_RESERVED_GIB, DEFAULT_SOURCE)


def with_reserve(role_spec: RoleSpec, reserve: GpuReserve) -> RoleSpec:
    """The role as the estimator sees it: its gpuReservedGiB is the resolved reserve."""
    return role_spec.model_copy(update={"gpu_reserved_gi_b": reserve.gib})


def parse_reserves(raw: str | None) -> dict[str, float]:
    """KVGATE_GPU_RESERVED_GIB_BY_PRODUCT (a JSON object of GPU product → GiB) as a mapping;
    ValueError naming the chart value, the entry and an example."""
    if raw is None or raw.strip() == "":
        return {}
    example = '{"NVIDIA-H100-80GB-HBM3": 2.5}'
    try:
        table = json.loads(raw)
    except ValueError:
        table = None
    if not isinstance(table, dict):
        raise ValueError(
            f"{RESERVES_ENV}={raw!r} (the chart value {RESERVES_SETTING}): must be a JSON "
            f"object of {GPU_PRODUCT_LABEL} value to GiB, e.g. {example}"
        )
    parsed: dict[str, float] = {}
    for product, gib in table.items():
        value = gib if isinstance(gib, int | float) and not isinstance(gib, bool) else math.nan
        if not product or not (math.isfinite(value) and 0 <= value <= MAX_RESERVE_GIB):
            raise ValueError(
                f"{RESERVES_ENV} (the chart value {RESERVES_SETTING}): {product!r}: {gib!r} "
                f"must be a GPU product with GiB between 0 and {MAX_RESERVE_GIB:g}, e.g. {example}"
            )
        parsed[str(product)] = float(value)
    return parsed


RESERVE_FLAG = "--gpu-reserve"


def parse_reserve_flags(values: list[str] | None) -> dict[str, float]:
    """``--gpu-reserve PRODUCT=GIB`` (repeated) as the chart value's mapping; ValueError naming
    the flag, the value and an example."""
    table: dict[str, float] = {}
    for value in values or []:
        product, _, gib = value.partition("=")
        try:
            number = float(gib)
        except ValueError:
            number = math.nan
        if not product or not (math.isfinite(number) and 0 <= number <= MAX_RESERVE_GIB):
            raise ValueError(
                f"{RESERVE_FLAG} {value!r}: must be PRODUCT=GIB, the {GPU_PRODUCT_LABEL} value "
                f"and its measured reserve (0-{MAX_RESERVE_GIB:g} GiB), e.g. "
                f"{RESERVE_FLAG} NVIDIA-H100-80GB-HBM3=2.5"
            )
        table[product] = number
    return table
