# batchsched image: `docker build -t batchsched:0.1.0 .` (deploy/ runs that tag).
# Everything is pinned, so a rebuild gives the same image:
# * the base: a full Python version on a fixed Debian release. Pinning its
#   digest too (`docker buildx imagetools inspect <image>`, then
#   python:3.11.14-slim-bookworm@sha256:...) also freezes its OS packages;
#   take a newer patch release on purpose, by editing this line.
# * the Python packages: requirements.lock, exactly the versions the tests ran
#   with (tools/lock_requirements.py regenerates it), installed without
#   resolving anything, then checked complete by `pip check`.
# * the build backend batchsched itself needs (pyproject [build-system]).
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm
ARG SETUPTOOLS_VERSION=80.9.0

# Builder: batchsched and its dependencies (all binary wheels) in a venv.
FROM ${PYTHON_IMAGE} AS build
ARG SETUPTOOLS_VERSION
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/batchsched
WORKDIR /src
COPY requirements.lock ./
RUN /opt/batchsched/bin/pip install --no-deps --only-binary=:all: --requirement requirements.lock
COPY pyproject.toml README.md ./
COPY batchsched ./batchsched
RUN /opt/batchsched/bin/pip install --no-deps "setuptools==${SETUPTOOLS_VERSION}" \
 && /opt/batchsched/bin/pip install --no-deps --no-build-isolation . \
 && /opt/batchsched/bin/pip check \
 && /opt/batchsched/bin/pip uninstall --yes pip setuptools

# Final: the same slim Python plus the venv; no compiler, no pip, not root.
FROM ${PYTHON_IMAGE}
RUN python -m pip uninstall --yes --root-user-action=ignore setuptools wheel pip
COPY --from=build /opt/batchsched /opt/batchsched
ENV PATH=/opt/batchsched/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
# 65532: the conventional "nonroot" uid; the Deployment requires non-root too.
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["batchsched"]
CMD ["run"]
