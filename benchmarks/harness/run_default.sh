#!/usr/bin/env bash
# The issue-6 default workload: 1M records of ~300-byte JSON-like values, 8 partitions, 256 KiB
# producer batches; shallow vs deep-confluent vs the fetch-only ceiling, 3 repeats per codec, on
# two embedded tansu clusters. Appends bench_run JSON lines to $OUT and prints the summary table.
#
#   benchmarks/harness/run_default.sh                      # lz4, zstd, gzip
#   CODECS=none,gzip,snappy,lz4,zstd REPEATS=1 benchmarks/harness/run_default.sh
#   SOURCE=kafka-a:9092 TARGET=kafka-b:9092 benchmarks/harness/run_default.sh   # your clusters
#
# Extra arguments go to `shallowmirror bench`, e.g. a MirrorMaker 2 run as the external mode:
#   benchmarks/harness/run_default.sh --modes shallow,external \
#     --external-cmd 'connect-mirror-maker.sh /path/mm2.properties' \
#     --external-target-topic 'source.{topic}'
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-bench-default.jsonl}
args=(--codecs "${CODECS:-lz4,zstd,gzip}" --records 1m --value-bytes 300 --batch-bytes 256KiB
      --partitions 8 --modes "${MODES:-shallow,deep-confluent,fetch-only}"
      --repeats "${REPEATS:-3}" --out "$OUT")
if [[ -n "${SOURCE:-}" || -n "${TARGET:-}" ]]; then
    args+=(--source-bootstrap "${SOURCE:?set both SOURCE and TARGET}"
           --target-bootstrap "${TARGET:?set both SOURCE and TARGET}")
fi
exec .venv/bin/shallowmirror bench "${args[@]}" "$@"
