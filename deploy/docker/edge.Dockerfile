# syntax=docker/dockerfile:1
#
# eventspec edge agent (EventGPT drafter beside an event camera), gRPC on 50062.
# CPU build by default, for x86_64 and aarch64 hosts; includes the `dsec` extra
# (h5py + hdf5plugin, for DSEC events.h5).
#
# Build from the repository root (BuildKit uses edge.Dockerfile.dockerignore):
#   DOCKER_BUILDKIT=1 docker build -f deploy/docker/edge.Dockerfile -t eventspec-edge:0.1.0 .
# Run against a cloud verifier:
#   docker run -p 50062:50062 -e EVENTSPEC_EDGE_CLOUD=cloud.example:50061 \
#     -v /srv/models:/models:ro -v /srv/dsec/zurich_city_00_a:/data:ro \
#     eventspec-edge:0.1.0 --source dsec:/data --adapter /models/adapter
#
# NVIDIA GPU edge (x86_64 + discrete GPU): build with
#   --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu130
# and run with --gpus 1 -e EVENTSPEC_EDGE_DEVICE=cuda.
# Jetson: not covered by this file. Jetson needs NVIDIA's JetPack torch wheels and an
# L4T base image (BASE_IMAGE/TORCH_INDEX_URL build args), and the project needs
# Python >= 3.11 while JetPack 6 ships 3.10; see deploy/README.md. Untested here.

ARG BASE_IMAGE=python:3.11-slim-bookworm

# ---- build: torch (explicit CPU wheel) + eventspec[edge] into /opt/venv ---------------
FROM ${BASE_IMAGE} AS build
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# torch first and explicitly: a bare "torch" requirement pulls a multi-GB CUDA build.
RUN python3 -m venv /opt/venv \
 && /opt/venv/bin/pip install --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"
WORKDIR /src
COPY pyproject.toml README.md ./
COPY shared ./shared
COPY edge ./edge
# eventspec.demoworld (--model tiny-random; the package list names it)
COPY tools/demoworld ./tools/demoworld
COPY cloud ./cloud
RUN /opt/venv/bin/pip install ".[edge]" \
 && /opt/venv/bin/python -c "import torch, h5py, hdf5plugin, eventspec.edge.cli; print('torch', torch.__version__)" \
 && /opt/venv/bin/eventspec-edge serve --help >/dev/null

# ---- runtime --------------------------------------------------------------------------
FROM ${BASE_IMAGE}
LABEL org.opencontainers.image.title="eventspec-edge" \
      org.opencontainers.image.description="eventspec edge agent: EventGPT drafter, gRPC eventspec.v1.EdgeAgent" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/venv/bin:${PATH} \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    XDG_CACHE_HOME=/tmp/cache \
    EVENTSPEC_EDGE_MODEL=/models/eventgpt \
    EVENTSPEC_EDGE_SOURCE=synthetic \
    EVENTSPEC_EDGE_HOST=0.0.0.0 \
    EVENTSPEC_EDGE_PORT=50062 \
    EVENTSPEC_EDGE_DEVICE=cpu
# Bound to 0.0.0.0, the server starts only with TLS and authentication configured
# (EVENTSPEC_EDGE_TLS_CERT/_TLS_KEY/_TLS_CA, EVENTSPEC_EDGE_TOKEN_FILE or
# EVENTSPEC_EDGE_TLS_CLIENT_AUTH=require), or with EVENTSPEC_EDGE_INSECURE=1 on a network
# you trust. See docs/network.md.
# EVENTSPEC_EDGE_CLOUD (HOST:PORT of the verifier) is left unset on purpose: without it
# the agent serves draft_only answers. Set it at run time.
RUN groupadd --system --gid 10001 eventspec \
 && useradd --system --uid 10001 --gid eventspec --home-dir /var/lib/eventspec \
      --no-create-home --shell /usr/sbin/nologin eventspec \
 && mkdir -p /models/eventgpt /models/clip /models/adapter /data /var/lib/eventspec \
 && chown eventspec:eventspec /var/lib/eventspec
COPY --from=build /opt/venv /opt/venv
COPY deploy/docker/grpc_health_probe.py /opt/eventspec/grpc_health_probe.py
USER 10001:10001
WORKDIR /var/lib/eventspec
EXPOSE 50062
# NOT_SERVING until the draft model is loaded and warmed up (a 7B model on CPU is slow).
HEALTHCHECK --interval=15s --timeout=5s --start-period=10m --retries=3 \
  CMD ["python", "/opt/eventspec/grpc_health_probe.py", "--port-env", "EVENTSPEC_EDGE_PORT", \
       "--tls-env", "EVENTSPEC_EDGE_"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["eventspec-edge", "serve"]
