# batchsched image: `docker build -t batchsched:0.1.0 .` (deploy/ runs that tag).
# Builder: batchsched and its dependencies (all binary wheels) in a venv.
FROM python:3.11-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/batchsched
WORKDIR /src
COPY pyproject.toml README.md ./
COPY batchsched ./batchsched
RUN /opt/batchsched/bin/pip install . \
 && /opt/batchsched/bin/pip uninstall --yes pip setuptools

# Final: the same slim Python plus the venv; no compiler, no pip, not root.
FROM python:3.11-slim-bookworm
RUN python -m pip uninstall --yes --root-user-action=ignore setuptools wheel pip
COPY --from=build /opt/batchsched /opt/batchsched
ENV PATH=/opt/batchsched/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
# 65532: the conventional "nonroot" uid; the Deployment requires non-root too.
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["batchsched"]
CMD ["run"]
