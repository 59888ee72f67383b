# PDL's container images. Two targets:
#
#   hub       JupyterHub + configurable-http-proxy + PDL (with its swarm extra: the
#             Docker Swarm spawner); runs jupyterhub_config.py
#   notebook  JupyterLab + PDL + ipyparallel + torch, as the non-root user jovyan
#             (uid 1000): a user's server (pdl-singleuser, the default command) and
#             the engine services (pdl-engine) both run this image.
#
#   DOCKER_BUILDKIT=1 docker build --target hub      -t pdl-hub .
#   DOCKER_BUILDKIT=1 docker build --target notebook -t pdl-notebook .
#
# Build arguments:
#   HUB_BASE, NOTEBOOK_BASE  base images: anything with python3 (>= 3.11) and its venv
#                            module, e.g. a plain Debian with python3-venv.
#   TORCH_VERSION            pin torch (scripts/build-images: 2.13.0, as constraints.txt).
#                            Empty: a base's own torch is kept when it fits pyproject.toml.
#   WITH_HOROVOD             1 (default): Horovod in the notebook image, from a horovod
#                            wheel in .pdl/wheelhouse if there is one, else built from
#                            source with the torch 2.x fixes (scripts/build-horovod,
#                            cached in a BuildKit cache mount); 0: without Horovod.
#
# Local wheels (optional): *.whl in .pdl/wheelhouse/ of the build context are preferred
# over downloads (scripts/build-images puts the machine's torch CPU wheel there).
# Behind a TLS-inspecting proxy, pass the CA bundle as the optional BuildKit secret "ca":
#   --secret id=ca,src=/etc/ssl/certs/ca-certificates.crt
# Every step that downloads mounts it over the image's bundle; without it nothing changes.
#
# Layers: the virtualenv, then the dependencies read from pyproject.toml, and only then
# PDL's wheel (built once, in the "wheel" stage, for both images). A code change
# rebuilds in seconds; a change that leaves the wheel as it was (tests, docs) leaves
# the images as they were. The helpers in docker/ are mounted, not copied.

ARG HUB_BASE=python:3.11-slim-bookworm
ARG NOTEBOOK_BASE=pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime

# .pdl/wheelhouse may be absent: with-ca (a file pip ignores there) keeps the wildcard
# COPY from matching nothing
FROM scratch AS wheelhouse
COPY docker/with-ca .pdl*/wheelhouse* /wheels/

# The requirements, read from pyproject.toml: the layers that install them are rebuilt
# only when these lists change, not on every edit of pyproject.toml.
FROM ${HUB_BASE} AS requirements
RUN --mount=type=bind,source=docker/requirements.py,target=/tmp/pdl-docker/requirements.py \
    --mount=type=bind,source=pyproject.toml,target=/tmp/pyproject.toml \
    mkdir /requirements && cd /tmp/pdl-docker \
    && python3 requirements.py /tmp/pyproject.toml --build-system >/requirements/build.txt \
    && python3 requirements.py /tmp/pyproject.toml --extra swarm --exclude torch >/requirements/hub.txt \
    && python3 requirements.py /tmp/pyproject.toml >/requirements/notebook.txt


# The start of the hub image; it also builds PDL's wheel (stage "wheel").
FROM ${HUB_BASE} AS hub-base
ENV PATH=/opt/pdl/bin:/opt/chp/bin:/opt/node/bin:$PATH \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN --mount=type=secret,id=ca,target=/etc/ssl/certs/ca-certificates.crt \
    --mount=type=bind,source=docker/with-ca,target=/tmp/pdl-docker/with-ca \
    --mount=type=bind,source=docker/make-venv,target=/tmp/pdl-docker/make-venv \
    --mount=type=cache,id=pdl-pip,target=/root/.cache/pip \
    /tmp/pdl-docker/make-venv
RUN --mount=type=secret,id=ca,target=/etc/ssl/certs/ca-certificates.crt \
    --mount=type=bind,source=docker/with-ca,target=/tmp/pdl-docker/with-ca \
    --mount=type=bind,source=docker/install-node,target=/tmp/pdl-docker/install-node \
    --mount=type=cache,id=pdl-pip,target=/root/.cache/pip \
    /tmp/pdl-docker/install-node


# PDL's wheel. The JupyterLab extension inside is the prebuilt one from the build
# context (share/jupyter/labextensions) when there is one, else npm builds it here.
FROM hub-base AS wheel
RUN --mount=type=secret,id=ca,target=/etc/ssl/certs/ca-certificates.crt \
    --mount=type=bind,source=docker/with-ca,target=/tmp/pdl-docker/with-ca \
    --mount=type=bind,source=docker/install-deps,target=/tmp/pdl-docker/install-deps \
    --mount=type=bind,from=requirements,source=/requirements/build.txt,target=/tmp/requirements.txt \
    --mount=type=bind,from=wheelhouse,source=/wheels,target=/tmp/wheelhouse \
    --mount=type=cache,id=pdl-pip,target=/root/.cache/pip \
    /tmp/pdl-docker/install-deps /tmp/requirements.txt
RUN --mount=type=secret,id=ca,target=/etc/ssl/certs/ca-certificates.crt \
    --mount=type=bind,target=/tmp/pdl-src,rw \
    --mount=type=cache,id=pdl-npm,target=/root/.npm \
    /tmp/pdl-src/docker/with-ca pip wheel --no-deps --no-build-isolation --no-index \
        --no-cache-dir -w /wheel /tmp/pdl-src


FROM hub-base AS hub
ARG CHP_VERSION=5.3.0
RUN --mount=type=secret,id=ca,target=/etc/ssl/certs/ca-certificates.crt \
    --mount=type=bind,source=docker/with-ca,target=/tmp/pdl-docker/with-ca \
    --mount=type=bind,source=docker/install-proxy,target=/tmp/pdl-docker/install-proxy \
    --mount=type=cache,id=pdl-npm,target=/root/.npm \
    /tmp/pdl-docker/install-proxy "$CHP_VERSION"
# The hub never imports torch: leave it (and its GBs) out of this image.
RUN --mount=type=secret,id=ca,target=/etc/ssl/certs/ca-certificates.crt \
    --mount=type=bind,source=docker/with-ca,target=/tmp/pdl-docker/with-ca \
    --mount=type=bind,source=docker/install-deps,target=/tmp/pdl-docker/install-deps \
    --mount=type=bind,from=requirements,source=/requirements/hub.txt,target=/tmp/requirements.txt \
    --mount=type=bind,from=wheelhouse,source=/wheels,target=/tmp/wheelhouse \
    --mount=type=cache,id=pdl-pip,target=/root/.cache/pip \
    /tmp/pdl-docker/install-deps /tmp/requirements.txt
RUN --mount=type=bind,from=wheel,source=/wheel,target=/tmp/wheel \
    pip install --no-deps --no-index --no-cache-dir /tmp/wheel/*.whl \
    && python -c "import pdl_spawner, jupyterhub"
ENV PDL_STATE_DIR=/srv/jupyterhub/state
WORKDIR /srv/jupyterhub
COPY jupyterhub_config.py /srv/jupyterhub/jupyterhub_config.py
EXPOSE 8000
CMD ["jupyterhub", "-f", "/srv/jupyterhub/jupyterhub_config.py"]


FROM ${NOTEBOOK_BASE} AS notebook
ARG TORCH_VERSION=
ARG WITH_HOROVOD=1
ARG NB_USER=jovyan
ARG NB_UID=1000
ENV PATH=/opt/pdl/bin:$PATH \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN id -u "$NB_USER" >/dev/null 2>&1 \
    || useradd --create-home --shell /bin/bash --uid "$NB_UID" --non-unique "$NB_USER"
RUN --mount=type=secret,id=ca,target=/etc/ssl/certs/ca-certificates.crt \
    --mount=type=bind,source=docker/with-ca,target=/tmp/pdl-docker/with-ca \
    --mount=type=bind,source=docker/make-venv,target=/tmp/pdl-docker/make-venv \
    --mount=type=cache,id=pdl-pip,target=/root/.cache/pip \
    /tmp/pdl-docker/make-venv --system-site-packages
RUN --mount=type=secret,id=ca,target=/etc/ssl/certs/ca-certificates.crt \
    --mount=type=bind,source=docker/with-ca,target=/tmp/pdl-docker/with-ca \
    --mount=type=bind,source=docker/install-deps,target=/tmp/pdl-docker/install-deps \
    --mount=type=bind,from=requirements,source=/requirements/notebook.txt,target=/tmp/requirements.txt \
    --mount=type=bind,from=wheelhouse,source=/wheels,target=/tmp/wheelhouse \
    --mount=type=cache,id=pdl-pip,target=/root/.cache/pip \
    TORCH_VERSION="$TORCH_VERSION" /tmp/pdl-docker/install-deps /tmp/requirements.txt
RUN --mount=type=secret,id=ca,target=/etc/ssl/certs/ca-certificates.crt \
    --mount=type=bind,source=docker/with-ca,target=/tmp/pdl-docker/with-ca \
    --mount=type=bind,source=docker/install-horovod,target=/tmp/pdl-docker/install-horovod \
    --mount=type=bind,source=scripts/build-horovod,target=/tmp/pdl-docker/build-horovod \
    --mount=type=bind,from=wheelhouse,source=/wheels,target=/tmp/wheelhouse \
    --mount=type=cache,id=pdl-horovod,target=/var/cache/pdl \
    --mount=type=cache,id=pdl-pip,target=/root/.cache/pip \
    if [ "$WITH_HOROVOD" = 1 ]; then /tmp/pdl-docker/install-horovod; fi
RUN --mount=type=bind,from=wheel,source=/wheel,target=/tmp/wheel \
    pip install --no-deps --no-index --no-cache-dir /tmp/wheel/*.whl \
    && python -c "import pdl, pdl_spawner.swarm.engine_boot, pdl_server.singleuser, pdl_magics, pdl_spawner, pdl_cinic10, ipyparallel, torch"
USER ${NB_USER}
WORKDIR /home/${NB_USER}
CMD ["pdl-singleuser"]
