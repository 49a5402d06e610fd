"""Goal: the Kubernetes example (deploy/k8s) is valid and its parts agree. Every manifest
validates offline against the schemas that kubernetes-validate bundles (a broken one is caught);
the gateway config in the ConfigMap loads with the gateway's own checks; the plugin's
adapter_params pass the plugin's own checks and name the gateway's socket; every token file is
inside a Secret the pod mounts; the gateway serves metrics on the port it is probed and scraped
on, and probes name ports that exist; the services run as non-root."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml

import lmcache_adp.config
from adp_gateway import config as gateway_config

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = sorted((ROOT / "deploy" / "k8s").glob("*.yaml"))
# The oldest release still widely run, and the newest the package knows.
VERSIONS = ("1.28.0", kubernetes_validate.latest_version())
SOCKET = "/run/lmcache-adp/gateway.sock"  # the image's ADP_SOCKET (Dockerfile)
PROBES = ("startupProbe", "livenessProbe", "readinessProbe")


def documents() -> list[dict[str, Any]]:
    docs = []
    for path in MANIFESTS:
        docs += [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]
    return docs


def find(kind: str, name: str) -> dict[str, Any]:
    for doc in documents():
        if doc["kind"] == kind and doc["metadata"]["name"] == name:
            return doc
    raise AssertionError(f"no {kind} {name} in deploy/k8s")


def pod(workload: str) -> dict[str, Any]:
    spec: dict[str, Any] = find("DaemonSet", workload)["spec"]["template"]["spec"]
    return spec


def test_there_are_manifests() -> None:
    kinds = {doc["kind"] for doc in documents()}
    assert {"Namespace", "ConfigMap", "Secret", "DaemonSet", "Deployment"} <= kinds


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("path", MANIFESTS, ids=[p.name for p in MANIFESTS])
def test_each_manifest_matches_the_kubernetes_schema(path: Path, version: str) -> None:
    for doc in yaml.safe_load_all(path.read_text()):
        if doc is not None:
            kubernetes_validate.validate(doc, version, strict=True)


def test_a_broken_manifest_is_caught() -> None:
    broken = find("DaemonSet", "adp-gateway")
    broken["spec"]["template"]["spec"]["containers"][0]["volumeMount"] = []  # a typo
    with pytest.raises(kubernetes_validate.ValidationError, match="volumeMount"):
        kubernetes_validate.validate(broken, VERSIONS[0], strict=True)


def gateway_yaml(tmp_path: Path) -> Path:
    path = tmp_path / "gateway.yaml"
    path.write_text(find("ConfigMap", "adp-gateway-config")["data"]["gateway.yaml"])
    return path


def test_the_gateway_config_passes_the_gateways_checks(tmp_path: Path) -> None:
    config = gateway_config.load(str(gateway_yaml(tmp_path)), {})
    config.region_quotas()  # the quotas fit the capacity
    assert config.socket == SOCKET
    assert config.data_dirs == ["/var/lib/lmcache-adp"]


def container(spec: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in spec["containers"] if c["name"] == name)


def mounted_secret_files(spec: dict[str, Any], name: str) -> set[str]:
    """Paths of the Secret keys mounted into a container of a pod."""
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    files = set()
    for mount in container(spec, name).get("volumeMounts", []):
        volume = volumes[mount["name"]]
        sources = volume.get("projected", {}).get("sources", [])
        for source in sources + ([{"secret": volume["secret"]}] if "secret" in volume else []):
            for item in source.get("secret", {}).get("items", []):
                files.add(f"{mount['mountPath']}/{item['path']}")
    return files


def test_token_files_are_mounted_secrets_readable_by_the_pods_group(tmp_path: Path) -> None:
    config = gateway_config.load(str(gateway_yaml(tmp_path)), {})
    gateway_files = mounted_secret_files(pod("adp-gateway"), "gateway")
    assert {t.token_file for t in config.tenants if t.token_file} <= gateway_files
    for workload in ("adp-gateway", "lmcache-server"):
        spec = pod(workload)
        assert spec["securityContext"]["fsGroup"] == 10001
        modes = [v["projected"]["defaultMode"] for v in spec["volumes"] if "projected" in v]
        assert modes and all(mode & 0o7 == 0 for mode in modes)  # never world-readable


def lmcache_server_args() -> list[str]:
    args: list[str] = container(pod("lmcache-server"), "lmcache-server")["args"]
    return args


def test_the_lmcache_servers_plugin_params_pass_the_plugins_checks() -> None:
    args = lmcache_server_args()
    assert args[:2] == ["lmcache", "server"]
    spec = json.loads(args[args.index("--l2-adapter") + 1])
    assert (spec["type"], spec["module_path"], spec["max_capacity_gb"]) == (
        "native_plugin",
        "lmcache_adp",
        0,
    )
    params = lmcache_adp.config.parse(spec["adapter_params"])
    assert params.socket_path == SOCKET
    assert params.token_file in mounted_secret_files(pod("lmcache-server"), "lmcache-server")


def test_the_lmcache_servers_l1_is_in_the_nodes_shared_memory() -> None:
    """Zero-copy stores: L1 in a /dev/shm segment, whole from the start, on a /dev/shm that is
    the node's (a container's own is 64 MiB)."""
    args = lmcache_server_args()
    assert args[args.index("--shm-name") + 1] and "--no-l1-use-lazy" in args
    spec = pod("lmcache-server")
    mounts = {m["name"]: m["mountPath"] for m in container(spec, "lmcache-server")["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    shm = next(name for name, path in mounts.items() if path == "/dev/shm")
    assert volumes[shm]["hostPath"]["path"] == "/dev/shm"


def test_vllm_reaches_the_lmcache_server_of_its_node() -> None:
    args = lmcache_server_args()
    port = int(args[args.index("--port") + 1])
    spec = find("Deployment", "vllm")["spec"]["template"]["spec"]
    vllm_args = container(spec, "vllm")["args"]
    extra = json.loads(vllm_args[vllm_args.index("--kv-transfer-config") + 1])
    assert extra["kv_connector"] == "LMCacheMPConnector"
    assert extra["kv_connector_extra_config"]["lmcache.mp.port"] == port
    assert args[args.index("--host") + 1] == "$(NODE_IP)"
    assert pod("lmcache-server")["hostNetwork"] is True


def test_probes_and_scrape_annotations_name_real_ports() -> None:
    for doc in documents():
        if doc["kind"] not in ("DaemonSet", "Deployment"):
            continue
        template = doc["spec"]["template"]
        for c in template["spec"]["containers"]:
            names = {p["name"] for p in c.get("ports", [])}
            for probe in PROBES:
                port = c.get(probe, {}).get("httpGet", {}).get("port")
                assert port is None or port in names, f"{c['name']} {probe}: no port {port}"
        annotations = template["metadata"].get("annotations", {})
        if annotations.get("prometheus.io/scrape") == "true":
            declared = {str(p["containerPort"]) for c in template["spec"]["containers"]
                        for p in c.get("ports", [])}  # fmt: skip
            args = " ".join(a for c in template["spec"]["containers"] for a in c.get("args", []))
            port = annotations["prometheus.io/port"]
            assert port in declared or re.search(rf"--prometheus-port {port}\b", args), doc


def test_the_gateway_serves_the_port_it_is_probed_and_scraped_on(tmp_path: Path) -> None:
    config = gateway_config.load(str(gateway_yaml(tmp_path)), {})
    assert config.metrics_address is not None
    port = int(config.metrics_address.rsplit(":", 1)[1])
    gateway = container(pod("adp-gateway"), "gateway")
    assert {"name": "metrics", "containerPort": port, "protocol": "TCP"} in gateway["ports"]
    paths = {probe: gateway[probe]["httpGet"]["path"] for probe in PROBES}
    assert paths == {"startupProbe": "/readyz", "livenessProbe": "/healthz",
                     "readinessProbe": "/readyz"}  # fmt: skip
    annotations = find("DaemonSet", "adp-gateway")["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(port)


def test_the_services_run_as_the_images_non_root_user() -> None:
    for workload in ("adp-gateway", "lmcache-server"):
        context = pod(workload)["securityContext"]
        assert context["runAsNonRoot"] is True
        assert (context["runAsUser"], context["runAsGroup"]) == (10001, 10001)
        for c in pod(workload)["containers"]:
            assert c["securityContext"]["allowPrivilegeEscalation"] is False
