"""The README and docs/ say what the code does: their generated tables are the generator's
output, their links resolve, the commands and make targets they quote exist, and every figure
names the raw output under bench/results/ it came from."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path

import click
import pytest
from click.testing import Result

from builder import REPO_ROOT
from builder.cli.app import cli, import_all_commands
from builder.report.tables import SECTIONS, splice

DOCS = sorted(
    [REPO_ROOT / "README.md", REPO_ROOT / "CHANGELOG.md", *(REPO_ROOT / "docs").glob("*.md")]
)
#: Pages whose every figure must cite its raw file: not the changelog (commit messages) nor the
#: generated rules table (each rule's error quotes what its own `evidence` in rules.yaml shows).
FIGURE_PAGES = [page for page in DOCS if page.name not in {"CHANGELOG.md", "rules.md"}]
#: A measured figure: a time, a speed or a ratio (a size or a count may be a setting).
FIGURE = re.compile(r"(?<![\w.])\d+(?:\.\d+)?\s?(?:ms|s|min|minutes|h|hours|tok/s|x|×|%)(?![\w/])")
RAW = re.compile(r"bench/results/[\w./-]*[\w/]")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _ids(pages: list[Path]) -> list[str]:
    return [str(page.relative_to(REPO_ROOT)) for page in pages]


def test_the_generated_tables_are_the_generators_output(run_cli: Callable[..., Result]) -> None:
    result = run_cli("docs", "--check")
    assert result.exit_code == 0, result.output


def test_a_new_stack_makes_the_readme_stale(
    run_cli: Callable[..., Result], write_stack: Callable[..., Path], stacks_dir: Path
) -> None:
    before = (REPO_ROOT / "README.md").read_text()
    write_stack("vllm-0.33-newer", "extends: vllm-0.33-marlin\n")
    result = run_cli("docs", "--check", stacks_dir=stacks_dir)
    assert result.exit_code == 1, result.output
    assert "stale: the stack table of README.md" in result.output
    assert (REPO_ROOT / "README.md").read_text() == before  # --check writes nothing


def test_every_section_has_its_markers() -> None:
    for section in SECTIONS:
        text = section.file.read_text()
        assert splice(text, section.name, "X", section.file).count("\nX\n") == 1


@pytest.mark.parametrize("page", DOCS, ids=_ids(DOCS))
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        if not (page.parent / target.split("#", 1)[0]).exists():
            broken.append(target)
    assert not broken, f"{page.name}: {broken}"


def _quoted(text: str) -> Iterator[str]:
    """Code: fenced blocks and inline spans, where commands are quoted."""
    fenced = re.findall(r"^```.*?^```", text, flags=re.S | re.M)
    yield from fenced
    rest = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    yield from re.findall(r"`([^`\n]+)`", rest)


def _make_targets() -> set[str]:
    makefile = (REPO_ROOT / "Makefile").read_text()
    return set(re.findall(r"^([A-Za-z][\w.-]*)\s*:(?!=)", makefile, flags=re.M))


@pytest.mark.parametrize("page", DOCS, ids=_ids(DOCS))
def test_every_quoted_command_and_make_target_exists(page: Path) -> None:
    import_all_commands()
    commands = set(cli.commands)
    targets = _make_targets()
    unknown = []
    for code in _quoted(page.read_text()):
        for name in re.findall(r"sm120-stacks[ \t]+([a-z][\w-]*)", code):
            if name not in commands:
                unknown.append(f"sm120-stacks {name}")
        for name in re.findall(r"(?<![\w-])make[ \t]+([a-z][\w-]*)", code):
            if name not in targets:
                unknown.append(f"make {name}")
    assert not unknown, f"{page.name}: {unknown}"


def _blocks(text: str) -> list[str]:
    """Paragraphs, list items, table rows and whole code blocks."""
    blocks: list[str] = []
    for chunk in re.split(r"(^```.*?^```$)", text, flags=re.S | re.M):
        if chunk.startswith("```"):
            blocks.append(chunk)
            continue
        for paragraph in re.split(r"\n\s*\n", chunk):
            blocks.extend(re.split(r"\n(?=\s*(?:[-*] |\d+\. |\|))", paragraph))
    return [block for block in blocks if block.strip()]


@pytest.mark.parametrize("page", FIGURE_PAGES, ids=_ids(FIGURE_PAGES))
def test_every_figure_names_its_raw_file(page: Path) -> None:
    """A block with a figure cites an existing bench/results/ path, or the block after it does
    (an example's output, then the sentence naming its raw files)."""
    blocks = _blocks(page.read_text())
    uncited = []
    for index, block in enumerate(blocks):
        figures = FIGURE.findall(block)
        if not figures:
            continue
        near = block + (blocks[index + 1] if index + 1 < len(blocks) else "")
        if not any((REPO_ROOT / path).exists() for path in RAW.findall(near)):
            uncited.append(f"{figures[0]!r} in: {block.strip()[:100]}")
    assert not uncited, f"{page.name}:\n" + "\n".join(uncited)


@pytest.mark.parametrize("page", DOCS, ids=_ids(DOCS))
def test_every_raw_file_cited_exists(page: Path) -> None:
    missing = [path for path in RAW.findall(page.read_text()) if not (REPO_ROOT / path).exists()]
    assert not missing, f"{page.name}: {missing}"


def test_the_commands_are_what_ci_runs() -> None:
    """The README's two commands are `.ci/run`'s and the Makefile's own."""
    readme = (REPO_ROOT / "README.md").read_text()
    assert "make stack STACK=vllm-0.33-marlin" in readme and "\nmake test " in readme
    assert re.search(r"^make test$", (REPO_ROOT / ".ci" / "run").read_text(), flags=re.M)
    assert isinstance(cli, click.Group)


def test_the_front_door_follows_the_rules() -> None:
    """Every stack the README tells a GPU host to `make stack` passes every rule, and serves
    the model the README has it download (issue 33: the front door once met an open crash)."""
    from builder.manifest.check import check_stack
    from builder.manifest.resolve import resolve

    readme = (REPO_ROOT / "README.md").read_text()
    doors = set(re.findall(r"make stack STACK=([\w.-]+)", readme)) - {"ci-mini"}
    downloads = set(re.findall(r"hf download (\S+)", readme))
    assert doors and downloads
    for name in doors:
        stack = resolve(name, REPO_ROOT / "stacks")
        assert check_stack(stack).ok, [v.rule.id for v in check_stack(stack).violations]
        assert stack.manifest.serve.model.id in downloads, name


def _newest_generation() -> str:
    from builder.manifest.resolve import resolve, stack_names

    stacks = REPO_ROOT / "stacks"
    versions = []
    for name in stack_names(stacks):
        vllm = resolve(name, stacks).manifest.python.packages.get("vllm")
        if vllm is not None:
            versions.append(tuple(int(part) for part in vllm.version.split(".")[:2]))
    return "vllm-{}.{}-".format(*max(versions))


def test_the_weekly_workflow_and_make_help_follow_the_current_generation() -> None:
    """`.github/workflows/upstream.yml` proposes from the newest vLLM's stacks, and the Makefile's
    examples name them (both named the 0.22 stacks long after 0.33 came)."""
    workflow = (REPO_ROOT / ".github" / "workflows" / "upstream.yml").read_text()
    flagships = re.search(r"^\s+FLAGSHIPS: (.+)$", workflow, flags=re.M)
    assert flagships is not None
    newest = _newest_generation()
    for name in flagships.group(1).split():
        assert (REPO_ROOT / "stacks" / f"{name}.yaml").is_file(), name
        assert name.startswith(newest), name
    help_text = (REPO_ROOT / "Makefile").read_text().split("\nhelp:", 1)[1].split("\n\n", 1)[0]
    examples = re.findall(r"STACK=(vllm-[\w.-]+)", help_text)
    assert examples and all(name.startswith(newest) for name in examples), examples
