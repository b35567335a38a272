"""Re-make the vendored schemas: ``python tests/data/crds/extract.py SRC [KIND]`` where SRC
holds the upstream CRD files named in README.md (with KIND: only that kind's). Each file is the served version's
``openAPIV3Schema`` without its ``description`` texts; InferenceService's subtrees that
deploy/ does not use are opened (``x-kubernetes-preserve-unknown-fields``) to keep the
file small."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
#: upstream file, kind, version -> vendored file
JOBS = [
    ("serving.kserve.io_clusterservingruntimes.yaml", "ClusterServingRuntime", "v1alpha1"),
    ("serving.kserve.io_inferenceservices.yaml", "InferenceService", "v1beta1"),
    ("crd-all.gen.yaml", "DestinationRule", "v1"),
    ("gateway.networking.k8s.io_httproutes.yaml", "HTTPRoute", "v1"),
    ("gateway.networking.k8s.io_grpcroutes.yaml", "GRPCRoute", "v1"),
    ("inference.networking.k8s.io_inferencepools.yaml", "InferencePool", "v1"),
]
OPEN: dict[str, Any] = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
#: InferenceService: components and predictor frameworks deploy/ does not use
OPENED_SPEC = ("canary", "explainer", "transformer")
OPENED_PREDICTOR = (
    *("huggingface", "lightgbm", "onnx", "paddle", "pmml", "pytorch"),
    *("sklearn", "tensorflow", "triton", "workerSpec", "xgboost"),
)


def strip(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: strip(v) for k, v in node.items() if not (k == "description" and isinstance(v, str))}
    if isinstance(node, list):
        return [strip(v) for v in node]
    return node


def schema_of(path: Path, kind: str, version: str) -> dict[str, Any]:
    for doc in yaml.safe_load_all(path.read_text()):
        if doc and doc.get("kind") == "CustomResourceDefinition" and doc["spec"]["names"]["kind"] == kind:
            (served,) = [v for v in doc["spec"]["versions"] if v["name"] == version]
            return strip(served["schema"]["openAPIV3Schema"])  # type: ignore[no-any-return]
    raise LookupError(f"{kind} not in {path}")


def main(src: Path, only: str | None = None) -> None:
    for name, kind, version in JOBS:
        if only is not None and kind != only:
            continue
        schema = schema_of(src / name, kind, version)
        if kind == "InferenceService":
            spec = schema["properties"]["spec"]["properties"]
            spec.update(dict.fromkeys(OPENED_SPEC, OPEN))
            spec["predictor"]["properties"].update(dict.fromkeys(OPENED_PREDICTOR, OPEN))
        out = HERE / f"{kind.lower()}-{version}.json"
        out.write_text(json.dumps(schema, sort_keys=True, separators=(",", ":")) + "\n")


if __name__ == "__main__":
    # SRC [KIND]: only KIND's file (when SRC holds only its upstream)
    main(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else None)
