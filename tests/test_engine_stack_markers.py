"""Keep the engine suite small: a test in tests/engine/ that builds or pushes ci-mini (3.6 GB)
must say it needs ci-mini's content with @pytest.mark.needs_ci_mini (on itself or its module's
pytestmark); every other engine test takes the tiny stack (issue 41). Read from the sources, so
it runs without an engine; tests/engine/conftest.py checks the same at run time, before a build.

What counts as using ci-mini: asking for a fixture that builds it (conftest's CI_MINI_FIXTURES,
or a fixture of the module, or one it imports from another engine module, that does), writing a
manifest that `extends: ci-mini`, or a call that builds or pushes "ci-mini" by name.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from builder import REPO_ROOT

ENGINE_TESTS = REPO_ROOT / "tests" / "engine"
#: Mirrors tests/engine/conftest.py (not imported: that module imports the engine's packages).
CI_MINI_FIXTURES = frozenset({"ci_mini", "variant"})
MARKER = "needs_ci_mini"
VERBS = frozenset({"build", "push"})

Function = ast.FunctionDef | ast.AsyncFunctionDef


def _functions(tree: ast.Module) -> list[Function]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]


def _decorator_names(node: Function) -> set[str]:
    """The last dotted part of each decorator (pytest.fixture -> fixture, pytest.mark.X -> X)."""
    names = set()
    for decorator in node.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        if isinstance(target, ast.Attribute):
            names.add(target.attr)
        elif isinstance(target, ast.Name):
            names.add(target.id)
    return names


def _module_marks(tree: ast.Module) -> set[str]:
    """The markers named in the module's `pytestmark = ...` (one or a list)."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets
        ):
            return {n.attr for n in ast.walk(node.value) if isinstance(n, ast.Attribute)}
    return set()


def _names_ci_mini_itself(node: Function) -> bool:
    """A manifest extending ci-mini, or a build/push of "ci-mini" by name, in node's body."""
    for inner in ast.walk(node):
        text = inner.value if isinstance(inner, ast.Constant) else None
        if isinstance(text, str) and ("extends: ci-mini\n" in text or text == "extends: ci-mini"):
            return True
        if isinstance(inner, ast.Call):
            said = {a.value for a in inner.args if isinstance(a, ast.Constant)}
            if "ci-mini" in said and said & VERBS:
                return True
    return False


def _args(node: Function) -> set[str]:
    return {a.arg for a in node.args.args + node.args.kwonlyargs}


def ci_mini_fixtures_of(path: Path, seen: dict[Path, set[str]] | None = None) -> set[str]:
    """The fixtures of the module at path that build ci-mini: directly, or through another
    (its own, conftest's, or one imported from another engine test module)."""
    seen = {} if seen is None else seen
    if path in seen:
        return seen[path]
    seen[path] = set()
    tree = ast.parse(path.read_text(), str(path))
    using = set(CI_MINI_FIXTURES)
    for node in tree.body:  # fixtures imported from other engine modules
        module = node.module if isinstance(node, ast.ImportFrom) else None
        if module and module.startswith("tests.engine.test_"):
            assert isinstance(node, ast.ImportFrom)
            other = ENGINE_TESTS / f"{module.rpartition('.')[2]}.py"
            imported = {alias.name for alias in node.names}
            using |= imported & ci_mini_fixtures_of(other, seen)
    fixtures = [f for f in _functions(tree) if "fixture" in _decorator_names(f)]
    changed = True
    while changed:  # fixtures of fixtures, until nothing more is found
        changed = False
        for fixture in fixtures:
            uses = _args(fixture) & using or _names_ci_mini_itself(fixture)
            if fixture.name not in using and uses:
                using.add(fixture.name)
                changed = True
    seen[path] = using
    return using


def unmarked_ci_mini_tests(path: Path) -> list[str]:
    """The tests of the module at path that use ci-mini without the needs_ci_mini marker."""
    tree = ast.parse(path.read_text(), str(path))
    if MARKER in _module_marks(tree):
        return []
    using = ci_mini_fixtures_of(path)
    return [
        node.name
        for node in _functions(tree)
        if node.name.startswith("test_")
        and MARKER not in _decorator_names(node)
        and (_args(node) & using or _names_ci_mini_itself(node))
    ]


def test_every_engine_test_that_builds_ci_mini_says_it_needs_its_content() -> None:
    unmarked = [
        f"{path.relative_to(REPO_ROOT)}::{name}"
        for path in sorted(ENGINE_TESTS.glob("test_*.py"))
        for name in unmarked_ci_mini_tests(path)
    ]
    assert not unmarked, (
        f"{len(unmarked)} engine tests use ci-mini (3.6 GB) without @pytest.mark.{MARKER}: "
        "take the tiny stack (tiny_stack, tiny_variant, tiny_pushed in tests/engine/conftest.py)"
        " or mark them, saying which of ci-mini's content they need:\n" + "\n".join(unmarked)
    )


def test_the_marker_is_registered(pytestconfig: pytest.Config) -> None:
    assert any(line.startswith(f"{MARKER}(") for line in pytestconfig.getini("markers"))


def test_the_conftest_guards_the_same_fixtures() -> None:
    source = (ENGINE_TESTS / "conftest.py").read_text()
    assert 'CI_MINI_FIXTURES = frozenset({"ci_mini", "variant"})' in source
    assert f'NEEDS_CI_MINI = "{MARKER}"' in source


@pytest.mark.parametrize(
    ("source", "unmarked"),
    [
        ("def test_a(ci_mini): pass\n", ["test_a"]),
        ("import pytest\n@pytest.mark.needs_ci_mini('jit')\ndef test_a(ci_mini): pass\n", []),
        ("import pytest\npytestmark = [pytest.mark.engine, pytest.mark.needs_ci_mini]\n"
         "def test_a(variant): pass\n", []),
        ("import pytest\n@pytest.fixture\ndef pushed(variant): pass\n"
         "@pytest.fixture\ndef twice(pushed): pass\ndef test_a(twice): pass\n", ["test_a"]),
        ("def test_a(tmp_path):\n    (tmp_path / 'x.yaml').write_text("
         "'extends: ci-mini\\nenv: {}')\n", ["test_a"]),
        ("def test_a(cli_process):\n    cli_process('push', 'ci-mini', '--force')\n", ["test_a"]),
        ("def test_a(tiny_variant, cli_process):\n    cli_process('check', 'ci-mini')\n", []),
    ],
    ids=[
        "fixture-unmarked",
        "marked-test",
        "marked-module",
        "fixture-of-fixture",
        "extends-ci-mini",
        "push-by-name",
        "tiny-only",
    ],
)  # fmt: skip
def test_the_check_finds_what_it_should(tmp_path: Path, source: str, unmarked: list[str]) -> None:
    folder = tmp_path / "repo"
    folder.mkdir()
    path = folder / "test_case.py"
    path.write_text(source)
    assert unmarked_ci_mini_tests(path) == unmarked
