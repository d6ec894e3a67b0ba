"""Stand-in packages and a stand-in systemctl for the throwaway host (tests/support/chroot.py).

The packages carry Docker CE's real control fields (docker/docker-ce-packaging, deb/common/control):
what makes apt remove Docker CE to install Debian's docker.io is exactly these Depends, Conflicts,
Replaces and Provides, so a stand-in with them meets the same resolver. They are built with
dpkg-deb from a control file, as equivs would build them, without equivs' toolchain. Their files
are inert and loud: `dockerd` and the init script only write to a log, so a test sees any call.

The stand-in systemctl (the host's systemd is not running in a chroot) logs every call and does
what the script's and the packages' calls need: `is-enabled` and `is-active` answer from the
wants links and the socket (deb-systemd-invoke starts only an enabled unit); `start docker`
links /run/docker.sock to the fake engine socket; `start docker-registry` runs the packaged
service as its unit would (all interfaces, :5000), so a forgotten guard shows up as a listener;
`enable` and `preset` (deb-systemd-helper's way of enabling) link the unit as its WantedBy=
says; `disable` removes the links (and with --now stops what it started).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

DOCKER_CE_VERSION = "5:27.3.1-1~debian.12~bookworm"
CONTROLS: dict[str, dict[str, str]] = {
    "docker-ce": {
        "Version": DOCKER_CE_VERSION,
        "Depends": "containerd.io (>= 1.6.24), docker-ce-cli",
        "Conflicts": "docker (<< 1.5~), docker-engine, docker.io",
        "Replaces": "docker-engine",
    },
    "docker-ce-cli": {
        "Version": DOCKER_CE_VERSION,
        "Conflicts": "docker (<< 1.5~), docker-engine, docker.io",
        "Replaces": "docker-ce (<< 5:0)",
    },
    "containerd.io": {
        "Version": "1.7.22-1",
        "Conflicts": "containerd, runc",
        "Replaces": "containerd, runc",
        "Provides": "containerd, runc",
    },
    # Debian 12's podman (its control fields' name and version; no files needed: host-setup
    # reads the package status).
    "podman": {"Version": "4.3.1+ds1-8+deb12u1"},
    # Not Docker's: a site package that conflicts with what host-setup installs, to see the
    # simulation refuse a plan that removes anything.
    "site-registry": {"Version": "1.0", "Conflicts": "docker-registry"},
}
DOCKER_CE = ("containerd.io", "docker-ce-cli", "docker-ce")

LOUD = '#!/bin/sh\necho "$0 $*" >>/var/log/standin-calls.log\nexit 1\n'
FILES: dict[str, dict[str, str]] = {
    "docker-ce": {
        "usr/bin/dockerd": LOUD,
        "etc/init.d/docker": LOUD,
        "lib/systemd/system/docker.service": (
            "[Unit]\nDescription=Docker Application Container Engine (stand-in)\n"
            "[Service]\nExecStart=/usr/bin/dockerd -H fd://\n[Install]\nWantedBy=multi-user.target\n"
        ),
    },
}
#: docker-ce's prerm as dh_installsystemd writes it: removing the package stops the engine.
PRERM = {
    "docker-ce": "#!/bin/sh\nset -e\nif [ -d /run/systemd/system ]; then\n"
    "  deb-systemd-invoke stop docker.service docker.socket >/dev/null || true\nfi\n"
}

SYSTEMCTL = r"""#!/bin/sh
# stand-in systemctl (tests/support/standins.py): logs every call, emulates the few it needs
echo "$*" >>/var/log/standin-systemctl.log
verb="" units="" now=0
for a in "$@"; do
  case $a in
    --now) now=1 ;;
    -*) ;;
    *) if [ -z "$verb" ]; then verb=$a; else units="$units ${a%.service}"; fi ;;
  esac
done
for u in $units; do
  case "$verb $u" in
    "start docker" | "start snap.docker.dockerd") ln -sf /run/fake-engine.sock /run/docker.sock ;;
    "stop docker") rm -f /run/docker.sock ;;
    "start docker-registry")
      setsid docker-registry serve /etc/docker/registry/config.yml \
        >/var/log/packaged-registry.log 2>&1 </dev/null &
      echo $! >/run/packaged-registry.pid ;;
    "stop docker-registry")
      [ -f /run/packaged-registry.pid ] && kill "$(cat /run/packaged-registry.pid)" ;;
    "enable "* | "preset "*)  # Debian's preset is "enable": link the unit where WantedBy= says
      for f in /etc/systemd/system/"$u".service /lib/systemd/system/"$u".service; do
        [ -f "$f" ] || continue
        for t in $(sed -n 's/^WantedBy=//p' "$f"); do
          mkdir -p /etc/systemd/system/"$t".wants && ln -sf "$f" /etc/systemd/system/"$t".wants/
        done
        break
      done ;;
    "disable "*)
      rm -f /etc/systemd/system/*.wants/"$u".service
      [ $now = 1 ] && [ "$u" = docker-registry ] && [ -f /run/packaged-registry.pid ] &&
        kill "$(cat /run/packaged-registry.pid)" ;;
    "is-enabled "*)
      if ls /etc/systemd/system/*.wants/"$u".service >/dev/null 2>&1; then echo enabled; exit 0; fi
      echo disabled; exit 1 ;;
    "is-active docker")
      [ -e /run/docker.sock ] && { echo active; exit 0; }; echo inactive; exit 3 ;;
    "is-active "*) echo inactive; exit 3 ;;
  esac
done
exit 0
"""


def build_debs(into: Path) -> dict[str, Path]:
    """Each stand-in as a .deb under into/, by package name."""
    debs = {}
    for name, fields in CONTROLS.items():
        tree = into / f"{name}-tree"
        (tree / "DEBIAN").mkdir(parents=True)
        control = {"Package": name, **fields, "Architecture": "amd64"}
        control |= {"Maintainer": "sm120-stacks tests <tests@invalid>"}
        control["Description"] = f"stand-in for {name} (sm120-stacks host-setup tests)"
        (tree / "DEBIAN" / "control").write_text(
            "".join(f"{key}: {value}\n" for key, value in control.items())
        )
        if name in PRERM:
            (tree / "DEBIAN" / "prerm").write_text(PRERM[name])
            (tree / "DEBIAN" / "prerm").chmod(0o755)
        for relative, text in FILES.get(name, {}).items():
            path = tree / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            path.chmod(0o755 if text.startswith("#!") else 0o644)
        deb = into / f"{name}.deb"
        subprocess.run(
            ["dpkg-deb", "--root-owner-group", "--build", str(tree), str(deb)],
            check=True,
            capture_output=True,
        )
        debs[name] = deb
    return debs
