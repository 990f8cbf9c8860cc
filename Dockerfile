# llm-gateway container image. Build:  docker build -t llm-gateway .
# Run:    docker run -p 8080:8080 -v "$PWD/my-config.yaml:/etc/llm-gateway/config.yaml:ro" llm-gateway
#
# Two stages: `build` installs the package and its dependencies into a virtualenv (every dependency
# ships binary wheels for CPython 3.11 on amd64 and arm64, so no compiler is needed even there); the
# final stage copies only that virtualenv onto a fresh slim base: no pip, no build tools, no sources.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
RUN python -m venv --without-pip /opt/venv
COPY pyproject.toml README.md ./
COPY core ./core
COPY gateway ./gateway
COPY router ./router
COPY admission ./admission
COPY mock_engine ./mock_engine
COPY capacity ./capacity
COPY bench ./bench
COPY cli ./cli
RUN pip --python /opt/venv/bin/python install --no-cache-dir --compile . \
    && /opt/venv/bin/llm-gateway --help > /dev/null

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="llm-gateway" \
      org.opencontainers.image.description="OpenAI-compatible routing gateway for LLM engine fleets" \
      org.opencontainers.image.licenses="Apache-2.0"
# The base image's own pip/setuptools/wheel are not needed at run time.
RUN python -m pip uninstall --yes --quiet pip setuptools wheel \
    && groupadd --system --gid 10001 gateway \
    && useradd --system --uid 10001 --gid gateway --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin gateway
COPY --from=build /opt/venv /opt/venv
# Config comes from a mounted volume (a ConfigMap in Kubernetes) at LLM_GATEWAY_CONFIG; the image has
# none, so a missing mount fails at start with a message naming the path. The host override makes any
# mounted config listen on all interfaces (override it with -e LLM_GATEWAY__SERVER__HOST=...).
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    LLM_GATEWAY_CONFIG=/etc/llm-gateway/config.yaml \
    LLM_GATEWAY__SERVER__HOST=0.0.0.0 \
    LLM_GATEWAY_HEALTHCHECK_URL=http://127.0.0.1:8080/healthz
USER 10001:10001
EXPOSE 8080
# Liveness without curl: the interpreter is already there. Set LLM_GATEWAY_HEALTHCHECK_URL when the
# config listens on another port.
HEALTHCHECK --interval=15s --timeout=3s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen(os.environ['LLM_GATEWAY_HEALTHCHECK_URL'], timeout=2)"]
ENTRYPOINT ["llm-gateway"]
CMD ["serve"]
