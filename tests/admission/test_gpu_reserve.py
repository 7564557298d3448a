"""The reserve per GPU the estimate takes (kvgate.admission.gpu_reserve): the spec's own, else
the cluster's measured reserve for the GPU product the role's nodeSelector or required node
affinity pins (chart value estimator.gpuReservedGiBByProduct), else kvgate's 1 GiB assumption;
and admission, `kvgate validate` and `kvgate plan -f` each say which one they used."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from factories.model_deployments import md_doc
from kvgate.admission.checks import check_document
from kvgate.admission.gpu_reserve import (
    RESERVES_ENV,
    parse_reserve_flags,
    parse_reserves,
    resolve_reserve,
)
from kvgate.admission.policy import ClusterPolicy
from kvgate.api.models import ModelDeployment, RoleSpec
from kvgate.api.revision import revision_of
from kvgate.cmd.cli import main

H100 = "NVIDIA-H100-80GB-HBM3"
MEASURED = ClusterPolicy(gpu_reserved_gib_by_product={H100: 3.0})


def on_h100(gpu_memory_gib: float, **decode: object) -> dict[str, object]:
    """The sample's decode role on 38 GiB: (38 − 1) × 0.85 − 15 = 16.45 GiB, 134,758 tokens
    (allowed) with 1 GiB; (38 − 3) × 0.85 − 15 = 14.75 GiB, 120,832 < 131,072 with 3 GiB."""
    doc = md_doc()
    doc["spec"]["decode"]["gpuMemoryGiB"] = gpu_memory_gib
    doc["spec"]["decode"]["nodeSelector"] = {"nvidia.com/gpu.product": H100}
    doc["spec"]["decode"].update(decode)
    return doc


def test_a_role_on_a_measured_gpu_product_is_judged_with_the_measured_reserve() -> None:
    assert check_document(on_h100(38)).allowed  # kvgate's 1 GiB
    result = check_document(on_h100(38), MEASURED)
    assert not result.allowed
    assert result.message.startswith(
        "spec.decode: estimated KV pool 120,832 tokens < contextLength 131,072 × headroom 1.0 "
        "(estimated with gpuReservedGiB 3 from the cluster's measured reserve for "
        f"nvidia.com/gpu.product={H100} (chart value estimator.gpuReservedGiBByProduct)); "
    ), result.message


def test_the_specs_own_reserve_wins_over_the_measured_one() -> None:
    result = check_document(on_h100(38, gpuReservedGiB=1), MEASURED)
    assert result.allowed, result.message


def test_another_product_or_none_takes_kvgates_assumption_and_says_so() -> None:
    role = RoleSpec(nodeSelector={"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"})
    reserve = resolve_reserve("decode", role, MEASURED.gpu_reserved_gib_by_product)
    assert reserve.gib == 1.0
    assert reserve.describe() == (
        "gpuReservedGiB 1 from kvgate's assumption, not a measurement: SGLang subtracts no "
        "fixed reserve"
    )
    assert resolve_reserve("decode", RoleSpec(), {H100: 3.0}).gib == 1.0


def test_a_reserve_that_takes_the_whole_gpu_names_where_it_came_from() -> None:
    policy = ClusterPolicy(gpu_reserved_gib_by_product={H100: 40.0})
    result = check_document(on_h100(38), policy)
    assert not result.allowed
    assert "spec.decode.gpuReservedGiB" in result.message
    assert "estimator.gpuReservedGiBByProduct" in result.message


def test_an_unset_reserve_keeps_the_revision_it_had_with_the_old_default() -> None:
    """Specs stored with the CRD's former default 1.0 and new ones without it run the same."""
    unset = ModelDeployment.model_validate(md_doc())
    stored = md_doc()
    for role in ("prefill", "decode"):
        stored["spec"][role]["gpuReservedGiB"] = 1.0
    assert unset.spec.decode.gpu_reserved_gi_b is None
    assert revision_of(unset.spec) == revision_of(ModelDeployment.model_validate(stored).spec)


@pytest.mark.parametrize(
    "raw",
    ["[1]", "{not json", '{"H100": -1}', '{"H100": "3"}', '{"": 2}', '{"H100": 1e9}'],
)
def test_a_wrong_chart_value_is_refused_naming_it_and_an_example(raw: str) -> None:
    with pytest.raises(ValueError) as error:
        parse_reserves(raw)
    assert RESERVES_ENV in str(error.value)
    assert "estimator.gpuReservedGiBByProduct" in str(error.value)
    assert "NVIDIA-H100-80GB-HBM3" in str(error.value)


def test_the_chart_value_and_the_flag_read_as_the_same_table() -> None:
    assert parse_reserves(json.dumps({H100: 3, "L40S": 1.5})) == {H100: 3.0, "L40S": 1.5}
    assert parse_reserves("") == {} and parse_reserves(None) == {}
    assert parse_reserve_flags([f"{H100}=3", "L40S=1.5"]) == {H100: 3.0, "L40S": 1.5}
    with pytest.raises(ValueError, match="--gpu-reserve 'H100': must be PRODUCT=GIB"):
        parse_reserve_flags(["H100"])


def _write(tmp_path: Path, doc: dict[str, object]) -> str:
    path = tmp_path / "md.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def test_validate_and_plan_take_the_measured_reserve_and_say_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(tmp_path, on_h100(38))
    assert main(["validate", path]) == 0
    capsys.readouterr()
    assert main(["validate", path, "--gpu-reserve", f"{H100}=3"]) == 1
    assert "estimated with gpuReservedGiB 3 from the cluster's measured reserve" in (
        capsys.readouterr().out
    )
    assert main(["plan", "-f", path, "--gpu-reserve", f"{H100}=3"]) == 1
    out = capsys.readouterr().out
    assert "decode (38 GiB × TP 1, auto, mem 0.85): KV pool 120,832 tokens, short by" in out
    assert (
        "    estimated with gpuReservedGiB 3 from the cluster's measured reserve for "
        f"nvidia.com/gpu.product={H100} (chart value estimator.gpuReservedGiBByProduct)\n"
    ) in out
    assert main(["plan", "-f", path, "--gpu-reserve", "H100"]) == 2


def test_a_plan_search_says_which_reserve_each_shape_was_estimated_with(
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = str(
        Path(__file__).resolve().parents[2] / "tests/golden/plan/llama-3.1-70b-config.json"
    )
    search = ["plan", "--config", config, "--weights-gib", "131.5", "--gpu-memory-gib", "80"]
    main(search)
    assert (
        ", gpuReservedGiB 1 from kvgate's assumption, not a measurement: SGLang subtracts no "
        "fixed reserve (estimates; kvgate verifies every live engine)\n"
    ) in capsys.readouterr().out
    main([*search, "--gpu-reserved-gib", "2.5"])
    assert ", gpuReservedGiB 2.5 from --gpu-reserved-gib (estimates;" in capsys.readouterr().out


def _pinned_by_affinity(*terms: list[dict[str, object]]) -> dict[str, object]:
    """The decode role of ``on_h100(38)`` placed by required node affinity, not nodeSelector."""
    doc = on_h100(38)
    del doc["spec"]["decode"]["nodeSelector"]  # type: ignore[index]
    doc["spec"]["decode"]["affinity"] = {  # type: ignore[index]
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": term} for term in terms]
            }
        }
    }
    return doc


def _product_in(*values: str) -> dict[str, object]:
    return {"key": "nvidia.com/gpu.product", "operator": "In", "values": list(values)}


def test_a_role_pinned_to_a_product_by_required_node_affinity_is_judged_with_its_reserve() -> None:
    doc = _pinned_by_affinity([_product_in(H100)])
    assert check_document(doc).allowed  # kvgate's 1 GiB
    result = check_document(doc, MEASURED)
    assert not result.allowed
    assert (
        "estimated with gpuReservedGiB 3 from the cluster's measured reserve for "
        f"nvidia.com/gpu.product={H100}" in result.message
    ), result.message
    spec = ModelDeployment.model_validate(doc).spec
    reserve = resolve_reserve("decode", spec.decode, MEASURED.gpu_reserved_gib_by_product)
    assert reserve.gib == 3.0


@pytest.mark.parametrize(
    "terms",
    [
        pytest.param([[_product_in(H100, "NVIDIA-A100-SXM4-80GB")]], id="two-products"),
        pytest.param([[_product_in(H100)], []], id="a-term-without-the-product"),
        pytest.param(
            [[_product_in(H100)], [_product_in("NVIDIA-A100-SXM4-80GB")]], id="terms-disagree"
        ),
        pytest.param(
            [[{"key": "nvidia.com/gpu.product", "operator": "NotIn", "values": [H100]}]],
            id="not-in",
        ),
    ],
)
def test_node_affinity_that_leaves_the_product_open_takes_kvgates_assumption(
    terms: list[list[dict[str, object]]],
) -> None:
    spec = ModelDeployment.model_validate(_pinned_by_affinity(*terms)).spec
    reserve = resolve_reserve("decode", spec.decode, MEASURED.gpu_reserved_gib_by_product)
    assert reserve.gib == 1.0, reserve


def test_only_required_node_affinity_pins_a_product_never_a_preferred_one() -> None:
    role = RoleSpec(
        affinity={
            "nodeAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 100, "preference": {"matchExpressions": [_product_in(H100)]}}
                ]
            }
        }
    )
    assert resolve_reserve("decode", role, {H100: 3.0}).gib == 1.0
