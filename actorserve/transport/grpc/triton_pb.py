"""Triton's model configuration and statistics as ``inference`` protobuf messages, from
the JSON shape of :mod:`actorserve.transport.triton` (one source for both transports),
and the parameters of a RepositoryModelLoad / Unload request as plain values. No I/O."""

from __future__ import annotations

from typing import Any

import betterproto2

from ...proto.inference import (
    DataType,
    InferBatchStatistics,
    InferStatistics,
    ModelConfig,
    ModelDynamicBatching,
    ModelInput,
    ModelInstanceGroup,
    ModelInstanceGroupKind,
    ModelOutput,
    ModelRepositoryParameter,
    ModelSequenceBatching,
    ModelStatistics,
    ModelStatisticsResponse,
    StatisticDuration,
)


def config_to_pb(config: dict[str, Any]) -> ModelConfig:
    """:func:`~actorserve.transport.triton.config_json` as a ``ModelConfig`` message."""
    dynamic = config.get("dynamic_batching")
    sequence = config.get("sequence_batching")
    return ModelConfig(
        name=config["name"],
        platform=config["platform"],
        backend=config["backend"],
        max_batch_size=config["max_batch_size"],
        input=[
            ModelInput(name=t["name"], data_type=DataType[t["data_type"]], dims=t["dims"])
            for t in config["input"]
        ],
        output=[
            ModelOutput(name=t["name"], data_type=DataType[t["data_type"]], dims=t["dims"])
            for t in config["output"]
        ],
        instance_group=[
            ModelInstanceGroup(name=g["name"], kind=ModelInstanceGroupKind.CPU, count=g["count"])
            for g in config["instance_group"]
        ],
        dynamic_batching=ModelDynamicBatching(**dynamic) if dynamic is not None else None,
        sequence_batching=ModelSequenceBatching(**sequence) if sequence is not None else None,
    )


def _duration(value: dict[str, int]) -> StatisticDuration:
    return StatisticDuration(count=value["count"], ns=value["ns"])


def statistics_to_pb(stats: dict[str, Any]) -> ModelStatisticsResponse:
    """:func:`~actorserve.transport.triton.statistics_json` as its response message."""
    models = []
    for s in stats["model_stats"]:
        phases = s["inference_stats"]
        models.append(
            ModelStatistics(
                name=s["name"],
                version=s["version"],
                last_inference=s["last_inference"],
                inference_count=s["inference_count"],
                execution_count=s["execution_count"],
                inference_stats=InferStatistics(**{phase: _duration(v) for phase, v in phases.items()}),
                batch_stats=[
                    InferBatchStatistics(
                        batch_size=b["batch_size"],
                        **{
                            phase: _duration(b[phase])
                            for phase in ("compute_input", "compute_infer", "compute_output")
                        },
                    )
                    for b in s["batch_stats"]
                ],
            )
        )
    return ModelStatisticsResponse(model_stats=models)


def repository_parameters(parameters: dict[str, ModelRepositoryParameter]) -> dict[str, Any]:
    """A load / unload request's parameters as plain values (bytes as bytes)."""
    plain: dict[str, Any] = {}
    for key, parameter in parameters.items():
        _, value = betterproto2.which_one_of(parameter, "parameter_choice")
        plain[key] = value
    return plain
