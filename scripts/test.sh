#!/usr/bin/env bash
# Installs portkit with its test dependencies (scripts/setup.sh) and runs the whole test suite.
source "$(dirname "$0")/setup.sh"
status=0
python -m pytest -n auto -q --durations=25 "$@" || status=$?
if [ "$status" = 5 ]; then
    echo "portkit test: pytest collected no tests; is tests/ there?" >&2
fi
exit "$status"
