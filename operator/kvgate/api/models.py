"""The ModelDeployment API (kvgate.io/v1alpha1): the one source of truth.

The CRD in ``crds/``, the chart's CRD, ``kubectl explain`` text and the webhook's schema checks
are all generated from these pydantic models. Field descriptions are user documentation.
"""

from __future__ import annotations

import math
import re
from enum import StrEnum
from typing import Annotated, Any

# Re-exported: the API's default, defined once in the engine package (Requirement's default too).
# Re-exported: how large one engine may be, shared with the estimator's input checks.
from kvgate_engine.shape_limits import MAX_ENGINE_NODES as MAX_ENGINE_NODES
from kvgate_engine.shape_limits import MAX_GPU_MEMORY_GIB as MAX_GPU_MEMORY_GIB
from kvgate_engine.shape_limits import MAX_GPUS_PER_NODE as MAX_GPUS_PER_NODE
from kvgate_engine.shape_limits import MAX_TENSOR_PARALLEL as MAX_TENSOR_PARALLEL
from kvgate_engine.verdict import DEFAULT_MIN_ENGINE_VERSION as DEFAULT_MIN_ENGINE_VERSION
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

GROUP = "kvgate.io"
VERSION = "v1alpha1"
KIND = "ModelDeployment"
PLURAL = "modeldeployments"
SINGULAR = "modeldeployment"
# Not `md`: Cluster API's MachineDeployment has it on every CAPI management cluster.
SHORT_NAMES = ["kvmd"]
API_VERSION = f"{GROUP}/{VERSION}"

DEFAULT_ENGINE_PORT = 30000
DEFAULT_BOOTSTRAP_PORT = 8998
DEFAULT_ROUTER_IMAGE = "ghcr.io/lightseekorg/smg:1.13.0"
DEFAULT_SHM_SIZE = "16Gi"  # NCCL, SGLang's TP workers and the KV transfer staging use /dev/shm
# Where a model source (spec.model.source) is mounted, read-only, in every engine container.
MODEL_MOUNT_PATH = "/models"
DEFAULT_HUB_ENDPOINT = "https://huggingface.co"
# A Hugging Face Hub repository id: <namespace>/<name> (or a legacy id without namespace).
HUB_REPO_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}(/[A-Za-z0-9][A-Za-z0-9._-]{0,95})?$"
# A relative path inside a volume (no leading or trailing '/'); '..' segments, which Kubernetes
# refuses in a subPath, are refused by PersistentVolumeClaimSource's own rule.
SUB_PATH_PATTERN = r"^[^/](.*[^/])?$"
# An http(s) URL without credentials, query or fragment.
ENDPOINT_PATTERN = r"^https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?(/[A-Za-z0-9._~/-]*)?$"
DNS_SUBDOMAIN_MAX = 253
INFINIBAND_DEVICE_DIR = "/dev/infiniband"
MAX_RDMA_DEVICES = 64
MAX_IB_DEVICES = 32
# A Kubernetes resource quantity as kvgate accepts it for sizes (binary or decimal suffix).
QUANTITY_PATTERN = r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|k|M|G|T|P)?$"
# An RDMA HCA name as SGLang's --disaggregation-ib-device takes it (mlx5_0, mlx5_bond_0, ionic_3).
IB_DEVICE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$"
# A device-plugin resource <domain>/<name> (rdma/hca_shared_devices_a, nvidia.com/hostdev).
RESOURCE_NAME_PATTERN = (
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)

# Input limits (README "Input limits"). Each is far above what a real deployment writes and low
# enough that everything kvgate builds from the spec stays within what Kubernetes accepts.
MAX_ENGINE_REPLICAS = 1024  # engine pods per role
MAX_ROUTER_REPLICAS = 64
# MAX_GPUS_PER_NODE, MAX_ENGINE_NODES, MAX_TENSOR_PARALLEL: kvgate_engine.shape_limits.
MAX_ARGS = 128  # items in engine.args, router.args and engine.env
MAX_ARG_LENGTH = 4096  # characters in one argument or environment value
MAX_NAME_LENGTH = 256  # model.name, env names
MAX_PATH_LENGTH = 1024  # model.path, images
MAX_VERSION_LENGTH = 64
MAX_TOLERATIONS = 32
MAX_NODE_SELECTOR = 32
MAX_RESOURCES = 16  # resource names per limits/requests
MAX_VERIFY_TIMEOUT_SECONDS = 86_400
MAX_REVERIFY_INTERVAL_SECONDS = 3_600  # re-verification never pauses longer than an hour
# Kubernetes' own limits on what kvgate copies into pod specs.
QUALIFIED_NAME_MAX = 317  # <DNS subdomain prefix (253)>/<name (63)>
LABEL_VALUE_MAX = 63
# Pod customization a platform team adds per role (kvgate.admission.pod_fit checks each).
MAX_POD_METADATA = 64  # podLabels or podAnnotations entries
MAX_PULL_SECRETS = 16
MAX_TOPOLOGY_SPREAD = 8
MAX_EXTRA_VOLUMES = 32  # extraVolumes, and extraVolumeMounts
DEFAULT_ACCELERATOR_RESOURCE = "nvidia.com/gpu"
# A DNS-1123 subdomain: the names of ServiceAccounts, PriorityClasses and Secrets.
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"

# Marks a free-form object in the generated CRD (x-kubernetes-preserve-unknown-fields).
PRESERVE_UNKNOWN: dict[str, Any] = {"x-kubernetes-preserve-unknown-fields": True}
INT_OR_STRING: dict[str, Any] = {"x-kubernetes-int-or-string": True}


class _Model(BaseModel):
    """Base: camelCase on the wire, unknown fields are errors (typos never vanish silently)."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        use_attribute_docstrings=False,
    )


# The CUDA context (~0.5 GiB on Hopper) and NCCL buffers exist before SGLang measures free
# memory. kvgate's own assumption, not SGLang's (which subtracts no fixed reserve) and not
# measured: the estimate takes it only when neither the spec nor the cluster's measured reserve
# for the GPU product gives one (kvgate.admission.gpu_reserve).
# kvgate_engine.estimator.DEFAULT_GPU_RESERVED_GIB is the same figure.
DEFAULT_GPU_RESERVED_GIB = 1.0


# --kv-cache-dtype values the API offers: each is one SGLang's parser lists (checked per release
# by tests/conformance/test_engine_flag_values.py) and the estimator sizes, except FLOAT16, which
# no supported release accepts: it stays in the schema so that stored objects remain readable
# (removing an enum value breaks them), and admission denies it (kvgate.admission.engine_flags).
class KvCacheDtype(StrEnum):
    AUTO = "auto"
    FP8_E4M3 = "fp8_e4m3"
    FP8_E5M2 = "fp8_e5m2"
    BFLOAT16 = "bfloat16"
    BF16 = "bf16"
    MXFP8 = "mxfp8"
    FLOAT16 = "float16"


class TransferBackend(StrEnum):
    MOONCAKE = "mooncake"
    MOONCAKE_TCP = "mooncake_tcp"
    NIXL = "nixl"


class Role(StrEnum):
    PREFILL = "prefill"
    DECODE = "decode"


class SecretKeyRef(_Model):
    name: str = Field(
        min_length=1,
        max_length=253,
        description="Name of a Secret in the ModelDeployment's namespace.",
    )
    key: str = Field(min_length=1, max_length=253, description="The key in that Secret.")


class PersistentVolumeClaimSource(_Model):
    """Weights already on a PersistentVolumeClaim of the ModelDeployment's namespace."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.subPath) || !(self.subPath == '..' || "
                    "self.subPath.startsWith('../') || self.subPath.contains('/../') || "
                    "self.subPath.endsWith('/..'))",
                    "message": "subPath must not hold '..' segments (Kubernetes refuses them)",
                }
            ]
        }
    )

    claim_name: str = Field(
        min_length=1,
        max_length=DNS_SUBDOMAIN_MAX,
        description=(
            "The claim, in the ModelDeployment's namespace. It is mounted read-only in every "
            "engine pod of both roles (every replica, every node of a multi-node engine), so "
            "with more than one node it needs an access mode that allows that: ReadOnlyMany "
            "or ReadWriteMany."
        ),
    )
    sub_path: str | None = Field(
        default=None,
        max_length=MAX_PATH_LENGTH,
        pattern=SUB_PATH_PATTERN,
        description=(
            f"A directory inside the claim mounted at {MODEL_MOUNT_PATH} instead of its root "
            "(relative, no '..')."
        ),
    )

    @model_validator(mode="after")
    def _no_parent_segments(self) -> PersistentVolumeClaimSource:
        if self.sub_path is not None and ".." in self.sub_path.split("/"):
            raise ValueError(
                f"subPath {self.sub_path} holds a '..' segment, which Kubernetes refuses in a "
                "volume mount (the pods would never be created); name a directory inside the "
                "claim"
            )
        return self


class HostPathType(StrEnum):
    DIRECTORY = "Directory"
    DIRECTORY_OR_CREATE = "DirectoryOrCreate"


class HostPathSource(_Model):
    """Weights in a directory of the node (a node-local cache filled by something else)."""

    path: str = Field(
        min_length=2,
        max_length=MAX_PATH_LENGTH,
        pattern=r"^/.*[^/]$",
        description=(
            "The node's directory (absolute), mounted read-only. Every node that may run an "
            "engine pod must hold the same weights there: kvgate cannot check what a node has."
        ),
    )
    type: HostPathType = Field(
        default=HostPathType.DIRECTORY,
        description=(
            "Directory: the pod does not start (FailedMount) on a node without it. "
            "DirectoryOrCreate creates it empty, and the engine then fails to load."
        ),
    )


class ImagePullPolicy(StrEnum):
    ALWAYS = "Always"
    IF_NOT_PRESENT = "IfNotPresent"
    NEVER = "Never"


class ImageSource(_Model):
    """Weights packaged as an OCI image or artifact, mounted as a Kubernetes image volume."""

    reference: str = Field(
        min_length=1,
        max_length=MAX_PATH_LENGTH,
        pattern=r"^[^\s]+$",
        description=(
            "The image or OCI artifact holding the weights, e.g. "
            "registry.example.com/models/llama-3.1-8b:v1 (a digest pins it), mounted read-only "
            "by the kubelet as an image volume (volumes[].image): alpha in Kubernetes 1.31, "
            "beta from 1.33; the ImageVolume feature gate must be on before 1.35, where it is "
            "on by default, and the runtime must support it (containerd 2.1+, CRI-O 1.31+)."
        ),
    )
    pull_policy: ImagePullPolicy = Field(
        default=ImagePullPolicy.IF_NOT_PRESENT,
        description="Always, IfNotPresent or Never, as for a container image.",
    )


class EmptyDirStorage(_Model):
    """A pod-local emptyDir: every engine pod downloads its own copy when it starts."""

    size_limit: str | None = Field(
        default=None,
        max_length=32,
        pattern=QUANTITY_PATTERN,
        description=(
            "The emptyDir's sizeLimit, e.g. 40Gi: at least the weights' size. The pod is "
            "evicted if the download grows past it; without it, the download may fill the "
            "node's disk."
        ),
    )


class DownloadStorage(_Model):
    """Where a download lands: exactly one of emptyDir and persistentVolumeClaim."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "has(self.emptyDir) != has(self.persistentVolumeClaim)",
                    "message": "set exactly one of download.storage.emptyDir and "
                    "download.storage.persistentVolumeClaim",
                }
            ]
        }
    )

    empty_dir: EmptyDirStorage | None = Field(
        default=None,
        description="Download into each pod's own emptyDir (the default).",
    )
    persistent_volume_claim: PersistentVolumeClaimSource | None = Field(
        default=None,
        description=(
            "Download into a claim, once: pods that find the download complete (its marker "
            "file) skip it. The download container mounts it read-write, the engine read-only; "
            "pods on several nodes need ReadWriteMany. A directory that holds another "
            "repository or revision is never overwritten: use another model.path."
        ),
    )

    @model_validator(mode="after")
    def _one_storage(self) -> DownloadStorage:
        if (self.empty_dir is None) == (self.persistent_volume_claim is None):
            raise ValueError(
                "set exactly one of emptyDir (each pod downloads its own copy) and "
                "persistentVolumeClaim (downloaded once, shared)"
            )
        return self


def _default_download_storage() -> DownloadStorage:
    return DownloadStorage(empty_dir=EmptyDirStorage())


class DownloadSource(_Model):
    """Weights fetched from a model hub at pod start by an init container (`kvgate fetch-model`,
    in kvgate's own image) speaking the Hugging Face Hub HTTP API."""

    repo: str = Field(
        min_length=1,
        max_length=193,
        pattern=HUB_REPO_PATTERN,
        description="The hub repository id, e.g. meta-llama/Llama-3.1-8B-Instruct.",
    )
    revision: str = Field(
        default="main",
        min_length=1,
        max_length=255,
        pattern=r"^[A-Za-z0-9._/-]+$",
        description=(
            "A branch, tag or commit. Pin a commit (40 hex digits): a branch can move between "
            "two pods' starts, and the revision kvgate rolls out would then run two models."
        ),
    )
    endpoint: str = Field(
        default=DEFAULT_HUB_ENDPOINT,
        max_length=MAX_PATH_LENGTH,
        pattern=ENDPOINT_PATTERN,
        description=(
            "The hub's base URL (HF_ENDPOINT), e.g. an internal mirror. https in production: "
            "the token travels to it."
        ),
    )
    token_secret_ref: SecretKeyRef | None = Field(
        default=None,
        description=(
            "A Secret key holding the hub token, sent as Authorization: Bearer to the endpoint "
            "only (never to a redirect's other host, never logged). Needed for private and "
            "gated repositories."
        ),
    )
    exclude: list[Annotated[str, Field(min_length=1, max_length=256)]] = Field(
        default_factory=list,
        max_length=32,
        description=(
            "Files not to download, as fnmatch patterns over their paths in the repository (as "
            'huggingface_hub\'s ignore_patterns: * also matches /), e.g. ["original/*"] for '
            "the second, consolidated copy of the weights Meta's repositories carry."
        ),
    )
    storage: DownloadStorage = Field(
        default_factory=_default_download_storage,
        description="Where the weights land: each pod's emptyDir (default) or a shared claim.",
        # The CRD's default (the API server fills it in): what the factory builds.
        json_schema_extra={"default": {"emptyDir": {}}},
    )


class ModelSource(_Model):
    """Where the weights at model.path come from: exactly one source."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "[has(self.persistentVolumeClaim), has(self.hostPath), "
                    "has(self.image), has(self.download)].filter(x, x).size() == 1",
                    "message": "set exactly one of model.source.persistentVolumeClaim, "
                    "hostPath, image and download",
                }
            ]
        }
    )

    persistent_volume_claim: PersistentVolumeClaimSource | None = Field(
        default=None, description="Weights on a PersistentVolumeClaim, mounted read-only."
    )
    host_path: HostPathSource | None = Field(
        default=None, description="Weights in a node directory, mounted read-only."
    )
    image: ImageSource | None = Field(
        default=None, description="Weights in an OCI image, mounted as an image volume."
    )
    download: DownloadSource | None = Field(
        default=None,
        description="Weights downloaded from a model hub by an init container at pod start.",
    )

    @model_validator(mode="after")
    def _one_source(self) -> ModelSource:
        set_ = [
            name
            for name, value in (
                ("persistentVolumeClaim", self.persistent_volume_claim),
                ("hostPath", self.host_path),
                ("image", self.image),
                ("download", self.download),
            )
            if value is not None
        ]
        if len(set_) != 1:
            got = ", ".join(set_) if set_ else "none"
            raise ValueError(
                "set exactly one of persistentVolumeClaim, hostPath, image and download "
                f"(got {got})"
            )
        return self


class ModelSpec(_Model):
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": f"!has(self.source) || ((self.path == '{MODEL_MOUNT_PATH}' || "
                    f"self.path.startsWith('{MODEL_MOUNT_PATH}/')) && "
                    "!self.path.contains('/../') && !self.path.endsWith('/..'))",
                    "message": f"with model.source, model.path must be {MODEL_MOUNT_PATH} or "
                    f"a path under it (the source is mounted at {MODEL_MOUNT_PATH}), without "
                    "'..'",
                }
            ]
        }
    )

    name: str = Field(
        min_length=1,
        max_length=MAX_NAME_LENGTH,
        description="Served model name (--served-model-name); clients send it as `model`.",
    )
    path: str = Field(
        min_length=1,
        max_length=MAX_PATH_LENGTH,
        description=(
            "Where the engine reads the weights (--model-path): a path in the engine container "
            f"or a hub id. With source, {MODEL_MOUNT_PATH} or a directory under it, e.g. "
            f"{MODEL_MOUNT_PATH}/llama-3.1-8b."
        ),
    )
    context_length: int = Field(
        gt=0,
        description=(
            "The advertised context window in tokens (--context-length). Every prefill and "
            "decode engine must prove a KV pool of at least contextLength x safety.headroom."
        ),
    )
    config: dict[str, Any] | None = Field(
        default=None,
        description=(
            "The model's Hugging Face config.json as a map. Enables admission-time KV pool "
            "estimates and the context-length check against the model's own limit. The whole "
            "spec, this included, is limited to 96 KiB as JSON (checked at admission)."
        ),
        json_schema_extra=PRESERVE_UNKNOWN,
    )
    weights_gi_b: float | None = Field(
        default=None,
        alias="weightsGiB",
        gt=0,
        description="Total weight size of one engine replica in GiB (split across its TP ranks).",
    )
    source: ModelSource | None = Field(
        default=None,
        description=(
            f"Where the weights come from, mounted read-only at {MODEL_MOUNT_PATH} in every "
            "engine container (leaders and workers alike): a PersistentVolumeClaim, a node "
            "directory, an OCI image, or a download at pod start. Without it, model.path must "
            "already exist in the engine image or be a hub id SGLang downloads itself. "
            "Loading counts against rollout.verifyTimeoutSeconds."
        ),
    )


class EnvVar(_Model):
    name: str = Field(
        min_length=1, max_length=MAX_NAME_LENGTH, description="Environment variable name."
    )
    value: str | None = Field(default=None, max_length=MAX_ARG_LENGTH, description="Literal value.")
    value_from: dict[str, Any] | None = Field(
        default=None,
        description="A Kubernetes EnvVarSource (secretKeyRef, configMapKeyRef, fieldRef, ...).",
        json_schema_extra=PRESERVE_UNKNOWN,
    )


class RdmaSpec(_Model):
    """Where the engine container gets its RDMA device from: a device-plugin resource (preferred)
    or the node's /dev/infiniband."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "has(self.resourceName) != has(self.hostPath)",
                    "message": "set exactly one of transfer.rdma.resourceName (a device plugin "
                    "resource) and transfer.rdma.hostPath (/dev/infiniband)",
                }
            ]
        }
    )

    resource_name: str | None = Field(
        default=None,
        max_length=QUALIFIED_NAME_MAX,
        pattern=RESOURCE_NAME_PATTERN,
        description=(
            "Device-plugin resource that gives the pod RDMA devices, requested as a limit, e.g. "
            "rdma/hca_shared_devices_a (k8s-rdma-shared-dev-plugin) or nvidia.com/hostdev "
            "(NVIDIA Network Operator). The engine keeps a non-privileged container."
        ),
    )
    count: int = Field(
        default=1,
        ge=1,
        le=MAX_RDMA_DEVICES,
        description="How many of resourceName each engine pod requests.",
    )
    host_path: str | None = Field(
        default=None,
        max_length=MAX_PATH_LENGTH,
        pattern=r"^/",
        description=(
            "The node's InfiniBand device directory (usually /dev/infiniband), mounted at "
            "/dev/infiniband. Device nodes from a hostPath work only in a privileged container, "
            "so the engine container runs privileged: use resourceName where a device plugin "
            "is installed."
        ),
    )

    @model_validator(mode="after")
    def _one_source(self) -> RdmaSpec:
        if (self.resource_name is None) == (self.host_path is None):
            raise ValueError(
                "set exactly one of resourceName (a device plugin resource, e.g. "
                "rdma/hca_shared_devices_a) and hostPath (/dev/infiniband)"
            )
        return self


class TransferSpec(_Model):
    """How prefill hands KV to decode, and what the engine pods need for it."""

    backend: TransferBackend = Field(
        default=TransferBackend.MOONCAKE,
        description=(
            "--disaggregation-transfer-backend. mooncake (SGLang's default) moves KV over RDMA "
            "and needs rdma and ibDevices on RDMA nodes; mooncake_tcp is mooncake over TCP "
            "(no device, no capability); nixl uses UCX, over RDMA when rdma is set, else TCP."
        ),
    )
    rdma: RdmaSpec | None = Field(
        default=None,
        description=(
            "The RDMA device for mooncake or nixl. With it the engine container gets the "
            "device and the IPC_LOCK capability (RDMA pins memory), and runs as root, because "
            "Kubernetes gives added capabilities to root processes only."
        ),
    )
    ib_devices: list[Annotated[str, Field(pattern=IB_DEVICE_PATTERN, max_length=64)]] = Field(
        default_factory=list,
        max_length=MAX_IB_DEVICES,
        description=(
            "HCA names for --disaggregation-ib-device, e.g. [mlx5_0, mlx5_1] (joined with "
            "commas). Empty: the backend picks devices itself. Needs rdma."
        ),
    )
    shm_size: str = Field(
        default=DEFAULT_SHM_SIZE,
        max_length=32,
        pattern=QUANTITY_PATTERN,
        description=(
            "Size of the in-memory /dev/shm (emptyDir, medium Memory) of engine pods, whatever "
            "the backend: NCCL's intra-node transport between TP ranks, SGLang's TP worker "
            "processes and the KV transfer's staging use it. It counts against the pod's memory "
            "(its limit, when set)."
        ),
    )
    host_network: bool = Field(
        default=False,
        description=(
            "Run engine pods in the node's network namespace (as SGLang's own RDMA examples "
            "do, for RoCE setups that need the host's interfaces). Engine NetworkPolicies do "
            "not apply to such pods, and the engine and bootstrap ports must be free on the "
            "node."
        ),
    )


class EngineSpec(_Model):
    image: str = Field(
        min_length=1,
        max_length=MAX_PATH_LENGTH,
        description=(
            "SGLang engine image, e.g. lmsysorg/sglang:v0.5.23. A tag naming a version below "
            "safety.minEngineVersion is denied at admission, and so is a kvCacheDtype or "
            "transfer.backend that this release's parser refuses."
        ),
    )
    kv_cache_dtype: KvCacheDtype = Field(
        default=KvCacheDtype.AUTO,
        description=(
            "KV cache dtype (--kv-cache-dtype). auto: the model's own dtype; bfloat16 (or "
            "bf16): 2 bytes per element; fp8_e4m3, fp8_e5m2: 1 byte (twice the tokens per "
            "GiB); mxfp8: 1 byte plus a scale byte per 32 elements (SGLang's FA4 backend). "
            "A value the image's SGLang release does not accept is denied at admission: "
            "float16 is accepted by no supported release (0.5.19 to 0.5.23) and is denied, use "
            "auto for a float16 model. FP4 caches (nvfp4, fp4_mx_block16) are not offered: "
            "kvgate cannot size them."
        ),
    )
    page_size: int = Field(
        default=1, ge=1, description="KV cache page size in tokens (--page-size)."
    )
    transfer_backend: TransferBackend | None = Field(
        default=None,
        description="Deprecated: use transfer.backend (read when transfer.backend is not set).",
    )
    transfer: TransferSpec = Field(
        default_factory=TransferSpec,
        description="The prefill->decode KV transfer: backend, RDMA device, /dev/shm.",
    )
    api_key_secret_ref: SecretKeyRef | None = Field(
        default=None,
        description=(
            "A Secret key holding the engine API key. kvgate passes it to the engine "
            "(--api-key, from the Secret via an environment variable), to its own probe and "
            "guard (Authorization: Bearer) and to the gateway (smg --api-key, which then also "
            "requires it from clients). Never put --api-key in args."
        ),
    )
    port: int = Field(
        default=DEFAULT_ENGINE_PORT, ge=1, le=65535, description="Engine HTTP port (--port)."
    )
    bootstrap_port: int = Field(
        default=DEFAULT_BOOTSTRAP_PORT,
        ge=1,
        le=65535,
        description="Prefill KV bootstrap port (--disaggregation-bootstrap-port).",
    )
    args: list[Annotated[str, Field(max_length=MAX_ARG_LENGTH)]] = Field(
        default_factory=list,
        max_length=MAX_ARGS,
        description="Extra sglang.launch_server flags, appended after kvgate's own.",
    )
    env: list[EnvVar] = Field(
        default_factory=list,
        max_length=MAX_ARGS,
        description="Extra environment variables for engine containers.",
    )

    @model_validator(mode="after")
    def _deprecated_transfer_backend(self) -> EngineSpec:
        old = self.transfer_backend
        if old is None:
            return self
        if "backend" in self.transfer.model_fields_set and self.transfer.backend != old:
            raise ValueError(
                f"transferBackend {old.value} and transfer.backend {self.transfer.backend.value} "
                "disagree; remove the deprecated transferBackend"
            )
        self.transfer = self.transfer.model_copy(update={"backend": old})
        return self


MAX_CONTENT_PROBE_LENGTHS = 8
MAX_CONTENT_PROBE_NEW_TOKENS = 1024
MAX_CONTENT_PROBE_TIMEOUT_SECONDS = 86_400


class ContentProbeSpec(_Model):
    """The content check at maximum length a new revision passes before it takes traffic."""

    enabled: bool = Field(
        default=True,
        description=(
            "Before a new revision takes traffic, send prompts of maximum length through its own "
            "router (kvgate.verify.content_probe): each in-range prompt must be answered with "
            "maxNewTokens tokens, and prompts just over the verified KV pool and over "
            "contextLength must be refused (never HTTP 200 with generated tokens). Costs one "
            "prefill of each length per rollout (README: cost model)."
        ),
    )
    lengths: list[Annotated[int, Field(ge=1, le=100)]] = Field(
        default_factory=lambda: [50, 100],
        min_length=1,
        max_length=MAX_CONTENT_PROBE_LENGTHS,
        description=(
            "In-range prompt lengths, in percent of the longest prompt SGLang answers in full: "
            "contextLength - maxNewTokens - 2, at most contextLength - 7."
        ),
    )
    max_new_tokens: int = Field(
        default=8,
        ge=1,
        le=MAX_CONTENT_PROBE_NEW_TOKENS,
        description="Tokens each in-range probe must generate (sent with ignore_eos).",
    )
    timeout_seconds: int = Field(
        default=600,
        ge=1,
        le=MAX_CONTENT_PROBE_TIMEOUT_SECONDS,
        description=(
            "Deadline of each probe request; an in-range probe that is not answered in time "
            "fails the check."
        ),
    )


class SafetySpec(_Model):
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "self.headroom >= 1.0",
                    "message": "safety.headroom must be >= 1.0 (the pool must hold the context)",
                }
            ]
        }
    )

    headroom: float = Field(
        default=1.0,
        ge=1.0,
        description=(
            "Required KV pool as a multiple of contextLength (>= 1.0). 1.2 demands a pool 20% "
            "larger than the advertised window."
        ),
    )
    min_engine_version: str = Field(
        default=DEFAULT_MIN_ENGINE_VERSION,
        min_length=1,
        max_length=MAX_VERSION_LENGTH,
        description=(
            "Lowest SGLang version allowed to serve (PEP 440). Disaggregated SGLang before "
            "0.5.22 can hand stale KV pages to decode on an over-length prompt. Must be at or "
            "above the cluster's floor (chart value engineVersionFloor)."
        ),
    )
    kv_canary: bool = Field(
        default=False,
        description="Run SGLang's own KV canary (--kv-canary log, SGLang >= 0.5.19).",
    )
    content_probe: ContentProbeSpec = Field(
        default_factory=ContentProbeSpec,
        description="The content check at maximum length before a new revision takes traffic.",
    )
    kv_checksum: bool = Field(
        default=True,
        description=(
            "Enable KV-transfer checksums (--disaggregation-enable-kv-checksum) on engines "
            "whose version has them (>= 0.5.21)."
        ),
    )
    deferred_decode_kv_release: bool = Field(
        default=True,
        description=(
            "Set SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE on both roles (SGLang >= "
            "0.5.19; off by default before 0.5.21): an aborted request's decode KV pages stay "
            "held until prefill's transfer into them drained (or 30 s). false writes it false."
        ),
    )


TOLERATION_OPERATORS = ("Exists", "Equal")
TAINT_EFFECTS = ("", "NoSchedule", "PreferNoSchedule", "NoExecute")
# resource.Quantity as Kubernetes parses it (apimachinery's quantity grammar): a decimal number,
# then a binary (Ki..Ei) or decimal (n, u, m, k, M, G, T, P, E) suffix or an exponent. Wider than
# QUANTITY_PATTERN, the size form kvgate reads in bytes (kvgate.admission.model_source).
KUBERNETES_QUANTITY_PATTERN = (
    r"^(?P<sign>[+-]?)(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
    r"(?:[KMGTPE]i|[numkMGTPE]|[eE][+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))?$"
)
_KUBERNETES_QUANTITY = re.compile(KUBERNETES_QUANTITY_PATTERN)


def quantity_problem(value: int | str) -> str | None:
    """Why Kubernetes would refuse `value` as a container's resource quantity, or None."""
    text = str(value)
    parsed = _KUBERNETES_QUANTITY.match(text)
    if parsed is None:
        return (
            f"{text!r} is not a Kubernetes resource quantity; write a number with an optional "
            "suffix (Ki, Mi, Gi, Ti, Pi, Ei, or m, k, M, G, T, P, E), no spaces, e.g. 64Gi"
        )
    if parsed["sign"] == "-" and float(parsed["number"]) != 0:
        return (
            f"{text!r} is not a Kubernetes resource quantity a container may ask for: it is "
            "negative; write 0 or more, e.g. 64Gi"
        )
    return None


def _kubernetes_quantity(value: int | str) -> int | str:
    problem = quantity_problem(value)
    if problem:
        raise ValueError(problem)
    return value


Quantity = Annotated[
    int | str, Field(json_schema_extra=INT_OR_STRING), AfterValidator(_kubernetes_quantity)
]


class Toleration(_Model):
    key: str | None = Field(
        default=None, max_length=QUALIFIED_NAME_MAX, description="Taint key to tolerate."
    )
    operator: str | None = Field(default=None, max_length=16, description="Exists or Equal.")
    value: str | None = Field(
        default=None, max_length=LABEL_VALUE_MAX, description="Taint value (operator Equal)."
    )
    effect: str | None = Field(
        default=None, max_length=32, description="NoSchedule, PreferNoSchedule, NoExecute."
    )
    toleration_seconds: int | None = Field(
        default=None, description="How long a NoExecute taint is tolerated."
    )

    @model_validator(mode="after")
    def _as_kubernetes_validates_it(self) -> Toleration:
        """The rules of Kubernetes' own ValidateTolerations: a toleration it refuses would make
        every engine pod of the role uncreatable, so it is refused here, with the way out."""
        operator = self.operator or "Equal"  # "" and unset mean Equal
        if operator not in TOLERATION_OPERATORS:
            raise ValueError(
                f"operator must be Exists or Equal (got {self.operator!r}), as Kubernetes "
                "requires; write Exists to match any value of the key"
            )
        if not self.key and operator != "Exists":
            raise ValueError(
                "operator must be Exists when key is empty (a toleration of every taint); "
                "set key, or operator: Exists"
            )
        if operator == "Exists" and self.value:
            raise ValueError(
                f"value must be empty when operator is Exists (got {self.value!r}); remove "
                "value, or use operator: Equal"
            )
        if (self.effect or "") not in TAINT_EFFECTS:
            raise ValueError(
                f"effect must be NoSchedule, PreferNoSchedule or NoExecute (got "
                f"{self.effect!r}), as Kubernetes requires; leave it out to tolerate every effect"
            )
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise ValueError(
                f"tolerationSeconds is allowed only with effect NoExecute (effect is "
                f"{self.effect!r}); set effect: NoExecute or remove tolerationSeconds"
            )
        return self


class Resources(_Model):
    limits: dict[str, Quantity] = Field(
        default_factory=dict,
        max_length=MAX_RESOURCES,
        description=(
            "Resource limits. On engines the role's acceleratorResource (nvidia.com/gpu by "
            "default) is kvgate's: tensorParallel / nodes per pod, set by kvgate; another "
            "count is denied at admission."
        ),
    )
    requests: dict[str, Quantity] = Field(
        default_factory=dict, max_length=MAX_RESOURCES, description="Resource requests."
    )


MAX_DRAIN_TIMEOUT_SECONDS = 3600


class RoleAutoscaling(_Model):
    """This role's count comes from its RoleScale object (an HPA, KEDA or kubectl scale)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "self.minReplicas <= self.maxReplicas",
                    "message": "autoscaling.minReplicas must be at most autoscaling.maxReplicas",
                    # format(), not +: the API server prices each + of a string(int) as an
                    # unbounded string and refuses the CRD.
                    "messageExpression": (
                        "'autoscaling.minReplicas %d is above autoscaling.maxReplicas %d: lower "
                        "minReplicas or raise maxReplicas'.format([self.minReplicas, "
                        "self.maxReplicas])"
                    ),
                }
            ]
        }
    )

    min_replicas: int = Field(
        default=1,
        ge=1,
        le=MAX_ENGINE_REPLICAS,
        description=(
            "Fewest engines of this role: kvgate never drains a verified engine when fewer "
            "than this many would stay verified, and refuses a RoleScale count below it."
        ),
    )
    max_replicas: int = Field(
        ge=1,
        le=MAX_ENGINE_REPLICAS,
        description="Most engines of this role (the GPUs it may take): a larger count is refused.",
    )
    drain_timeout_seconds: int = Field(
        default=300,
        ge=1,
        le=MAX_DRAIN_TIMEOUT_SECONDS,
        description=(
            "Scale-down takes an engine out of traffic and removes it only once it reports no "
            "running or queued request and no KV transfer in flight; after this long it is "
            "removed anyway (a Warning Event names what was still in flight)."
        ),
    )


class LocalObjectReference(_Model):
    """A Secret in the ModelDeployment's namespace, by name (a pod's imagePullSecrets entry)."""

    name: str = Field(
        min_length=1,
        max_length=DNS_SUBDOMAIN_MAX,
        pattern=DNS_SUBDOMAIN_PATTERN,
        description="The Secret's name (type kubernetes.io/dockerconfigjson).",
    )


class VolumeMount(_Model):
    """Where one of the role's extraVolumes appears in the engine container."""

    name: str = Field(
        min_length=1,
        max_length=63,
        description="The name of one of this role's extraVolumes.",
    )
    mount_path: str = Field(
        min_length=1,
        max_length=MAX_PATH_LENGTH,
        pattern=r"^/",
        description=(
            "Absolute path in the engine container; never at, inside or above a path kvgate "
            f"mounts (/dev/shm, {MODEL_MOUNT_PATH}, {INFINIBAND_DEVICE_DIR})."
        ),
    )
    read_only: bool = Field(default=False, description="Mount read-only.")
    sub_path: str | None = Field(
        default=None,
        max_length=MAX_PATH_LENGTH,
        pattern=SUB_PATH_PATTERN,
        description="A path inside the volume to mount instead of its root (relative, no '..').",
    )

    @model_validator(mode="after")
    def _no_parent_segments(self) -> VolumeMount:
        if self.sub_path is not None and ".." in self.sub_path.split("/"):
            raise ValueError(
                f"subPath {self.sub_path} holds a '..' segment, which Kubernetes refuses in a "
                "volume mount (the pods would never be created); name a path inside the volume"
            )
        return self


class RoleSpec(_Model):
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "self.memFractionStatic > 0.0 && self.memFractionStatic < 1.0",
                    "message": "memFractionStatic must be between 0 and 1 (exclusive)",
                },
                {"rule": "self.replicas >= 0", "message": "replicas must be >= 0"},
                {
                    "rule": "self.tensorParallel % self.nodes == 0",
                    "message": "tensorParallel (GPUs per engine) must be a multiple of nodes: "
                    "each of an engine's nodes pods gets tensorParallel / nodes GPUs",
                },
                {
                    "rule": f"self.tensorParallel <= {MAX_GPUS_PER_NODE} * self.nodes",
                    "message": f"tensorParallel / nodes (GPUs per node) must be at most "
                    f"{MAX_GPUS_PER_NODE}: no node has more; raise nodes",
                },
            ]
        }
    )

    replicas: int = Field(
        default=1,
        ge=0,
        le=MAX_ENGINE_REPLICAS,
        description=(
            "Engine pods of this role. With autoscaling set: the count its RoleScale starts "
            "at (within minReplicas..maxReplicas); the RoleScale's count rules after that."
        ),
    )
    autoscaling: RoleAutoscaling | None = Field(
        default=None,
        description=(
            "Scale this role through the Kubernetes scale API: kvgate creates the RoleScale "
            "<name>-<role> (kubectl scale, an HPA or a KEDA ScaledObject target it) and runs the "
            "count it asks for, within these bounds. Single-node roles only (nodes: 1)."
        ),
    )
    tensor_parallel: int = Field(
        default=1,
        ge=1,
        le=MAX_TENSOR_PARALLEL,
        description=(
            "GPUs per engine, across all its nodes (--tp-size). Each of the engine's `nodes` "
            f"pods requests tensorParallel / nodes nvidia.com/gpu (at most {MAX_GPUS_PER_NODE}), "
            "so it must be a multiple of nodes: 16 on 2 nodes of 8 GPUs."
        ),
    )
    nodes: int = Field(
        default=1,
        ge=1,
        le=MAX_ENGINE_NODES,
        description=(
            "Pods (one per node) per engine. 1: each engine is one pod of a Deployment. More: "
            "each engine is one LeaderWorkerSet group (leaderworkerset.x-k8s.io/v1, which must "
            "be installed) whose leader runs rank 0 and serves HTTP and whose workers run ranks "
            "1..nodes-1 (--nnodes, --node-rank, --dist-init-addr); the engine is verified, and "
            "takes traffic, only while its leader's pool meets the requirement and every rank "
            "runs. replicas counts engines (groups), not pods."
        ),
    )
    mem_fraction_static: float = Field(
        default=0.85,
        gt=0,
        lt=1,
        description=(
            "Fraction of GPU memory for weights and KV pool (--mem-fraction-static), 0 < x < 1. "
            "Always passed explicitly: SGLang's own default depends on the GPU."
        ),
    )
    max_total_tokens: int | None = Field(
        default=None,
        gt=0,
        description="Optional cap on the KV pool (--max-total-tokens); it can only lower it.",
    )
    gpu_memory_gi_b: float | None = Field(
        default=None,
        alias="gpuMemoryGiB",
        gt=0,
        description="Memory of one GPU in GiB; enables the admission-time pool estimate.",
    )
    gpu_reserved_gi_b: float | None = Field(
        default=None,
        alias="gpuReservedGiB",
        ge=0,
        description=(
            "GPU memory in GiB the engine never sees as free: the CUDA context, NCCL buffers "
            "and other tenants. The admission estimate applies memFractionStatic to "
            "gpuMemoryGiB minus this, as SGLang applies it to the free memory it measures. "
            "Unset: the cluster's measured reserve for the GPU product the nodeSelector or "
            "the required node affinity (one value) pins (nvidia.com/gpu.product, chart value "
            "estimator.gpuReservedGiBByProduct), else "
            "1 GiB, kvgate's own assumption (SGLang subtracts no fixed reserve)."
        ),
    )
    resources: Resources = Field(
        default_factory=Resources, description="CPU/memory requests and limits."
    )
    node_selector: dict[str, Annotated[str, Field(max_length=LABEL_VALUE_MAX)]] = Field(
        default_factory=dict,
        max_length=MAX_NODE_SELECTOR,
        description="Node labels the engine pods must match.",
    )
    tolerations: list[Toleration] = Field(
        default_factory=list,
        max_length=MAX_TOLERATIONS,
        description="Tolerations for the engine pods.",
    )
    affinity: dict[str, Any] | None = Field(
        default=None,
        description="A Kubernetes Affinity for the engine pods.",
        json_schema_extra=PRESERVE_UNKNOWN,
    )
    accelerator_resource: str = Field(
        default=DEFAULT_ACCELERATOR_RESOURCE,
        max_length=QUALIFIED_NAME_MAX,
        pattern=RESOURCE_NAME_PATTERN,
        description=(
            "The device-plugin resource each engine pod requests tensorParallel / nodes of, as "
            "its limit and request: nvidia.com/gpu (default), amd.com/gpu, or a MIG slice such "
            "as nvidia.com/mig-3g.40gb. The estimate uses gpuMemoryGiB as the memory of one: "
            "for a MIG slice, the slice's memory (40 for mig-3g.40gb)."
        ),
    )
    pod_labels: dict[str, Annotated[str, Field(max_length=LABEL_VALUE_MAX)]] = Field(
        default_factory=dict,
        max_length=MAX_POD_METADATA,
        description=(
            "Extra labels on the engine pods (cost centre, team, a mesh's opt-out). kvgate's "
            "own (kvgate.io/*) and those the Deployment and LeaderWorkerSet controllers set "
            "are denied."
        ),
    )
    pod_annotations: dict[str, Annotated[str, Field(max_length=MAX_ARG_LENGTH)]] = Field(
        default_factory=dict,
        max_length=MAX_POD_METADATA,
        description="Extra annotations on the engine pods; kvgate.io/* ones are denied.",
    )
    service_account_name: str | None = Field(
        default=None,
        max_length=DNS_SUBDOMAIN_MAX,
        pattern=DNS_SUBDOMAIN_PATTERN,
        description=(
            "The engine pods' ServiceAccount (it must exist in the namespace), e.g. for a "
            "registry credential or a node pool's workload identity. Its API token is still "
            "not mounted: the engine needs no API access."
        ),
    )
    priority_class_name: str | None = Field(
        default=None,
        max_length=DNS_SUBDOMAIN_MAX,
        pattern=DNS_SUBDOMAIN_PATTERN,
        description="The engine pods' PriorityClass (it must exist).",
    )
    image_pull_secrets: list[LocalObjectReference] = Field(
        default_factory=list,
        max_length=MAX_PULL_SECRETS,
        description=(
            "Secrets for pulling the engine image, e.g. [{name: regcred}], in the "
            "ModelDeployment's namespace. The operator adds the chart's imagePullSecrets "
            "(the guard sidecar is kvgate's own image): those Secrets must exist here too."
        ),
    )
    topology_spread_constraints: list[
        Annotated[dict[str, Any], Field(json_schema_extra=PRESERVE_UNKNOWN)]
    ] = Field(
        default_factory=list,
        max_length=MAX_TOPOLOGY_SPREAD,
        description=(
            "Kubernetes TopologySpreadConstraints for the engine pods; select them with "
            "kvgate.io/deployment and kvgate.io/role labels, e.g. to spread a role over zones."
        ),
    )
    extra_volumes: list[Annotated[dict[str, Any], Field(json_schema_extra=PRESERVE_UNKNOWN)]] = (
        Field(
            default_factory=list,
            max_length=MAX_EXTRA_VOLUMES,
            description=(
                "Kubernetes Volumes added to the engine pods (a CA bundle ConfigMap, a "
                "compilation cache claim), mounted by extraVolumeMounts. Not hostPath (use "
                "model.source.hostPath within the cluster's allowed directories), and not the "
                "names of kvgate's own volumes (dshm, model, infiniband)."
            ),
        )
    )
    extra_volume_mounts: list[VolumeMount] = Field(
        default_factory=list,
        max_length=MAX_EXTRA_VOLUMES,
        description="Mounts of extraVolumes in the engine container.",
    )
    extra_env: list[EnvVar] = Field(
        default_factory=list,
        max_length=MAX_ARGS,
        description=(
            "Environment variables for this role's engine containers only, after engine.env "
            "(a name in both takes this role's value)."
        ),
    )


class RouterSpec(_Model):
    replicas: int = Field(
        default=1, ge=0, le=MAX_ROUTER_REPLICAS, description="Gateway (smg) pods."
    )
    image: str = Field(
        default=DEFAULT_ROUTER_IMAGE,
        min_length=1,
        max_length=MAX_PATH_LENGTH,
        description="SGLang gateway (smg) image.",
    )
    port: int = Field(default=8000, ge=1, le=65535, description="Gateway HTTP port.")
    args: list[Annotated[str, Field(max_length=MAX_ARG_LENGTH)]] = Field(
        default_factory=list,
        max_length=MAX_ARGS,
        description=(
            "Extra smg flags, appended last. Flags that add workers, change discovery, "
            "control-plane or API authentication, or where the router listens are denied."
        ),
    )
    resources: Resources = Field(
        default_factory=Resources,
        description=(
            "CPU/memory requests and limits of the router pods (without them they run "
            "BestEffort, and a namespace ResourceQuota on requests refuses them)."
        ),
    )
    node_selector: dict[str, Annotated[str, Field(max_length=LABEL_VALUE_MAX)]] = Field(
        default_factory=dict,
        max_length=MAX_NODE_SELECTOR,
        description="Node labels the router pods must match (e.g. a CPU node pool).",
    )
    tolerations: list[Toleration] = Field(
        default_factory=list,
        max_length=MAX_TOLERATIONS,
        description="Tolerations for the router pods.",
    )
    affinity: dict[str, Any] | None = Field(
        default=None,
        description="A Kubernetes Affinity for the router pods.",
        json_schema_extra=PRESERVE_UNKNOWN,
    )
    image_pull_secrets: list[LocalObjectReference] = Field(
        default_factory=list,
        max_length=MAX_PULL_SECRETS,
        description="Secrets for pulling the router image (a private mirror of smg).",
    )


class RolloutStrategy(StrEnum):
    SWITCH = "Switch"
    PROGRESSIVE = "Progressive"


class RolloutStepSpec(_Model):
    """One traffic step of a progressive rollout."""

    weight: int = Field(
        ge=1,
        le=99,
        description=(
            "Share of requests (percent) the new revision takes during this step; the split "
            "follows the ratio of the two revisions' ready routers (rollout.maxSplitRouters)."
        ),
    )
    pause_seconds: int = Field(
        default=60,
        ge=0,
        le=MAX_VERIFY_TIMEOUT_SECONDS,
        description=(
            "How long the step holds, with the step check watching the new revision's routers, "
            "before the next step starts."
        ),
    )


def _default_steps() -> list[RolloutStepSpec]:
    return [RolloutStepSpec(weight=10), RolloutStepSpec(weight=50)]


class StepCheckSpec(_Model):
    """What the new revision's routers must show during each progressive step."""

    max_error_percent: float = Field(
        default=1.0,
        ge=0,
        le=100,
        description=(
            "Largest share (percent) of the generation requests the new revision answered "
            "during a step that may fail (a 5xx, a 499, a stream that broke after its 200 head, "
            "or a request its PD engines failed: a KV transfer or bootstrap the engines counted, "
            "whatever the client got); above it the rollout is rolled back at once. Requests "
            "refused with a 4xx are not answered ones: no number of them dilutes the share."
        ),
    )
    max_rejected_percent: float = Field(
        default=100.0,
        ge=0,
        le=100,
        description=(
            "Largest share (percent) of generation requests the new revision may refuse with a "
            "4xx (over-length prompts, invalid bodies); 100 reports the share without acting on "
            "it. Refusals count only here: never toward maxErrorPercent's share or minRequests."
        ),
    )
    min_requests: int = Field(
        default=0,
        ge=0,
        le=1_000_000,
        description=(
            "Generation requests the new revision must answer during a step before the step "
            "may end (its pause is over and the check judged enough traffic); requests refused "
            "with a 4xx do not count. 0 lets a step without traffic end when its pause is over."
        ),
    )


class RolloutSpec(_Model):
    verify_timeout_seconds: int = Field(
        default=900,
        ge=1,
        le=MAX_VERIFY_TIMEOUT_SECONDS,
        description=(
            "A new revision whose prefill and decode pods are not verified within this time is "
            "refused; the serving revision keeps serving."
        ),
    )
    min_verified_percent: int = Field(
        default=100,
        ge=1,
        le=100,
        description=(
            "Share of each role's replicas that must be verified before a new revision takes "
            "traffic (rounded up, at least one pod per role)."
        ),
    )
    scale_down_refused: bool = Field(
        default=True,
        description="Scale a refused revision's engines to zero to free their GPUs.",
    )
    reverify_interval_seconds: int = Field(
        default=30,
        ge=1,
        le=MAX_REVERIFY_INTERVAL_SECONDS,
        description="How often every engine pod is re-verified against its live engine.",
    )
    strategy: RolloutStrategy = Field(
        default=RolloutStrategy.SWITCH,
        description=(
            "Switch: all traffic moves to the new revision once it is verified. Progressive: "
            "it takes rollout.steps shares first, each held for its pause while the step check "
            "watches its routers; a failed check rolls traffic back to the serving revision."
        ),
    )
    steps: list[RolloutStepSpec] = Field(
        default_factory=_default_steps,
        min_length=1,
        max_length=10,
        description=(
            "Progressive traffic steps, weights strictly increasing and below 100; the last "
            "step is followed by 100 %."
        ),
    )
    step_check: StepCheckSpec = Field(
        default_factory=StepCheckSpec,
        description="What the new revision must show during each progressive step.",
    )
    max_split_routers: int = Field(
        default=10,
        ge=2,
        le=MAX_ROUTER_REPLICAS,
        description=(
            "Most routers the two revisions run together during a progressive step; the split "
            "is the ratio of their ready routers, so this bounds its precision "
            "(1/(2 x maxSplitRouters) of the requests, e.g. 5 points for 10)."
        ),
    )
    revision_history_limit: int = Field(
        default=3,
        ge=0,
        le=10,
        description=(
            "How many revisions that served keep their full spec in status.history, so "
            "`kubectl annotate kvmd <name> kvgate.io/rollback=<revision>` can bring one back "
            "(re-created and verified before it takes traffic) without its objects running."
        ),
    )

    @model_validator(mode="after")
    def _increasing_steps(self) -> RolloutSpec:
        weights = [step.weight for step in self.steps]
        for index in range(1, len(weights)):
            if weights[index] <= weights[index - 1]:
                raise ValueError(
                    f"steps[{index}].weight={weights[index]} is not above steps[{index - 1}]"
                    f".weight={weights[index - 1]}: progressive weights must strictly "
                    f"increase (e.g. 10, 50); got {weights}"
                )
        low, high = 100 / self.max_split_routers, 100 - 100 / self.max_split_routers
        for index, weight in enumerate(weights):
            if not low <= weight <= high:
                need = math.ceil(100 / min(weight, 100 - weight))
                raise ValueError(
                    f"steps[{index}].weight={weight} cannot be split with maxSplitRouters="
                    f"{self.max_split_routers} (each revision keeps at least one router, so "
                    f"shares run from {low:g} % to {high:g} %): raise maxSplitRouters to "
                    f"{need} or pick a weight in that range"
                )
        return self


class RatioBounds(_Model):
    """Bounds on prefill engines per decode engine, e.g. min 0.25, max 1 (1:4 to 1:1)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "self.min <= self.max",
                    "message": "prefillPerDecode.min must be at most prefillPerDecode.max",
                }
            ]
        }
    )

    min: float = Field(gt=0, le=MAX_ENGINE_REPLICAS, description="Fewest prefill per decode.")
    max: float = Field(gt=0, le=MAX_ENGINE_REPLICAS, description="Most prefill per decode.")


class ModelDeploymentSpec(_Model):
    model: ModelSpec = Field(description="The model and the context window it advertises.")
    engine: EngineSpec = Field(description="The SGLang engine shared by both roles.")
    safety: SafetySpec = Field(
        default_factory=SafetySpec, description="What a live engine must prove."
    )
    prefill: RoleSpec = Field(default_factory=RoleSpec, description="Prefill engines.")
    decode: RoleSpec = Field(default_factory=RoleSpec, description="Decode engines.")
    router: RouterSpec = Field(
        default_factory=RouterSpec, description="The SGLang gateway in front of the engines."
    )
    rollout: RolloutSpec = Field(
        default_factory=RolloutSpec, description="How a new revision is verified and promoted."
    )
    prefill_per_decode: RatioBounds | None = Field(
        default=None,
        description=(
            "With both roles autoscaled: keep prefill engines per decode engine within these "
            "bounds. kvgate runs the nearest counts that satisfy them (it never rewrites a "
            "RoleScale's count); the RoleScale status says which bound moved a count."
        ),
    )


class ConditionStatus(StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class Condition(_Model):
    """metav1.Condition."""

    type: str = Field(min_length=1, description="Condition type, CamelCase.")
    status: ConditionStatus = Field(description="True, False or Unknown.")
    observed_generation: int | None = Field(
        default=None, ge=0, description="metadata.generation the condition was computed from."
    )
    last_transition_time: str = Field(description="When status last changed (RFC 3339).")
    reason: str = Field(min_length=1, description="CamelCase machine-readable reason.")
    message: str = Field(default="", description="Human-readable detail, with numbers.")


class PodPoolDrift(_Model):
    """One verified engine's live KV pool against the estimate for its role's shape."""

    pod: str = Field(min_length=1, max_length=253, description="Engine pod name.")
    live_kv_pool_tokens: int = Field(ge=0, description="The pool its live engine reports.")
    drift_percent: float = Field(
        description="(live − estimated) / estimated × 100; negative: the estimate was optimistic."
    )


class PoolEstimateStatus(_Model):
    """The admission estimate of a role's KV pool against its verified engines' live pools."""

    estimated_kv_pool_tokens: int = Field(
        ge=0, description="The estimator's pool for this role's shape (what admission judged)."
    )
    gpu_reserved_gi_b: float = Field(
        alias="gpuReservedGiB", ge=0, description="The reserve per GPU the estimate took."
    )
    reserve_source: str = Field(
        default="",
        max_length=256,
        description="Where that reserve came from: the spec, the cluster's measured reserve "
        "for the GPU product, or kvgate's assumption.",
    )
    drift_percent: float | None = Field(
        default=None,
        description="The worst verified pod's (live − estimated) / estimated × 100.",
    )
    optimistic: bool = Field(
        default=False,
        description="A verified pod's live pool is more than optimisticDriftPercent below the "
        "estimate: admission allows shapes that may not hold (measure the GPU's reserve).",
    )
    optimistic_drift_percent: float = Field(
        default=10.0, ge=0, description="The threshold (the operator's setting)."
    )
    pods: list[PodPoolDrift] = Field(
        default_factory=list,
        max_length=16,
        description="Each verified pod's drift, worst first (at most 16).",
    )
    message: str = Field(default="", description="The numbers and the way out.")


class EngineDefenceStatus(_Model):
    """One of SGLang's own KV defences on this role's engines (target revision)."""

    name: str = Field(max_length=64, description="The spec.safety field that asks for it.")
    enabled: bool = Field(description="Whether the engines run with it.")
    message: str = Field(
        default="", max_length=512, description="When off: why, and the way to turn it on."
    )


class RoleStatus(_Model):
    replicas: int = Field(
        default=0, ge=0, description="Engine pods of this role (target revision)."
    )
    ready_replicas: int = Field(default=0, ge=0, description="Pods that are Ready.")
    verified_replicas: int = Field(
        default=0, ge=0, description="Pods whose live engine passed verification."
    )
    min_verified_kv_pool_tokens: int | None = Field(
        default=None,
        ge=0,
        description="Smallest KV pool (tokens) among this role's verified pods.",
    )
    pool_estimate: PoolEstimateStatus | None = Field(
        default=None,
        description="The admission estimate for this role's shape against the live pools of "
        "its verified pods (absent: nothing to compare).",
    )
    engine_defences: list[EngineDefenceStatus] = Field(
        default_factory=list,
        max_length=8,
        description="SGLang's own KV defences (KV-transfer checksums, deferred decode KV "
        "release) on the target revision's engines: on, or off with the reason.",
    )


class RevisionRecord(_Model):
    """What one revision's engines must prove, recorded when kvgate rolls the revision out."""

    revision: str = Field(min_length=1, max_length=63, description="Revision hash.")
    context_length: int = Field(ge=1, description="model.contextLength of that revision.")
    headroom: float = Field(ge=1.0, description="safety.headroom of that revision.")
    min_engine_version: str = Field(
        min_length=1, max_length=64, description="safety.minEngineVersion of that revision."
    )


class RefusalStatus(_Model):
    reason: str = Field(
        min_length=1, description="EngineUnsafe or VerificationTimeout (CamelCase)."
    )
    message: str = Field(default="", description="Why, with the numbers.")


class RefusedRevisionRecord(_Model):
    """One revision verification refused, as kvgate decided it (``kvgate history`` lists it)."""

    revision: str = Field(min_length=1, max_length=63, description="Revision hash.")
    reason: str = Field(
        min_length=1, max_length=128, description="Why, as a CamelCase reason (EngineUnsafe...)."
    )
    message: str = Field(default="", description="Why, with the numbers.")
    refused_at: str | None = Field(default=None, description="When kvgate refused it (RFC 3339).")


class RouterCountersStatus(_Model):
    """One of the target's router pods' generation-path responses when the step began."""

    pod: str = Field(min_length=1, max_length=253, description="Router pod name.")
    requests: int = Field(default=0, ge=0, description="Responses to generation requests.")
    errors: int = Field(default=0, ge=0, description="Of which 5xx.")
    rejected: int = Field(default=0, ge=0, description="Of which 4xx (over-length among them).")


class EngineFailuresStatus(_Model):
    """One of the target's engine pods' failed PD requests (SGLang's counters) when the step
    began."""

    pod: str = Field(min_length=1, max_length=253, description="Engine pod name.")
    role: str = Field(default="", max_length=16, description="prefill or decode.")
    transfers: int = Field(
        default=0, ge=0, description="sglang:num_transfer_failed_reqs_total (every rank)."
    )
    bootstraps: int = Field(
        default=0, ge=0, description="sglang:num_bootstrap_failed_reqs_total (every rank)."
    )


class ProgressiveStepStatus(_Model):
    """The progressive step in progress (rollout.strategy Progressive)."""

    index: int = Field(ge=0, description="Index into spec.rollout.steps.")
    weight: int = Field(ge=0, le=100, description="The step's share of requests (percent).")
    started_at: str = Field(description="When the step began (RFC 3339); its pause runs from here.")
    serving_router_replicas: int = Field(
        default=1, ge=0, description="The serving revision's routers before the split."
    )
    baseline: list[RouterCountersStatus] = Field(
        default_factory=list,
        max_length=MAX_ROUTER_REPLICAS,
        description="The target's router counters when the step began.",
    )
    engine_baseline: list[EngineFailuresStatus] = Field(
        default_factory=list,
        max_length=2 * MAX_ENGINE_REPLICAS,
        description="The target's engine pods' failure counters when the step began.",
    )
    check: str = Field(default="", description="The step check so far, with the numbers.")


class RolloutStatus(_Model):
    """kvgate's record of targetRevision's rollout; it outlives the Deployments' annotations."""

    verify_started_at: str | None = Field(
        default=None,
        description=(
            "When verification of targetRevision began (RFC 3339); "
            "rollout.verifyTimeoutSeconds runs from here."
        ),
    )
    refusal: RefusalStatus | None = Field(
        default=None, description="Why targetRevision was refused; absent unless it was."
    )
    step: ProgressiveStepStatus | None = Field(
        default=None,
        description="targetRevision's progressive step in progress; absent outside a split.",
    )


class ContentProbeStatus(_Model):
    """One probe request of a content check and what came back."""

    name: str = Field(min_length=1, description="What the length is.")
    prompt_tokens: int = Field(ge=1, description="Prompt length in tokens.")
    max_new_tokens: int = Field(ge=1, description="Tokens asked for.")
    expect: str = Field(min_length=1, description="Answer, Refusal, KnownAnswer or Abort.")
    http_status: int | None = Field(
        default=None, description="HTTP status through the router; absent: no answer."
    )
    generated_tokens: int = Field(default=0, ge=0, description="Tokens the client received.")
    error: str | None = Field(
        default=None, description="The answer's error (shortened), or why nothing came back."
    )
    passed: bool = Field(description="The answer is what a safe engine gives.")


class ContentCheckStatus(_Model):
    """A revision's content check at maximum length (safety.contentProbe)."""

    revision: str = Field(min_length=1, max_length=63, description="Revision hash.")
    passed: bool = Field(description="Every probe got the answer a safe engine gives.")
    checked_at: str | None = Field(default=None, description="When it ran (RFC 3339).")
    message: str = Field(default="", description="The lengths and the answers.")
    probes: list[ContentProbeStatus] = Field(
        default_factory=list, max_length=16, description="Each probe and its answer."
    )


class HistoryEntry(_Model):
    """A revision that served, with the spec it was rolled out from (for kvgate.io/rollback)."""

    revision: str = Field(min_length=1, max_length=63, description="Revision hash.")
    served_at: str | None = Field(default=None, description="When it first served (RFC 3339).")
    spec: dict[str, Any] = Field(
        description=(
            "The spec of that revision, as applied (kept as written: it is validated again, by "
            "the webhook too, when restored)."
        ),
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )


class ModelDeploymentStatus(_Model):
    observed_generation: int | None = Field(
        default=None, ge=0, description="metadata.generation this status reflects."
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        description="Ready, EnginesVerified, Progressing, Degraded.",
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["type"],
        },
    )
    serving_revision: str | None = Field(
        default=None, description="Revision whose router and engines take traffic."
    )
    target_revision: str | None = Field(
        default=None, description="Revision computed from the current spec."
    )
    rollout: RolloutStatus | None = Field(
        default=None,
        description=(
            "targetRevision's verification start and refusal. With servingRevision, the "
            "durable rollout record: written only by the operator, read back every pass."
        ),
    )
    refused_revision: str | None = Field(
        default=None, description="Last revision refused by verification, if any."
    )
    refusals: list[RefusedRevisionRecord] = Field(
        default_factory=list,
        max_length=10,
        description="The last 10 revisions refused by verification, newest first, each with "
        "its reason and message: kvgate's record of refusals (Events expire, and any client "
        "that may create Events can write one). Written by the operator.",
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["revision"],
        },
    )
    traffic_split: str | None = Field(
        default=None,
        max_length=128,
        description=(
            "Each revision's share of the Service's ready routers, e.g. `4f2a=90%,9c1e=10%` "
            "(a progressive step) or `4f2a=100%`."
        ),
    )
    url: str | None = Field(
        default=None,
        max_length=512,
        description=(
            "The in-cluster URL of the ModelDeployment's Service, `http://<name>.<namespace>.svc:"
            "<spec.router.port>` (the router's OpenAI-compatible and SGLang APIs, e.g. "
            "`/v1/chat/completions`, `/generate`); unset while no revision serves."
        ),
    )
    content_checks: list[ContentCheckStatus] = Field(
        default_factory=list,
        max_length=10,
        description="Content checks at maximum length of the revisions kvgate runs (written by "
        "the operator): a revision takes traffic only after its check passed.",
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["revision"],
        },
    )
    context_length: int | None = Field(
        default=None, ge=0, description="contextLength of the serving revision."
    )
    revisions: list[RevisionRecord] = Field(
        default_factory=list,
        max_length=10,
        description="Requirements of the revisions kvgate runs (the target first). Written by "
        "the operator; engine pods are verified against these, never against pod annotations.",
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["revision"],
        },
    )
    history: list[HistoryEntry] = Field(
        default_factory=list,
        max_length=10,
        description="The last spec.rollout.revisionHistoryLimit revisions that served, newest "
        "first, with their specs: what kvgate.io/rollback=<revision> can restore. Written by "
        "the operator.",
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["revision"],
        },
    )
    prefill: RoleStatus = Field(default_factory=RoleStatus, description="Prefill engines.")
    decode: RoleStatus = Field(default_factory=RoleStatus, description="Decode engines.")
    message: str = Field(default="", description="One-line summary for humans.")


class ObjectMeta(BaseModel):
    """The slice of metav1.ObjectMeta kvgate reads; everything else is kept as given."""

    model_config = ConfigDict(extra="allow")

    name: str | None = None
    namespace: str | None = None
    generation: int | None = None
    uid: str | None = None


class ModelDeployment(_Model):
    api_version: str = Field(default=API_VERSION, description="kvgate.io/v1alpha1")
    kind: str = Field(default=KIND, description="ModelDeployment")
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: ModelDeploymentSpec
    status: ModelDeploymentStatus | None = None


SCALE_KIND = "RoleScale"
SCALE_PLURAL = "rolescales"
SCALE_SINGULAR = "rolescale"
SCALE_SHORT_NAMES = ["mdscale"]


class RoleScaleSpec(_Model):
    """One role's count, as an autoscaler or kubectl asks for it (the scale subresource)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "self.replicas <= self.maxReplicas",
                    "message": "replicas is above maxReplicas",
                    "messageExpression": (
                        "'replicas %d is above maxReplicas %d: ModelDeployment %s allows at most "
                        "%d %s engines (spec.%s.autoscaling.maxReplicas); scale to at most %d or "
                        "raise it there'.format([self.replicas, self.maxReplicas, "
                        "self.modelDeployment, self.maxReplicas, self.role, self.role, "
                        "self.maxReplicas])"
                    ),
                },
                {
                    "rule": "self.replicas >= self.minReplicas",
                    "message": "replicas is below minReplicas",
                    "messageExpression": (
                        "'replicas %d is below minReplicas %d: ModelDeployment %s keeps at least "
                        "%d %s engines (spec.%s.autoscaling.minReplicas); scale to at least %d or "
                        "lower it there'.format([self.replicas, self.minReplicas, "
                        "self.modelDeployment, self.minReplicas, self.role, self.role, "
                        "self.minReplicas])"
                    ),
                },
            ]
        }
    )

    replicas: int = Field(
        ge=0,
        le=MAX_ENGINE_REPLICAS,
        description=(
            "Engines of this role the autoscaler (or kubectl scale) asks for. kvgate sets it "
            "only when it creates this object, and never overwrites it."
        ),
    )
    model_deployment: str = Field(
        max_length=253, description="The ModelDeployment this role belongs to (set by kvgate)."
    )
    role: Role = Field(description="prefill or decode (set by kvgate).")
    min_replicas: int = Field(
        ge=0, le=MAX_ENGINE_REPLICAS, description="spec.<role>.autoscaling.minReplicas (kvgate)."
    )
    max_replicas: int = Field(
        ge=0, le=MAX_ENGINE_REPLICAS, description="spec.<role>.autoscaling.maxReplicas (kvgate)."
    )


class RoleScaleStatus(_Model):
    replicas: int = Field(
        default=0,
        ge=0,
        description=(
            "Verified Ready engines of this role in the revisions taking traffic (what an "
            "autoscaler counts as current)."
        ),
    )
    selector: str = Field(
        default="",
        max_length=4096,
        description="Label selector of this role's engine pods in the revisions taking traffic.",
    )
    effective_replicas: int = Field(
        default=0,
        ge=0,
        description="The count kvgate runs: spec.replicas within the bounds and ratio.",
    )
    draining: list[str] = Field(
        default_factory=list,
        max_length=MAX_ENGINE_REPLICAS,
        description="Engine pods out of traffic, waiting for their requests to finish.",
    )
    message: str = Field(default="", max_length=4096, description="What kvgate is doing.")
    observed_generation: int | None = Field(
        default=None, description="The RoleScale generation this status describes."
    )


class RoleScale(_Model):
    api_version: str = Field(default=API_VERSION, description="kvgate.io/v1alpha1")
    kind: str = Field(default=SCALE_KIND, description="RoleScale")
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: RoleScaleSpec
    status: RoleScaleStatus | None = None
