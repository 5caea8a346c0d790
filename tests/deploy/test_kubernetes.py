"""deploy/kubernetes renders (kustomize) and validates strictly: every built-in kind against
kubernetes-validate's schemas (--strict, and a missing schema fails), the ScaledObjects against
the strict KEDA schema in deploy/kubernetes/schemas/. The KEDA triggers watch the Redis lists RQ
queues each model's jobs in (contract/queues.py), and every SPINF_* name is a setting."""

import json
import shutil
import subprocess
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from contract import queues
from contract.settings import Settings

REPO = Path(__file__).resolve().parents[2]
KUSTOMIZE_DIR = REPO / "deploy" / "kubernetes"
KEDA_SCHEMA = json.loads((KUSTOMIZE_DIR / "schemas" / "scaledobject-keda.sh-v1alpha1.json").read_text())


@pytest.fixture(scope="module")
def rendered() -> list[dict]:
    if not shutil.which("kubectl"):
        pytest.fail("kubectl is needed to render deploy/kubernetes (kubectl kustomize)")
    text = subprocess.run(["kubectl", "kustomize", str(KUSTOMIZE_DIR)], check=True, capture_output=True, text=True).stdout
    return [doc for doc in yaml.safe_load_all(text) if doc]


def test_every_resource_validates_strictly(rendered):
    for doc in rendered:
        if doc["kind"] == "ScaledObject":
            jsonschema.Draft202012Validator(KEDA_SCHEMA).validate(doc)
            continue
        # raises on a schema violation and on a kind with no schema (SchemaNotFoundError)
        kubernetes_validate.validate(doc, "1.32.0", strict=True)


def test_the_strict_validation_can_fail(rendered):
    [scaled] = [d for d in rendered if d["kind"] == "ScaledObject"][:1]
    bad = json.loads(json.dumps(scaled))
    bad["spec"]["minReplicas"] = 1  # a misspelt field
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(KEDA_SCHEMA).validate(bad)
    [api] = [d for d in rendered if d["kind"] == "Deployment" and d["metadata"]["name"] == "spinf-api"]
    bad = json.loads(json.dumps(api))
    bad["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, "1.32.0", strict=True)
    with pytest.raises(kubernetes_validate.SchemaNotFoundError):
        kubernetes_validate.validate({"apiVersion": "example.com/v1", "kind": "Gadget", "metadata": {"name": "x"}},
                                     "1.32.0", strict=True)


def test_keda_watches_the_rq_queue_keys_of_each_model(rendered):
    config = next(d for d in rendered if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "spinf-config")["data"]
    models = dict.fromkeys([config["SPINF_DEFAULT_MODEL"], *json.loads(config["SPINF_MODELS"])])
    scale_to_zero = json.loads(config["SPINF_SCALE_TO_ZERO_MODELS"])
    scaled = [d for d in rendered if d["kind"] == "ScaledObject"]
    workers = {d["metadata"]["name"]: d for d in rendered if d["kind"] == "Deployment" and "worker" in d["metadata"]["name"]}
    for model in models:
        pair = queues.queue_pair(model)
        expected = {f"rq:queue:{pair.sync}", f"rq:queue:{pair.batch}"}  # RQ's key of each queue
        [obj] = [s for s in scaled if {t["metadata"]["listName"] for t in s["spec"]["triggers"]} == expected]
        assert all(int(t["metadata"]["activationListLength"]) >= 1 for t in obj["spec"]["triggers"])
        if model not in scale_to_zero:  # it serves sync calls: a warm worker
            assert obj["spec"]["minReplicaCount"] >= 1
        worker = workers[obj["spec"]["scaleTargetRef"]["name"]]
        [container] = worker["spec"]["template"]["spec"]["containers"]
        assert container["command"][container["command"].index("--model") + 1] == model
        assert container["resources"]["limits"]["nvidia.com/gpu"] == 1


def test_api_probes_health_and_names_only_real_settings(rendered):
    [api] = [d for d in rendered if d["kind"] == "Deployment" and d["metadata"]["name"] == "spinf-api"]
    [container] = api["spec"]["template"]["spec"]["containers"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"
    read = {f"SPINF_{name.upper()}" for name in Settings.model_fields}
    for doc in rendered:
        if doc["kind"] in ("ConfigMap", "Secret") and doc["metadata"]["name"].startswith("spinf-config") \
                or doc["metadata"]["name"] == "spinf-secrets":
            names = set(doc.get("data", {})) | set(doc.get("stringData", {}))
            assert names <= read, names - read
    secrets = next(d for d in rendered if d["metadata"]["name"] == "spinf-secrets")["stringData"]
    assert "SPINF_METRICS_TOKEN_SHA256" in secrets
    scrape = yaml.safe_load(next(d for d in rendered if d["metadata"]["name"] == "spinf-prometheus-scrape")
                            ["data"]["spinf-scrape.yaml"])
    [job] = scrape["scrape_configs"]
    assert job["metrics_path"] == "/metrics" and job["authorization"]["type"] == "Bearer"
