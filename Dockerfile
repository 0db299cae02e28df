# syntax=docker/dockerfile:1
# fleetwatch: one image for every subcommand (export, taint, report, demo).
#   docker build -t fleetwatch .
#   docker run --rm fleetwatch export --simulate dgx-h100
# The exporter needs root on GPU nodes (the kubelet's PodResources socket, /dev/kmsg and
# the NVIDIA device nodes belong to root): the Helm chart runs it as uid 0 with every
# capability dropped but those it needs. Everything else runs as the unprivileged user
# this image defaults to. No HEALTHCHECK: Kubernetes probes /healthz and /readyz.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
RUN python -m venv /opt/fleetwatch
ENV PATH=/opt/fleetwatch/bin:$PATH
COPY pyproject.toml README.md ./
COPY src/ src/
COPY exporter/ exporter/
COPY collectors/ collectors/
COPY tainter/ tainter/
COPY report/ report/
COPY rules/ rules/
# The README's install: the package from this source tree (`pip install .`).
RUN pip install --no-cache-dir .

FROM ${PYTHON_IMAGE}
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="fleetwatch" \
      org.opencontainers.image.description="GPU fleet telemetry exporter, alert rules and taint controller" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/fleetwatch/fleetwatch"
# perfquery and ibstat for the InfiniBand collector, from Debian as in dev.sh. Debian
# stable only takes security fixes, so the package is not pinned to a version.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends infiniband-diags \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /opt/fleetwatch /opt/fleetwatch
ENV PATH=/opt/fleetwatch/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
RUN groupadd --system --gid 65532 fleetwatch \
    && useradd --system --uid 65532 --gid 65532 --no-create-home \
       --shell /usr/sbin/nologin fleetwatch
USER 65532:65532
EXPOSE 9842 9848
ENTRYPOINT ["fleetwatch"]
CMD ["--help"]
