# Rendered by sm120-stacks from stacks/vllm-0.33-sm90-mtp.yaml; edit the manifest, not this file.

# --- toolchain: build base, system packages, Python 3.12 virtual environment ---
FROM nvidia/cuda:13.0.2-devel-ubuntu24.04@sha256:5dc1bca23d05bd37b011be68ec470c03b403a5da07ec3a86e41af9470e9d0cc6 AS toolchain
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3.12 python3.12-venv python3.12-dev ca-certificates \
 && rm -rf /var/lib/apt/lists/*
RUN python3.12 -m venv /opt/venv
ENV VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# --- jit-deps: only what the FlashInfer JIT compile reads (torch, FlashInfer and its imports) ---
# Its own requirements file (requirements/jit.txt, knowledge/jit_dependencies.yaml says which
# packages), FROM toolchain: a change of vLLM or of any other pin leaves this stage and the
# compiles after it cached. The packages stage continues from here, so these layers ship as they
# are; the modules come over from jit-cache.
FROM toolchain AS jit-deps
# The heavy part first, in a layer of its own: it survives any other change.
COPY requirements/lock-heavy.txt /opt/sm120-stacks/requirements/
# hadolint ignore=DL3042,DL3059
RUN --mount=type=cache,target=/root/.cache/pip,sharing=locked \
    --mount=type=secret,id=proxy-ca \
    --mount=type=secret,id=hf-token \
    --mount=type=bind,source=tools/with-secrets.sh,target=/opt/sm120-stacks/tools/with-secrets.sh \
    /opt/sm120-stacks/tools/with-secrets.sh \
    pip install --require-hashes --no-deps -r /opt/sm120-stacks/requirements/lock-heavy.txt
COPY requirements/jit.txt /opt/sm120-stacks/requirements/
# hadolint ignore=DL3042,DL3059
RUN --mount=type=cache,target=/root/.cache/pip,sharing=locked \
    --mount=type=secret,id=proxy-ca \
    --mount=type=secret,id=hf-token \
    --mount=type=bind,source=tools/with-secrets.sh,target=/opt/sm120-stacks/tools/with-secrets.sh \
    /opt/sm120-stacks/tools/with-secrets.sh \
    pip install --require-hashes --no-deps -r /opt/sm120-stacks/requirements/jit.txt
# A requirement of the JIT's packages that the subset lacks stops the build here, named: add it
# to knowledge/jit_dependencies.yaml. Version conflicts are the lock's to judge, not this check's.
# hadolint ignore=DL3059
RUN { pip check > /tmp/jit-deps-check.txt || true; } \
 && if grep "which is not installed" /tmp/jit-deps-check.txt; then exit 1; fi \
 && rm /tmp/jit-deps-check.txt

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

# --- packages: exact pins, over jit-deps (torch and FlashInfer's part in layers of their own) ---
# FROM jit-deps, not toolchain: the packages the FlashInfer modules were compiled against are
# those very files in the image (same layers, same times, so ninja finds the modules fresh);
# uv leaves them as they are (already installed) and adds the rest from its cache mount.
FROM jit-deps AS packages
# Locked (stacks/vllm-0.33-sm90.lock): the complete package set, each file hash-checked, so
# --no-deps; uv's cache lives in a cache mount shared by every stack, and the proxy CA and HF
# token arrive as BuildKit secrets that never touch a layer. First the set of
# stacks/vllm-0.33-marlin.lock, in a layer of its own: byte for byte the file and
# step of that stack and of every child of it, so BuildKit shares the layer between them.
COPY requirements/lock-base.txt /opt/sm120-stacks/requirements/
# hadolint ignore=DL3059
RUN --mount=type=cache,target=/root/.cache/uv,sharing=locked \
    --mount=type=bind,from=installer,source=/opt/sm120-stacks-uv,target=/opt/sm120-stacks-uv \
    --mount=type=secret,id=proxy-ca \
    --mount=type=secret,id=hf-token \
    --mount=type=bind,source=tools/with-secrets.sh,target=/opt/sm120-stacks/tools/with-secrets.sh \
    UV_LINK_MODE=copy UV_NO_PROGRESS=1 /opt/sm120-stacks/tools/with-secrets.sh \
    /opt/sm120-stacks-uv/bin/uv pip install --python /opt/venv/bin/python --require-hashes --no-deps -r /opt/sm120-stacks/requirements/lock-base.txt \
 && { python -m compileall -q -j 0 "$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" >/dev/null || true; }
COPY requirements/ /opt/sm120-stacks/requirements/

# --- patches: applied to the installed packages, checksums verified first ---
FROM packages AS patched

# --- jit-cache: FlashInfer modules compiled for 9.0a, one at a time ---
FROM jit-deps AS jit-cache
# Compile jobs: the manifest's max_jobs, or what the build machine's memory allows ("auto").
ARG MAX_JOBS=2
ENV CMAKE_CUDA_ARCHITECTURES="90a" \
    CUDA_HOME="/usr/local/cuda" \
    FLASHINFER_CUDA_ARCH_LIST="9.0a" \
    FLASHINFER_NVCC_THREADS="1" \
    FLASHINFER_WORKSPACE_BASE="/opt/flashinfer-cache" \
    TORCH_CUDA_ARCH_LIST="9.0a"
# ninja works in a cache mount at FlashInfer's real workspace path, so a compile stopped after
# hours resumes where it stopped (objects, .ninja_log and the generated sources they depend on
# survive). The same step copies the finished modules into its own layer, so a cached step
# always has its output: the mount can be gone or replaced by then (`docker builder prune`; a
# --no-cache build with the same id gets a fresh one).
RUN --mount=type=bind,source=tools/flashinfer_jit.py,target=/opt/sm120-stacks/tools/flashinfer_jit.py \
    --mount=type=bind,source=tools/jit-modules.json,target=/opt/sm120-stacks/tools/jit-modules.json \
    --mount=type=cache,id=sm120-stacks-flashinfer-workspace-0.7.2.post1-90a-py3.12-36ba89d78e85,target=/opt/flashinfer-cache/.cache/flashinfer/0.7.2.post1/90a,sharing=locked \
    python /opt/sm120-stacks/tools/flashinfer_jit.py precompile \
    sampling \
 && mkdir -p /opt/sm120-stacks-jit/cached_ops \
 && cp -a /opt/flashinfer-cache/.cache/flashinfer/0.7.2.post1/90a/cached_ops/sampling /opt/sm120-stacks-jit/cached_ops/

# --- runtime: packages and the JIT cache only; settings below change without rebuilding them ---
# Same base image as the build: continue from the patched packages, so torch keeps its own layer
# (shared with the build, stored once) and a change of any other pin does not re-ship it. Not
# from jit-cache: its layer holds the modules' staging copy, which would ship beside the copies
# below.
FROM patched AS runtime
COPY --from=jit-cache /opt/flashinfer-cache /opt/flashinfer-cache
# The precompiled modules also in FlashInfer's AOT directory: loaded with no ninja run at all.
COPY --from=jit-cache /opt/venv/lib/python3.12/site-packages/flashinfer/data/aot /opt/venv/lib/python3.12/site-packages/flashinfer/data/aot
COPY --from=jit-cache /opt/sm120-stacks-jit/cached_ops/ /opt/flashinfer-cache/.cache/flashinfer/0.7.2.post1/90a/cached_ops/
COPY tools/ /opt/sm120-stacks/tools/
ENV VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    CMAKE_CUDA_ARCHITECTURES="90a" \
    CUDA_HOME="/usr/local/cuda" \
    FLASHINFER_CUDA_ARCH_LIST="9.0a" \
    FLASHINFER_NVCC_THREADS="1" \
    FLASHINFER_WORKSPACE_BASE="/opt/flashinfer-cache" \
    TORCH_CUDA_ARCH_LIST="9.0a" \
    MAX_JOBS=2
ENV DO_NOT_TRACK="1" \
    FLASHINFER_NO_DOWNLOAD="1" \
    HF_HOME="/models/hf" \
    HF_HUB_OFFLINE="1" \
    TRITON_PTXAS_PATH="/usr/local/cuda/bin/ptxas" \
    VLLM_ENABLE_CUDA_COMPATIBILITY="0" \
    VLLM_NO_USAGE_STATS="1"
EXPOSE 8000
CMD ["vllm", "serve", "/models/tiny-nemotronh-mtp-nvfp4", "--host", "0.0.0.0", "--port", "8000", "--served-model-name", "tiny-nemotronh-mtp", "--moe-backend", "marlin", "--max-model-len", "256", "--gpu-memory-utilization", "0.5", "--dtype", "bfloat16", "--speculative-config", "{\"method\":\"mtp\",\"moe_backend\":\"triton\",\"num_speculative_tokens\":2}", "--attention-config.use_trtllm_attention=false"]
