# syntax=docker/dockerfile:1
# egress-gateway image: build a venv in a throwaway stage, copy only the venv into a clean slim
# runtime stage. Build from the repository root:  docker build -t egress-gateway:0.1.0 .

# ---- build: the compiler toolchain lives in this stage only ----
FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
# Every dependency has wheels on amd64/arm64; the toolchain covers platforms without one.
RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential \
    && rm -rf /var/lib/apt/lists/*
RUN python -m venv /opt/venv
WORKDIR /src
COPY pyproject.toml README.md ./
COPY gateway ./gateway
RUN /opt/venv/bin/pip install --no-cache-dir . \
    && /opt/venv/bin/pip uninstall -y pip setuptools wheel

# ---- runtime: no compilers, no pip, no pip cache, no shell in front of the gateway ----
FROM python:3.11-slim AS runtime
LABEL org.opencontainers.image.title="egress-gateway" \
      org.opencontainers.image.description="Forward proxy and tools API that owns all outbound traffic of AI agents" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    EGRESS_POLICY=/opt/egress-gateway/policies/default.yaml \
    EGRESS_PROXY_LISTEN=0.0.0.0:3128 \
    EGRESS_API_LISTEN=0.0.0.0:8080 \
    EGRESS_ADMIN_LISTEN=0.0.0.0:9090 \
    EGRESS_AUDIT_LOG=-
COPY --from=build /opt/venv /opt/venv
COPY policies /opt/egress-gateway/policies
# The root filesystem is read-only at run time, so Python could never cache bytecode: compile
# the venv and the stdlib now (the base image ships no .pyc). The base image's own pip and
# setuptools go too; the gateway's venv never had them after the build stage.
# Numeric uid/gid 65532 so Kubernetes runAsNonRoot can verify it without reading /etc/passwd.
# nftables: the chart's transparent init container runs `egress-gateway redirect --apply` from
# this image (the gateway itself never runs nft; it runs without any capability).
RUN python -m pip uninstall -y -q pip setuptools wheel \
    && apt-get update && apt-get install -y --no-install-recommends nftables \
    && python -m compileall -q -j 0 /opt/venv /usr/local/lib/python3.11 \
    && groupadd --system --gid 65532 nonroot \
    && useradd --system --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin nonroot \
    && rm -rf /root/.cache /var/lib/apt/lists/*
USER 65532:65532
WORKDIR /tmp
EXPOSE 3128 8080 9090
# Exec form: the gateway is PID 1 and gets SIGTERM (drain, then exit) and SIGHUP (policy reload)
# itself; a shell wrapper would not forward them.
ENTRYPOINT ["/opt/venv/bin/egress-gateway", "serve"]
