# syntax=docker/dockerfile:1
# A CPU-only model server image for the kind end-to-end test: the same model_server package
# as server/Dockerfile, with ONNX Runtime's CPU build instead of the ROCm one (kind nodes have
# no GPU; the e2e InferenceService asks for CPUExecutionProvider).
#
#   docker build -f e2e/model-server-cpu.Dockerfile -t rocm-inference/model-server:e2e .
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
FROM ${PYTHON_IMAGE}
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY server/model_server ./server/model_server
COPY operator/inference_operator ./operator/inference_operator
RUN python -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-compile '.[server]' onnxruntime \
    && rm -rf /src
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /
USER 1000:1000
