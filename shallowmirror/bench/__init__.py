"""The benchmark harness behind ``shallowmirror bench``: shallow versus deep mirroring.

A workload (codec x value size x producer batch size x partitions x record count, see
``matrix``) is loaded into a source cluster once; then each mirror mode runs as its own process
(``modes``) while the runner (``runner``) samples the process tree's CPU and RSS (``sampling``)
and watches the target's high watermarks (``watermarks``) until every record arrived. One
``bench_run`` JSON line (``shallowmirror.metrics_schema``) is written per run; a run that Ctrl-C
cut short is not one (``interrupts``).
"""
