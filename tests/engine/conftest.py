"""Engine fixtures: the base image, the local wheels, the registry, and the CLI as a process."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from builder import REPO_ROOT
from builder.engine.address import from_environment
from builder.engine.docker_adapter import DockerEngine
from builder.image.names import local_ref, moving_ref
from builder.image.registry import REGISTRY_ENV, Registry
from builder.manifest.resolve import resolve
from builder.render.context import render
from builder.verify.garbage import answer_matches
from tests.conftest import REQUIRE_ENGINE
from tests.support.tinymodel import make_tiny_model

BASE_IMAGE = "local/cuda:13.0.2-devel-bookworm"
DEFAULT_REGISTRY = "127.0.0.1:5000"
#: This run's own suffix for every stack, host (so container) and tag the engine tests make:
#: two clones running `make test` on one engine never touch each other's (it happened: a run's
#: teardown untagged the other's variant mid-test). SM120_STACKS_TEST_RUN fixes it by hand.
RUN = os.environ.get("SM120_STACKS_TEST_RUN") or os.urandom(3).hex()


def unique(name: str) -> str:
    """name as this run's own (stacks, hosts, containers and tags derive from it)."""
    return name if name.endswith(f"-{RUN}") else f"{name}-{RUN}"


CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
#: What the tiny models answer ci-mini's smoke prompts: the right answer, and a fluent wrong one.
RIGHT = "The capital of Kentucky is Frankfort."
WRONG = "The capital of Kentucky is Louisville."


@pytest.fixture(scope="session")
def engine() -> DockerEngine:
    """The engine as the tool sees it (what builder functions take)."""
    from builder.engine.docker_adapter import connect_engine

    return connect_engine(from_environment())


@pytest.fixture(scope="session")
def api(engine: DockerEngine) -> Any:
    """The docker SDK client behind it, for setting up and inspecting what the tool did."""
    return engine.sdk


@pytest.fixture(scope="session")
def base_image(api: Any) -> str:
    """The registry-free base image the test stacks build FROM (made here when missing)."""
    from docker.errors import ImageNotFound

    try:
        api.images.get(BASE_IMAGE)
    except ImageNotFound:
        subprocess.run([str(REPO_ROOT / "scripts" / "make-base-cuda-local.sh")], check=True)
    subprocess.run(
        [str(REPO_ROOT / "scripts" / "fetch-local-wheels.sh")],
        check=True,
        cwd=REPO_ROOT,
        capture_output=True,
    )
    return BASE_IMAGE


@pytest.fixture(scope="session")
def workspace(tmp_path_factory: pytest.TempPathFactory, base_image: str) -> Path:
    """A repository-shaped scratch folder: stacks/ to add variants to, build/ for outputs."""
    root = tmp_path_factory.mktemp("repo")
    shutil.copytree(REPO_ROOT / "stacks", root / "stacks")
    (root / "patches").symlink_to(REPO_ROOT / "patches")
    (root / "build").mkdir()
    (root / "build" / "wheels").symlink_to(REPO_ROOT / "build" / "wheels")
    return root


@pytest.fixture(scope="session")
def proxy_ca(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The machine's CA bundle, a private CA made here (the proxy CA the leak check must find,
    on a machine whose bundle is only public certificates) and a unique marker line (PEM
    readers skip text between certificates)."""
    marker = "sm120-stacks-secret-marker-" + os.urandom(8).hex()
    folder = tmp_path_factory.mktemp("secrets")
    private = folder / "private-ca.pem"
    request = ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2"]
    subject = ["-subj", "/CN=sm120-stacks test proxy CA"]
    subprocess.run(
        [*request, *subject, "-keyout", str(folder / "key.pem"), "-out", str(private)],
        check=True,
        capture_output=True,
    )
    path = folder / "proxy-ca.pem"
    path.write_text(CA_BUNDLE.read_text() + private.read_text() + f"\n{marker}\n")
    return path, marker


@pytest.fixture(scope="session")
def cli_process(workspace: Path, proxy_ca: tuple[Path, str]) -> Callable[..., Any]:
    """Run `sm120-stacks` as a real process in the workspace (exit status and output kept)."""

    def run(
        *args: str, check: bool = True, env: dict[str, str] | None = None, **popen: Any
    ) -> subprocess.CompletedProcess[str]:
        """env: variables on top of this process's (a registry's login and trust, say)."""
        env = {**os.environ, "SM120_STACKS_CA_BUNDLE": str(proxy_ca[0]), **(env or {})}
        result = subprocess.run(
            [sys.executable, "-m", "builder", *args],
            cwd=workspace,
            env=env,
            capture_output=True,
            text=True,
            **popen,
        )
        if check and result.returncode != 0:
            raise AssertionError(
                f"sm120-stacks {' '.join(args)} -> {result.returncode}\n"
                f"{result.stdout}\n{result.stderr}"
            )
        return result

    return run


def clone_workspace(workspace: Path, root: Path) -> Path:
    """A second clone's workspace at root: the same stacks, its own (empty) build folder."""
    shutil.copytree(workspace / "stacks", root / "stacks")
    (root / "patches").symlink_to(workspace / "patches")
    (root / "build").mkdir()
    (root / "build" / "wheels").symlink_to((workspace / "build" / "wheels").resolve())
    return root


@pytest.fixture(scope="session")
def ci_mini(cli_process: Callable[..., Any], workspace: Path, api: Any) -> dict[str, str]:
    """ci-mini built (or found up to date) once per session."""
    cli_process("build", "ci-mini")
    content_hash = render(resolve("ci-mini", workspace / "stacks")).content_hash()
    return {"hash": content_hash, "ref": local_ref("ci-mini", content_hash)}


@pytest.fixture(scope="session")
def registry() -> Registry:
    value = os.environ.get(REGISTRY_ENV, DEFAULT_REGISTRY)
    target = Registry.parse(value)
    try:
        urllib.request.urlopen(f"http://{target.host}/v2/", timeout=5)
    except OSError as exc:
        message = f"no registry at {target.host} ({exc}); .ci/run starts one"
        if REQUIRE_ENGINE:
            pytest.fail(message)
        pytest.skip(message)
    return target


@pytest.fixture
def variant(workspace: Path, api: Any) -> Iterator[Callable[[str, str], str]]:
    """Write stacks/NAME.yaml extending ci-mini; untag its images afterwards."""
    names: list[str] = []

    def untag(name: str) -> None:
        content_hash = render(resolve(name, workspace / "stacks")).content_hash()
        for ref in (local_ref(name, content_hash), moving_ref(name)):
            with contextlib.suppress(Exception):
                api.images.remove(ref, noprune=False)

    def make(name: str, body: str) -> str:
        name = unique(name)
        (workspace / "stacks" / f"{name}.yaml").write_text(f"extends: ci-mini\n{body}\n")
        names.append(name)
        untag(name)  # a killed earlier run may have left its tags behind
        return name

    yield make
    for name in names:
        untag(name)


@pytest.fixture(scope="session")
def models(tmp_path_factory: pytest.TempPathFactory, workspace: Path) -> dict[str, Path]:
    """Model directories: trained on the manifest's questions, random, wrong, and empty."""
    prompts = resolve("ci-mini", workspace / "stacks").manifest.smoke.prompts
    assert prompts and all(answer_matches(RIGHT, p.expect) for p in prompts)
    assert not any(answer_matches(WRONG, p.expect) for p in prompts)
    root = tmp_path_factory.mktemp("models")
    right = [(p.prompt, RIGHT) for p in prompts]
    empty = root / "empty"
    empty.mkdir(mode=0o755)
    return {
        "trained": make_tiny_model(root / "trained", right),
        "random": make_tiny_model(root / "random", right, trained=False),
        "wrong": make_tiny_model(root / "wrong", [(p.prompt, WRONG) for p in prompts]),
        "empty": empty,
    }


#: A small image with Python and a shell (scripts/make-base-local.sh), for servers of a few lines.
LOCAL_BASE = "local/debian-python:bookworm"


@contextlib.contextmanager
def pushed_local_base(
    api: Any, engine: DockerEngine, registry: Registry, name: str
) -> Iterator[str]:
    """The local base image pushed as REGISTRY/NAME:1, by digest (what a pin names); its tag
    removed afterwards."""
    from docker.errors import ImageNotFound

    try:
        api.images.get(LOCAL_BASE)
    except ImageNotFound:
        subprocess.run([str(REPO_ROOT / "scripts" / "make-base-local.sh")], check=True)
    repository = f"{registry.host}/{name}"
    engine.tag(LOCAL_BASE, f"{repository}:1")
    digest = engine.push(repository, "1")
    try:
        yield f"{repository}@{digest}"
    finally:
        with contextlib.suppress(Exception):
            api.images.remove(f"{repository}:1")
