"""The static image checks: a pytest-testinfra module run against a container of the image.

validate.py runs this file with pytest and `--hosts=docker://<container>`, and hands it what to
expect through a plugin (run_image_checks.CheckInputs) that provides the `expect`, `inspect` and
`proxy_ca_lines` fixtures and the parameters. Nothing is read from the environment or at import,
so one process can check several images. Every check is generic; the manifest decides what it
expects. Nothing here needs a GPU.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

PUBLIC_CA_STORES = ("/etc/ssl/certs/", "/usr/share/ca-certificates/")
SEARCHED_DIRS = ["/opt", "/root", "/etc", "/usr/local", "/home", "/tmp", "/var", "/run"]

VERSION_SCRIPT = (
    "import importlib.metadata as m, json, sys;"
    "print(json.dumps({n: m.version(n) for n in sys.argv[1:]}))"
)


def test_package_version_equals_the_pin(host: Any, expect: dict[str, Any], package: str) -> None:
    out = host.check_output("%s -c %s %s", expect["python"], VERSION_SCRIPT, package)
    assert json.loads(out)[package] == expect["packages"][package]


#: Every distribution the image's Python sees, by PEP 503 name.
INSTALLED_SCRIPT = (
    "import importlib.metadata as m, json, re;"
    "print(json.dumps({re.sub(r'[-_.]+', '-', d.metadata['Name']).lower(): d.version"
    " for d in m.distributions()}))"
)
#: Seeded by `python -m venv` itself (setuptools too before Python 3.12), not by the stack:
#: compared only when the lock holds them.
VENV_SEEDED = {"pip", "setuptools"}


def test_installed_set_equals_the_lock(host: Any, expect: dict[str, Any]) -> None:
    """Pins say what we chose; the lock says everything. A package that floated (transformers
    5.x under a lock of 4.57) is caught here, not at serve time."""
    if expect.get("locked") is None:
        pytest.skip("the stack has no lock")
    out = host.check_output("%s -c %s", expect["python"], INSTALLED_SCRIPT)
    locked = expect["locked"]
    installed = {n: v for n, v in json.loads(out).items() if n in locked or n not in VENV_SEEDED}
    wrong = sorted(
        f"{name} {locked.get(name, 'not locked')} -> {installed.get(name, 'missing')}"
        for name in installed.keys() | locked.keys()
        if installed.get(name) != locked.get(name)
    )
    assert not wrong, f"{len(wrong)} differ from the lock: {', '.join(wrong[:8])}"


def test_environment_variable(host: Any, expect: dict[str, Any], variable: str) -> None:
    assert host.environment().get(variable) == expect["env"][variable]


def test_patch_is_applied(host: Any, expect: dict[str, Any], patch: dict[str, Any] | None) -> None:
    if patch is None:
        pytest.skip("the stack applies no patches")
    site = host.check_output(
        "%s -c %s", expect["python"], "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    )
    for target, lines in patch["added"].items():
        content = host.file(f"{site}/{target}").content_string
        missing = [line for line in lines if line not in content]
        assert not missing, f"{target} lacks patched lines: {missing[:3]}"


def test_nvcc_matches_the_stack_cuda(host: Any, expect: dict[str, Any]) -> None:
    toolkit_nvcc = "/usr/local/cuda/bin/nvcc"
    nvcc = "nvcc" if host.exists("nvcc") else toolkit_nvcc
    if nvcc == toolkit_nvcc and not host.file(toolkit_nvcc).exists:
        pytest.skip("the image keeps no nvcc")
    out = host.check_output("%s --version", nvcc)
    assert f"release {expect['cuda_release']}," in out, out
    if expect["nvcc_wheel"]:
        wheel_nvcc = host.check_output(
            "%s -c %s %s", expect["python"], VERSION_SCRIPT, "nvidia-cuda-nvcc"
        )
        assert json.loads(wheel_nvcc)["nvidia-cuda-nvcc"] == expect["nvcc_wheel"]


def test_jit_cache_holds_every_module_for_the_target_archs(
    host: Any, expect: dict[str, Any]
) -> None:
    if not expect["jit_modules"]:
        pytest.skip("the stack precompiles no FlashInfer module")
    modules = expect["jit_modules"]
    result = host.run(  # one %s per module: testinfra quotes each argument on its own
        "%s /opt/sm120-stacks/tools/flashinfer_jit.py verify" + " %s" * len(modules),
        expect["python"],
        *modules,
    )
    rows = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert [r["module"] for r in rows] == expect["jit_modules"], result.stderr
    for row in rows:
        assert row["status"] == "hit", row
        missing = set(expect["module_archs"][row["module"]]) - set(row["archs"])
        assert not missing, f"{row['module']} has no device code for {sorted(missing)}: {row}"


def test_no_secret_left_in_the_image(host: Any, proxy_ca_lines: list[str]) -> None:
    secret_words = {"TOKEN", "SECRET", "PASSWORD", "PASSWD", "APIKEY", "CREDENTIALS"}
    leaked = [k for k in host.environment() if secret_words & set(k.upper().split("_"))]
    assert not leaked, f"secret-like variables in the image: {leaked}"
    for path in ["/root/.cache/huggingface/token", "/root/.netrc", "/root/.config/pip/pip.conf"]:
        assert not host.file(path).exists, path
    secrets = host.run("ls -A /run/secrets 2>/dev/null")
    assert secrets.stdout.strip() == "", f"/run/secrets holds {secrets.stdout}"
    if proxy_ca_lines:
        # One pass over the image for all lines (`-e` each): a host bundle can hold dozens of
        # certificates certifi lacks, and one grep per line over a 12 GB flagship took an hour.
        # One %s per argument: testinfra quotes each, so a joined string would be one
        # (nonexistent) path and the check would find nothing, ever.
        patterns = " ".join(["-e %s"] * len(proxy_ca_lines))
        dirs = " ".join(["%s"] * len(SEARCHED_DIRS))
        command = f"grep -rlsF {patterns} -- {dirs}"
        hits = host.run(command, *proxy_ca_lines, *SEARCHED_DIRS).stdout.split()
        leaks = [path for path in hits if not _is_public_ca_store(path)]
        assert not leaks, f"proxy CA certificate found in {leaks}"


def _is_public_ca_store(path: str) -> bool:
    """The distribution's and certifi's CA stores hold public certificates a host bundle shares
    (some older than the host's certifi knows); a leaked proxy CA is looked for elsewhere."""
    return path.startswith(PUBLIC_CA_STORES) or path.endswith("/certifi/cacert.pem")


def test_image_is_built_for_the_stack_platform(
    expect: dict[str, Any], inspect: dict[str, Any]
) -> None:
    """The image config's os/architecture is the stack's platform. An engine that ignores
    --platform, or a base of another architecture under the expected tag, yields an image
    labelled for one machine that runs only on another (bench/RESULTS.md §9)."""
    built = f"{inspect.get('Os')}/{inspect.get('Architecture')}"
    assert built == expect["platform"], f"image is {built}, the stack says {expect['platform']}"


def test_labels_identify_the_stack(expect: dict[str, Any], inspect: dict[str, Any]) -> None:
    labels = inspect["Config"]["Labels"]
    assert labels["sm120-stacks.stack"] == expect["stack"]
    assert labels["sm120-stacks.content-hash"] == expect["content_hash"]
    assert (
        json.loads(labels["sm120-stacks.arch"])["FLASHINFER_CUDA_ARCH_LIST"]
        == expect["env"]["FLASHINFER_CUDA_ARCH_LIST"]
    )
    assert json.loads(labels["sm120-stacks.manifest"])["name"] == expect["stack"]


def test_config_runs_the_serve_command(expect: dict[str, Any], inspect: dict[str, Any]) -> None:
    config = inspect["Config"]
    assert config["Cmd"] == expect["cmd"]
    assert not config.get("Entrypoint")
    assert f"{expect['port']}/tcp" in (config.get("ExposedPorts") or {})
    assert config.get("User", "") in ("", "root", "0")
    env = dict(item.split("=", 1) for item in config["Env"])
    for name, value in expect["env"].items():
        assert env.get(name) == value, name
