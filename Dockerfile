# The project image: every omega process (cellstate server, agent, scheduler, workload)
# runs from it with a different command; see docker-compose.yml.
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app
COPY pyproject.toml README.md ./
COPY protos ./protos
COPY cellstate ./cellstate
COPY schedulers ./schedulers
COPY simulator ./simulator
COPY omega ./omega
# /certs and /ca belong to omega, so the named volumes compose mounts there (and fills
# with `omega certs`) do too: Docker copies a new volume's owner from the image.
RUN pip install . && useradd --create-home omega && mkdir /certs /ca \
    && chown omega:omega /certs /ca && chmod 0700 /ca
USER omega
# A service's command names the process, e.g. ["omega", "server", ...].
CMD ["omega", "--help"]
