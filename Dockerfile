# The Warmplane services' image: one image, the command picks the service.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md alembic.ini ./
COPY src ./src
COPY shared ./shared
COPY services ./services
COPY migrations ./migrations
RUN pip install --no-cache-dir '.[services]'
USER 65534
ENTRYPOINT ["warmplane"]
CMD ["planner"]
