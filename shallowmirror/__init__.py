"""shallowmirror: a Kafka mirror that forwards compressed RecordBatches without decompressing them.

Packages, from the wire inwards:
  codec/    RecordBatch and Fetch/Produce wire codec (native Cython + pure-Python twin)
  net/      connections to brokers, request framing, version negotiation, cluster metadata
  engine/   fetcher (source), forwarder (sink), offset tracker, memory budget, metrics
  mirror/   MirrorMaker 2 semantics: config, replication policy, topic sync, the mirror process
  reports/  PySpark jobs over metrics and the HTML report
  bench/    benchmark harness: workloads and mirror modes (shallow, deep, external)
  cli/      the `shallowmirror` command, one module per subcommand
  testing/  embedded brokers, workload loader, topic readers and comparisons
"""

from ._version import __version__

__all__ = ["__version__"]
