#!/usr/bin/env bash
# Installs portkit and everything its backends need here (scripts/setup.sh), lists the backends,
# and runs the conformance suite on every one that is available, ending with a summary.
source "$(dirname "$0")/setup.sh"
portkit backends
portkit conform --available --quick "$@"
