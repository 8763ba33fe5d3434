# syntax=docker/dockerfile:1
# One Dockerfile for every fleet image; the role is a build argument:
#   docker build --build-arg ROLE=denoiser -t fastvideo3-denoiser:0.1.0 .
# ROLE: scheduler | encoder | denoiser | decoder | reward | dynamo | gateway
# The image runs `python -m services.<ROLE>` (for dynamo: `python -m fleet.dynamo`, for gateway:
# `python -m fleet.gateway`); the Helm
# chart sets the command explicitly and passes the flags.
ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS build
ARG ROLE
# Torch goes in first, pinned: otherwise a later dependency may pull another torch build.
# The default index gives the CUDA build; pass the PyTorch CPU wheel index as
# TORCH_INDEX_URL for a CPU-only image.
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=""
# The CUDA version of that torch build (torch.version.cuda), or "cpu": PyPI's default torch 2.13.0
# is built for CUDA 13.0. Checked after the install and recorded in the image's labels.
ARG TORCH_CUDA=13.0
ARG DYNAMO_VERSION=1.6.1
# Project extras to install; empty = the role's default (see the case below): the pools get
# `transport` (NIXL) for GPU-to-GPU tensor moves; every name must be an extra of pyproject.toml.
ARG EXTRAS=""
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN case "${ROLE}" in \
      scheduler|encoder|denoiser|decoder|reward|dynamo|gateway) ;; \
      *) echo "ROLE must be one of scheduler|encoder|denoiser|decoder|reward|dynamo|gateway (got '${ROLE}')" >&2; exit 1 ;; \
    esac
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
RUN pip install "torch==${TORCH_VERSION}" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} \
    && python -c "import sys, torch; v, c = torch.__version__.split('+')[0], torch.version.cuda or 'cpu'; \
sys.exit(0 if (v, c) == ('${TORCH_VERSION}', '${TORCH_CUDA}') else \
f'installed torch {v} (cuda {c}) is not TORCH_VERSION=${TORCH_VERSION} TORCH_CUDA=${TORCH_CUDA}')"
# ai-dynamo's own requirements include a placeholder package that cannot be installed; its
# real runtime needs come from the project's `dynamo` extra, so the two wheels go in bare.
RUN if [ "${ROLE}" = dynamo ]; then \
      pip install --no-deps "ai-dynamo==${DYNAMO_VERSION}" "ai-dynamo-runtime==${DYNAMO_VERSION}"; \
    fi
WORKDIR /src
COPY . .
RUN extras="${EXTRAS}"; \
    if [ -z "$extras" ]; then \
      case "${ROLE}" in \
        scheduler|gateway) extras=services ;; \
        dynamo) extras=services,dynamo ;; \
        encoder|denoiser|decoder|reward) extras=services,transport ;; \
      esac; \
    fi; \
    echo "torch==${TORCH_VERSION}" > /tmp/torch-constraint.txt \
    && pip install -c /tmp/torch-constraint.txt ".[${extras}]" \
    && python -c "import fastvideo3, services, fleet"

FROM ${PYTHON_IMAGE}
ARG ROLE
ARG TORCH_VERSION=2.13.0
ARG TORCH_CUDA=13.0
LABEL org.opencontainers.image.title="fastvideo3-${ROLE}" \
      org.opencontainers.image.description="fastvideo3 ${ROLE} service" \
      io.fastvideo3.torch.version="${TORCH_VERSION}" \
      io.fastvideo3.torch.cuda="${TORCH_CUDA}"
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    FASTVIDEO3_ROLE=${ROLE} \
    HOME=/home/fastvideo
# uid 10001 matches the chart's podSecurityContext.runAsUser.
RUN groupadd --gid 10001 fastvideo \
    && useradd --uid 10001 --gid 10001 --create-home --home-dir /home/fastvideo fastvideo
COPY --from=build /opt/venv /opt/venv
USER 10001:10001
WORKDIR /home/fastvideo
EXPOSE 50051 9464
ENTRYPOINT ["/bin/sh", "-c", "case \"$FASTVIDEO3_ROLE\" in dynamo) m=fleet.dynamo ;; gateway) m=fleet.gateway ;; *) m=services.$FASTVIDEO3_ROLE ;; esac; exec python -m \"$m\" \"$@\"", "fastvideo3"]
