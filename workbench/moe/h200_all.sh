#!/usr/bin/env bash
# One device call (repository root, carry .whl; about 8-9 minutes): the dispatch check without the pipeline
# (h200_dispatch_check.sh: moe_small_dispatch.json, every gpu test), then the full benchmark with the GPU pipeline
# (h200_run.sh: moe_bandwidth.json). $OUT/dispatch.tgz and $OUT/bandwidth.tgz.
# Usage: WORKBENCH_COMMIT=<sha> OUT=<dir> bash workbench/moe/h200_all.sh
set -u
D=$(dirname "$0")
PIPELINE=0 bash "$D/h200_dispatch_check.sh"
PIPELINE=1 bash "$D/h200_run.sh"
