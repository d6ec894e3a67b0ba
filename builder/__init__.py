"""sm120-stacks: pinned, tested vLLM + FlashInfer images for NVIDIA sm120/sm121 GPUs.

One subpackage per pipeline step, data flowing one way: spec (manifest -> resolved stack)
-> lock (the stack with its lock, read once) -> render (build context) -> image (what build
decides, builds, records, registry) -> verify (test report) -> evidence (documents in the
registry) -> warm (warm-cache artifacts) -> hosts (pin, deploy, drift) | report (HTML, the
docs' tables); upstream proposes new stacks; cli sits on top. engine/ (the container engine),
errors.py and files.py are the ground floor beneath every step. The layering is an import
contract checked by `make lint` (.importlinter); docs/architecture.md has a line per module.
"""

from pathlib import Path

#: The repository root: templates/, knowledge/, patches/ and stacks/ live beside the package.
REPO_ROOT = Path(__file__).resolve().parent.parent
