"""Pin -> Kubernetes: a Deployment and a Service that run exactly the pinned image.

The same pin as the compose file and the systemd unit, in Kubernetes' terms: the image by
digest, the serve command as the container's args (the image's entrypoint kept, as `docker run`
keeps it), `nvidia.com/gpu` = tensor parallel x pipeline parallel GPUs, a node selector on the
GPU Feature Discovery labels (the product with --gpu-product, else the compute capability the
stack was built for), the health path as readiness, liveness and startup probe (the startup
probe allows the pin's start period: a model loads for minutes before liveness counts), and
/dev/shm as a memory-backed emptyDir of the pin's shared-memory size (the 64 MiB default breaks
NCCL). The Deployment recreates its pod on change: a rolling update would need a second set of
GPUs while the first still serves.

Both objects are checked against the Kubernetes schema of knowledge/k8s/schema.json (strict:
an unknown field is an error) before anything is written; `kubectl apply -f k8s.yaml` is the
next step.
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from builder import REPO_ROOT
from builder.engine.protocol import ContainerSpec, HealthCheck
from builder.errors import StackError
from builder.files import write_atomic
from builder.hosts.container import SECRET_TARGET, describe
from builder.hosts.pin_schema import LABEL_CONTENT, LABEL_HOST, LABEL_STACK, Pin
from builder.vllmcli.vllm_argv import last_value

SCHEMA = REPO_ROOT / "knowledge" / "k8s" / "schema.json"
FILE = "k8s.yaml"
GPU_RESOURCE = "nvidia.com/gpu"
PRODUCT_LABEL = "nvidia.com/gpu.product"
COMPUTE_MAJOR = "nvidia.com/gpu.compute.major"
COMPUTE_MINOR = "nvidia.com/gpu.compute.minor"
CONTAINER = "server"
PORT_NAME = "http"
TP_FLAGS = ("--tensor-parallel-size", "-tp")
PP_FLAGS = ("--pipeline-parallel-size", "-pp")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


class ManifestInvalid(StackError):
    """A rendered object the Kubernetes schema refuses: a bug here, or a pin value it cannot
    take (named with its path)."""


def object_name(pin: Pin) -> str:
    """The Deployment's and Service's name: the pin's container name as a DNS-1123 label."""
    name = re.sub(r"[^a-z0-9-]+", "-", pin.container.lower()).strip("-")
    return name[:63].rstrip("-")


def gpu_count(pin: Pin) -> int:
    """GPUs the server needs: its tensor-parallel times its pipeline-parallel size, read as
    vLLM's parser reads them (vllmcli/vllm_argv)."""
    return _flag(pin.command, TP_FLAGS) * _flag(pin.command, PP_FLAGS)


def secret_name(pin: Pin) -> str:
    """The Secret holding the pin's API key: `kubectl create secret generic NAME
    --from-file=api-key=FILE` (the key is in no rendered file)."""
    return f"{object_name(pin)}-api-key"[:63]


def node_selector(pin: Pin, gpu_product: str | None) -> dict[str, str]:
    """GPU Feature Discovery labels a node must carry: the product when named, else the
    compute capability of the stack's one GPU target (several targets: the product is needed)."""
    if gpu_product is not None:
        if not _LABEL_VALUE.match(gpu_product) or len(gpu_product) > 63:
            raise StackError(
                f"{gpu_product!r} is not a label value",
                key="--gpu-product",
                hint="as nodes carry it: kubectl get nodes -L nvidia.com/gpu.product",
            )
        return {PRODUCT_LABEL: gpu_product}
    capabilities = sorted(set(pin.needs.targets.values()))
    if len(capabilities) != 1:
        raise StackError(
            f"{pin.stack} targets several GPUs ({', '.join(capabilities)}): name the nodes' one",
            key="--gpu-product",
            hint="kubectl get nodes -L nvidia.com/gpu.product shows the values",
        )
    major, minor = capabilities[0].split(".")
    return {COMPUTE_MAJOR: major, COMPUTE_MINOR: minor}


def manifests(pin: Pin, gpu_product: str | None = None) -> list[dict[str, Any]]:
    """The Deployment and the Service of the pin, checked against the Kubernetes schema.

    What runs comes from the pin's container description (hosts/container.py), as compose and
    the unit have it; the pin itself adds only what Kubernetes asks besides: the port the server
    listens on, the health path for an HTTP probe, and the GPU count and node selector."""
    spec = describe(pin)
    name = object_name(pin)
    selector = {"app.kubernetes.io/name": "sm120-stacks", "app.kubernetes.io/instance": name}
    labels = {**selector, **{key: spec.labels[key] for key in (LABEL_HOST, LABEL_STACK)}}
    annotations = {LABEL_CONTENT: spec.labels[LABEL_CONTENT], "sm120-stacks.image": spec.image}
    pod = _pod(pin, spec, gpu_product)
    deployment = _deployment(_metadata(name, labels, annotations), selector, pod)
    service = _service(_metadata(name, labels, annotations), selector, pin.serve_port)
    for document in (deployment, service):
        check(document)
    return [deployment, service]


def _metadata(name: str, labels: dict[str, str], annotations: dict[str, str]) -> dict[str, Any]:
    return {"name": name, "labels": labels, "annotations": annotations}


def _pod(pin: Pin, spec: ContainerSpec, gpu_product: str | None) -> dict[str, Any]:
    """The pod's spec: its one container (what runs, as the description says), the GPU count
    and node selector where it gets GPUs, and its volumes."""
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": spec.image,
        "imagePullPolicy": "IfNotPresent",
        "args": list(spec.command or ()),
        "env": [{"name": key, "value": value} for key, value in spec.environment.items()],
        "ports": [{"name": PORT_NAME, "containerPort": pin.serve_port, "protocol": "TCP"}],
        **_security(spec),
        **_probes(pin.health.path, spec.healthcheck),
    }
    pod: dict[str, Any] = {"containers": [container], "restartPolicy": "Always"}
    if spec.gpus is not None:
        count = gpu_count(pin)
        container["resources"] = {"limits": {GPU_RESOURCE: count}}
        pod["nodeSelector"] = node_selector(pin, gpu_product)
    mounts, volumes = _volumes(pin, spec)
    container["volumeMounts"] = mounts
    pod["volumes"] = volumes
    return pod


def _deployment(
    metadata: dict[str, Any], selector: dict[str, str], pod: dict[str, Any]
) -> dict[str, Any]:
    """One replica, replaced (not rolled: two servers would share the GPUs and the caches)."""
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata,
        "spec": {
            "replicas": 1,
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {"labels": metadata["labels"], "annotations": metadata["annotations"]},
                "spec": pod,
            },
        },
    }


def _service(metadata: dict[str, Any], selector: dict[str, str], port: int) -> dict[str, Any]:
    """A ClusterIP Service on the serve port."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata,
        "spec": {
            "type": "ClusterIP",
            "selector": selector,
            "ports": [
                {"name": PORT_NAME, "port": port, "targetPort": PORT_NAME, "protocol": "TCP"}
            ],
        },
    }


def render(pin: Pin, gpu_product: str | None = None) -> str:
    header = (
        f"# Rendered by sm120-stacks from hosts/{pin.host}.yaml; edit the pin, not this file.\n"
        f"# Runs stack {pin.stack} exactly as pinned (by digest): kubectl apply -f {FILE}\n"
        f"# The health check `docker run` would run: {_health_words(describe(pin))} ...\n"
    )
    body = yaml.safe_dump_all(manifests(pin, gpu_product), sort_keys=False, width=200)
    return header + body


def write_k8s(pin: Pin, out_dir: Path, gpu_product: str | None = None) -> Path:
    path = out_dir / FILE
    write_atomic(path, render(pin, gpu_product))
    return path


def check(document: dict[str, Any]) -> None:
    """Validate one object against its kind's schema; ManifestInvalid names the first error."""
    import jsonschema

    kind = str(document.get("kind"))
    schema = _schemas().get(kind)
    if schema is None:
        raise ManifestInvalid(f"no schema for kind {kind!r} in {SCHEMA}")
    errors = sorted(
        jsonschema.Draft202012Validator(schema).iter_errors(document),
        key=lambda e: list(e.absolute_path),
    )
    if errors:
        first = errors[0]
        where = ".".join(str(part) for part in first.absolute_path) or "(top)"
        raise ManifestInvalid(
            f"the rendered {kind} is not valid Kubernetes ({len(errors)} error(s)); "
            f"{where}: {first.message[:300]}",
            file=SCHEMA,
        )


@cache
def _schemas() -> dict[str, dict[str, Any]]:
    document = json.loads(SCHEMA.read_text())
    return {
        kind: {**schema, "$defs": document["$defs"]} for kind, schema in document["kinds"].items()
    }


def _flag(command: list[str], names: tuple[str, ...]) -> int:
    try:
        found = last_value(command, names[0], names[1:])
    except ValueError:
        return 1
    return int(found.value) if found is not None and found.value.isdigit() else 1


def _volumes(pin: Pin, spec: ContainerSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """/dev/shm in memory, and the container's mounts by their kind: a bind stays a host path
    (the model folder of that node), a named volume becomes the PersistentVolumeClaim of that
    name, and the API key file (a bind at SECRET_TARGET) becomes a Secret: a node has no copy."""
    shm = _quantity(spec.shm_size or pin.shm_size)
    mounts: list[dict[str, Any]] = [{"name": "dshm", "mountPath": "/dev/shm"}]
    volumes: list[dict[str, Any]] = [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": shm}}
    ]
    for index, mount in enumerate(m for m in spec.mounts if m.target != SECRET_TARGET):
        name = f"volume-{index}"
        mounts.append({"name": name, "mountPath": mount.target, "readOnly": mount.read_only})
        if mount.bind:
            kind = "Directory" if mount.read_only else "DirectoryOrCreate"
            volumes.append({"name": name, "hostPath": {"path": mount.source, "type": kind}})
        else:
            claim = {"claimName": mount.source, "readOnly": mount.read_only}
            volumes.append({"name": name, "persistentVolumeClaim": claim})
    if any(m.target == SECRET_TARGET for m in spec.mounts):
        mounts.append(
            {"name": "api-key", "mountPath": SECRET_TARGET, "subPath": "api-key", "readOnly": True}
        )
        secret = {"secretName": secret_name(pin), "defaultMode": 0o400}
        volumes.append({"name": "api-key", "secret": secret})
    return mounts, volumes


def _probes(path: str, check: HealthCheck | None) -> dict[str, Any]:
    """Startup, readiness and liveness probes: an HTTP GET of the health path, on the timing
    of the container's health check (the startup probe allows its start period)."""
    if check is None:
        return {}
    probe = {
        "httpGet": {"path": path, "port": PORT_NAME},
        "periodSeconds": check.interval_s,
        "timeoutSeconds": check.timeout_s,
        "failureThreshold": check.retries,
    }
    startup = {
        **probe,
        "periodSeconds": 10,
        "failureThreshold": max(1, -(-check.start_period_s // 10)),
    }
    return {"startupProbe": startup, "readinessProbe": probe, "livenessProbe": probe}


def _health_words(spec: ContainerSpec) -> str:
    return " ".join(spec.healthcheck.test[1:3]) if spec.healthcheck else "none"


def _security(spec: ContainerSpec) -> dict[str, Any]:
    """The container's user, as the pod's container runs it; never privileged."""
    context: dict[str, Any] = {"privileged": False, "allowPrivilegeEscalation": False}
    if spec.user is not None:
        uid, _, gid = spec.user.partition(":")
        context["runAsUser"] = int(uid)
        context["runAsNonRoot"] = int(uid) != 0
        if gid:
            context["runAsGroup"] = int(gid)
    return {"securityContext": context}


def _quantity(size: str) -> str:
    """Docker's 16g / 512m / 1024k -> Kubernetes' 16Gi / 512Mi / 1024Ki."""
    number, unit = re.fullmatch(r"([0-9]+)([kmg]?)", size.lower()).groups()  # type: ignore[union-attr]
    return number + {"": "", "k": "Ki", "m": "Mi", "g": "Gi"}[unit]
