# lmcache-adp: one image, both services, one per container (deploy/docker/entrypoint.sh):
#   docker run IMAGE gateway [adp-gateway serve flags]             the storage gateway (default)
#   docker run IMAGE lmcache-server [configs/lmcache-server.sh flags] [-- lmcache server flags]
#   docker run IMAGE adp-gateway check | lmcache bench l2 ...       any other command, as given
#
# Build (public defaults: python:3.11-slim-bookworm and the PyTorch CPU index):
#   docker build -t lmcache-adp .
# Build with no index reached from inside the build (what tests/docker does):
#   scripts/docker-offline.sh       # the wheels downloaded on the host, then PIP_NO_INDEX=1
#
# torch: LMCache imports torch, and PyPI's default torch for Linux is a CUDA build of several GB.
# The L2 path is CPU-only, so the image takes the CPU build: pip looks in deploy/docker/wheels/
# (find-links; empty in git), then in PyPI and TORCH_INDEX_URL, PyTorch's CPU index. An offline
# build: scripts/docker-offline.sh fills deploy/docker/wheels/ with every wheel and passes
# --build-arg PIP_NO_INDEX=1; this also serves a build behind a TLS-inspecting proxy, since the
# host's pip already trusts it. The wheels are
# only in the build stage, never in the final image. (A BuildKit bind mount would keep them out
# of even that stage's layers, but the legacy builder, which a Docker CLI without buildx falls
# back to, has none; COPY works with both.)
#
# Users: the services run as adp (uid 10001) in group lmcache (gid 10001). The gateway's socket
# is mode 0660, so a client must run as uid 10001 or carry gid 10001 (docker run --group-add
# 10001, Kubernetes supplementalGroups); give that group to the socket with `socket_group:
# lmcache` in the gateway config. Host directories mounted as the data or socket dir must be
# writable by uid 10001 (chown 10001:10001 DIR). A raw block device as a database (`devices:`
# in the config) is root:disk 0660 on the host: pass the device (docker run --device) and run
# with --group-add disk (gid 6 on Debian), or as root where the host's disk gid differs.

ARG BASE_IMAGE=python:3.11-slim-bookworm

FROM ${BASE_IMAGE} AS build
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG LMCACHE_VERSION=0.5.6
# 1: install only from deploy/docker/wheels/ (an offline build). Unset: PyPI too.
ARG PIP_NO_INDEX
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore \
    PIP_FIND_LINKS=/tmp/wheels
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
RUN python3 -m venv /opt/venv
# Layers from the least to the most often changed: torch, then the dependencies named in
# pyproject.toml, then the project itself, so a code change rebuilds only the last layer.
COPY deploy/docker/wheels/ /tmp/wheels/
RUN printf 'torch==%s\nlmcache==%s\n' "$TORCH_VERSION" "$LMCACHE_VERSION" > /opt/venv/constraints.txt \
 && /opt/venv/bin/pip install ${TORCH_INDEX_URL:+--extra-index-url "$TORCH_INDEX_URL"} \
      --constraint /opt/venv/constraints.txt torch
RUN /opt/venv/bin/python -c 'import sys, torch; torch.version.cuda and sys.exit( \
      f"torch {torch.__version__} is a CUDA build: set TORCH_INDEX_URL to a CPU index, or put " \
      "the CPU wheel in deploy/docker/wheels/ (see the top of this Dockerfile)")'
COPY pyproject.toml /tmp/project/
RUN /opt/venv/bin/python -c 'import tomllib; print(*tomllib.load(open("/tmp/project/pyproject.toml", "rb"))["project"]["dependencies"], sep="\n")' > /tmp/requirements.txt \
 && /opt/venv/bin/pip install --constraint /opt/venv/constraints.txt --requirement /tmp/requirements.txt
COPY README.md plugin_manifest.yaml /tmp/project/
COPY adp_wire /tmp/project/adp_wire
COPY lmcache_adp /tmp/project/lmcache_adp
COPY adp_gateway /tmp/project/adp_gateway
# setuptools came with torch: no build environment to fetch.
RUN /opt/venv/bin/pip install --no-deps --no-build-isolation /tmp/project \
 && /opt/venv/bin/python -c 'import adp_wire, adp_gateway, lmcache_adp'

FROM ${BASE_IMAGE}
ARG ADP_UID=10001
ARG ADP_GID=10001
LABEL org.opencontainers.image.title="lmcache-adp" \
      org.opencontainers.image.description="Persistent NVMe KV-cache tier for LMCache's MP server: storage gateway and lmcache server with the native_plugin adapter"
ENV PATH=/opt/venv/bin:$PATH \
    LMCACHE_TRACK_USAGE=false DO_NOT_TRACK=1 LMCACHE_DISABLE_BANNER=1 PYTHONUNBUFFERED=1 \
    ADP_SOCKET=/run/lmcache-adp/gateway.sock ADP_DATA_DIR=/var/lib/lmcache-adp \
    NUMBA_CACHE_DIR=/tmp/numba-cache
# NUMBA_CACHE_DIR: LMCache's numba kernels cache their compilation, which needs a writable
# directory; site-packages is not one for the non-root user (LMCache then runs CLI-only).
# The socket dir is writable by the gateway alone (the plugin refuses a socket in a directory
# others can write), searchable by group lmcache, and setgid, so the socket belongs to that
# group whatever group the gateway runs as. The data dir is the gateway's alone.
RUN groupadd --gid "$ADP_GID" lmcache \
 && useradd --uid "$ADP_UID" --gid lmcache --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin adp \
 && mkdir -p /var/lib/lmcache-adp /run/lmcache-adp /opt/lmcache-adp \
 && chown adp:lmcache /var/lib/lmcache-adp /run/lmcache-adp \
 && chmod 0700 /var/lib/lmcache-adp \
 && chmod 2750 /run/lmcache-adp
COPY --from=build /opt/venv /opt/venv
COPY configs /opt/lmcache-adp/configs
COPY deploy/docker/entrypoint.sh /usr/local/bin/adp-entrypoint
COPY deploy/docker/healthcheck.py /usr/local/bin/adp-healthcheck
# Numeric, so Kubernetes can check runAsNonRoot without reading the image's /etc/passwd.
USER ${ADP_UID}:${ADP_GID}
# Readable by any uid a pod may run as (the data dir is the gateway's alone).
WORKDIR /opt/lmcache-adp
VOLUME ["/var/lib/lmcache-adp", "/run/lmcache-adp"]
# lmcache server: 5555 for vLLM (LMCacheMPConnector), 8080 for its HTTP API (/healthcheck).
# The gateway: 9464 for /metrics, /healthz and /readyz, with ADP_METRICS_ADDRESS=0.0.0.0:9464.
EXPOSE 5555 8080 9464
# The gateway: `adp-gateway status` answers over its socket and says ready. The lmcache
# server: GET /healthcheck. See deploy/docker/healthcheck.py.
HEALTHCHECK --interval=30s --timeout=10s --start-period=120s --retries=3 CMD ["adp-healthcheck"]
# SIGINT stops both services cleanly: the gateway seals its open regions and syncs; the lmcache
# server (which takes SIGINT as its stop) finishes its L2 writes and closes the plugin.
STOPSIGNAL SIGINT
ENTRYPOINT ["adp-entrypoint"]
CMD ["gateway"]
