"""scripts/host-setup.sh: what `make stack`, `make test` and CI run before anything else."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from builder import REPO_ROOT
from tests.support.chroot import (
    fake_engine_socket,
    fresh_host,
    in_namespaces,
    mirror_unreachable,
    remove_host,
)
from tests.support.standins import DOCKER_CE, SYSTEMCTL, build_debs

SCRIPT = REPO_ROOT / "scripts" / "host-setup.sh"


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("su") is None, reason="needs root to become another user"
)
def test_a_user_who_cannot_install_is_told_the_one_command_to_run() -> None:
    """Run from a copy in a folder everyone may enter: a checkout in `mktemp -d` (mode 0700, as
    CI's clean clone may be) is closed to the other user, who would get bash's 126 instead."""
    folder = Path(tempfile.mkdtemp(prefix="sm120-host-setup-"))
    try:
        folder.chmod(0o755)
        script = folder / SCRIPT.name
        shutil.copy2(SCRIPT, script)
        result = subprocess.run(
            ["su", "nobody", "-s", "/bin/bash", "-c", f"DOCKER_HOST= {script}"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        shutil.rmtree(folder)
    assert result.returncode == 2, result.stderr
    assert f"run  sudo {script}" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.engine
def test_with_everything_up_it_does_nothing_and_says_nothing() -> None:
    result = subprocess.run([str(SCRIPT), "--registry"], capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")


# --- a throwaway Debian 12 host (debootstrap), run in namespaces of its own ----------------------
#
# Each case is a fresh copy of a debootstrapped bookworm (tests/support/chroot.py) with the
# stand-ins of tests/support/standins.py; the real script runs in it offline (the .debs a bare
# host installs are already in apt's cache), in a network namespace of its own: it cannot see
# this machine's engine or its registry, and all it starts dies with the case.

NEEDS_ROOT = "needs root and unshare, ss (util-linux, iproute2) for the throwaway host"
NO_ROOT = os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("ss") is None


@dataclass
class Outcome:
    """What one case left: exit status and stderr of each run, the packages (name -> 'ii'
    status) before the first run and after the last, the listeners after, the stand-ins' logs."""

    runs: list[tuple[int, str]]
    before: dict[str, str]
    after: dict[str, str]
    listening: list[str]
    systemctl: list[str]
    calls: str
    root: Path


@pytest.fixture(scope="module")
def standin_debs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    if NO_ROOT:
        pytest.skip(NEEDS_ROOT)
    reason = mirror_unreachable()
    if reason:
        pytest.skip(f"HOST-SETUP CHROOT TESTS NOT RUN: {reason}")
    return build_debs(tmp_path_factory.mktemp("standins"))


@pytest.fixture
def host(standin_debs: dict[str, Path]) -> Iterator[Path]:
    """A fresh throwaway host, in memory where /dev/shm is there (a copy on this machine's small
    shared disk took half a minute, and as long again to delete)."""
    shm = Path("/dev/shm")
    work = Path(tempfile.mkdtemp(prefix="sm120-host-setup-", dir=shm if shm.is_dir() else None))
    root = fresh_host(work)
    (root / "tmp" / "standins").mkdir()
    for deb in standin_debs.values():
        shutil.copy2(deb, root / "tmp" / "standins" / deb.name)
    (root / "tmp" / "standin-systemctl").write_text(SYSTEMCTL)
    shutil.copy2(SCRIPT, root / "opt" / "host-setup.sh")
    yield root
    remove_host(root)
    work.rmdir()


def _packages(text: str) -> dict[str, str]:
    return dict(line.split(" ", 1) for line in text.splitlines() if line.strip())


def run_case(
    root: Path,
    *,
    install: tuple[str, ...] = (),
    systemd: bool = True,
    running: bool = False,
    runs: tuple[tuple[str, ...], ...] = (("--registry",),),
    before_runs: str = "",
) -> Outcome:
    """Set the host up (stand-ins installed, a systemd host or not, the engine running or not),
    then run the script once per entry of runs (each: env assignments and arguments)."""
    debs = " ".join(f"/tmp/standins/{name}.deb" for name in install)
    query = "dpkg-query -W -f '${Package} ${db:Status-Abbrev}\\n'"
    lines = ['C="chroot $ROOT"', "mkdir -p $ROOT/tmp/out"]
    if systemd:
        lines += [
            "mkdir -p $ROOT/run/systemd/system",
            "$C dpkg-divert --local --rename --add /bin/systemctl >/dev/null",
            "install -m 755 $ROOT/tmp/standin-systemctl $ROOT/usr/bin/systemctl",
        ]
    if debs:
        lines.append(f"$C dpkg -i {debs} >$ROOT/tmp/out/standins.log 2>&1")
    if running:
        lines.append("ln -sf /run/fake-engine.sock $ROOT/run/docker.sock")
    lines += ["rm -f $ROOT/var/log/standin-*.log", f"$C {query} >$ROOT/tmp/out/before", before_runs]
    for index, run in enumerate(runs):
        env = [word for word in run if "=" in word]
        args = [word for word in run if "=" not in word]
        lines.append(
            f"$C env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin {' '.join(env)} /opt/host-setup.sh "
            f"{' '.join(args)} >/dev/null 2>$ROOT/tmp/out/stderr{index} "
            f"&& echo 0 >$ROOT/tmp/out/rc{index} || echo $? >$ROOT/tmp/out/rc{index}"
        )
    lines += [f"$C {query} >$ROOT/tmp/out/after", "ss -Hltn >$ROOT/tmp/out/listen"]
    with fake_engine_socket(root):
        done = in_namespaces(root, "\n".join(lines), timeout=600)
    assert done.returncode == 0, done.stderr
    out = root / "tmp" / "out"
    log = root / "var" / "log"

    def text(path: Path) -> str:
        return path.read_text() if path.exists() else ""

    return Outcome(
        runs=[(int(text(out / f"rc{i}")), text(out / f"stderr{i}")) for i in range(len(runs))],
        before=_packages(text(out / "before")),
        after=_packages(text(out / "after")),
        listening=[line.split()[3] for line in text(out / "listen").splitlines() if line.strip()],
        systemctl=text(log / "standin-systemctl.log").splitlines(),
        calls=text(log / "standin-calls.log"),
        root=root,
    )


def _installed(packages: dict[str, str]) -> set[str]:
    """Those installed (the second letter of dpkg's status: held ones are 'hi')."""
    return {name for name, status in packages.items() if status[1:2] == "i"}


def assert_nothing_removed(outcome: Outcome) -> None:
    assert _installed(outcome.before) <= _installed(outcome.after), _installed(
        outcome.before
    ) - _installed(outcome.after)


def assert_only_loopback(outcome: Outcome) -> None:
    assert all(address.startswith("127.") for address in outcome.listening), outcome.listening


def assert_packaged_registry_off(outcome: Outcome) -> None:
    assert not list(outcome.root.glob("etc/systemd/system/*.wants/docker-registry.service"))
    assert not any(
        line.startswith("start") and "docker-registry" in line for line in outcome.systemctl
    )
    assert not (outcome.root / "usr" / "sbin" / "policy-rc.d").exists()


@pytest.mark.network
def test_docker_ce_running_is_left_alone_and_the_registry_comes_up_on_loopback(host: Path) -> None:
    """make test on a Docker CE host whose engine runs: docker.io is never asked for (apt would
    remove docker-ce, docker-ce-cli and containerd.io for it), the engine is neither stopped nor
    started, and the registry packages install with their own service left off."""
    outcome = run_case(host, install=DOCKER_CE, running=True)
    ((rc, stderr),) = outcome.runs
    assert rc == 0, stderr
    assert_nothing_removed(outcome)
    assert set(DOCKER_CE) <= _installed(outcome.after)
    assert "docker.io" not in _installed(outcome.after)
    assert {"docker-registry", "debootstrap", "openssl"} <= _installed(outcome.after)
    assert not any(
        "docker" in line.split()[-1] and line.split()[0] in {"start", "stop", "restart"}
        for line in outcome.systemctl
        if line.split()
    ), outcome.systemctl
    assert "disable --now docker-registry.service" in outcome.systemctl
    assert outcome.calls == ""  # no dockerd, no init script
    assert_packaged_registry_off(outcome)
    assert outcome.listening == ["127.0.0.1:5000"]


@pytest.mark.network
def test_docker_ce_stopped_is_started_by_its_own_unit_and_nothing_installed(host: Path) -> None:
    outcome = run_case(host, install=DOCKER_CE, runs=((),))
    ((rc, stderr),) = outcome.runs
    assert rc == 0, stderr
    assert "systemctl start docker" in stderr and "started docker.service" in stderr
    assert outcome.systemctl == ["start docker"]
    assert outcome.after == outcome.before
    assert outcome.calls == ""
    assert outcome.listening == []


@pytest.mark.network
def test_docker_ce_stopped_without_systemd_gets_the_command_and_no_bare_dockerd(host: Path) -> None:
    outcome = run_case(host, install=DOCKER_CE, systemd=False, runs=((),))
    ((rc, stderr),) = outcome.runs
    assert rc == 2, stderr
    assert "package docker-ce" in stderr and "service docker start" in stderr
    assert "installs, replaces and restarts no engine it did not install" in stderr
    assert outcome.after == outcome.before
    assert outcome.calls == ""


#: Debian's docker.io installed before host-setup runs (the machine's image, or a host-setup
#: older than its mark), from the tree's apt cache with service starts forbidden; its dockerd
#: then replaced by a loud one that links the socket to the fake engine, as a started one would.
DOCKER_IO_PREINSTALLED = (
    "printf '#!/bin/sh\\nexit 101\\n' >$ROOT/usr/sbin/policy-rc.d\n"
    "chmod 755 $ROOT/usr/sbin/policy-rc.d\n"
    "$C env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-download docker.io"
    " >$ROOT/tmp/out/docker-io.log 2>&1\n"
    "rm -f $ROOT/usr/sbin/policy-rc.d\n"
    'printf \'#!/bin/sh\\necho "$0 $*" >>/var/log/standin-calls.log\\n'
    "ln -sf /run/fake-engine.sock /run/docker.sock\\n' >$ROOT/usr/sbin/dockerd\n"
)


@pytest.mark.network
def test_debian_docker_io_stopped_without_systemd_is_started_bare_not_refused(host: Path) -> None:
    """The CI machine of 2026-12-02: docker.io installed, no systemd, no engine answering and no
    mark of host-setup's. Its init script fails in a container (ulimit), so host-setup starts
    it as it starts its own: a bare dockerd; nothing is installed or removed for the engine."""
    outcome = run_case(host, systemd=False, runs=((),), before_runs=DOCKER_IO_PREINSTALLED)
    ((rc, stderr),) = outcome.runs
    assert rc == 0, stderr
    assert "docker.io is installed (not by host-setup) and stopped" in stderr
    assert "starting dockerd" in stderr
    assert outcome.calls.splitlines() == ["/usr/sbin/dockerd "], outcome.calls
    assert "docker.io" in _installed(outcome.after)
    assert not (host / "var/lib/sm120-stacks/engine-installed-by-host-setup").exists()


@pytest.mark.network
def test_a_bare_host_gets_docker_io_and_a_loopback_registry_only(host: Path) -> None:
    outcome = run_case(host)
    ((rc, stderr),) = outcome.runs
    assert rc == 0, stderr
    assert_nothing_removed(outcome)
    new = _installed(outcome.after) - _installed(outcome.before)
    assert {"docker.io", "docker-registry", "debootstrap"} <= new
    assert "openssl" in _installed(outcome.after)  # minbase has it already (ca-certificates)
    assert "docker-buildx" not in new  # bookworm has none
    assert "Debian GNU/Linux 12 (bookworm): docker.io 20.10" in stderr
    assert "start docker" in outcome.systemctl
    assert "disable --now docker-registry.service" in outcome.systemctl
    assert_packaged_registry_off(outcome)
    assert (host / "var/lib/sm120-stacks/engine-installed-by-host-setup").exists()
    assert outcome.listening == ["127.0.0.1:5000"]
    assert (
        "Remv"
        not in (host / "var/log/sm120-stacks/apt.log").read_text().split("apt-get install -y")[-1]
    )


@pytest.mark.network
def test_a_plan_that_removes_a_package_is_refused_before_anything_is_installed(host: Path) -> None:
    outcome = run_case(host, install=("site-registry",))
    ((rc, stderr),) = outcome.runs
    assert rc == 2, stderr
    assert "would REMOVE site-registry" in stderr and "nothing was installed" in stderr
    assert outcome.after == outcome.before
    assert outcome.systemctl == [] and outcome.listening == []


@pytest.mark.network
def test_a_plan_apt_refuses_is_explained_with_apt_s_own_lines(host: Path) -> None:
    """What Ubuntu's apt did with Docker CE (it refused, and the reason went to the stdout the
    old script threw away): here a held package that conflicts makes apt refuse the same way."""
    outcome = run_case(
        host, install=("site-registry",), before_runs="$C apt-mark hold site-registry >/dev/null"
    )
    ((rc, stderr),) = outcome.runs
    assert rc == 2, stderr
    assert "apt refuses to install" in stderr and "nothing was installed" in stderr
    assert "apt: E: " in stderr and "site-registry" in stderr.split("apt refuses")[1]
    assert _installed(outcome.after) == _installed(outcome.before)


@pytest.mark.network
def test_without_systemd_the_packaged_registry_is_neither_started_nor_enabled(host: Path) -> None:
    """A host without systemd (a container, a CI runner) with an engine that answers: the
    package's init script would serve :5000 on every interface; policy-rc.d keeps it from
    starting and update-rc.d turns it off at boot."""
    outcome = run_case(host, systemd=False, running=True)
    ((rc, stderr),) = outcome.runs
    assert rc == 0, stderr
    assert "docker-registry" in _installed(outcome.after)
    assert (host / "etc/init.d/docker-registry").exists()
    assert not list(host.glob("etc/rc[2-5].d/S*docker-registry"))
    assert outcome.listening == ["127.0.0.1:5000"]
    assert not (host / "usr/sbin/policy-rc.d").exists()


@pytest.mark.network
def test_another_system_is_told_what_to_run_and_nothing_is_installed(host: Path) -> None:
    (host / "etc" / "os-release").unlink()
    (host / "etc" / "os-release").write_text('ID=fedora\nPRETTY_NAME="Fedora Linux 41"\n')
    outcome = run_case(host, systemd=False)
    ((rc, stderr),) = outcome.runs
    assert rc == 2, stderr
    assert "Fedora Linux 41 is not Debian or Ubuntu: host-setup installs nothing here" in stderr
    assert "docker run -d -p 127.0.0.1:5000:5000 registry:2" in stderr
    assert outcome.after == outcome.before


LOGIN_REGISTRY = (
    "import http.server as h\n"
    "class R(h.BaseHTTPRequestHandler):\n"
    "    def do_GET(self):\n"
    "        self.send_response(401)\n"
    "        self.send_header('WWW-Authenticate', 'Basic realm=x')\n"
    "        self.send_header('Docker-Distribution-Api-Version', 'registry/2.0')\n"
    "        self.end_headers()\n"
    "    def log_message(self, *a): pass\n"
    "h.HTTPServer(('127.0.0.1', 5000), R).serve_forever()\n"
)


@pytest.mark.network
def test_a_port_taken_by_a_login_registry_is_named_and_another_port_works(host: Path) -> None:
    (host / "tmp" / "login_registry.py").write_text(LOGIN_REGISTRY)
    start = (
        f"{sys.executable} $ROOT/tmp/login_registry.py & "
        "for i in $(seq 50); do ss -Hltn | grep -q :5000 && break; sleep 0.1; done"
    )
    outcome = run_case(
        host,
        install=DOCKER_CE,
        running=True,
        before_runs=start,
        runs=(("--registry",), ("SM120_STACKS_REGISTRY=127.0.0.1:5001", "--registry")),
    )
    (refused, said), (rc, stderr) = outcome.runs
    assert refused == 2, said
    assert "port 5000 is taken" in said and "HTTP/1.0 401" in said
    assert said.count("HTTP/1.0 401") == 1, said  # once, not twice
    assert "SM120_STACKS_REGISTRY=127.0.0.1:5001" in said
    assert rc == 0, stderr
    assert sorted(outcome.listening) == ["127.0.0.1:5000", "127.0.0.1:5001"]
    assert_nothing_removed(outcome)


# --- engines that are not a plain rootful Docker (issue 47) ---------------------------------------

SNAP = (
    "mkdir -p $ROOT/snap/bin && printf '#!/bin/sh\\nexit 1\\n' >$ROOT/snap/bin/docker && "
    "chmod 755 $ROOT/snap/bin/docker && "
    "printf '[Service]\\nExecStart=/snap/bin/dockerd\\n' "
    ">$ROOT/etc/systemd/system/snap.docker.dockerd.service"
)


@pytest.mark.network
def test_a_stopped_docker_snap_is_started_and_no_docker_io_goes_beside_it(host: Path) -> None:
    """Ubuntu Server's installer offers the Docker snap: a docker.io beside it would serve the
    same socket from another image store; the snap's own unit is started instead."""
    outcome = run_case(host, before_runs=SNAP, runs=((),))
    ((rc, stderr),) = outcome.runs
    assert rc == 0, stderr
    assert "the Docker snap is installed but stopped" in stderr and "snap docker" in stderr
    assert outcome.systemctl == ["start snap.docker.dockerd"]
    assert outcome.after == outcome.before, "nothing installed beside the snap"


@pytest.mark.network
def test_a_docker_snap_without_systemd_gets_the_command(host: Path) -> None:
    outcome = run_case(host, systemd=False, before_runs=SNAP, runs=((),))
    ((rc, stderr),) = outcome.runs
    assert rc == 2, stderr
    assert "snap start docker" in stderr and "no second engine" in stderr
    assert outcome.after == outcome.before and outcome.calls == ""


@pytest.mark.network
def test_a_containerd_only_host_is_told_it_has_no_docker_engine(host: Path) -> None:
    """A Kubernetes GPU node: containerd.io and no Docker. Starting containerd never gives
    /var/run/docker.sock; what helps is Docker CE beside it, or the k8s rendering."""
    outcome = run_case(host, install=("containerd.io",), runs=((),))
    ((rc, stderr),) = outcome.runs
    assert rc == 2, stderr
    assert "containerd alone is no Docker engine" in stderr
    assert "apt-get install docker-ce docker-ce-cli" in stderr and "--format k8s" in stderr
    assert "the way it was installed" not in stderr
    assert outcome.after == outcome.before and outcome.systemctl == []


@pytest.mark.network
def test_rootless_docker_is_recognised_and_told_how_to_reach_it(host: Path) -> None:
    rootless = (
        "printf '#!/bin/sh\\nexit 1\\n' >$ROOT/usr/bin/dockerd-rootless.sh && "
        "chmod 755 $ROOT/usr/bin/dockerd-rootless.sh"
    )
    outcome = run_case(host, before_runs=rootless, runs=((),))
    ((rc, stderr),) = outcome.runs
    assert rc == 2, stderr
    assert "systemctl --user start docker" in stderr
    assert "DOCKER_HOST=unix://$XDG_RUNTIME_DIR/docker.sock" in stderr
    assert "Rootless Docker" in stderr, "the unit's limit is named"
    assert outcome.after == outcome.before, "no rootful engine installed beside it"


@pytest.mark.network
def test_podman_only_is_told_it_can_pin_and_deploy_but_not_build(host: Path) -> None:
    outcome = run_case(host, install=("podman",), runs=((),))
    ((rc, stderr),) = outcome.runs
    assert rc == 2, stderr
    assert "systemctl enable --now podman.socket" in stderr
    assert "podman can pin and deploy" in stderr and "builds need Docker with BuildKit" in stderr
    assert outcome.after == outcome.before
