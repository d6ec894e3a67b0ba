"""The engine interface without an engine: progress streams, retries, the runtime probe, the
build client, and a build that cannot pull its base, each fed what a real one produces."""

from __future__ import annotations

import os
import subprocess
import textwrap
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from builder.engine.docker_adapter import DockerEngine, parse_progress_stream
from builder.engine.hostprobe import Probe, gather
from builder.engine.progress import StepTracker
from builder.engine.protocol import ContainerSpec, EngineHost, Image, nvidia_runtimes
from builder.errors import (
    EngineError,
    EngineNotFound,
    EngineUnreachable,
    OperationFailed,
    StackError,
    ToolMissing,
)
from builder.hosts.hostcheck import check
from builder.image.basepull import (
    BaseImageUnavailable,
    as_written,
    base_unavailable_error,
    unpullable_base,
)
from builder.image.build import BuildFailed, _run_build
from builder.image.buildclient import BuildClient, detect_build_client
from builder.image.names import content_tag
from builder.image.registry import (
    Registry,
    RegistryError,
    has_image,
    is_transient,
    is_transient_message,
    push,
)
from builder.manifest.substitute import ENV_VAR as SUBSTITUTE_ENV

DIGEST = "sha256:" + "ab" * 32
IMAGE_ID = "sha256:" + "cd" * 32
REGISTRY = Registry.parse("registry.example:5000")
CONTENT_HASH = "0123" + "0" * 60
TAG = content_tag("ci-mini", CONTENT_HASH)


# --- progress streams --------------------------------------------------------------------------


def _stream(
    lines: Sequence[dict[str, Any]], read: list[dict[str, Any]]
) -> Iterator[dict[str, Any]]:
    for line in lines:
        read.append(line)
        yield line


PUSH_ERROR_MID_STREAM = [
    {"status": "The push refers to repository [registry.example:5000/sm120-stacks]"},
    {"status": "Preparing", "progressDetail": {}, "id": "5f70bf18a086"},
    {"status": "Pushing", "progressDetail": {"current": 512, "total": 1024}, "id": "5f70bf18a086"},
    {
        "errorDetail": {"message": "unauthorized: authentication required"},
        "error": "unauthorized: authentication required",
    },
    {"status": "never read: the first error ends the push"},
]
PULL_ERROR_MID_STREAM = [
    {"status": "Pulling from sm120-stacks", "id": "ci-mini"},
    {"status": "Pulling fs layer", "progressDetail": {}, "id": "a1b2c3"},
    {"error": 'Get "https://registry.example:5000/v2/sm120-stacks/blobs/sha256:1": EOF'},
]


def test_an_error_line_anywhere_in_a_push_stream_fails_the_push() -> None:
    read: list[dict[str, Any]] = []
    with pytest.raises(EngineError) as caught:
        parse_progress_stream(_stream(PUSH_ERROR_MID_STREAM, read))
    assert caught.value.explanation == "unauthorized: authentication required"
    assert len(read) == 4, "reading stops at the error"


def test_an_error_line_without_error_detail_fails_a_pull() -> None:
    with pytest.raises(EngineError, match=r'blobs/sha256:1": EOF$'):
        parse_progress_stream(iter(PULL_ERROR_MID_STREAM))


def test_a_clean_push_stream_gives_its_digest() -> None:
    lines = [
        {"status": "Pushed", "progressDetail": {}, "id": "5f70bf18a086"},
        {"status": f"ci-mini-0123: digest: {DIGEST} size: 528"},
        {"progressDetail": {}, "aux": {"Tag": "ci-mini-0123", "Digest": DIGEST, "Size": 528}},
    ]
    assert parse_progress_stream(iter(lines)) == DIGEST
    assert parse_progress_stream(iter(lines[:2])) == DIGEST, "the status line alone names it"
    pull = [{"status": "Pull complete", "id": "a1b2c3"}, {"status": f"Digest: {DIGEST}"}]
    assert parse_progress_stream(iter(pull)) == ""


# --- retries -----------------------------------------------------------------------------------

TRANSIENT = [
    'Get "http://127.0.0.1:5999/v2/": dial tcp 127.0.0.1:5999: connect: connection refused',
    'Get "https://nowhere.example/v2/": dial tcp: lookup nowhere.example on 10.0.0.53:53: '
    "server misbehaving",
    "read tcp 10.0.0.2:41414->10.0.0.9:443: read: connection reset by peer",
    'Put "https://registry.example:5000/v2/sm120-stacks/blobs/uploads/": EOF',
    'Head "https://registry.example:5000/v2/sm120-stacks/manifests/ci-mini": EOF',
    "unexpected EOF",
    "net/http: TLS handshake timeout",
    'Get "https://registry.example:5000/v2/": net/http: request canceled while waiting for '
    "connection (Client.Timeout exceeded while awaiting headers)",
    "received unexpected HTTP status: 503 Service Unavailable",
    "received unexpected HTTP status: 502 Bad Gateway",
    "error parsing HTTP 504 response body: invalid character '<' looking for beginning of value",
]
PERMANENT = [
    # A registry's own answer, which mentions EOF (the old classifier retried any "EOF").
    "manifest unknown: manifest unknown: upstream said EOF",
    "manifest for registry.example:5000/sm120-stacks:x not found: manifest unknown: EOF",
    "unauthorized: authentication required",
    "denied: requested access to the resource is denied",
    "toomanyrequests: You have reached your pull rate limit",
    'name invalid: repository name "EOF" is not allowed',
    "error parsing HTTP 400 response body: unexpected end of JSON input: EOF",
    # The engine API's own 500 wrapping is not a registry 5xx.
    "500 Server Error for http+docker://localhost/v1.41/images/x/push: Internal Server Error",
    "x509: certificate signed by unknown authority",
]


@pytest.mark.parametrize("message", TRANSIENT)
def test_connection_failures_and_5xx_are_retried(message: str) -> None:
    assert is_transient_message(message)
    assert is_transient(EngineError(message, status_code=500))


@pytest.mark.parametrize("message", PERMANENT)
def test_answers_and_eof_in_an_error_body_are_not_retried(message: str) -> None:
    assert not is_transient_message(message)
    assert not is_transient(EngineError(message, status_code=500))


def test_only_engine_failures_are_judged() -> None:
    assert is_transient(EngineUnreachable("the engine's API dropped the connection"))
    assert not is_transient(RegistryError("connection refused"))
    assert not is_transient(ValueError("dial tcp: connection refused"))


class _PushingEngine:
    """An Engine whose pushes fail with `failures` in turn, then succeed."""

    def __init__(self, failures: Sequence[str]) -> None:
        self.failures = list(failures)
        self.pushes = 0
        self.tags: list[tuple[str, str]] = []

    def image(self, ref: str) -> Image | None:
        return Image(IMAGE_ID, {"RepoDigests": []})

    def tag(self, image: str, ref: str) -> None:
        self.tags.append((image, ref))

    def push(self, repository: str, tag: str, progress: object = None) -> str:
        self.pushes += 1
        if self.failures:
            raise EngineError(self.failures.pop(0), status_code=500)
        return DIGEST

    def registry_digest(self, ref: str) -> str:
        if self.failures:
            raise EngineError(self.failures.pop(0), status_code=500)
        raise EngineNotFound("manifest unknown", status_code=404)


@pytest.fixture
def no_sleep(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    slept: list[float] = []
    monkeypatch.setattr("builder.image.registry.time.sleep", slept.append)
    return slept


def test_a_registry_answer_mentioning_eof_fails_at_once(no_sleep: list[float]) -> None:
    engine = _PushingEngine(["manifest unknown: manifest unknown: upstream said EOF"])
    with pytest.raises(RegistryError, match=f"push of {TAG} failed: manifest unknown"):
        push(engine, REGISTRY, f"sm120-stacks:{TAG}", "ci-mini", CONTENT_HASH)
    assert (engine.pushes, no_sleep) == (1, [])


def test_an_auth_error_fails_at_once(no_sleep: list[float]) -> None:
    engine = _PushingEngine(["unauthorized: authentication required"])
    # A refused login is the user's to fix: a StackError with the remedy (exit 2, issue 47).
    with pytest.raises(StackError, match="unauthorized") as raised:
        push(engine, REGISTRY, f"sm120-stacks:{TAG}", "ci-mini", CONTENT_HASH)
    assert engine.pushes == 1
    assert not isinstance(raised.value, OperationFailed) and "docker login" in str(raised.value)


def test_a_dropped_connection_is_retried_until_it_works(no_sleep: list[float]) -> None:
    engine = _PushingEngine(["unexpected EOF", "read: connection reset by peer"])
    pushed = push(engine, REGISTRY, f"sm120-stacks:{TAG}", "ci-mini", CONTENT_HASH)
    assert pushed == f"{REGISTRY.repository}@{DIGEST}"
    assert engine.pushes == 4, "two failures, then the content tag and the moving tag"
    assert no_sleep == [0.5, 1.0]
    assert [ref for _, ref in engine.tags] == [
        f"{REGISTRY.repository}:{TAG}",
        f"{REGISTRY.repository}:ci-mini",
    ]


def test_a_registry_that_never_answers_is_unreachable(no_sleep: list[float]) -> None:
    engine = _PushingEngine(["dial tcp 10.0.0.9:5000: connect: connection refused"] * 5)
    with pytest.raises(ToolMissing, match="registry registry.example:5000 is unreachable"):
        push(engine, REGISTRY, f"sm120-stacks:{TAG}", "ci-mini", CONTENT_HASH)
    assert engine.pushes == 5


def test_has_image_retries_a_5xx_and_reads_not_found_as_absent(no_sleep: list[float]) -> None:
    engine = _PushingEngine(["received unexpected HTTP status: 503 Service Unavailable"])
    assert not has_image(engine, REGISTRY, "ci-mini", "0" * 64)
    assert len(no_sleep) == 1


# --- the docker SDK adapter --------------------------------------------------------------------


class _Sdk:
    """The few docker SDK calls DockerEngine makes, failing as the SDK fails."""

    def __init__(self, info: Any = None) -> None:
        self.api = self
        self.images = self
        self._info = info
        self.timeout = 600  # APIClient's per-read limit, which a push or pull narrows

    def info(self) -> Any:
        if isinstance(self._info, Exception):
            raise self._info
        return self._info

    def get(self, ref: str) -> Any:
        from docker.errors import ImageNotFound

        raise ImageNotFound(f"No such image: {ref}")

    def inspect_distribution(self, ref: str) -> Any:
        from docker.errors import APIError

        raise APIError(
            "500 Server Error for http+docker://localhost/v1.41/distribution/x/json",
            explanation='Get "http://127.0.0.1:5999/v2/": dial tcp 127.0.0.1:5999: '
            "connect: connection refused",
        )

    def push(self, repository: str, **kwargs: Any) -> Iterator[dict[str, Any]]:
        return iter(PUSH_ERROR_MID_STREAM)


def test_the_adapter_turns_sdk_failures_into_engine_errors() -> None:
    engine = DockerEngine(_Sdk())
    assert engine.image("missing:1") is None
    with pytest.raises(EngineError) as caught:
        engine.registry_digest("127.0.0.1:5999/x:1")
    assert caught.value.explanation.startswith('Get "http://127.0.0.1:5999/v2/"')
    assert is_transient(caught.value)
    with pytest.raises(EngineError, match="unauthorized"):
        engine.push("registry.example:5000/sm120-stacks", "ci-mini")


def test_the_runtime_probe_reads_runtimes_and_raises_what_the_engine_said() -> None:
    from requests.exceptions import ConnectionError as RequestsConnectionError

    runtimes = {"runc": {}, "nvidia": {}, "nvidia-cdi": {}, "io.containerd.runc.v2": {}}
    assert nvidia_runtimes(DockerEngine(_Sdk({"Runtimes": runtimes}))) == ["nvidia", "nvidia-cdi"]
    assert nvidia_runtimes(DockerEngine(_Sdk({"Runtimes": {"runc": {}}}))) == []
    with pytest.raises(EngineUnreachable):
        nvidia_runtimes(DockerEngine(_Sdk(RequestsConnectionError("socket closed"))))


# --- host prerequisites: the runtime probe ----------------------------------------------------


class _RuntimeEngine:
    def __init__(self, answer: list[str] | EngineError) -> None:
        self.answer = answer

    def host(self) -> EngineHost:
        if isinstance(self.answer, EngineError):
            raise self.answer
        return EngineHost(None, None, None, None, None, runtimes=tuple(self.answer))


NO_GPU_PROBE = Probe(run=lambda argv: (127, ""), which=lambda name: None, cdi_dirs=())


def _runtime_finding(engine: Any) -> Any:
    facts = gather(engine, None, NO_GPU_PROBE)
    return {f.name: f for f in check(facts, None)}["runtime"]


def test_an_engine_error_is_reported_as_itself_not_as_no_runtime() -> None:
    error = EngineError("Cannot connect to the Docker daemon at unix:///var/run/docker.sock")
    finding = _runtime_finding(_RuntimeEngine(error))
    assert not finding.ok
    assert "Cannot connect to the Docker daemon" in finding.detail
    assert "no NVIDIA container runtime" not in finding.detail


def test_only_an_answer_without_nvidia_is_no_runtime() -> None:
    finding = _runtime_finding(_RuntimeEngine(["io.containerd.runc.v2", "runc"]))
    assert (finding.ok, finding.detail) == (False, "no NVIDIA container runtime for Docker")
    found = _runtime_finding(_RuntimeEngine(["nvidia", "runc"]))
    assert (found.ok, found.detail) == (True, "NVIDIA container runtime: runtime nvidia")


# --- which client builds -----------------------------------------------------------------------


def _fake_docker(folder: Path, *, buildx: bool, version: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "docker"
    path.write_text(
        textwrap.dedent(
            f"""\
            #!/bin/sh
            if [ "$1" = buildx ]; then
              {"echo 'github.com/docker/buildx v0.23.0'; exit 0" if buildx else "exit 1"}
            fi
            if [ "$1" = version ]; then echo '{version}'; exit 0; fi
            exit 2
            """
        )
    )
    path.chmod(0o755)
    return path


def test_a_client_with_buildx_builds_with_buildx(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    docker = _fake_docker(tmp_path / "bin", buildx=True, version="28.2.2")
    monkeypatch.setenv("PATH", str(docker.parent))
    client = detect_build_client(candidates=("docker",))
    assert client == BuildClient("buildx", (str(docker), "buildx", "build", "--load"))


def test_a_classic_20_10_client_builds_with_docker_buildkit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    docker = _fake_docker(tmp_path / "bin", buildx=False, version="20.10.24+dfsg1")
    monkeypatch.setenv("PATH", str(docker.parent))
    client = detect_build_client(candidates=("docker",))
    assert client == BuildClient(
        "classic+buildkit", (str(docker), "build"), {"DOCKER_BUILDKIT": "1"}
    )


def test_a_28_client_without_buildx_cannot_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    docker = _fake_docker(tmp_path / "bin", buildx=False, version="28.2.2")
    monkeypatch.setenv("PATH", str(docker.parent))
    with pytest.raises(ToolMissing) as caught:
        detect_build_client(candidates=("docker",))
    assert f"{docker} (client 28, no buildx plugin)" in caught.value.message
    assert "docker-buildx" in str(caught.value.hint)


def test_a_later_candidate_is_tried_when_the_first_cannot_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    new = _fake_docker(tmp_path / "local", buildx=False, version="28.2.2")
    old = _fake_docker(tmp_path / "usr", buildx=False, version="20.10.24+dfsg1")
    monkeypatch.setenv("PATH", str(new.parent))
    client = detect_build_client(candidates=("docker", str(old)))
    assert client.argv == (str(old), "build")


def test_the_answer_is_kept_until_the_client_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An upgraded client (another file at that path) is asked again; a plugin folder that
    changes too; no client found is not kept."""
    memo = tmp_path / "build" / "cache" / "build-client.json"
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker-config"))
    docker = _fake_docker(tmp_path / "bin", buildx=False, version="20.10.24+dfsg1")
    monkeypatch.setenv("PATH", str(docker.parent))
    assert detect_build_client(candidates=("docker",), memo=memo).kind == "classic+buildkit"
    kept = memo.read_text()
    plugin = tmp_path / "docker-config" / "cli-plugins" / "docker-buildx"
    plugin.parent.mkdir(parents=True)
    plugin.write_text("")  # a buildx plugin installed: the answer is asked for again
    detect_build_client(candidates=("docker",), memo=memo)
    assert memo.read_text() != kept
    _fake_docker(tmp_path / "bin", buildx=True, version="28.2.2")  # upgraded, with buildx
    os.utime(docker, ns=(1, 1))
    assert detect_build_client(candidates=("docker",), memo=memo).kind == "buildx"
    docker.unlink()
    with pytest.raises(ToolMissing):
        detect_build_client(candidates=("docker",), memo=memo)


def test_a_kept_answer_is_used_without_running_the_client(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    memo = tmp_path / "build-client.json"
    docker = _fake_docker(tmp_path / "bin", buildx=True, version="28.2.2")
    monkeypatch.setenv("PATH", str(docker.parent))
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker-config"))
    first = detect_build_client(candidates=("docker",), memo=memo)
    calls: list[list[str]] = []
    real_run = subprocess.run

    def counting(argv: list[str], *args: Any, **kwargs: Any) -> Any:
        calls.append(list(argv))
        return real_run(argv, *args, **kwargs)

    monkeypatch.setattr(subprocess, "run", counting)
    assert detect_build_client(candidates=("docker",), memo=memo) == first
    assert calls == []
    memo.write_text("{not json")  # a damaged memo: asked again, never an error
    assert detect_build_client(candidates=("docker",), memo=memo) == first
    assert calls and calls[0][1:] == ["buildx", "version"]


# --- a base image that cannot be pulled --------------------------------------------------------

#: What Docker 20.10's BuildKit printed here for `FROM nonexistent.invalid/nothing:1`.
CLASSIC_LOG = """\
#1 [internal] load build definition from Dockerfile
#1 sha256:ea1485e883bad3560f00fcc97cd8ce21ad4f840ec47cf8a25663ffdeb5c2a683
#1 transferring dockerfile: 81B done
#1 DONE 0.0s

#3 [internal] load metadata for nonexistent.invalid/nothing:1
#3 sha256:f8e22bcad3fda280b345cf5f8b46e4d9447fbcda1e28e3879de812df7051d169
#3 ERROR: failed to do request: Head "https://nonexistent.invalid/v2/nothing/manifests/1": dial tcp: lookup nonexistent.invalid on 10.255.255.53:53: no such host
------
 > [internal] load metadata for nonexistent.invalid/nothing:1:
------
failed to solve with frontend dockerfile.v0: failed to create LLB definition: failed to do request: Head "https://nonexistent.invalid/v2/nothing/manifests/1": dial tcp: lookup nonexistent.invalid on 10.255.255.53:53: no such host
"""  # noqa: E501
#: buildx's summary of the same failure for the flagships' base, with no step line before it.
BUILDX_SUMMARY = (
    "ERROR: failed to solve: nvidia/cuda:13.0.2-devel-ubuntu24.04: failed to resolve source "
    "metadata for docker.io/nvidia/cuda:13.0.2-devel-ubuntu24.04: failed to do request: Head "
    '"https://registry-1.docker.io/v2/nvidia/cuda/manifests/13.0.2-devel-ubuntu24.04": dial '
    "tcp: lookup registry-1.docker.io: no such host"
)
RUN_STEP_FAILED = """\
#9 [packages 2/3] RUN pip install -r requirements.txt
#9 ERROR: process "/bin/sh -c pip install -r requirements.txt" did not complete successfully: exit code: 1
"""  # noqa: E501


def _tracked(log: str) -> StepTracker:
    tracker = StepTracker()
    for line in log.splitlines():
        tracker.feed(line)
    return tracker


def test_the_failed_metadata_step_names_the_base() -> None:
    lines = CLASSIC_LOG.splitlines()
    found = unpullable_base(_tracked(CLASSIC_LOG).failed, lines)
    assert found is not None and found.image == "nonexistent.invalid/nothing:1"
    assert found.line.startswith("failed to do request: Head") and "no such host" in found.line


def test_buildkits_summary_line_names_the_base() -> None:
    found = unpullable_base(None, ["#1 DONE 0.0s", BUILDX_SUMMARY])
    assert found is not None and found.image == "docker.io/nvidia/cuda:13.0.2-devel-ubuntu24.04"
    assert found.line == BUILDX_SUMMARY


def test_other_failures_are_not_blamed_on_the_base() -> None:
    assert unpullable_base(_tracked(RUN_STEP_FAILED).failed, RUN_STEP_FAILED.splitlines()) is None
    assert unpullable_base(None, []) is None


def test_the_base_is_named_as_the_manifest_writes_it() -> None:
    written = ["local/cuda:13.0.2-devel-bookworm", "nvidia/cuda:13.0.2-devel-ubuntu24.04"]
    assert as_written("docker.io/nvidia/cuda:13.0.2-devel-ubuntu24.04", written) == written[1]
    pinned = "docker.io/nvidia/cuda:13.0.2-devel-ubuntu24.04@" + DIGEST
    assert as_written(pinned, written) == written[1]
    assert as_written("docker.io/library/debian:bookworm", ["debian:bookworm"]) == "debian:bookworm"
    assert as_written("docker.io/library/python", []) == "python"


def test_the_error_says_what_to_do(tmp_path: Path) -> None:
    found = unpullable_base(None, [BUILDX_SUMMARY])
    assert found is not None
    error = base_unavailable_error(
        "vllm-0.22-b12x", found, ["nvidia/cuda:13.0.2-devel-ubuntu24.04"], tmp_path / "b.log"
    )
    text = str(error)
    assert "the base image nvidia/cuda:13.0.2-devel-ubuntu24.04 of vllm-0.22-b12x" in text
    assert f"BuildKit: {BUILDX_SUMMARY}" in text
    assert "--substitute-base nvidia/cuda:13.0.2-devel-ubuntu24.04=" in text
    assert SUBSTITUTE_ENV in text and "make base-cuda-local" in text
    assert "make flagship-local STACK=vllm-0.22-b12x" in text
    assert isinstance(error, StackError)


def test_a_build_that_cannot_pull_its_base_fails_with_the_remedies(tmp_path: Path) -> None:
    """The build path end to end, with a client that prints what 20.10 printed and fails."""
    client_path = tmp_path / "docker"
    (tmp_path / "output.txt").write_text(CLASSIC_LOG)
    client_path.write_text(f"#!/bin/sh\ncat {tmp_path / 'output.txt'}\nexit 1\n")
    client_path.chmod(0o755)
    client = BuildClient("classic+buildkit", (str(client_path), "build"))
    log = tmp_path / "build.log"
    with pytest.raises(BaseImageUnavailable) as caught:
        _run_build("ci-mini", [*client.argv, "."], client, log, False, ["nothing:1"])
    assert "the base image nonexistent.invalid/nothing:1 of ci-mini" in caught.value.message
    assert "make flagship-local STACK=ci-mini" in str(caught.value.hint)
    cause = caught.value.__cause__
    assert isinstance(cause, BuildFailed) and "load metadata for" in str(cause)
    assert "no such host" in log.read_text()


def test_a_specced_container_keeps_the_image_cmd_unless_told() -> None:
    from builder.engine.docker_adapter import run_kwargs

    kwargs = run_kwargs(ContainerSpec(image="x:1"))
    assert kwargs == {"image": "x:1", "detach": True, "environment": {}, "labels": {}}


@pytest.mark.parametrize(
    ("ref", "split"),
    [
        ("sm120-stacks:ci-mini", ("sm120-stacks", "ci-mini")),
        (
            "127.0.0.1:5000/sm120-stacks:ci-mini-0123",
            ("127.0.0.1:5000/sm120-stacks", "ci-mini-0123"),
        ),
        ("127.0.0.1:5000/sm120-stacks", ("127.0.0.1:5000/sm120-stacks", None)),
        ("repo@sha256:" + "a" * 64, ("repo@sha256:" + "a" * 64, None)),
    ],
)
def test_a_port_or_a_digest_is_not_taken_for_a_tag(ref: str, split: tuple[str, str | None]) -> None:
    from builder.engine.docker_adapter import split_tag

    assert split_tag(ref) == split


def test_the_socket_path_names_a_missing_engine_without_the_sdk(tmp_path: Path) -> None:
    from builder.engine.docker_adapter import connect_engine
    from builder.errors import ToolMissing

    with pytest.raises(ToolMissing, match="cannot reach a Docker engine"):
        connect_engine(f"unix://{tmp_path}/no.sock")


class _QueuedPushApi:
    """An engine API whose push stream queues its layers ("Waiting") and then goes quiet: the
    read times out, as a push does whose layers wait behind other transfers on the engine."""

    timeout = 60

    def __init__(self, statuses: list[str]) -> None:
        self.statuses = statuses

    def push(self, repository: str, **_: Any) -> Iterator[dict[str, Any]]:
        import urllib3

        for index, status in enumerate(self.statuses):
            yield {"status": status, "progressDetail": {}, "id": f"layer{index}"}
        raise urllib3.exceptions.ReadTimeoutError(None, "/push", "Read timed out.")  # type: ignore[arg-type]


class _Client:
    def __init__(self, api: _QueuedPushApi) -> None:
        self.api = api


@pytest.mark.parametrize(
    ("statuses", "said"),
    [
        (["Layer already exists", "Waiting", "Waiting"], "2 layer(s) still waiting their turn"),
        (["Layer already exists", "Pushing"], "(the registry stopped answering;"),
    ],
)
def test_a_stalled_push_says_whether_the_engine_still_queued_its_layers(
    statuses: list[str], said: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 34's outage slice: a push on an engine busy with two other 3.6 GB pushes went
    quiet for the stall limit and was told "the registry stopped answering" while the registry
    answered; layers the engine still holds as "Waiting" are said as such."""
    monkeypatch.setenv("SM120_STACKS_REGISTRY_TIMEOUT", "5")
    engine = DockerEngine(_Client(_QueuedPushApi(statuses)))
    with pytest.raises(EngineError) as caught:
        engine.push("127.0.0.1:5000/sm120-stacks", "t")
    assert "stalled: the engine reported no progress for 5 s" in str(caught.value)
    assert said in str(caught.value)
    assert caught.value.retried
