#!/usr/bin/env bash
# CI for {{ cookiecutter.__project }}, for any CI system: call it from a job on a machine that has the
# device and its driver, and keep reports/ (JUnit XML for the CI's test view, HTML for people).
# It expects portkit to be installed (or installable) in the active Python environment.
set -euo pipefail
cd "$(dirname "$0")"

python -m pip install -e ".[test]"
portkit backends
# The package's own tests, which include `portkit conform --quick`.
python -m pytest -q tests
# The full conformance run, kept as reports; exits non-zero if any case failed.
mkdir -p reports
portkit conform --backend {{ cookiecutter.name }} --junit reports/conform.xml --html reports/conform.html \
    --json reports/conform.json --repro-dir reports/repro "$@"
