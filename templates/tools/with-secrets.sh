#!/bin/sh
# Runs a build command with the BuildKit secrets it may need, without writing them to a layer:
# the proxy CA (TLS-intercepting proxies) and a Hugging Face token, when the build passed them.
set -eu
if [ -s /run/secrets/proxy-ca ]; then
    export PIP_CERT=/run/secrets/proxy-ca SSL_CERT_FILE=/run/secrets/proxy-ca \
        REQUESTS_CA_BUNDLE=/run/secrets/proxy-ca UV_NATIVE_TLS=1
fi
if [ -s /run/secrets/hf-token ]; then
    HF_TOKEN="$(cat /run/secrets/hf-token)"
    export HF_TOKEN
fi
exec "$@"
