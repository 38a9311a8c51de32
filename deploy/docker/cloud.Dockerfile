# syntax=docker/dockerfile:1
#
# eventspec cloud verifier (Video-LLaVA-7B-hf on one NVIDIA GPU), gRPC on 50061.
#
# Build from the repository root (BuildKit picks up cloud.Dockerfile.dockerignore
# next to this file, so only the package sources are sent):
#   DOCKER_BUILDKIT=1 docker build -f deploy/docker/cloud.Dockerfile -t eventspec-cloud:0.1.0 .
# CPU-only variant (small image, for tiny-random trials):
#   ... --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
#
# Run (needs the NVIDIA Container Toolkit; host driver >= 580 for the CUDA 13.0 wheel):
#   docker run --gpus 1 -p 50061:50061 \
#     -v /srv/models/Video-LLaVA-7B-hf:/models/video-llava:ro \
#     -v eventspec-profile:/var/lib/eventspec eventspec-cloud:0.1.0
#
# The torch CUDA wheel brings its own CUDA user-space libraries (cuBLAS, cuDNN, ...),
# so the "base" flavour of the CUDA image is enough: it supplies the driver hooks
# (NVIDIA_* variables) without a second copy of the libraries.

ARG CUDA_IMAGE=nvidia/cuda:13.0.1-base-ubuntu24.04
ARG UV_IMAGE=ghcr.io/astral-sh/uv:0.13.8

FROM ${UV_IMAGE} AS uv

# ---- build: Python 3.11 + torch (explicit CUDA wheel) + eventspec into /opt/venv -----
FROM ${CUDA_IMAGE} AS build
ARG PYTHON_VERSION=3.11
ARG TORCH_VERSION=2.13.0
# cu130 = the CUDA 13.0 build (PyPI's default Linux wheel of torch 2.13.0 is the same
# build). Use .../whl/cu128 for hosts with an R570 driver, .../whl/cpu for CPU only.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cu130
ENV UV_PYTHON_INSTALL_DIR=/opt/python \
    UV_PYTHON_PREFERENCE=only-managed \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
COPY --from=uv /uv /usr/local/bin/uv
# A standalone CPython 3.11 (Ubuntu 24.04 ships 3.12; the project is tested on 3.11).
RUN uv python install "${PYTHON_VERSION}" \
 && uv venv --seed --python "${PYTHON_VERSION}" /opt/venv
# torch first and explicitly: a bare "torch" requirement would pick whatever build the
# index offers.
RUN /opt/venv/bin/pip install --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"
WORKDIR /src
COPY pyproject.toml README.md ./
COPY shared ./shared
COPY cloud ./cloud
COPY edge ./edge
# eventspec.demoworld (--model tiny-random; the package list names it)
COPY tools/demoworld ./tools/demoworld
RUN /opt/venv/bin/pip install ".[cloud]" \
 && /opt/venv/bin/python -c "import torch, transformers, eventspec.cloud.cli; print('torch', torch.__version__)" \
 && /opt/venv/bin/eventspec-cloud serve --help >/dev/null

# ---- runtime --------------------------------------------------------------------------
FROM ${CUDA_IMAGE}
LABEL org.opencontainers.image.title="eventspec-cloud" \
      org.opencontainers.image.description="eventspec cloud verifier: Video-LLaVA-7B, gRPC eventspec.v1.Verifier" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/venv/bin:${PATH} \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    XDG_CACHE_HOME=/tmp/cache \
    EVENTSPEC_CLOUD_MODEL=/models/video-llava \
    EVENTSPEC_CLOUD_HOST=0.0.0.0 \
    EVENTSPEC_CLOUD_PORT=50061 \
    EVENTSPEC_CLOUD_DEVICE=cuda \
    EVENTSPEC_CLOUD_DTYPE=bf16
# Bound to 0.0.0.0, the server starts only with TLS and authentication configured
# (EVENTSPEC_CLOUD_TLS_CERT/_TLS_KEY/_TLS_CA, EVENTSPEC_CLOUD_TOKEN_FILE or
# EVENTSPEC_CLOUD_TLS_CLIENT_AUTH=require), or with EVENTSPEC_CLOUD_INSECURE=1 on a network
# you trust. See docs/network.md.
RUN groupadd --system --gid 10001 eventspec \
 && useradd --system --uid 10001 --gid eventspec --home-dir /var/lib/eventspec \
      --no-create-home --shell /usr/sbin/nologin eventspec \
 && mkdir -p /models/video-llava /var/lib/eventspec \
 && chown eventspec:eventspec /var/lib/eventspec
COPY --from=build /opt/python /opt/python
COPY --from=build /opt/venv /opt/venv
COPY deploy/docker/grpc_health_probe.py /opt/eventspec/grpc_health_probe.py
USER 10001:10001
WORKDIR /var/lib/eventspec
# The calibration profile lives here; keep it on a volume so restarts skip calibration.
VOLUME ["/var/lib/eventspec"]
EXPOSE 50061
# NOT_SERVING until the 7B model is loaded and calibrated: allow minutes at start.
HEALTHCHECK --interval=15s --timeout=5s --start-period=10m --retries=3 \
  CMD ["python", "/opt/eventspec/grpc_health_probe.py", "--port-env", "EVENTSPEC_CLOUD_PORT", \
       "--tls-env", "EVENTSPEC_CLOUD_"]
# SIGTERM (docker stop) = NOT_SERVING, then a graceful stop of in-flight streams.
STOPSIGNAL SIGTERM
ENTRYPOINT ["eventspec-cloud", "serve"]
CMD ["--profile", "/var/lib/eventspec/cloud-profile.msgpack"]
