"""The engine killed under `test` (bench/kill_outages.py, engine test t0.10/t0.40/t0.70): the
engine's API drops the connection and the command ends on EngineUnreachable. Before the fix it
said only "failed: the Docker engine: the engine's API dropped the connection: (...)", naming
nothing to do; now it says the engine stopped answering and to run the command again once it
answers. An engine that answers and refuses keeps its old words."""

from __future__ import annotations

import pytest

from builder.cli.app import user_errors
from builder.errors import EngineError, EngineUnreachable

#: What the engine adapter raised (bench/results/kill-sweep/outages/engine-test-t0.10-killed.txt).
DROPPED = (
    "the engine's API dropped the connection: ('Connection aborted.', "
    "ConnectionRefusedError(111, 'Connection refused'))"
)


def test_an_engine_that_stopped_answering_is_said_with_what_to_do(
    capsys: pytest.CaptureFixture[str],
) -> None:
    @user_errors
    def smoke() -> None:
        raise EngineUnreachable(DROPPED)

    with pytest.raises(SystemExit) as ended:
        smoke()
    assert ended.value.code == 1
    said = capsys.readouterr().err.splitlines()
    assert len(said) == 1 and said[0].startswith("failed: the Docker engine stopped answering")
    assert DROPPED in said[0] and "run the command again" in said[0]


def test_an_engine_that_refuses_keeps_its_words(capsys: pytest.CaptureFixture[str]) -> None:
    @user_errors
    def run() -> None:
        raise EngineError("Conflict. The container name is already in use")

    with pytest.raises(SystemExit) as ended:
        run()
    assert ended.value.code == 1
    assert capsys.readouterr().err == (
        "failed: the Docker engine: Conflict. The container name is already in use\n"
    )


def test_a_streamed_answer_cut_short_is_the_engine_unreachable() -> None:
    """Engine test t0.70: the engine killed while `test` read a streamed answer; requests said
    ChunkedEncodingError, which was a plain EngineError ("ChunkedEncodingError: Response ended
    prematurely", nothing to do). It is the engine gone, as a cut-off push stream is."""
    import requests

    from builder.engine.docker_adapter import _engine_errors

    cut = pytest.raises(EngineUnreachable, match="dropped the connection mid-stream")
    with cut, _engine_errors():
        raise requests.exceptions.ChunkedEncodingError("Response ended prematurely")
