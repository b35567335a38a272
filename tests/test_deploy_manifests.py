"""deploy/ checked without a cluster: the Kustomize base rendered in Python (its only
transformer is a label on every object and selector), then every object's fields that
the server's behaviour depends on (and the core kinds against the Kubernetes schemas,
with kubernetes-validate): probes on the health routes, a grace period that
covers the drain, settings that exist, h2c for gRPC, the KServe runtime's contract,
the routers' sticky key; the KServe, Istio and Gateway API objects strictly against
their CRDs' schemas, vendored in tests/data/crds (jsonschema). ``nginx -t`` on
deploy/nginx (HAProxy's ``-c``: tests/e2e/test_deploy_haproxy.py)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import attrs
import jsonschema
import pytest
import yaml
from support.programs import require_program

from actorserve.server.processes import KILL_AFTER
from actorserve.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
BASE = DEPLOY / "kustomize" / "base"
FIELDS = {field.name for field in attrs.fields(Settings)}
#: the CRDs' openAPIV3Schema, vendored (tests/data/crds/README.md says from where)
CRDS = ROOT / "tests" / "data" / "crds"


def load(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def render_base() -> list[dict[str, Any]]:
    """``kubectl kustomize deploy/kustomize/base``, for what the base uses: resources
    and ``labels`` (with ``includeSelectors``)."""
    (kustomization,) = load(BASE / "kustomization.yaml")
    assert set(kustomization) <= {"apiVersion", "kind", "labels", "resources"}, (
        "a transformer this render lacks"
    )
    objects = [doc for name in kustomization["resources"] for doc in load(BASE / name)]
    for entry in kustomization.get("labels", []):
        pairs = entry["pairs"]
        for obj in objects:
            obj["metadata"].setdefault("labels", {}).update(pairs)
            if not entry.get("includeSelectors"):
                continue
            spec = obj.get("spec", {})
            if obj["kind"] == "Service":
                spec["selector"] = {**(spec.get("selector") or {}), **pairs}
            elif "selector" in spec:
                spec["selector"]["matchLabels"] = {**(spec["selector"].get("matchLabels") or {}), **pairs}
            if "template" in spec:
                spec["template"]["metadata"].setdefault("labels", {}).update(pairs)
    return objects


def by_kind(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    kinds = {obj["kind"]: obj for obj in objects}
    assert len(kinds) == len(objects)
    return kinds


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}
    settings = {name[len("ACTORSERVE_") :].lower() for name in env}
    assert settings <= FIELDS, f"not a setting: {settings - FIELDS}"
    return env


def test_the_base_renders_to_objects_whose_selectors_match_their_pods() -> None:
    kinds = by_kind(render_base())
    assert set(kinds) == {"Deployment", "Service", "PodDisruptionBudget", "HorizontalPodAutoscaler"}
    for obj in kinds.values():
        assert obj["apiVersion"] and obj["metadata"]["name"] == "actorserve"
    pod_labels = kinds["Deployment"]["spec"]["template"]["metadata"]["labels"]
    assert kinds["Deployment"]["spec"]["selector"]["matchLabels"] == pod_labels
    assert kinds["Service"]["spec"]["selector"] == pod_labels
    assert kinds["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"] == pod_labels
    assert kinds["HorizontalPodAutoscaler"]["spec"]["scaleTargetRef"]["name"] == "actorserve"


#: the Kubernetes version the base is checked against (preStop ``sleep``: 1.29 and later)
KUBERNETES_VERSION = "1.30"


def test_the_base_is_valid_against_the_kubernetes_schemas() -> None:
    """Every object, strictly (an unknown field fails), against the schemas
    kubernetes-validate bundles: no cluster, no network."""
    try:
        import kubernetes_validate
    except ImportError:
        pytest.fail("kubernetes-validate is not installed (it is in the 'test' extra)")
    for obj in render_base():
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


def test_the_deployment_probes_drains_and_names_its_replicas() -> None:
    deployment = by_kind(render_base())["Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = env_of(container)
    assert env["ACTORSERVE_REPLICA_ID"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    # the default shape (fronts and an engine process): the fronts, then the engine, stop
    shape_stops = 1 if env.get("ACTORSERVE_API_WORKERS") == "0" else 2
    assert container["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    pause = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    stop = shape_stops * (float(env["ACTORSERVE_GRACE_PERIOD"]) + KILL_AFTER)
    needed = pause + float(env["ACTORSERVE_DRAIN_TIMEOUT"]) + stop
    assert pod["terminationGracePeriodSeconds"] > needed  # else the kubelet kills a draining pod
    assert {m["mountPath"] for m in container["volumeMounts"]} == {
        "/mnt/models",
        "/var/run/secrets/actorserve",
    }
    assert container["args"] == ["/mnt/models"]
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"http": 8080, "grpc": 8081}


def test_the_service_speaks_h2c_to_grpc() -> None:
    service = by_kind(render_base())["Service"]
    ports = {p["name"]: p for p in service["spec"]["ports"]}
    assert ports["grpc"]["appProtocol"] == "kubernetes.io/h2c"
    assert (ports["http"]["port"], ports["grpc"]["port"]) == (8080, 8081)


def test_the_kserve_runtime_and_inference_service() -> None:
    (runtime,) = load(DEPLOY / "kserve" / "cluster-serving-runtime.yaml")
    (isvc,) = load(DEPLOY / "kserve" / "inference-service.yaml")
    assert (runtime["apiVersion"], runtime["kind"]) == ("serving.kserve.io/v1alpha1", "ClusterServingRuntime")
    spec = runtime["spec"]
    assert set(spec["protocolVersions"]) == {"v2", "grpc-v2"}
    assert spec["annotations"]["prometheus.kserve.io/path"] == "/metrics"
    (container,) = spec["containers"]
    assert container["name"] == "kserve-container" and container["args"] == ["/mnt/models"]
    env_of(container)
    assert (isvc["apiVersion"], isvc["kind"]) == ("serving.kserve.io/v1beta1", "InferenceService")
    assert isvc["metadata"]["annotations"]["serving.kserve.io/deploymentMode"] == "RawDeployment"
    model = isvc["spec"]["predictor"]["model"]
    assert model["runtime"] == runtime["metadata"]["name"]
    assert model["modelFormat"]["name"] == spec["supportedModelFormats"][0]["name"]


def test_the_routers_stick_on_the_sequence_id_header() -> None:
    (rule,) = load(DEPLOY / "istio" / "destination-rule.yaml")
    assert rule["kind"] == "DestinationRule"
    assert rule["spec"]["trafficPolicy"]["loadBalancer"]["consistentHash"] == {
        "httpHeaderName": "sequence-id"
    }
    http, grpc = load(DEPLOY / "gateway-api" / "routes.yaml")
    assert (http["kind"], grpc["kind"]) == ("HTTPRoute", "GRPCRoute")
    assert http["spec"]["rules"][0]["backendRefs"] == [{"name": "actorserve", "port": 8080}]
    assert grpc["spec"]["rules"][0]["backendRefs"] == [{"name": "actorserve", "port": 8081}]
    assert grpc["spec"]["rules"][0]["matches"][0]["method"]["service"] == "inference.GRPCInferenceService"
    nginx = (DEPLOY / "nginx" / "nginx.conf").read_text()
    assert nginx.count("hash $http_sequence_id consistent;") == 2


def strict(schema: Any) -> Any:
    """``schema`` with ``additionalProperties: false`` wherever it lists ``properties`` and
    keeps no unknown fields: the API server prunes an unknown field (kubectl
    ``--validate=strict`` refuses it), so a misspelt field must fail here."""
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: strict(value) for key, value in schema.items()}
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


OBJECT_FIELDS: dict[str, Any] = {
    "apiVersion": {"type": "string"},
    "kind": {"type": "string"},
    "metadata": {"type": "object"},
}


def crd_validator(kind: str, version: str) -> jsonschema.protocols.Validator:
    schema = json.loads((CRDS / f"{kind.lower()}-{version}.json").read_text())
    # the API server knows these of every object; some CRDs (Istio's) do not list them
    schema["properties"] = {**OBJECT_FIELDS, **schema["properties"]}
    return jsonschema.Draft4Validator(strict(schema))


CUSTOM_OBJECTS = [
    ("kserve/cluster-serving-runtime.yaml", 0),
    ("kserve/inference-service.yaml", 0),
    ("istio/destination-rule.yaml", 0),
    ("gateway-api/routes.yaml", 0),
    ("gateway-api/routes.yaml", 1),
    ("gateway-api/inference-pool.yaml", 0),
    ("gateway-api/inference-pool.yaml", 6),
]


@pytest.mark.parametrize(("path", "index"), CUSTOM_OBJECTS)
def test_the_custom_objects_are_valid_against_their_crd_schemas(path: str, index: int) -> None:
    obj = load(DEPLOY / path)[index]
    version = obj["apiVersion"].rsplit("/", 1)[1]
    errors = [e.message for e in crd_validator(obj["kind"], version).iter_errors(obj)]
    assert errors == []


def test_the_crd_schemas_refuse_a_misspelt_field() -> None:
    """The check above is strict: an unknown field and a wrong enum value fail."""
    (rule,) = load(DEPLOY / "istio" / "destination-rule.yaml")
    hashing = rule["spec"]["trafficPolicy"]["loadBalancer"]["consistentHash"]
    hashing["httpHeadrName"] = hashing.pop("httpHeaderName")
    assert not crd_validator("DestinationRule", "v1").is_valid(rule)
    (runtime,) = load(DEPLOY / "kserve" / "cluster-serving-runtime.yaml")
    runtime["spec"]["containers"][0]["imagePullPolcy"] = "Always"
    assert not crd_validator("ClusterServingRuntime", "v1alpha1").is_valid(runtime)
    http, _ = load(DEPLOY / "gateway-api" / "routes.yaml")
    http["spec"]["rules"][0]["matches"][0]["path"]["type"] = "Glob"
    assert not crd_validator("HTTPRoute", "v1").is_valid(http)
    pool = load(DEPLOY / "gateway-api" / "inference-pool.yaml")[0]
    pool["spec"]["endpointPickerRef"]["failureMode"] = "FailSometimes"
    assert not crd_validator("InferencePool", "v1").is_valid(pool)
    pool = load(DEPLOY / "gateway-api" / "inference-pool.yaml")[0]
    pool["spec"]["targetPort"] = pool["spec"].pop("targetPorts")
    assert not crd_validator("InferencePool", "v1").is_valid(pool)


#: the Inference Extension's model-server protocol -> the endpoint picker's flag
EPP_FLAGS = {
    "TotalQueuedRequests": "--total-queued-requests-metric",
    "TotalRunningRequests": "--total-running-requests-metric",
    "KVCacheUtilization": "--kv-cache-usage-percentage-metric",
}


def test_the_inference_pool_picks_by_actorserves_own_gauges() -> None:
    """deploy/gateway-api/inference-pool.yaml: the pool selects the base's pods on their
    REST port, its picker is the Service the pool names and reads the three gauges of
    the model-server protocol under the names actorserve exports (docs/metrics.md's
    table); the core objects valid against the Kubernetes schemas."""
    import kubernetes_validate

    objects = load(DEPLOY / "gateway-api" / "inference-pool.yaml")
    kinds = {(obj["kind"], obj["metadata"]["name"]): obj for obj in objects}
    pool = kinds["InferencePool", "actorserve"]
    pod_labels = by_kind(render_base())["Deployment"]["spec"]["template"]["metadata"]["labels"]
    assert pool["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert pool["spec"]["targetPorts"] == [{"number": 8080}]
    picker = pool["spec"]["endpointPickerRef"]
    service = kinds["Service", picker["name"]]
    assert [p["port"] for p in service["spec"]["ports"]] == [picker["port"]["number"]]
    deployment = kinds["Deployment", picker["name"]]
    assert service["spec"]["selector"] == deployment["spec"]["template"]["metadata"]["labels"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    flags = dict(arg.split("=", 1) for arg in container["args"])
    assert flags["--pool-name"] == pool["metadata"]["name"]
    assert flags["--model-server-metrics-path"] == "/metrics"
    documented = (ROOT / "docs" / "metrics.md").read_text()
    for metric, flag in EPP_FLAGS.items():
        name = flags[flag]
        row = re.search(rf"\| `{metric}`[^\n]*\| `{re.escape(name)}` \|", documented)
        assert row is not None, (metric, name)
    route = kinds["HTTPRoute", "actorserve-pool"]
    assert route["spec"]["rules"][0]["backendRefs"] == [
        {"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": "actorserve"}
    ]
    for obj in objects:
        if obj["apiVersion"] in ("v1", "apps/v1", "rbac.authorization.k8s.io/v1"):
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


def test_the_gauges_the_picker_reads_exist() -> None:
    """Every metric the picker is told to read is one the server exports."""
    from actorserve.metrics import Metrics

    exported = {family.name for family in Metrics().registry.collect()}
    flags = dict(
        arg.split("=", 1)
        for obj in load(DEPLOY / "gateway-api" / "inference-pool.yaml")
        if obj["kind"] == "Deployment"
        for arg in obj["spec"]["template"]["spec"]["containers"][0]["args"]
    )
    assert {flags[flag] for flag in EPP_FLAGS.values()} <= exported


def test_nginx_accepts_its_configuration(tmp_path: Path) -> None:
    binary = require_program("nginx", "nginx -t checks deploy/nginx's configuration")
    checked = subprocess.run(
        [
            binary,
            "-t",
            "-c",
            str(DEPLOY / "nginx" / "nginx.conf"),
            "-p",
            str(tmp_path),
            "-e",
            str(tmp_path / "error.log"),
        ],
        capture_output=True,
        timeout=30,
    )
    assert checked.returncode == 0, checked.stderr.decode()


def test_the_images_install_the_package_and_serve_the_model_mount() -> None:
    for name in ("Dockerfile", "Dockerfile.cuda"):
        text = (DEPLOY / "image" / name).read_text()
        assert "pip install --no-cache-dir ." in text and 'CMD ["/mnt/models"]' in text
        assert "ACTORSERVE_API_WORKERS" not in text  # the default shape: the drain works in both


#: where the manifests mount the token Secret, and the file ACTORSERVE_TOKEN_FILE names
TOKENS_MOUNT = "/var/run/secrets/actorserve"


def every_manifest() -> list[tuple[Path, dict[str, Any]]]:
    return [(path, doc) for path in sorted(DEPLOY.rglob("*.yaml")) for doc in load(path)]


def containers_of(doc: dict[str, Any]) -> list[dict[str, Any]]:
    spec = doc.get("spec", {})
    pod = spec.get("template", {}).get("spec", spec)
    return list(pod.get("containers", []))


def test_no_manifest_turns_auth_off() -> None:
    """Issue 30, finding 15: every actorserve container of deploy/ keeps auth on and
    reads its tokens from the Secret mounted at :data:`TOKENS_MOUNT`; nothing in
    deploy/ (manifests, image) says NO_AUTH."""
    for path in sorted(p for p in DEPLOY.rglob("*") if p.is_file()):
        assert "NO_AUTH" not in path.read_text().upper().replace("-", "_"), path
    seen = 0
    for path, doc in every_manifest():
        spec = doc.get("spec", {})
        pod = spec.get("template", {}).get("spec", spec)
        for container in containers_of(doc):
            if not str(container.get("image", "")).startswith("actorserve"):
                continue
            seen += 1
            env = env_of(container)
            assert env.get("ACTORSERVE_NO_AUTH") in (None, "false"), path
            assert env["ACTORSERVE_TOKEN_FILE"] == f"{TOKENS_MOUNT}/tokens", path
            (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == TOKENS_MOUNT]
            assert mount["readOnly"] is True
            (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
            assert volume["secret"]["secretName"] == "actorserve-tokens", path
            assert volume["secret"]["defaultMode"] & 0o022 == 0, path  # nobody but readers
    assert seen == 2  # the Kustomize base's Deployment and the KServe runtime


def pip_installs(dockerfile: str) -> list[str]:
    """Each ``pip install`` of a Dockerfile's RUN lines (continuations joined, split at
    ``&&``), in order."""
    text = (DEPLOY / "image" / dockerfile).read_text().replace("\\\n", " ")
    commands = [
        c.strip() for line in text.splitlines() if line.startswith("RUN ") for c in line[4:].split("&&")
    ]
    return [" ".join(c.split()) for c in commands if c.startswith("pip install")]


@pytest.mark.parametrize(
    ("dockerfile", "index"),
    [("Dockerfile", "https://download.pytorch.org/whl/cpu"), ("Dockerfile.cuda", "https://pypi.org/simple")],
)
def test_each_image_installs_the_pinned_torch_build_it_names_once(dockerfile: str, index: str) -> None:
    """Docker cannot run here, so the Dockerfiles are read: torch is installed once, the
    pyproject's pinned version, from the index that has the build the image says (the CPU
    image from PyTorch's CPU index: PyPI's Linux torch is the CUDA build), before the
    package, whose pin it then satisfies (no second torch)."""
    pin = re.search(r'"torch==([^"]+)"', (DEPLOY.parent / "pyproject.toml").read_text())
    assert pin is not None
    installs = pip_installs(dockerfile)
    torch = [c for c in installs if re.search(r"\btorch\b", c)]
    assert torch == [f"pip install --no-cache-dir torch=={pin[1]} --index-url {index}"]
    assert installs == [*torch, "pip install --no-cache-dir ."]


def test_the_docs_say_what_the_images_run() -> None:
    deploy = " ".join((DEPLOY.parent / "docs" / "deploy.md").read_text().split())
    row = re.search(r"\| `image/Dockerfile`, `image/Dockerfile.cuda` \|([^|]*)\|", deploy)
    assert row is not None
    assert "one process" not in row[1]  # the images set no --api-workers: the default shape
    assert "the default shape" in row[1]
    assert "CPU index" in row[1] and "CUDA build" in row[1]
