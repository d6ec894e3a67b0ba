# Rendered by sm120-stacks from stacks/ci-tiny.yaml; edit the manifest, not this file.

# --- toolchain: build base, system packages, Python 3.11 virtual environment ---
FROM local/debian-python:bookworm AS toolchain
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
RUN python3.11 -m venv /opt/venv
ENV VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# --- jit-deps: only what the FlashInfer JIT compile reads (torch, FlashInfer and its imports) ---
# Its own requirements file (requirements/jit.txt, knowledge/jit_dependencies.yaml says which
# packages), FROM toolchain: a change of vLLM or of any other pin leaves this stage and the
# compiles after it cached. The packages stage continues from here, so these layers ship as they
# are; the modules come over from jit-cache.
FROM toolchain AS jit-deps
COPY requirements/jit.txt /opt/sm120-stacks/requirements/
# hadolint ignore=DL3042,DL3059
RUN --mount=type=cache,target=/root/.cache/pip,sharing=locked \
    --mount=type=secret,id=proxy-ca \
    --mount=type=secret,id=hf-token \
    --mount=type=bind,source=tools/with-secrets.sh,target=/opt/sm120-stacks/tools/with-secrets.sh \
    /opt/sm120-stacks/tools/with-secrets.sh \
    pip install -r /opt/sm120-stacks/requirements/jit.txt

# --- installer: uv, hash-pinned, for the packages stage (mounted there, never shipped) ---
FROM toolchain AS installer
COPY requirements/uv.txt /opt/sm120-stacks/requirements/
# hadolint ignore=DL3042,DL3059
RUN --mount=type=cache,target=/root/.cache/pip,sharing=locked \
    --mount=type=secret,id=proxy-ca \
    --mount=type=secret,id=hf-token \
    --mount=type=bind,source=tools/with-secrets.sh,target=/opt/sm120-stacks/tools/with-secrets.sh \
    /opt/sm120-stacks/tools/with-secrets.sh \
    pip install --require-hashes --no-deps --target /opt/sm120-stacks-uv -r /opt/sm120-stacks/requirements/uv.txt

# --- packages: exact pins, over jit-deps ( and FlashInfer's part in layers of their own) ---
# FROM jit-deps, not toolchain: the packages the FlashInfer modules were compiled against are
# those very files in the image (same layers, same times, so ninja finds the modules fresh);
# uv leaves them as they are (already installed) and adds the rest from its cache mount.
FROM jit-deps AS packages
# The proxy CA and HF token arrive as BuildKit secrets and never touch a layer; uv's cache lives
# in a cache mount shared by every stack, so a pin change downloads only what is new.
COPY requirements/ /opt/sm120-stacks/requirements/
# hadolint ignore=DL3059
RUN --mount=type=cache,target=/root/.cache/uv,sharing=locked \
    --mount=type=bind,from=installer,source=/opt/sm120-stacks-uv,target=/opt/sm120-stacks-uv \
    --mount=type=secret,id=proxy-ca \
    --mount=type=secret,id=hf-token \
    --mount=type=bind,source=tools/with-secrets.sh,target=/opt/sm120-stacks/tools/with-secrets.sh \
    UV_LINK_MODE=copy UV_NO_PROGRESS=1 /opt/sm120-stacks/tools/with-secrets.sh \
    /opt/sm120-stacks-uv/bin/uv pip install --python /opt/venv/bin/python -r /opt/sm120-stacks/requirements/all.txt \
 && { python -m compileall -q -j 0 "$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" >/dev/null || true; }

# --- patches: applied to the installed packages, checksums verified first ---
FROM packages AS patched

# --- jit-cache: FlashInfer modules compiled for 12.0f, one at a time ---
FROM jit-deps AS jit-cache
# Compile jobs: the manifest's max_jobs, or what the build machine's memory allows ("auto").
ARG MAX_JOBS=2
ENV CMAKE_CUDA_ARCHITECTURES="120f" \
    FLASHINFER_CUDA_ARCH_LIST="12.0f" \
    FLASHINFER_NVCC_THREADS="1" \
    FLASHINFER_WORKSPACE_BASE="/opt/flashinfer-cache" \
    TORCH_CUDA_ARCH_LIST="12.0a"
RUN mkdir -p /opt/flashinfer-cache

# --- runtime: packages and the JIT cache only; settings below change without rebuilding them ---
# Same base image as the build: continue from the patched packages, so torch keeps its own layer
# (shared with the build, stored once) and a change of any other pin does not re-ship it. Not
# from jit-cache: its layer holds the modules' staging copy, which would ship beside the copies
# below.
FROM patched AS runtime
COPY --from=jit-cache /opt/flashinfer-cache /opt/flashinfer-cache
COPY tools/ /opt/sm120-stacks/tools/
ENV VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    CMAKE_CUDA_ARCHITECTURES="120f" \
    FLASHINFER_CUDA_ARCH_LIST="12.0f" \
    FLASHINFER_NVCC_THREADS="1" \
    FLASHINFER_WORKSPACE_BASE="/opt/flashinfer-cache" \
    TORCH_CUDA_ARCH_LIST="12.0a" \
    MAX_JOBS=2
ENV OMP_NUM_THREADS="1"
EXPOSE 8000
CMD ["vllm", "serve", "/models/tiny", "--host", "0.0.0.0", "--port", "8000"]
