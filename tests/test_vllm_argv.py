"""The one reader of vLLM's command line (builder/vllmcli/vllm_argv.py): argparse's rules, as
vLLM's FlexibleArgumentParser applies them, for every reader of a serve argv."""

from __future__ import annotations

import pytest

from builder.hosts.topology import serve_of
from builder.vllmcli.vllm_argv import has_flag, last_value

TP = "--tensor-parallel-size"


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["vllm", "serve", "m", "-tp", "2"], "2"),
        (["vllm", "serve", "m", "--tensor-parallel-size=4"], "4"),
        (["vllm", "serve", "m", "--tensor_parallel_size", "4"], "4"),  # underscores read as dashes
        (["vllm", "serve", "m", "--tensor-parallel", "8"], "8"),  # an unambiguous prefix
        (["vllm", "serve", "m", "-tp", "2", "--tensor-parallel-size", "4"], "4"),  # last wins
        (["vllm", "serve", "m", "-tp", "-1"], "-1"),  # a negative number is a value
        (["vllm", "serve", "m"], None),
    ],
)
def test_last_value_reads_as_argparse_does(argv: list[str], expected: str | None) -> None:
    found = last_value(argv, TP, ("-tp",))
    assert (found and found.value) == expected


def test_an_option_without_its_value_is_refused() -> None:
    with pytest.raises(ValueError, match="takes a value"):
        last_value(["-tp", "--enforce-eager"], TP, ("-tp",))


def test_flags_in_every_spelling() -> None:
    assert has_flag(["--disable_custom_all_reduce"], "--disable-custom-all-reduce")
    assert has_flag(["--disable-custom-all"], "--disable-custom-all-reduce")
    assert not has_flag(["--disable-custom-all-reduce=1"], "--disable-custom-all-reduce")
    assert not has_flag(["--trust-remote-code"], "--disable-custom-all-reduce")


def test_doctor_reads_the_parallel_shape_as_the_serve_path_does() -> None:
    """topology used to match exact spellings only: `--tensor_parallel_size 2` read as 1."""
    argv = ["vllm", "serve", "m", "--tensor_parallel_size", "2", "--pipeline-parallel=2"]
    serve = serve_of("pin", [*argv, "--disable_custom_all_reduce"], {}, None)
    assert (serve.tensor_parallel, serve.pipeline_parallel) == (2, 2)
    assert serve.custom_all_reduce_disabled
