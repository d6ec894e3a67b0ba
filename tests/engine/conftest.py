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
from builder.image.names import content_tag, local_ref, moving_ref
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
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A repository-shaped scratch folder: stacks/ to add variants to, build/ for outputs. The
    CUDA base and the local wheels come with the tests that build ci-mini (base_image), not
    here: the tiny stack's tests need neither."""
    root = tmp_path_factory.mktemp("repo")
    shutil.copytree(REPO_ROOT / "stacks", root / "stacks")
    (root / "patches").symlink_to(REPO_ROOT / "patches")
    (root / "build").mkdir()
    (root / "build" / "wheels").symlink_to(REPO_ROOT / "build" / "wheels")
    return root


#: What trust on first use writes into a hosts folder (evidence/firstuse.py): trust.yaml and
#: the public keys beside it; and the evidence index versions relied on (evidence/index.py).
TRUST_FILES = ("trust.yaml", "keys", "evidence-versions.json")


@pytest.fixture(autouse=True)
def _first_use_stays_in_its_test(workspace: Path) -> Iterator[None]:
    """The workspace (so its hosts/ folder) is the session's, and a `pin`, `pull` or `deploy`
    from signed evidence with no trust.yaml writes one there (issue 43: trust on first use).
    Left behind, it would be a policy no later test wrote, refusing another test's key: what a
    test's first use wrote into workspace/hosts is removed after it."""
    yield from _trust_written_meanwhile_removed(workspace / "hosts")


@pytest.fixture(scope="module", autouse=True)
def _first_use_stays_in_its_module(workspace: Path) -> Iterator[None]:
    """The same for a module's own fixtures that pin and deploy (set up before any test's
    function fixtures, torn down after the module's last test)."""
    yield from _trust_written_meanwhile_removed(workspace / "hosts")


def _trust_written_meanwhile_removed(hosts: Path) -> Iterator[None]:
    before = _trust_files(hosts)
    yield
    for path in sorted(_trust_files(hosts) - before, reverse=True):
        with contextlib.suppress(OSError):
            if path.is_dir():
                path.rmdir()
            else:
                path.unlink()


def _trust_files(hosts: Path) -> set[Path]:
    found: set[Path] = set()
    for name in TRUST_FILES:
        path = hosts / name
        if path.exists():
            found.add(path)
            if path.is_dir():
                found.update(path.rglob("*"))
    return found


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


#: The fixtures that build ci-mini (3.6 GB: torch, FlashInfer, a JIT module) or a variant of it.
#: A test that asks for one says why with @pytest.mark.needs_ci_mini (its content: the JIT
#: cache, `transformers serve`, soak, device code, a real server's warm caches); every other
#: engine test takes the tiny stack (tiny_stack, tiny_pushed, tiny_variant). Checked statically
#: by tests/test_engine_stack_markers.py and at run time by _ci_mini_needs_its_marker below.
CI_MINI_FIXTURES = frozenset({"ci_mini", "variant"})
NEEDS_CI_MINI = "needs_ci_mini"
#: The tiny stack (stacks/ci-tiny.yaml): FROM the local Debian + Python base, one small package.
TINY = "ci-tiny"


@pytest.fixture(autouse=True)
def _ci_mini_needs_its_marker(request: pytest.FixtureRequest) -> None:
    """A test that builds ci-mini without saying it needs ci-mini's content fails at once,
    before the 3.6 GB build: the tiny stack does for everything else. A test that says it
    needs ci-mini gets its base image and wheels (base_image) first, whatever it builds."""
    marked = request.node.get_closest_marker(NEEDS_CI_MINI) is not None
    if marked:
        request.getfixturevalue("base_image")
    elif CI_MINI_FIXTURES & set(request.fixturenames):
        pytest.fail(
            f"{request.node.nodeid} uses {sorted(CI_MINI_FIXTURES & set(request.fixturenames))}"
            f" without @pytest.mark.{NEEDS_CI_MINI}: take tiny_stack/tiny_variant/tiny_pushed"
            " unless the test needs ci-mini's content (then mark it, saying why)"
        )


@pytest.fixture(scope="session")
def ci_mini(
    cli_process: Callable[..., Any], workspace: Path, api: Any, base_image: str
) -> dict[str, str]:
    """ci-mini built (or found up to date) once per session."""
    cli_process("build", "ci-mini")
    content_hash = render(resolve("ci-mini", workspace / "stacks")).content_hash()
    return {"hash": content_hash, "ref": local_ref("ci-mini", content_hash)}


@pytest.fixture(scope="session")
def local_base(api: Any) -> str:
    """The small Debian + Python base image (scripts/make-base-local.sh), made when missing."""
    from docker.errors import ImageNotFound

    try:
        api.images.get(LOCAL_BASE)
    except ImageNotFound:
        subprocess.run([str(REPO_ROOT / "scripts" / "make-base-local.sh")], check=True)
    return LOCAL_BASE


@pytest.fixture(scope="session")
def tiny_stack(cli_process: Callable[..., Any], workspace: Path, local_base: str) -> dict[str, str]:
    """ci-tiny built once per session and tested as `test` tests every stack (its static checks;
    its GPU smoke skips here): read-only for every test. A test that changes, removes or
    re-tags an image takes tiny_variant."""
    cli_process("build", TINY)
    cli_process("test", TINY)
    content_hash = render(resolve(TINY, workspace / "stacks")).content_hash()
    return {"hash": content_hash, "ref": local_ref(TINY, content_hash)}


@pytest.fixture(scope="session")
def tiny_signing_key(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A build key made here (`keys generate`), for the evidence tiny_pushed signs."""
    from builder.evidence.keys import generate_key_pair

    folder = tmp_path_factory.mktemp("tiny-keys")
    generate_key_pair(folder, "tiny-build")
    return folder / "tiny-build.key"


@pytest.fixture(scope="session")
def tiny_pushed(
    tiny_stack: dict[str, str],
    workspace: Path,
    registry: Registry,
    cli_process: Callable[..., Any],
    tiny_signing_key: Path,
    api: Any,
) -> Iterator[dict[str, str]]:
    """The tiny stack under this run's own name (so its image, and the evidence that refers to
    it, are this run's alone: the registry keeps every earlier run's), built, tested and pushed
    once per session with its evidence signed by tiny_signing_key: its name, hash, local
    reference and digest reference ("digest_ref")."""
    name = unique("ci-tiny-pushed")
    (workspace / "stacks" / f"{name}.yaml").write_text(f"extends: {TINY}\n")
    cli_process("build", name)
    cli_process("test", name)
    pushed = cli_process(
        "push", name, "--registry", registry.host, "--signing-key", str(tiny_signing_key)
    )
    assert "evidence: verdict" in pushed.stderr and "evidence: sbom" in pushed.stderr
    content_hash = render(resolve(name, workspace / "stacks")).content_hash()
    yield {
        "name": name,
        "hash": content_hash,
        "ref": local_ref(name, content_hash),
        "digest_ref": pushed.stdout.strip().splitlines()[0],
    }
    for ref in (
        local_ref(name, content_hash),
        moving_ref(name),
        registry.ref(content_tag(name, content_hash)),
        registry.ref(name),
    ):
        with contextlib.suppress(Exception):
            api.images.remove(ref, noprune=False)


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
def variant(workspace: Path, api: Any, base_image: str) -> Iterator[Callable[[str, str], str]]:
    """Write stacks/NAME.yaml extending ci-mini; untag its images afterwards."""
    yield from _variants(workspace, api, "ci-mini")


@pytest.fixture
def tiny_variant(workspace: Path, api: Any, local_base: str) -> Iterator[Callable[[str, str], str]]:
    """Write stacks/NAME.yaml extending ci-tiny (an image of the test's own, to change, push,
    remove or re-tag); untag its images afterwards."""
    yield from _variants(workspace, api, TINY)


def _variants(workspace: Path, api: Any, parent: str) -> Iterator[Callable[[str, str], str]]:
    names: list[str] = []

    def untag(name: str) -> None:
        content_hash = render(resolve(name, workspace / "stacks")).content_hash()
        refs = [local_ref(name, content_hash), moving_ref(name)]
        # And the registry names a push or a pull of it left (REPO:NAME, REPO:NAME-HASH): the
        # name is this run's own (unique), so these tags are this test's, whatever the repo.
        own = {name, content_tag(name, content_hash)}
        with contextlib.suppress(Exception):
            tags = (tag for image in api.images.list() for tag in image.tags)
            refs += [tag for tag in tags if tag.rpartition(":")[2] in own and tag not in refs]
        for ref in refs:
            with contextlib.suppress(Exception):
                api.images.remove(ref, noprune=False)

    def make(name: str, body: str) -> str:
        name = unique(name)
        (workspace / "stacks" / f"{name}.yaml").write_text(f"extends: {parent}\n{body}\n")
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
