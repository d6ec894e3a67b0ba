"""One reader of vLLM's command line, with the rules of vLLM's own parser.

vLLM's `FlexibleArgumentParser` (vllm/utils/argparse_utils.py, read in 0.22.1 and 0.33.0) is an
argparse parser: an option's value follows it or comes after `=`, underscores read as dashes,
any unambiguous prefix of a long option is the option (allow_abbrev), and an option given twice
keeps its last value. Everything in this project that reads a serve argv (the checks of
serve.extra_args, the attention backend the serve path derives from, the parallel sizes
`doctor` and the warm-cache key read from a pin's command) reads it here, so no two of them can
read one argv two ways.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from builder.vllmcli.serveflags import ATTENTION_CONFIG_OPTIONS, BACKEND_OPTION, vllm_options

#: Every option of vLLM's this project reads, to tell what an abbreviation stands for.
VLLM_OPTIONS = vllm_options()
CONFIG_OPTIONS = ATTENTION_CONFIG_OPTIONS
#: argparse's _negative_number_matcher.
NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")


@dataclass(frozen=True)
class OptionValue:
    """The value an argv gives an option, where argparse would take it from."""

    value: str
    #: The index of the argument that holds the value (the option's own, with `=`).
    index: int
    #: The option as the argv spells it (an abbreviation, underscores).
    spelled: str


def last_value(
    args: Sequence[str], option: str, aliases: Collection[str] = ()
) -> OptionValue | None:
    """The value argparse keeps for option (or its short aliases): the last one given; None
    when the argv does not give it. A given option without a value is a ValueError."""
    names = {option, *aliases}
    found: OptionValue | None = None
    for index, arg in enumerate(args):
        parsed = option_of(arg)
        if parsed is None:
            continue
        name, value = parsed
        if name in names or expand(name, VLLM_OPTIONS) == option:
            if value is None:
                if index + 1 >= len(args) or _is_option(args[index + 1]):
                    raise ValueError(f"{arg} takes a value")
                found = OptionValue(args[index + 1], index + 1, name)
            else:
                found = OptionValue(value, index, name)
    return found


def _is_option(arg: str) -> bool:
    """argparse's test: a word starting with `-` is an option unless it looks like a negative
    number (the parser has no option that does), which it takes as a value."""
    return arg.startswith("-") and NEGATIVE_NUMBER.match(arg) is None


def has_flag(args: Sequence[str], flag: str) -> bool:
    """Whether the argv sets a store_true flag (spelled in full, abbreviated or underscored)."""
    for arg in args:
        parsed = option_of(arg)
        if parsed is not None and parsed[1] is None and expand(parsed[0], VLLM_OPTIONS) == flag:
            return True
    return False


@dataclass(frozen=True)
class BackendOption:
    """The attention backend serve.extra_args name, as vLLM will run it."""

    #: Upper-cased, as vLLM looks it up (AttentionBackendEnum[value.upper()]).
    backend: str
    #: The argument of serve.extra_args that names it.
    index: int
    #: That argument as the manifest spells it, with its value: where the backend comes from.
    spelled: str


class ExtraArgError(ValueError):
    """An argument of serve.extra_args vLLM would refuse at start, with its index there."""

    def __init__(self, index: int, message: str, hint: str) -> None:
        super().__init__(message)
        self.index, self.message, self.hint = index, message, hint


def attention_backend_option(args: Sequence[str]) -> BackendOption | None:
    """The attention backend serve.extra_args name, read as vLLM's parser reads them (read in
    0.22.1 and 0.33.0: vllm/utils/argparse_utils.py FlexibleArgumentParser, engine/arg_utils.py
    create_engine_config); None where they name none, or `auto` (vLLM then picks, as with none).

    `--attention-backend X` and `--attention-config '{"backend": "X"}'` (`-ac`), `=` or a
    separate value, underscores for dashes, any unambiguous prefix of the option; each is stored
    by argparse, so the last occurrence wins. `--attention-config.KEY VALUE` arguments are merged
    into one object per spelling and passed after all others, so such an object replaces any JSON
    one, its own `backend` key or not. vLLM refuses to start with both a backend and a config
    that names one, with a value that is missing or another option, and with a config that is
    not a JSON object: so does this (ExtraArgError)."""
    config: tuple[str | None, int] | None = None  # the backend of the config vLLM runs with
    found = attention_config_value(args, "backend")
    if found is not None and isinstance(found[0], str) and found[0].lower() != "auto":
        config = (found[0], found[1])  # else it names no backend (auto: vLLM picks)
    backend: tuple[str | None, int] | None = None  # the last --attention-backend
    for index, arg in enumerate(args):
        parsed = option_of(arg)
        if parsed is None or "." in parsed[0] or expand(parsed[0], VLLM_OPTIONS) != BACKEND_OPTION:
            continue
        value = value_of(args, index, parsed[1], BACKEND_OPTION)
        backend = (None if value == "None" else value, index)  # optional_type(str)
    chosen = config
    if backend is not None and backend[0] is not None:
        if config is not None:
            raise ExtraArgError(
                backend[1],
                f"{args[config[1]]} names the attention backend too: vLLM refuses to start "
                "with both (attention_backend and attention_config.backend are mutually "
                "exclusive)",
                "name the backend once",
            )
        chosen = backend
    if chosen is None or chosen[0] is None or chosen[0].lower() == "auto":
        return None
    index = chosen[1]
    written = args[index] if "=" in args[index] else " ".join(args[index : index + 2])
    return BackendOption(chosen[0].upper(), index, written)


def option_of(arg: str) -> tuple[str, str | None] | None:
    """An argument as vLLM's parser names an option: underscores before the first `.` read as
    dashes (FlexibleArgumentParser.parse_args), and the value after `=`; None for a value."""
    if not arg.startswith("-"):
        return None
    name, has_value, value = arg.partition("=")
    if name.startswith("--"):
        head, dot, rest = name.partition(".")
        name = head.replace("_", "-") + dot + rest
    return name, (value if has_value else None)


def expand(spelled: str, options: Collection[str]) -> str | None:
    """The option of these that `spelled` names: itself, or the only one a long option's prefix
    abbreviates (argparse's allow_abbrev, on in vLLM's parser). No option of vLLM's is a prefix of
    one of these, so an exact name of vLLM's never reads as one of them."""
    if spelled in options:
        return spelled
    if spelled.startswith("--") and len(spelled) > 2:
        found = [option for option in options if option.startswith(spelled)]
        if len(found) == 1:
            return found[0]
    return None


def value_of(args: Sequence[str], index: int, value: str | None, option: str) -> str:
    """The value an option at args[index] takes: after `=`, or the next argument; an option
    with none (the end, or another option next) is refused, as vLLM's parser refuses it."""
    if value is None and index + 1 < len(args):
        value = args[index + 1]
    if not value or _is_option(value):
        got = "nothing" if not value else f"the option {value}"
        raise ExtraArgError(
            index,
            f"{args[index]} takes a value and is followed by {got}: vLLM refuses to start",
            f"write {option} VALUE",
        )
    return value


def attention_config_value(args: Sequence[str], key: str) -> tuple[Any, int] | None:
    """The value vLLM's --attention-config ends up with for key, and the index of the argument
    that gives it; None where no argument sets an attention config (a value of None: the config
    vLLM runs with does not set key). The one reader of that option's merge, as vLLM's parser
    does it (read in 0.22.1 and 0.33.0): each JSON object (`-ac`, `=` or a separate value, any
    prefix of the option) is stored in order and the last wins; the `--attention-config.KEY
    VALUE` arguments of one spelling merge into one object passed after all others, so such an
    object replaces any JSON one, its own KEY or not; a dotted value is JSON where it parses,
    else text. A value that is missing or another option, and a JSON config that is not an
    object, are refused as vLLM refuses them (ExtraArgError)."""
    objects: list[tuple[Any, int]] = []
    dotted: dict[str, tuple[Any, int]] = {}
    for index, arg in enumerate(args):
        parsed = option_of(arg)
        if parsed is None:
            continue
        name, value = parsed
        spelled, _, sub = name.partition(".")
        option = expand(spelled, VLLM_OPTIONS)
        if option not in CONFIG_OPTIONS:
            continue
        text = value_of(args, index, value, option)
        if sub == key:
            dotted[spelled] = (_json_or_text(text), index)
        elif sub:
            dotted.setdefault(spelled, (None, index))
        else:
            objects.append((_config_object(text, index).get(key), index))
    chosen = [*objects, *dotted.values()]
    return chosen[-1] if chosen else None


def _json_or_text(value: str) -> Any:
    """A dotted option's value as vLLM reads it: JSON where it parses, else the text."""
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return value


def _config_object(
    value: str,
    index: int,
    option: str = "--attention-config",
    example: str = """write it as '{"backend": "FLASHINFER"}', or use --attention-backend NAME""",
) -> dict[str, Any]:
    """A config option's JSON object (--attention-config, --speculative-config); anything else
    is refused, as vLLM refuses it at start. example: the hint, in the option's own terms."""
    try:
        config = json.loads(value)
    except json.JSONDecodeError:
        config = None
    if not isinstance(config, dict):
        raise ExtraArgError(
            index, f"{value} is not a JSON object: vLLM's {option} refuses it at start", example
        )
    return config


#: vLLM's --speculative-config and its short form (engine/arg_utils.py:1864-1866 in 0.33.0), and
#: the 0.33 shorthands that set one key of it each (:1869-1872, merged at :2108-2121).
SPECULATIVE_OPTIONS = ("--speculative-config", "-sc")
SPECULATIVE_SHORTHANDS = {
    "--spec-method": "method",
    "--spec-model": "model",
    "--spec-tokens": "num_speculative_tokens",
}


@dataclass(frozen=True)
class SpeculativeOption:
    """The speculative config a serve argv gives vLLM, as its parser and
    EngineArgs.create_speculative_config read it."""

    #: The object vLLM builds SpeculativeConfig from (keys with underscores).
    config: dict[str, object]
    #: The index of the argument it comes from (the last that contributes).
    index: int


def speculative_config(args: Sequence[str]) -> SpeculativeOption | None:
    """The speculative config an argv asks for; None where it asks for none.

    `--speculative-config JSON` (`-sc`, `=` or a separate value, any unambiguous prefix), the
    last one kept as argparse keeps it; `--speculative-config.KEY VALUE` arguments merged into
    one object passed after all others (so it replaces a JSON one), as vLLM's
    FlexibleArgumentParser does for every dotted config option; then 0.33's `--spec-method`,
    `--spec-model`, `--spec-tokens`, each setting its key and refused where the config sets the
    key too (arg_utils.py:2117-2120), as vLLM refuses it. A value that is not a JSON object is
    refused (ExtraArgError), as vLLM refuses it at start."""
    whole: tuple[dict[str, object], int] | None = None
    dotted: dict[str, object] = {}
    dotted_at = -1
    short: dict[str, tuple[str, object, int]] = {}  # key -> (shorthand, value, index)
    options = (*VLLM_OPTIONS, *SPECULATIVE_SHORTHANDS)
    for index, arg in enumerate(args):
        parsed = option_of(arg)
        if parsed is None:
            continue
        name, value = parsed
        spelled, _, key = name.partition(".")
        option = SPECULATIVE_OPTIONS[0] if spelled == "-sc" else expand(spelled, options)
        if option in SPECULATIVE_SHORTHANDS and not key:
            text = value_of(args, index, value, option)
            wanted = SPECULATIVE_SHORTHANDS[option]
            short[wanted] = (option, int(text) if text.isdigit() else text, index)
            continue
        if option != SPECULATIVE_OPTIONS[0]:
            continue
        text = value_of(args, index, value, option)
        if key:
            loaded = _json_value(text)
            dotted[key.partition(".")[0].replace("-", "_")] = loaded
            dotted_at = index
            continue
        if text == "None":  # optional_type(json.loads)
            whole = None
            continue
        config = _config_object(
            text,
            index,
            "--speculative-config",
            """write it as '{"method": "mtp", "num_speculative_tokens": 1}'""",
        )
        whole = ({str(k).replace("-", "_"): v for k, v in config.items()}, index)
    if dotted:
        whole = (dotted, dotted_at)
    for key, (flag, setting, index) in short.items():
        if whole is not None and key in whole[0]:
            raise ExtraArgError(
                index,
                f"{flag} and --speculative-config['{key}'] are mutually exclusive: vLLM "
                "refuses to start",
                "set the key once",
            )
        config_so_far, last = whole if whole is not None else ({}, -1)
        whole = ({**config_so_far, key: setting}, max(index, last))
    if whole is None:
        return None
    return SpeculativeOption(whole[0], whole[1])


def _json_value(value: str) -> object:
    """A dotted option's value as vLLM reads it: JSON where it parses, else the text."""
    try:
        loaded: object = json.loads(value)
        return loaded
    except json.JSONDecodeError:
        return value


__all__ = [
    "CONFIG_OPTIONS",
    "VLLM_OPTIONS",
    "BackendOption",
    "ExtraArgError",
    "OptionValue",
    "SpeculativeOption",
    "attention_backend_option",
    "attention_config_value",
    "expand",
    "has_flag",
    "last_value",
    "option_of",
    "speculative_config",
    "value_of",
]
