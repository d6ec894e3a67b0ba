"""Messages that repeat what the user gave and say what happened (issue 47, "Messages"), checked
without an engine or registry: the hint after a push whose evidence failed names the push to run
again with the user's own --registry, --signing-key and --engine; the engine's errors run
together are said one after the other."""

from __future__ import annotations

import pytest

from builder.errors import OperationFailed, StackError
from builder.evidence.publish import _evidence_failed
from builder.hosts.deploy import separated
from builder.image.distribute import Pushed
from builder.image.registry import Registry

PUSHED = Pushed("ci-tiny", "0" * 64, "reg.example:5443/team/sm120-stacks@sha256:" + "a" * 64)
AGAIN = (
    "`sm120-stacks push ci-tiny --registry reg.example:5443/team --signing-key "
    "'/keys/my build.key' --engine ssh://ops@gpu1` again (it sends only what is missing)"
)
OPTIONS = ("--signing-key", "/keys/my build.key", "--engine", "ssh://ops@gpu1")


def test_a_failed_evidence_step_keeps_its_exit_status_and_repeats_the_users_options() -> None:
    registry = Registry.parse("reg.example:5443/team")
    refused = StackError("login refused", hint="docker login reg.example:5443")
    said = _evidence_failed(refused, PUSHED, registry, OPTIONS)
    assert type(said) is StackError  # exit 2, as the login's refusal is everywhere
    assert said.hint == f"docker login reg.example:5443; then {AGAIN}"
    assert "its evidence did not: it is not recorded as pushed" in said.message
    failed = _evidence_failed(OperationFailed("the registry said 500"), PUSHED, registry, OPTIONS)
    assert type(failed) is OperationFailed and str(failed).endswith(f"fix that, then {AGAIN}")


@pytest.mark.parametrize(
    ("engine_said", "readable"),
    [
        (
            "Get http://127.0.0.1:5999/v2/: dial tcp 127.0.0.1:5999: connect: connection refused"
            "Error response from daemon: no such image: x@sha256:ee",
            "Get http://127.0.0.1:5999/v2/: dial tcp 127.0.0.1:5999: connect: connection "
            "refused; Error response from daemon: no such image: x@sha256:ee",
        ),
        (
            "Error response from daemon: one error only",
            "Error response from daemon: one error only",
        ),
        (
            "a; Error response from daemon: already apart",
            "a; Error response from daemon: already apart",
        ),
    ],
)
def test_the_engines_errors_are_said_one_after_the_other(engine_said: str, readable: str) -> None:
    assert separated(engine_said) == readable


def test_push_repeats_engine_only_where_the_user_gave_it() -> None:
    from pathlib import Path

    from builder.cli.app import Settings
    from builder.cli.images import _engine_given
    from builder.manifest.substitute import Substitutions

    settings = Settings(Path("stacks"), Path("build"), Substitutions())
    assert _engine_given(settings) == ()
    settings.engine, settings.engine_given = "ssh://ops@gpu1", True
    assert _engine_given(settings) == ("--engine", "ssh://ops@gpu1")
