"""Where the model lives (and its LoRA adapters): URIs, the Hub's token, the fetch cache."""

from __future__ import annotations

from enum import StrEnum

from pydantic import ConfigDict, Field

from .base import SpecModel, cel, cel_rules
from .names import HF_URI_PATTERN, MODEL_URI_PATTERN, SAFE_NAME_PATTERN, DnsLabel, DnsSubdomain, SafeName


class ModelFormat(StrEnum):
    ONNX = "onnx"
    TORCHSCRIPT = "torchscript"


SHA256_MESSAGE = "model.sha256 applies to http(s):// model URIs, which name one file"


class HuggingFaceSpec(SpecModel):
    """Access to the Hugging Face Hub for hf:// models: a token and, for mirrors, an endpoint."""

    token_secret: DnsSubdomain | None = Field(
        None,
        description="Name of a Secret in the namespace holding the Hub token (exposed as HF_TOKEN).",
    )
    token_key: str = Field(
        "token", pattern=r"^[-._a-zA-Z0-9]+$", max_length=253, description="Key of the token in that Secret."
    )
    endpoint: str | None = Field(
        None,
        pattern=r"^https?://\S+$",
        max_length=2048,
        description="Hub endpoint (HF_ENDPOINT), e.g. an in-house mirror; the public Hub when unset.",
    )


CACHE_PVC_MESSAGE = "model.cachePvc applies to fetched models (s3://, http(s)://, hf://), not pvc:// or oci://"


class ModelSpec(SpecModel):
    """The model to serve: where it lives (uri), its format and version, the name clients ask for,
    and, for fetched models, the Hub's credentials and a cache to keep the copy on."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            cel(
                "!has(self.sha256) || (has(self.uri) && self.uri.startsWith('http'))",
                SHA256_MESSAGE,
                ".sha256",
            ),
            cel(
                "!has(self.cachePvc) || !has(self.uri)"
                " || !(self.uri.startsWith('pvc://') || self.uri.startsWith('oci://'))",
                CACHE_PVC_MESSAGE,
                ".cachePvc",
            ),
        )
    )

    uri: str = Field(
        pattern=MODEL_URI_PATTERN,
        max_length=2048,
        description="pvc://CLAIM/PATH mounts a claim read-only; s3://, http(s)://, oci:// and hf://ORG/NAME[@REVISION] "
        "are fetched by an init container.",
    )
    format: ModelFormat = Field(
        ModelFormat.ONNX,
        description="How the model server loads the model (engine modelServer): onnx with ONNX Runtime (on "
        "runtime.executionProviders), torchscript with torch. vLLM reads the model's own layout.",
    )
    version: SafeName | None = Field(
        None,
        description="Model version to serve (a directory of the model repository); the highest version found "
        "when unset.",
    )
    name: SafeName | None = Field(
        None,
        description="Model name in the inference API and metrics; defaults to the InferenceService's name.",
    )
    hugging_face: HuggingFaceSpec | None = Field(
        None, description="Hub token and endpoint for hf:// URIs (the model's and the adapters')."
    )
    cache_pvc: DnsLabel | None = Field(
        None,
        description="A (ReadWriteMany) PersistentVolumeClaim to keep fetched models on: replicas and restarts reuse "
        "the copy instead of downloading again. Without it each pod fetches into an emptyDir.",
    )

    sha256: str | None = Field(
        None,
        pattern=r"^[0-9a-f]{64}$",
        description="SHA-256 (hex) of the file an http(s):// URI names; the init container refuses any other "
        "content before the server sees it.",
    )

    @property
    def scheme(self) -> str:
        return self.uri.split("://", 1)[0]


# hf://ORG/NAME[@REVISION] or s3://BUCKET/PATH: a directory of PEFT adapter files.
ADAPTER_URI_PATTERN = rf"^({HF_URI_PATTERN}|s3://[a-z0-9][-a-z0-9.]*[a-z0-9](/\S*)?)$"


class AdapterSpec(SpecModel):
    """A LoRA adapter of the base model, served by name through the OpenAI API (engine vllm)."""

    name: str = Field(
        pattern=SAFE_NAME_PATTERN,
        max_length=63,
        description="The name clients ask for (the OpenAI `model` field); not the base model's.",
    )
    uri: str = Field(
        pattern=ADAPTER_URI_PATTERN,
        max_length=2048,
        description="hf://ORG/NAME[@REVISION] (with model.huggingFace's token and endpoint) or s3://BUCKET/PATH: "
        "a PEFT LoRA adapter's directory (adapter_config.json and its weights).",
    )
