"""The Kubernetes recipe for ``verify-server`` (deploy/kubernetes): every manifest against the
API's own schemas (kubernetes-validate's bundled copies, strict: an unknown field fails),
offline, on the oldest Kubernetes it needs (1.29, native sidecars) and the newest; and the
pieces agreeing with each other and with the server's own command line."""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from codepost.flows.cli import build_parser
from codepost.settings.config import load_config
from codepost.verifiers.server.config import ServerConfig

MANIFESTS = Path(__file__).parents[1] / "deploy" / "kubernetes"
VERSIONS = ["1.29.0", "1.37.0"]


def _documents() -> dict[str, dict[str, Any]]:
    """Every manifest by kind."""
    documents = [doc for path in sorted(MANIFESTS.glob("*.yaml"))
                 for doc in yaml.safe_load_all(path.read_text()) if doc]  # fmt: skip
    return {doc["kind"]: doc for doc in documents}


@pytest.fixture
def offline(monkeypatch):
    """No socket can be opened: the schemas must come from the package."""

    def refused(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the validation tried to reach the network")

    monkeypatch.setattr(socket, "socket", refused)
    monkeypatch.setattr(socket, "create_connection", refused)


@pytest.mark.parametrize("version", VERSIONS)
def test_every_manifest_is_valid_against_the_kubernetes_schemas(offline, version):
    documents = _documents()
    assert set(documents) == {"Deployment", "Service", "Secret", "HorizontalPodAutoscaler",
                              "NetworkPolicy"}  # fmt: skip
    for document in documents.values():
        kubernetes_validate.validate(document, version, strict=True)


def test_the_validator_refuses_a_misspelt_field(offline):
    """A field the API does not have, and a probe without its port: both refused."""
    deployment = _documents()["Deployment"]
    server = deployment["spec"]["template"]["spec"]["containers"][0]
    misspelt = {**server, "readinesProbe": server["readinessProbe"]}
    deployment["spec"]["template"]["spec"]["containers"] = [misspelt]
    with pytest.raises(kubernetes_validate.ValidationError, match="readinesProbe"):
        kubernetes_validate.validate(deployment, VERSIONS[0], strict=True)
    no_port = {**server, "readinessProbe": {"httpGet": {"path": "/health"}}}
    deployment["spec"]["template"]["spec"]["containers"] = [no_port]
    with pytest.raises(kubernetes_validate.ValidationError, match="port"):
        kubernetes_validate.validate(deployment, VERSIONS[0], strict=True)


def test_the_pieces_agree_with_each_other_and_with_the_server():
    documents = _documents()
    pod = documents["Deployment"]["spec"]["template"]
    labels = pod["metadata"]["labels"]
    assert documents["Deployment"]["spec"]["selector"]["matchLabels"] == labels
    assert documents["Service"]["spec"]["selector"] == labels
    assert documents["NetworkPolicy"]["spec"]["podSelector"]["matchLabels"] == labels
    assert (
        documents["HorizontalPodAutoscaler"]["spec"]["scaleTargetRef"]["name"]
        == (documents["Deployment"]["metadata"]["name"])
    )
    (server,) = pod["spec"]["containers"]
    script = shlex.split(server["command"][-1])
    cleanup = script[script.index("-c") + 1]
    compile(cleanup, "the start's clean-up", "exec")  # Python the server's image runs
    argv = script[script.index("exec") + 1 :]
    assert argv[0] == "codepost"
    args = build_parser("verify-server").parse_args(argv[1:])  # the flags the server has
    config = load_config(ServerConfig, args.config, args.settings)
    assert config.host == "0.0.0.0"
    (port,) = server["ports"]
    assert port["containerPort"] == config.port
    assert server["readinessProbe"]["httpGet"] == {"path": "/health", "port": port["name"]}
    (service_port,) = documents["Service"]["spec"]["ports"]
    assert service_port["targetPort"] == port["name"]
    assert documents["NetworkPolicy"]["spec"]["ingress"][0]["ports"][0]["port"] == config.port
    token = next(e for e in server["env"] if e["name"] == "CODEPOST_SERVER_TOKEN")
    secret = documents["Secret"]
    assert token["valueFrom"]["secretKeyRef"] == {"name": secret["metadata"]["name"],
                                                  "key": "token"}  # fmt: skip
    assert secret["stringData"] == {"token": ""}  # no token committed: the server refuses ""
    # the server and the engine sidecar share the engine's socket
    engine = next(c for c in pod["spec"]["initContainers"] if c["name"] == "docker")
    socket_dir = next(m["mountPath"] for m in engine["volumeMounts"] if m["name"] == "dind-socket")
    docker_host = next(e["value"] for e in server["env"] if e["name"] == "DOCKER_HOST")
    assert docker_host == f"unix://{socket_dir}/docker.sock"
    assert f"--host={docker_host}" in engine["args"]
    assert engine["restartPolicy"] == "Always"  # a sidecar, started before the server
    # the pod waits for a shutdown that lets accepted requests finish
    assert pod["spec"]["terminationGracePeriodSeconds"] > config.shutdown_timeout_s


def test_the_secret_as_committed_keeps_the_server_from_starting():
    """Applied unchanged, the empty token is refused (exit 2) before any container starts."""
    token = _documents()["Secret"]["stringData"]["token"]
    codepost = Path(sys.executable).parent / "codepost"
    refused = subprocess.run(
        [str(codepost), "verify-server", "--port", "0"],
        env={**os.environ, "CODEPOST_SERVER_TOKEN": token},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode == 2, refused.stderr
    assert "token" in refused.stderr and "got an empty one" in refused.stderr
