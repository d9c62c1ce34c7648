# psflow in a container: `psflow` is the entrypoint, run as the non-root user psflow (uid/gid 10001, which the
# manifests of `psflow k8s render` expect). Built from this source tree, with the exact versions of constraints.txt:
#
#   docker build -t registry.example.com/psflow:0.1.0 .
#   docker build --build-arg EXTRAS=zookeeper -t registry.example.com/psflow:0.1.0-zk .
#
# See docs/deploying.md.

FROM python:3.11-slim AS build
# A C compiler for psflow's optional C kernels (the TFRecord reader; the ps tasks' Adagrad and FTRL updates).
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# The wheel must carry the compiled kernels: without them psflow runs its numpy twins, several times slower.
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels . \
 && python -c "import glob, sys, zipfile; names = zipfile.ZipFile(glob.glob('/wheels/psflow-*.whl')[0]).namelist(); sys.exit(0 if sum(n.endswith('.so') for n in names) == 2 else 'the C kernels did not build')"

FROM python:3.11-slim
# Extras to install with psflow, comma-separated (plots, zookeeper, tensorboard, cloud; torch needs PyTorch's CPU index:
# --build-arg PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu).
ARG EXTRAS=""
ARG PIP_EXTRA_INDEX_URL=""
ENV PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1
COPY --from=build /wheels /wheels
COPY constraints.txt /tmp/constraints.txt
RUN wheel="$(ls /wheels/psflow-*.whl)" \
 && pip install --no-cache-dir -c /tmp/constraints.txt "psflow${EXTRAS:+[$EXTRAS]} @ file://${wheel}" \
 && rm -rf /wheels /tmp/constraints.txt \
 && groupadd --gid 10001 psflow \
 && useradd --uid 10001 --gid 10001 --create-home --home-dir /home/psflow --shell /usr/sbin/nologin psflow \
 && mkdir -p /var/lib/psflow /data \
 && chown psflow:psflow /var/lib/psflow
USER 10001:10001
WORKDIR /home/psflow
ENTRYPOINT ["psflow"]
CMD ["--help"]
