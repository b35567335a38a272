"""Triton's model configuration and statistics in its JSON shape, and the parameters of
its repository load / unload requests. The configuration and statistics are the REST answers of
``GET /v2/models/{name}/config`` and ``/stats``; the gRPC transport builds its messages
from the same dicts. No I/O.

The configuration says what applies to actorserve: inputs and outputs (``dims`` are
each request's full shape: a request is one member of a continuous batch, no tensor
dimension is added), ``max_batch_size`` (requests stepped together), the instance
count (workers, ``KIND_CPU``), and ``sequence_batching`` for a model that needs
sequences, else ``dynamic_batching`` for a BatchModel (Triton allows one of them).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

from ..api import Duration, InferenceStatistics, ModelDescription, ModelMetadata, TensorMetadata
from ..errors import BadInput

#: OIP datatype -> Triton's config data type
DATA_TYPES: Final = {
    "BOOL": "TYPE_BOOL",
    "UINT8": "TYPE_UINT8",
    "UINT16": "TYPE_UINT16",
    "UINT32": "TYPE_UINT32",
    "UINT64": "TYPE_UINT64",
    "INT8": "TYPE_INT8",
    "INT16": "TYPE_INT16",
    "INT32": "TYPE_INT32",
    "INT64": "TYPE_INT64",
    "FP16": "TYPE_FP16",
    "FP32": "TYPE_FP32",
    "FP64": "TYPE_FP64",
    "BYTES": "TYPE_STRING",
    "BF16": "TYPE_BF16",
}

#: what ``backend`` says: the models are Python objects run by actorserve
BACKEND: Final = "actorserve"

#: The protocol extensions this server really implements: what REST's ``GET /v2`` and
#: gRPC's ServerMetadata both report.
EXTENSIONS: Final = (
    "binary_tensor_data",
    "generate",
    "model_repository",
    "parameters",
    "sequence",
    "streaming",
)


def _tensors(specs: tuple[TensorMetadata, ...]) -> list[dict[str, Any]]:
    return [
        {"name": s.name, "data_type": DATA_TYPES.get(s.datatype, "TYPE_INVALID"), "dims": list(s.shape)}
        for s in specs
    ]


def config_json(description: ModelDescription, metadata: ModelMetadata) -> dict[str, Any]:
    """Triton's model configuration (JSON names, as tritonclient.http returns it)."""
    config: dict[str, Any] = {
        "name": description.name,
        "platform": metadata.platform or description.platform,
        "backend": BACKEND,
        "max_batch_size": description.max_batch_size,
        "input": _tensors(metadata.inputs),
        "output": _tensors(metadata.outputs),
        "instance_group": [{"name": description.name, "kind": "KIND_CPU", "count": description.workers}],
    }
    if description.requires_sequence:
        config["sequence_batching"] = {
            "max_sequence_idle_microseconds": description.idle_timeout_ms * 1000,
            "iterative_sequence": description.batched,
        }
    elif description.batched:
        config["dynamic_batching"] = {"max_queue_delay_microseconds": round(description.max_batch_time * 1e6)}
    return config


def _duration(duration: Duration) -> dict[str, int]:
    return {"count": duration.count, "ns": duration.ns}


_NONE: Final = {"count": 0, "ns": 0}


def statistics_json(stats: list[InferenceStatistics]) -> dict[str, Any]:
    """Triton's ``{"model_stats": [...]}``; the phases actorserve does not measure
    apart (compute_input / compute_output, the cache) are zero."""
    return {
        "model_stats": [
            {
                "name": s.name,
                "version": s.version,
                "last_inference": s.last_inference,
                "inference_count": s.inference_count,
                "execution_count": s.execution_count,
                "inference_stats": {
                    "success": _duration(s.success),
                    "fail": _duration(s.fail),
                    "queue": _duration(s.queue),
                    "compute_input": dict(_NONE),
                    "compute_infer": _duration(s.compute_infer),
                    "compute_output": dict(_NONE),
                    "cache_hit": dict(_NONE),
                    "cache_miss": dict(_NONE),
                },
                "batch_stats": [
                    {
                        "batch_size": b.batch_size,
                        "compute_input": dict(_NONE),
                        "compute_infer": _duration(b.compute_infer),
                        "compute_output": dict(_NONE),
                    }
                    for b in s.batches
                ],
                "memory_usage": [],
            }
            for s in stats
        ]
    }


UNLOAD_DEPENDENTS_NOTE: Final = (
    "unload_dependents is ignored: actorserve models have no dependents (no ensembles)"
)


def load_config(parameters: Mapping[str, Any]) -> dict[str, Any] | None:
    """The model-settings override of a load request's parameters (Triton's ``config``:
    a JSON string; over REST also a JSON object); :class:`BadInput` for Triton's
    ``file:`` parameters (model files in the request), which actorserve does not take."""
    files = sorted(k for k in parameters if k.startswith("file:"))
    if files:
        raise BadInput(f"loading model files from the request ({', '.join(files)}) is not supported")
    config = parameters.get("config")
    if config is None or config == "":
        return None
    if isinstance(config, str):
        try:
            config = json.loads(config)
        except json.JSONDecodeError as exc:
            raise BadInput(f"parameters.config is not valid JSON: {exc}") from None
    if not isinstance(config, dict):
        raise BadInput("parameters.config must be a JSON object of model-settings.json fields")
    return config
