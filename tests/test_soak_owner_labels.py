"""Every container the tool starts for itself carries its run's owner label (issue 34 item 3),
so a killed run's container is found and removed by the next run's reaper (engine/owner.py).

Read from the source, so a new `engine.run(...)` anywhere in builder/ is held to it: its spec
is `owned(...)`, or a ContainerSpec built in the same function with OWNER_LABEL among its
labels. The one exception is the pin's own server (`container_spec(pin)`, hosts/deploy.py):
it outlives the run by design, is labelled by its host and replaced by the next deploy, and a
reaper must never remove it. The engine tests show the label on the real containers
(tests/engine/test_killed_test.py, test_smoke.py, test_two_folders.py).
"""

from __future__ import annotations

import ast

from builder import REPO_ROOT

BUILDER = REPO_ROOT / "builder"

#: The pin's server: long-lived, labelled by host (sm120-stacks.host), never reaped.
NOT_OWNED = {("builder/hosts/deploy.py", "container_spec")}


def _engine_runs(tree: ast.AST) -> list[tuple[ast.FunctionDef | ast.AsyncFunctionDef, ast.Call]]:
    """Each `<...>engine.run(ARG)` call with the function it is in."""
    found = []
    for func in ast.walk(tree):
        if not isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(func):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            receiver = node.func.value
            name = receiver.attr if isinstance(receiver, ast.Attribute) else None
            name = receiver.id if isinstance(receiver, ast.Name) else name
            if node.func.attr == "run" and name is not None and name.endswith("engine"):
                found.append((func, node))
    return found


def _called(node: ast.AST) -> str | None:
    if isinstance(node, ast.Call):
        if isinstance(node.func, ast.Name):
            return node.func.id
        if isinstance(node.func, ast.Attribute):
            return node.func.attr
    return None


def _labels_name_the_owner(spec: ast.Call) -> bool:
    for keyword in spec.keywords:
        if keyword.arg == "labels" and isinstance(keyword.value, ast.Dict):
            return any(
                isinstance(k, ast.Name) and k.id == "OWNER_LABEL" for k in keyword.value.keys
            )
    return False


def _owned(func: ast.FunctionDef | ast.AsyncFunctionDef, arg: ast.expr) -> bool:
    if _called(arg) == "owned":
        return True
    if _called(arg) == "ContainerSpec":
        return _labels_name_the_owner(arg)  # type: ignore[arg-type]
    if isinstance(arg, ast.Name):
        for node in ast.walk(func):
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == arg.id for t in node.targets
            ):
                if _called(node.value) == "owned":
                    return True
                if _called(node.value) == "ContainerSpec":
                    return _labels_name_the_owner(node.value)  # type: ignore[arg-type]
    return False


def test_every_container_the_tool_starts_for_itself_names_its_owner() -> None:
    runs, unowned = [], []
    for path in sorted(BUILDER.rglob("*.py")):
        relative = str(path.relative_to(REPO_ROOT))
        if relative == "builder/engine/docker_adapter.py":
            continue  # the adapter's own run: what the others call
        for func, call in _engine_runs(ast.parse(path.read_text(), relative)):
            assert len(call.args) == 1, f"{relative}:{call.lineno}: engine.run takes one spec"
            runs.append(f"{relative}:{call.lineno}")
            if (relative, _called(call.args[0])) in NOT_OWNED:
                continue
            if not _owned(func, call.args[0]):
                unowned.append(f"{relative}:{call.lineno} in {func.name}()")
    assert len(runs) >= 5, f"the check found too few engine.run calls to mean anything: {runs}"
    assert not unowned, f"containers started with no owner label: {unowned}"


def test_the_check_tells_an_unlabelled_spec_from_a_labelled_one() -> None:
    source = """
def labelled(engine):
    spec = ContainerSpec(image="i", labels={"x": "y", OWNER_LABEL: owner()})
    return engine.run(spec)

def wrapped(self):
    return self.engine.run(owned(ContainerSpec(image="i")))

def bare(engine):
    spec = ContainerSpec(image="i", labels={"sm120-stacks.smoke": "s"})
    return engine.run(spec)
"""
    verdicts = {
        func.name: _owned(func, call.args[0]) for func, call in _engine_runs(ast.parse(source))
    }
    assert verdicts == {"labelled": True, "wrapped": True, "bare": False}
