# tercel in a container: the compiled build, the data dir as a volume.
#
#   docker build -t tercel .
#   docker run -d --name tercel -p 22133:22133 -p 127.0.0.1:2223:2223 \
#       -e TERCEL_ADMIN_TOKEN="$(openssl rand -hex 16)" -v tercel-data:/var/lib/tercel tercel
#   docker kill -s HUP tercel     # reload /etc/tercel/tercel.toml (mount your own over it)
#   docker stop tercel            # SIGTERM: open reads go back, journals are fsynced
#
# Inside the container tercel listens on 0.0.0.0 (else the published ports reach nothing), so
# the admin port requires a token (examples/docker-entrypoint.sh adds TERCEL_ADMIN_TOKEN to the
# config; without one tercel refuses to start and says why). Publish the admin port on loopback
# only, as above, or not at all. Arguments after the image name go to `tercel serve`.

# Stage 1: build the wheel; with gcc and the Python headers there, `pip wheel` compiles the
# request path with mypyc (setup.py; 1-2 minutes of CPU).
FROM python:3.11-slim AS build
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml setup.py README.md LICENSE ./
COPY src ./src
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

# Stage 2: the runtime, without a compiler.
FROM python:3.11-slim
RUN useradd --system --home-dir /var/lib/tercel --shell /usr/sbin/nologin tercel \
    && mkdir -p /var/lib/tercel /etc/tercel \
    && chown tercel:tercel /var/lib/tercel
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
COPY examples/tercel.toml /etc/tercel/tercel.toml
COPY examples/docker-entrypoint.sh /usr/local/bin/docker-entrypoint.sh
USER tercel
VOLUME ["/var/lib/tercel"]
EXPOSE 22133 2223
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=10s --timeout=3s \
    CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:2223/ping', timeout=2)"
ENTRYPOINT ["/usr/local/bin/docker-entrypoint.sh"]
