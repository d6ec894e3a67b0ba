"""FlashInfer JIT modules the builder knows (knowledge/flashinfer_modules.yaml) and the presets
that name sets of them (knowledge/jit_presets.yaml).

Most modules are one fixed build each (`sampling`, `fused_moe_120`) and are listed by name. The
attention modules are not: FlashInfer compiles one per combination of dtypes, head dims and
variant flags and spells every parameter into the module's name. Listing each head dim by hand
would never end, and a name that differs by one character from the one FlashInfer looks up is a
cache miss at serve time. So a *family* says once how FlashInfer spells such a name and which
generator arguments make it; a name a family spells is known without being listed, with its
arguments read back out of the name.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Annotated, Any, Literal

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from pydantic import AfterValidator, Field, StringConstraints

from builder.errors import StackError
from builder.knowledge.loader import parse_document, read_knowledge
from builder.knowledge.strict import Strict

#: A generator argument, or a value a family parameter takes: a string "torch.NAME" is that
#: torch dtype (templates/tools/flashinfer_jit.py generator_arg).
ArgValue = bool | int | str
PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
ParamKind = Literal["dtype", "int", "bool"]


def _specifier(value: str) -> str:
    try:
        SpecifierSet(value)
    except InvalidSpecifier:
        raise ValueError(f"{value!r} is not a version specifier (e.g. >=0.6.5,<0.7)") from None
    return value


Specifier = Annotated[str, AfterValidator(_specifier)]


class JitModule(Strict):
    generator: str
    #: Positional arguments of the generator; a string "torch.NAME" is that torch dtype.
    args: list[ArgValue] = Field(default_factory=list)
    peak_gb: float
    used_by: str
    #: Archs the generator always builds for, whatever FLASHINFER_CUDA_ARCH_LIST says.
    fixed_archs: list[str] = Field(default_factory=list)


class ModuleFamily(Strict):
    """One generator whose modules are named by their parameters (see the module docstring)."""

    generator: str
    #: Parameter name -> kind, in the order they appear in `name`.
    params: dict[Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")], ParamKind]
    #: The generator's positional arguments; "{param}" stands for that parameter's value.
    args: list[ArgValue]
    #: The module name FlashInfer derives from the arguments, "{param}" standing for each.
    name: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_{}]+$")]
    peak_gb: float
    used_by: str
    fixed_archs: list[str] = Field(default_factory=list)
    #: The flashinfer-python versions whose generator and spelling were read.
    flashinfer: Specifier | None = None
    #: FlashInfer's own function that names the module from the same arguments (module:function):
    #: the tests call it from the pinned wheel and compare its spelling with `name`.
    uri: str | None = None
    #: What FlashInfer appends to that function's spelling for this family (0.7's FA2 module:
    #: `_kv_stride_equal`, added by its generator, not by the naming function).
    uri_suffix: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_]*$")] = ""

    def model_post_init(self, context: Any) -> None:
        named = PLACEHOLDER.findall(self.name)
        if sorted(named) != sorted(self.params) or len(set(named)) != len(named):
            raise ValueError(
                f"name must spell every parameter exactly once: {', '.join(self.params)}"
            )
        for arg in self.args:
            for used in PLACEHOLDER.findall(arg) if isinstance(arg, str) else ():
                if used not in self.params:
                    raise ValueError(f"args use {{{used}}}, which is not a parameter")


class _ModuleFile(Strict):
    modules: dict[str, JitModule]
    families: dict[str, ModuleFamily] = Field(default_factory=dict)
    #: torch dtype ("torch.bfloat16") -> how FlashInfer spells it in names ("bf16").
    dtype_names: dict[Annotated[str, StringConstraints(pattern=r"^torch\.[a-z0-9_]+$")], str] = (
        Field(default_factory=dict)
    )

    def model_post_init(self, context: Any) -> None:
        spellings = list(self.dtype_names.values())
        if len(set(spellings)) != len(spellings):
            raise ValueError("dtype_names: two dtypes with one spelling could not be read back")


class _Preset(Strict):
    description: str
    modules: list[str]
    includes: list[str] = Field(default_factory=list)


class _PresetFile(Strict):
    presets: dict[str, _Preset]


@dataclass(frozen=True)
class FamilyModule:
    """One module of a family: its name and the entry a listed module would have."""

    family: str
    name: str
    module: JitModule


class KnownModules(Mapping[str, JitModule]):
    """Every module the builder can precompile, by name: the listed ones, and any name a family
    spells. Iterating yields the listed ones only (a family's names are endless)."""

    def __init__(
        self,
        listed: dict[str, JitModule],
        families: dict[str, ModuleFamily],
        dtype_names: dict[str, str],
    ) -> None:
        self._listed = listed
        self.families = families
        self._dtype_names = dtype_names
        self._dtypes_by_name = {spelled: dtype for dtype, spelled in dtype_names.items()}
        self._patterns = {
            family_name: self._pattern(family) for family_name, family in families.items()
        }

    def __getitem__(self, name: str) -> JitModule:
        if name in self._listed:
            return self._listed[name]
        found = self.parse(name)
        if found is None:
            raise KeyError(name)
        return found.module

    def __iter__(self) -> Iterator[str]:
        return iter(self._listed)

    def __len__(self) -> int:
        return len(self._listed)

    def instance(self, family_name: str, values: Mapping[str, ArgValue]) -> FamilyModule:
        """The module of a family for these parameter values (dtypes as "torch.NAME")."""
        family = self.families[family_name]
        missing = set(family.params) - set(values)
        if missing:
            raise ValueError(f"{family_name}: no value for {', '.join(sorted(missing))}")
        spelled = {key: self._spell(family_name, key, values[key]) for key in family.params}
        name = PLACEHOLDER.sub(lambda m: spelled[m.group(1)], family.name)
        args = [_fill(arg, values) for arg in family.args]
        module = JitModule(
            generator=family.generator,
            args=args,
            peak_gb=family.peak_gb,
            used_by=family.used_by,
            fixed_archs=list(family.fixed_archs),
        )
        return FamilyModule(family=family_name, name=name, module=module)

    def parse(self, name: str) -> FamilyModule | None:
        """The family module of this name, its arguments read back out of it; None if no family
        spells it."""
        for family_name, pattern in self._patterns.items():
            match = pattern.fullmatch(name)
            if match is None:
                continue
            family = self.families[family_name]
            values: dict[str, ArgValue] = {}
            for key, kind in family.params.items():
                text = match.group(key)
                if kind == "dtype":
                    values[key] = self._dtypes_by_name[text]
                elif kind == "int":
                    values[key] = int(text)
                else:
                    values[key] = text == "True"
            found = self.instance(family_name, values)
            if found.name == name:  # e.g. "064" reads as 64 but FlashInfer spells "64"
                return found
        return None

    def _spell(self, family_name: str, key: str, value: ArgValue) -> str:
        kind = self.families[family_name].params[key]
        if kind == "dtype":
            if not isinstance(value, str) or value not in self._dtype_names:
                raise ValueError(f"{family_name}.{key}: {value!r} is not a dtype in dtype_names")
            return self._dtype_names[value]
        if kind == "bool":
            if not isinstance(value, bool):
                raise ValueError(f"{family_name}.{key}: {value!r} is not a bool")
            return str(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{family_name}.{key}: {value!r} is not an integer")
        return str(value)

    def _pattern(self, family: ModuleFamily) -> re.Pattern[str]:
        dtypes = "|".join(sorted(map(re.escape, self._dtypes_by_name), key=len, reverse=True))
        kinds = {"dtype": f"(?:{dtypes})", "int": r"\d+", "bool": "True|False"}
        parts, last = [], 0
        for match in PLACEHOLDER.finditer(family.name):
            parts.append(re.escape(family.name[last : match.start()]))
            key = match.group(1)
            parts.append(f"(?P<{key}>{kinds[family.params[key]]})")
            last = match.end()
        parts.append(re.escape(family.name[last:]))
        return re.compile("".join(parts))


def _fill(arg: ArgValue, values: Mapping[str, ArgValue]) -> ArgValue:
    """A generator argument with its placeholder replaced: a whole "{param}" by the value itself
    (keeping its type), anything else as it is."""
    if isinstance(arg, str):
        whole = PLACEHOLDER.fullmatch(arg)
        if whole:
            return values[whole.group(1)]
    return arg


@cache
def jit_presets() -> dict[str, _Preset]:
    return parse_document(read_knowledge("jit_presets.yaml"), _PresetFile).presets


@cache
def jit_modules_known() -> KnownModules:
    doc = read_knowledge("flashinfer_modules.yaml")
    parsed = parse_document(doc, _ModuleFile)
    known = KnownModules(parsed.modules, parsed.families, parsed.dtype_names)
    for name, listed in parsed.modules.items():
        spelled = known.parse(name)
        if spelled is not None and (
            spelled.module.generator,
            spelled.module.args,
            spelled.module.fixed_archs,
        ) != (listed.generator, listed.args, listed.fixed_archs):
            raise StackError(
                f"module {name} is spelled by family {spelled.family} with other arguments",
                file=doc.path,
                key=f"modules.{name}",
                line=doc.lines.get(("modules", name)),
                hint="make its generator, args and fixed_archs the family's, or drop the entry",
            )
    return known
