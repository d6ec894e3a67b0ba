"""sm120-stacks: pinned, tested vLLM + FlashInfer images for NVIDIA sm120/sm121 GPUs.

One subpackage per pipeline step, data flowing one way:
spec (manifest -> resolved stack) -> lock -> render (build context) -> image (build, records,
registry) -> verify (test report) -> hosts (pin, deploy, drift); cli sits on top. The layering
is an import contract checked by `make lint` (.importlinter).
"""

from pathlib import Path

#: The repository root: templates/, knowledge/, patches/ and stacks/ live beside the package.
REPO_ROOT = Path(__file__).resolve().parent.parent
