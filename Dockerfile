# iclmem's container image: the package, its pinned dependencies, the shipped pfn-mini weights (inside the
# package), the TabICL and TabPFN extras, run as a non-root user. One file for CPU and CUDA nodes:
#   make image                       # CPU wheels of torch (what the defaults and CI use)
#   make image TORCH_VARIANT=cu126   # CUDA 12.6 wheels; the node's NVIDIA driver comes from the container runtime
# The same image is KubeRay's head and worker image (k8s/) and Slurm's (slurm/). `iclmem cluster-check Dockerfile`
# checks it offline: base image pinned, pins equal to pyproject.toml's, no secret, a non-root user.
ARG PYTHON_IMAGE=python:3.11.7-slim-bookworm
FROM ${PYTHON_IMAGE}

ARG TORCH_VARIANT=cpu
# No key, token or password here or in any layer: the W&B key and the Ray token reach the driver at run time
# (Kubernetes Secrets, a 0600 file on a Slurm head; docs/CLUSTER.md).
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    RAY_USAGE_STATS_ENABLED=0 \
    WANDB_MODE=offline

RUN useradd --create-home --uid 1000 --shell /bin/bash iclmem
WORKDIR /opt/iclmem

# torch first, from the wheel index of the variant, at the version pyproject.toml pins (an open range or the
# default index would pull another build)
RUN pip install --index-url https://download.pytorch.org/whl/${TORCH_VARIANT} torch==2.13.0

COPY pyproject.toml README.md ./
COPY iclmem ./iclmem
COPY orchestrator ./orchestrator
COPY trainables ./trainables
COPY probes ./probes
COPY configs ./configs
RUN pip install ".[tabicl,tabpfn]" ray[tune,default]==2.60.0 opacus==1.6.0 tabicl==2.2.0 tabpfn==9.2.0 \
    && iclmem --version

USER iclmem
WORKDIR /home/iclmem
ENTRYPOINT ["iclmem"]
CMD ["--help"]
