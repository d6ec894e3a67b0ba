"""A registry as users have them, on loopback: TLS from a private CA made here, and a password.

Debian's docker-registry (distribution 2.8, the one scripts/host-setup.sh installs) serves it,
with an htpasswd file (bcrypt, as distribution requires) and a certificate for 127.0.0.1 and
localhost. The CA goes where the engine and the tool look for it (a certs.d folder of the
test's own, HOST/ca.crt); the login is made with the real `docker login`, into a DOCKER_CONFIG
of the test's own, so nothing here touches the machine's own config or trust.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.support.net import free_port


@dataclass(frozen=True)
class TlsRegistry:
    host: str
    user: str
    password: str
    ca: Path
    certs_d: Path
    docker_config: Path
    process: subprocess.Popen[bytes]
    log: Path

    def env(self, **extra: str) -> dict[str, str]:
        """What a user who ran `docker login` and trusted the CA has: no insecure registry."""
        return {
            "DOCKER_CONFIG": str(self.docker_config),
            "SM120_STACKS_CERTS_D": str(self.certs_d),
            "SM120_STACKS_INSECURE_REGISTRIES": "",
            **extra,
        }

    @contextlib.contextmanager
    def frozen(self) -> Iterator[None]:
        """The registry stopped (SIGSTOP): connections are accepted, nothing is answered."""
        self.process.send_signal(signal.SIGSTOP)
        try:
            yield
        finally:
            self.process.send_signal(signal.SIGCONT)


def bcrypt_hash(password: str) -> str:
    """The bcrypt hash distribution's htpasswd needs, from the C library's crypt(3) (libxcrypt
    on Debian): the standard library's `crypt` (Python <= 3.12) wraps it."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import crypt

    return crypt.crypt(password, crypt.mksalt(crypt.METHOD_BLOWFISH))


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_certificates(folder: Path) -> tuple[Path, Path, Path]:
    """A CA, and a server certificate it signs for 127.0.0.1 and localhost: (ca, cert, key)."""
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
             "/CN=sm120-stacks test registry CA", "-keyout", "ca.key", "-out", "ca.crt",
             cwd=folder)  # fmt: skip
    (folder / "san.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1",
             "-keyout", "server.key", "-out", "server.csr", cwd=folder)  # fmt: skip
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
             "-CAcreateserial", "-days", "2", "-extfile", "san.cnf", "-out", "server.crt",
             cwd=folder)  # fmt: skip
    return folder / "ca.crt", folder / "server.crt", folder / "server.key"


@contextlib.contextmanager
def tls_registry(folder: Path, docker: str = "docker") -> Iterator[TlsRegistry]:
    folder.mkdir(parents=True, exist_ok=True)
    ca, cert, key = make_certificates(folder)
    user, password = "sm120-tester", "pw-" + os.urandom(12).hex()
    (folder / "htpasswd").write_text(f"{user}:{bcrypt_hash(password)}\n")
    host = f"127.0.0.1:{free_port()}"
    (folder / "config.yml").write_text(
        "version: 0.1\nlog:\n  level: warn\n"
        f"storage:\n  filesystem:\n    rootdirectory: {folder / 'data'}\n"
        "  delete:\n    enabled: true\n"
        f"http:\n  addr: {host}\n  tls:\n    certificate: {cert}\n    key: {key}\n"
        f"auth:\n  htpasswd:\n    realm: sm120-test\n    path: {folder / 'htpasswd'}\n"
    )
    log = folder / "registry.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            ["docker-registry", "serve", str(folder / "config.yml")], stdout=out, stderr=out
        )
    try:
        _wait_until_up(host, ca, log)
        certs_d = folder / "certs.d"
        (certs_d / host).mkdir(parents=True)
        (certs_d / host / "ca.crt").write_bytes(ca.read_bytes())
        config = folder / "docker-config"
        config.mkdir()
        subprocess.run(
            [docker, "login", host, "--username", user, "--password-stdin"],
            input=password.encode(),
            env={**os.environ, "DOCKER_CONFIG": str(config)},
            check=True,
            capture_output=True,
        )
        yield TlsRegistry(host, user, password, ca, certs_d, config, process, log)
    finally:
        process.send_signal(signal.SIGCONT)
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()


def _wait_until_up(host: str, ca: Path, log: Path) -> None:
    import ssl

    context = ssl.create_default_context(cafile=str(ca))
    for _ in range(60):
        try:
            urllib.request.urlopen(f"https://{host}/v2/", timeout=2, context=context)
        except urllib.error.HTTPError as exc:
            if exc.code == 401:
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"the TLS registry on {host} did not come up: {log.read_text()[-2000:]}")
