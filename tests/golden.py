"""Golden Dockerfiles: `make golden` rewrites tests/golden/; review the change as a diff."""

from __future__ import annotations

from pathlib import Path

from builder import REPO_ROOT
from builder.manifest.resolve import resolve, stack_names
from builder.render.context import render

GOLDEN_DIR = Path(__file__).parent / "golden"
STACKS = REPO_ROOT / "stacks"


def rendered_dockerfile(name: str) -> str:
    return render(resolve(name, STACKS)).dockerfile


def regenerate() -> list[Path]:
    GOLDEN_DIR.mkdir(exist_ok=True)
    written = []
    for name in stack_names(STACKS):
        path = GOLDEN_DIR / f"{name}.Dockerfile"
        path.write_text(rendered_dockerfile(name))
        written.append(path)
    return written


if __name__ == "__main__":
    for path in regenerate():
        print(path.relative_to(REPO_ROOT))
