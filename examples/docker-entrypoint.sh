#!/bin/sh
# The container's entrypoint (Dockerfile). Inside a container tercel must listen on 0.0.0.0,
# and then the admin port requires admin_token: pass it as TERCEL_ADMIN_TOKEN (8 or more
# letters, digits, "-", "_" or "."), or mount a config that sets it. Extra arguments go to
# `tercel serve` and override the defaults below (the last flag wins).
set -eu
config="${TERCEL_CONFIG:-/etc/tercel/tercel.toml}"
if [ -n "${TERCEL_ADMIN_TOKEN:-}" ]; then
    case "$TERCEL_ADMIN_TOKEN" in
        *[!A-Za-z0-9._-]*) echo "TERCEL_ADMIN_TOKEN: use letters, digits, '-', '_', '.'" >&2; exit 2 ;;
    esac
    with_token="${TMPDIR:-/tmp}/tercel.toml"
    sed "/^\[server\]/a admin_token = \"$TERCEL_ADMIN_TOKEN\"" "$config" > "$with_token"
    config="$with_token"
fi
exec tercel serve --config "$config" --host 0.0.0.0 --data-dir /var/lib/tercel "$@"
