# syntax=docker/dockerfile:1
# fleetwatch: two lean images, one per workload, both running as the unprivileged user
# 65532 by default.
#   docker build --target exporter -t fleetwatch-exporter .   # the DaemonSet: `pip install .`
#   docker build --target tainter -t fleetwatch-tainter .     # `pip install './[tainter]'`
#   docker run --rm fleetwatch-exporter export --simulate dgx-h100
# The exporter image holds the base install only (no Kubernetes client, no report
# libraries): every GPU node of the fleet pulls it. `export` on a node loads neither the
# simulator (fleetwatch.sim, only under --simulate) nor the rules (fleetwatch.rules); both
# still ship in the one distribution, for `export --simulate` and the other subcommands. The Helm chart runs the exporter's
# privileged collectors in a second container of the same image as root with only the
# capabilities they need (docs/deploy.md, "Privileges on the node").
# No HEALTHCHECK: Kubernetes probes /healthz and /readyz.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# The source tree and an empty virtualenv, shared by both installs.
FROM ${PYTHON_IMAGE} AS source
WORKDIR /src
RUN python -m venv /opt/fleetwatch
ENV PATH=/opt/fleetwatch/bin:$PATH
COPY pyproject.toml README.md ./
COPY src/ src/
COPY exporter/ exporter/
COPY collectors/ collectors/
COPY tainter/ tainter/
COPY slurm/ slurm/
COPY report/ report/
COPY rules/ rules/
COPY sim/ sim/

# The README's install: the package from this source tree, base dependencies only.
FROM source AS build-exporter
RUN pip install --no-cache-dir .

# `./[tainter]` is `.[tainter]`, spelled as a path so hadolint does not read it as an
# unpinned PyPI package.
FROM source AS build-tainter
RUN pip install --no-cache-dir './[tainter]'

# What both images share: labels, environment and the unprivileged user.
FROM ${PYTHON_IMAGE} AS runtime
ARG VERSION=0.4.0
LABEL org.opencontainers.image.title="fleetwatch" \
      org.opencontainers.image.description="GPU fleet telemetry exporter, alert rules and taint controller" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/fleetwatch/fleetwatch"
ENV PATH=/opt/fleetwatch/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
RUN groupadd --system --gid 65532 fleetwatch \
    && useradd --system --uid 65532 --gid 65532 --no-create-home \
       --shell /usr/sbin/nologin fleetwatch
ENTRYPOINT ["fleetwatch"]

FROM runtime AS tainter
COPY --from=build-tainter /opt/fleetwatch /opt/fleetwatch
USER 65532:65532
EXPOSE 9848
CMD ["taint", "--help"]

# Last, so a plain `docker build .` gives the exporter image.
FROM runtime AS exporter
# perfquery and ibstat for the InfiniBand collector, from Debian as in dev.sh. Debian
# stable only takes security fixes, so the package is not pinned to a version.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends infiniband-diags \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build-exporter /opt/fleetwatch /opt/fleetwatch
USER 65532:65532
EXPOSE 9842 9843
CMD ["export", "--help"]
