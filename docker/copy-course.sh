#!/bin/bash
# Runs (sourced) before each single-user server starts. A learner's home is a persistent volume on
# JupyterHub, so the course's notebooks are copied into it once, and never over the learner's work.
if [ ! -e "${HOME}/paged-kv" ]; then
    mkdir -p "${HOME}/paged-kv"
    cp -r /opt/paged-kv/lessons /opt/paged-kv/exercises "${HOME}/paged-kv/"
    [ -f /opt/paged-kv/README.md ] && cp /opt/paged-kv/README.md "${HOME}/paged-kv/"
    echo "paged-kv: copied the course's notebooks into ${HOME}/paged-kv"
fi
