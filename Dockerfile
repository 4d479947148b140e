# The project image: every omega process (cellstate server, agent, scheduler, workload)
# runs from it with a different command; see docker-compose.yml.
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    NUMBA_CACHE_DIR=/var/cache/omega-numba
WORKDIR /app
COPY pyproject.toml README.md ./
COPY protos ./protos
COPY cellstate ./cellstate
COPY schedulers ./schedulers
COPY simulator ./simulator
COPY omega ./omega
# /certs and /ca belong to omega, so the named volumes compose mounts there (and fills
# with `omega certs`) do too: Docker copies a new volume's owner from the image.
# The flow scheduler's solver kernels are compiled here, once, into numba's cache (its
# processes load them instead of compiling at their first round).
RUN pip install . && useradd --create-home omega \
    && mkdir -p /certs /ca "$NUMBA_CACHE_DIR" /var/log/omega/tasks \
    && python -m schedulers.flow.mcf.compile \
    && chown omega:omega /certs /ca /var/log/omega/tasks \
    && chown -R omega:omega "$NUMBA_CACHE_DIR" \
    && chmod 0700 /ca
USER omega
# A service's command names the process, e.g. ["omega", "server", ...].
CMD ["omega", "--help"]
