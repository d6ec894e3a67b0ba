"""The field knowledge of tensor parallelism over PCIe, knowledge/pcie_p2p.yaml: the `topo -p2p`
legend, the ACS redirect flags, the workaround and its cost, every sentence and fix a finding
says, and the sources they cite; its schema, and the checks beyond it (every advice the code
asks for, only the template fields the code fills, every cited key a source).
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from functools import cache
from typing import Any

from pydantic import Field

from builder.errors import StackError
from builder.hosts.hostcheck import Finding
from builder.knowledge.loader import parse_document, read_knowledge
from builder.knowledge.strict import Strict
from builder.knowledge.yamlsafe import YamlDocument

KNOWLEDGE_FILE = "pcie_p2p.yaml"


class Source(Strict):
    url: str = Field(pattern=r"^https://\S+$")
    #: What the source establishes, paraphrased.
    says: str


class Status(Strict):
    """One code of the `nvidia-smi topo -p2p` legend."""

    meaning: str
    consequence: str = ""
    fix: str = ""
    evidence: list[str] = Field(default_factory=list)


class Advice(Strict):
    detail: str
    fix: str = ""
    evidence: list[str] = Field(default_factory=list)


class Workaround(Strict):
    how: str
    cost: str
    evidence: list[str] = Field(default_factory=list)


class PcieKnowledge(Strict):
    #: The `topo -p2p` legend, OK first, then from the most to the least severe: a pair whose
    #: read and write matrices differ is reported under the more severe of its two codes.
    p2p_status: dict[str, Status]
    acs_redirect_flags: list[str]
    setpci: str
    workaround: Workaround
    advice: dict[str, Advice]
    sources: dict[str, Source]

    def urls(self, keys: Sequence[str]) -> tuple[str, ...]:
        return tuple(dict.fromkeys(self.sources[key].url for key in keys))

    def severity(self, code: str) -> int:
        """How severe a `topo -p2p` code is, 0 the most: its place in p2p_status; a code the
        file does not know ranks as U (Unknown), whose wording it gets."""
        order = list(self.p2p_status)
        return order.index(code if code in order else "U")

    def worst(self, codes: set[str]) -> str | None:
        """The most severe of codes other than OK (None: all OK)."""
        refused = codes - {"OK"}
        return min(refused, key=lambda c: (self.severity(c), c)) if refused else None

    def finding(
        self, name: str, key: str, ok: bool = True, warn: bool = False, **fields: Any
    ) -> Finding:
        """The finding advice `key` words, its templates filled with fields."""
        advice = self.advice[key]
        fix = advice.fix.format(**fields) if advice.fix and (not ok or warn) else ""
        return Finding(
            name,
            ok,
            advice.detail.format(**fields),
            fix,
            warn=warn,
            evidence=self.urls(advice.evidence),
        )


#: The fields each advice's templates may use (checked when the file is read).
ADVICE_FIELDS: dict[str, frozenset[str]] = {
    key: frozenset(fields)
    for key, fields in {
        "not_applicable": {"why"},
        "no_serve": set(),
        "gpus": {"what", "needed", "gpus"},
        "gpus_missing": {"what", "needed", "tp", "pp", "have"},
        "gpus_unread": {"why"},
        "p2p_ok": {"pairs"},
        "p2p_not_ok": {"pairs", "status", "meaning", "consequence", "fix"},
        "p2p_unread": {"why"},
        "over_nvlink": {"pairs"},
        "over_pcie": {"pairs"},
        "acs_ok": {"bridges"},
        "acs_none": {"pairs"},
        "acs_redirect": {"pairs", "bridges", "setpci", "kernel_list", "workaround", "how"},
        "acs_redirect_passthrough": {"pairs", "bridges", "setpci", "kernel_list", "how"},
        "acs_unread": {"why"},
        "acs_denied": {"bridges"},
        "acs_not_needed": set(),
        "acs_nvlink": {"pairs"},
        "iommu_ok": {"how"},
        "iommu_translated": {"how", "pairs", "workaround"},
        "iommu_unknown": {"how"},
        "iommu_not_needed": set(),
        "iommu_nvlink": {"pairs", "how"},
        "workaround_in_effect": {"finding", "custom_ar", "cost"},
        "workaround_incomplete": {"finding", "fix"},
        "workaround_unneeded": set(),
    }.items()
}


@cache
def knowledge() -> PcieKnowledge:
    """knowledge/pcie_p2p.yaml, checked (read once per process)."""
    return checked_knowledge(read_knowledge(KNOWLEDGE_FILE))


def checked_knowledge(doc: YamlDocument) -> PcieKnowledge:
    """The knowledge doc holds, checked beyond its schema: every advice the code asks for, only
    the template fields the code fills, every evidence key a source, the OK and U statuses."""
    parsed = parse_document(doc, PcieKnowledge)

    def wrong(message: str, *key: str | int) -> StackError:
        return StackError(
            message, file=doc.path, key=".".join(map(str, key)), line=doc.line_of(key)
        )

    for key, allowed in ADVICE_FIELDS.items():
        advice = parsed.advice.get(key)
        if advice is None:
            raise wrong("missing advice", "advice", key)
        for part in ("detail", "fix"):
            used = {name for _, name, _, _ in string.Formatter().parse(getattr(advice, part))}
            unknown = sorted(name for name in used - allowed if name is not None)
            if unknown:
                raise wrong(f"unknown template field {{{unknown[0]}}}", "advice", key, part)
    cited = [("workaround", parsed.workaround.evidence)]
    cited += [(f"advice.{k}", a.evidence) for k, a in parsed.advice.items()]
    cited += [(f"p2p_status.{k}", s.evidence) for k, s in parsed.p2p_status.items()]
    for where, keys in cited:
        for key in keys:
            if key not in parsed.sources:
                raise wrong(f"evidence {key!r} is not a source", *where.split("."), "evidence")
    for status in ("OK", "U"):
        if status not in parsed.p2p_status:
            raise wrong(f"the {status} status is missing", "p2p_status")
    return parsed
