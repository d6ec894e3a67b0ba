"""What a serve asks of its host's GPUs, read from its command line and env: the parallel sizes
(vLLM's argparse rules, through vllmcli/vllm_argv), the GPUs its container gets, and whether it
works around P2P. Bad sizes are StackErrors naming the file, key and line they were written at.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from builder.errors import StackError
from builder.knowledge.loader import locate
from builder.knowledge.yamlsafe import YamlDocument
from builder.vllmcli.vllm_argv import has_flag, last_value

#: vLLM's spellings of the parallel sizes (argparse: the last one given wins; `--flag=N` too).
TP_FLAGS = ("--tensor-parallel-size", "-tp")
PP_FLAGS = ("--pipeline-parallel-size", "-pp")
NO_CUSTOM_ALL_REDUCE = "--disable-custom-all-reduce"
P2P_DISABLE = "NCCL_P2P_DISABLE"
#: vLLM's custom all-reduce runs over P2P only at 2 PCIe GPUs: it turns itself off for more
#: than two GPUs without NVLink (custom_all_reduce.py, "more than two PCIe-only GPUs").
CUSTOM_ALL_REDUCE_PCIE_SIZE = 2


@dataclass(frozen=True)
class Serve:
    """What a serve asks of its host's GPUs: its parallel sizes, the GPUs the container gets,
    and whether it works around P2P (NCCL_P2P_DISABLE=1, --disable-custom-all-reduce)."""

    #: Who asks, for messages: "the pin of gpu-node-07", "stack vllm-0.22-marlin".
    what: str
    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    #: GPU indices the container gets; None: all of the host's.
    gpus: tuple[int, ...] | None = None
    nccl_p2p_disabled: bool = False
    custom_all_reduce_disabled: bool = False

    @property
    def world(self) -> int:
        """GPUs the serve runs on."""
        return self.tensor_parallel * self.pipeline_parallel

    @property
    def custom_all_reduce_uses_p2p(self) -> bool:
        return (
            self.tensor_parallel == CUSTOM_ALL_REDUCE_PCIE_SIZE
            and not self.custom_all_reduce_disabled
        )

    @property
    def works_around_p2p(self) -> bool:
        """NCCL kept off P2P, and vLLM's custom all-reduce too where it would use it."""
        return self.nccl_p2p_disabled and not self.custom_all_reduce_uses_p2p


@dataclass(frozen=True)
class ArgvOrigin:
    """Where the words of a serve argv were written, for errors that name the file, key and line:
    from argv[first] on, the list at `key` (a pin's `command`; a stack's serve.extra_args, after
    the words the tool derives from the manifest) of the first of docs (child first) that
    spells it out."""

    key: tuple[str, ...] = ("command",)
    first: int = 0
    docs: tuple[YamlDocument, ...] = ()

    def error(self, index: int, message: str, hint: str) -> StackError:
        """An error about argv[index]: `key.N` with N its index in that list."""
        if index < self.first:  # a word derived from a checked manifest field: no list index
            return StackError(message, key=".".join(self.key), hint=hint)
        key_path = (*self.key, index - self.first)
        file, line = None, None
        if self.docs:
            doc, line = locate(key_path, list(self.docs))
            file = doc.path
        key = ".".join(map(str, key_path))
        return StackError(message, file=file, key=key, line=line, hint=hint)


def serve_of(
    what: str,
    argv: Sequence[str],
    env: Mapping[str, str],
    gpus: Sequence[int] | None,
    origin: ArgvOrigin | None = None,
) -> Serve:
    """The Serve of a serve command (a pin's `command`, a stack's serve argv) and its env.

    A parallel size that is not a positive whole number is bad input: a StackError naming where
    origin says the word was written (default: key command.N, no file).
    """
    origin = origin or ArgvOrigin()
    return Serve(
        what=what,
        tensor_parallel=_parallel_size(argv, TP_FLAGS, origin),
        pipeline_parallel=_parallel_size(argv, PP_FLAGS, origin),
        gpus=None if gpus is None else tuple(gpus),
        nccl_p2p_disabled=env.get(P2P_DISABLE, "").strip() == "1",
        custom_all_reduce_disabled=has_flag(argv, NO_CUSTOM_ALL_REDUCE),
    )


def _parallel_size(argv: Sequence[str], flags: tuple[str, ...], origin: ArgvOrigin) -> int:
    """The size vLLM's parser keeps (vllmcli/vllm_argv: the last given, any spelling it takes)."""
    flag = flags[0]
    try:
        found = last_value(argv, flag, flags[1:])
    except ValueError:
        found = None  # a dangling option: vLLM refuses it at start; 1 is what would run
    if found is None:
        return 1
    value = found.value
    # str.isdigit() is true for "²" and other digits int() refuses: ASCII digits only.
    if not (value.isascii() and value.isdigit()) or int(value) < 1:
        raise origin.error(
            found.index,
            f"{found.spelled} {value!r} is not a number of GPUs",
            hint=f"the serve command needs {flag} N with N >= 1",
        )
    return int(value)
