# syntax=docker/dockerfile:1
# sweetspot gateway image: `docker build -t sweetspot:local .`
#
# Two stages: `build` installs the serve path into a virtualenv (first the pinned, hash-checked dependencies of
# requirements.lock in a layer of their own, then the package without dependencies); `runtime` copies only
# that virtualenv onto a fresh slim Python, so no build tools, source tree, pip or setuptools ship. The tools
# (sim, sweep, plan, demo) need extras the image leaves out. Every dependency has a binary wheel here.
# Settings come from SWEETSPOT_* environment variables only (see gateway/settings.py and .env.example).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
# The virtualenv lives at the same path in both stages: its scripts carry absolute shebangs.
RUN python -m venv /opt/sweetspot
COPY requirements.lock ./
RUN /opt/sweetspot/bin/pip install --no-cache-dir --require-hashes -r requirements.lock
COPY pyproject.toml README.md LICENSE ./
COPY gateway ./gateway
# EXTRAS: the tools an image carries beside the gateway (compose's `sim` profile builds one with "sim").
ARG EXTRAS=""
RUN /opt/sweetspot/bin/pip install --no-cache-dir --no-deps . \
    && if [ -n "${EXTRAS}" ]; then /opt/sweetspot/bin/pip install --no-cache-dir ".[${EXTRAS}]"; fi \
    && /opt/sweetspot/bin/pip uninstall --yes pip setuptools

FROM ${PYTHON_IMAGE} AS runtime
LABEL org.opencontainers.image.title="sweetspot" \
      org.opencontainers.image.description="Adaptive concurrency gateway for LLM inference servers" \
      org.opencontainers.image.licenses="Apache-2.0"
# A fixed, unprivileged uid/gid (no login shell, no home) so volume permissions are predictable. The base
# image's own pip, setuptools and wheel go too: the gateway runs from its virtualenv and needs none of them,
# and scanners rightly flag the old setuptools the base image carries.
RUN groupadd --system --gid 10001 sweetspot \
    && useradd --system --uid 10001 --gid sweetspot --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin sweetspot \
    && rm -rf /usr/local/lib/python3.*/site-packages/pip /usr/local/lib/python3.*/site-packages/pip-* \
       /usr/local/lib/python3.*/site-packages/setuptools /usr/local/lib/python3.*/site-packages/setuptools-* \
       /usr/local/lib/python3.*/site-packages/_distutils_hack \
       /usr/local/lib/python3.*/site-packages/distutils-precedence.pth \
       /usr/local/lib/python3.*/site-packages/wheel /usr/local/lib/python3.*/site-packages/wheel-* \
       /usr/local/bin/pip /usr/local/bin/pip3 /usr/local/bin/pip3.* /usr/local/bin/wheel
COPY --from=build /opt/sweetspot /opt/sweetspot
ENV PATH="/opt/sweetspot/bin:${PATH}" \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    SWEETSPOT_HOST=0.0.0.0 \
    SWEETSPOT_PORT=8080
USER 10001:10001
EXPOSE 8080
# No curl in a slim image: the standard library does the probe. urlopen raises on any non-2xx answer.
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('SWEETSPOT_PORT', '8080'), timeout=2)"]
ENTRYPOINT ["sweetspot"]
CMD ["serve"]
