"""sm120-stacks: pinned, tested vLLM + FlashInfer images for NVIDIA sm120/sm121 GPUs.

The pipeline runs one way, one module per step:
manifest (manifest.py, yamlsafe.py) -> resolved stack (resolve.py, archflags.py, rules.py)
-> rendered build context (render.py) -> image (engine.py, build.py) -> test report
-> registry digest (registry.py) -> host pin.
"""

from pathlib import Path

#: The repository root: templates/, knowledge/, patches/ and stacks/ live beside the package.
REPO_ROOT = Path(__file__).resolve().parent.parent
