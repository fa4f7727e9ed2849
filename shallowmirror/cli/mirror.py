"""`shallowmirror mirror mm2.properties`: MirrorMaker 2 dedicated mode, shallow by default."""

from __future__ import annotations

import argparse
import sys

from shallowmirror.cli.formatting import finite_float


def add_process_options(p: argparse.ArgumentParser) -> None:
    """Options shared by `mirror` and `legacy` (they override the configuration file)."""
    p.add_argument("--deep", action="store_true",
                   help="decompress and recompress (the deep path) instead of forwarding "
                        "batches byte for byte; same as use.raw.bytes=false on every flow")
    p.add_argument("--exit-when-caught-up", action="store_true",
                   help="stop (committing offsets) once every flow has mirrored its topics up "
                        "to their high watermarks, at least every record on the source when "
                        "the mirror started")
    p.add_argument("--caught-up-timeout", type=finite_float, metavar="SECONDS",
                   help="with --exit-when-caught-up: give up (exit status 1) after this long")
    p.add_argument("--status-interval", type=finite_float, metavar="SECONDS",
                   help="status line period (status.interval.seconds; 0 turns it off)")
    p.add_argument("--prometheus-port", type=int, metavar="PORT",
                   help="serve Prometheus metrics on this port (prometheus.port)")
    p.add_argument("--metrics-file", metavar="PATH",
                   help="append JSON-lines metrics events to PATH (metrics.file)")
    p.add_argument("--summary-json", metavar="PATH",
                   help="write the exit summary (records, bytes, MB/s, CPU) as JSON to PATH")
    p.add_argument("--log-format", choices=("text", "json"), default="text",
                   help="json: one JSON object per log line with flow/topic/partition fields")
    p.add_argument("--check", action="store_true",
                   help="validate the configuration, print the flows, and exit")


def process_options(args: argparse.Namespace):
    from shallowmirror.mirror.process import ProcessOptions

    return ProcessOptions(exit_when_caught_up=args.exit_when_caught_up,
                          caught_up_timeout_s=args.caught_up_timeout,
                          status_interval_s=args.status_interval,
                          prometheus_port=args.prometheus_port,
                          metrics_file=args.metrics_file, summary_json=args.summary_json)


def check_conflicts(args: argparse.Namespace) -> list[str]:
    problems = []
    if args.caught_up_timeout is not None and not args.exit_when_caught_up:
        problems.append("--caught-up-timeout needs --exit-when-caught-up")
    if args.caught_up_timeout is not None and args.caught_up_timeout <= 0:
        problems.append("--caught-up-timeout must be positive")
    if args.status_interval is not None and args.status_interval < 0:
        problems.append("--status-interval must not be negative")
    if args.prometheus_port is not None and not 0 < args.prometheus_port < 65536:
        problems.append(f"--prometheus-port must be a TCP port, 1-65535, got "
                        f"{args.prometheus_port}")
    return problems


EXAMPLES = [
    ("shallowmirror mirror mm2.properties --check",
     "validate every key and value, print the flows, and exit (nothing is contacted)"),
    ("shallowmirror mirror mm2.properties",
     "run until SIGTERM or Ctrl-C, with a status line per flow every 30 s"),
    ("shallowmirror mirror mm2.properties --exit-when-caught-up --caught-up-timeout 600",
     "copy what is there now and exit 0; exit 1 if a flow cannot catch up"),
    ("shallowmirror mirror mm2.properties --deep --metrics-file run.jsonl",
     "the decompress/recompress path, with metrics for `shallowmirror report`"),
]

MM2_EXAMPLE = """\
a minimal mm2.properties:
  clusters = A, B
  A.bootstrap.servers = 127.0.0.1:9092
  B.bootstrap.servers = 127.0.0.1:9093
  A->B.enabled = true
  A->B.topics = orders, payments.*"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    from shallowmirror.cli.formatting import epilog
    from shallowmirror.mirror.config import MIRROR_SETTINGS

    p = sub.add_parser(
        "mirror", help="run MirrorMaker 2 flows from an mm2.properties file",
        description="Run the replication flows of a MirrorMaker 2 configuration (dedicated "
                    "mode). Flows are enabled with `A->B.enabled = true`; remote topics are "
                    "created on the target with the source's partitions and configs and "
                    "compression.type=producer. SIGTERM/SIGINT stop gracefully.",
        epilog=epilog(EXAMPLES, MM2_EXAMPLE + "\n\n" + MIRROR_SETTINGS.help_text()
                      + "\n\nEngine and client keys: `shallowmirror info --config-reference`."))
    p.add_argument("config", metavar="mm2.properties", help="MirrorMaker 2 properties file")
    p.add_argument("--clusters", metavar="ALIAS[,ALIAS]",
                   help="run only the flows into these target clusters (as MM2's --clusters)")
    p.add_argument("--allow-unknown-keys", action="store_true",
                   help="warn about unknown configuration keys instead of refusing to start")
    add_process_options(p)
    p.set_defaults(func=run)


def describe(config) -> str:
    lines = []
    for f in config.flows:
        lines.append(f"flow {f.name}: {'shallow' if f.shallow else 'deep'}, "
                     f"policy {f.policy.class_name.rsplit('.', 1)[-1]}, "
                     f"topics {','.join(f.settings['topics'])}, "
                     f"exclude {','.join(f.topic_filter.exclude)}, "
                     f"source {f.source_consumer.get('bootstrap.servers')}, "
                     f"target {f.target_producer.get('bootstrap.servers')}, "
                     f"group.id {f.engine_settings.get('group.id')}"
                     + "".join(f", {extra}" for extra in _group_features(f)))
    if getattr(config, "heartbeat_pairs", None):
        lines.append("heartbeats: " + ", ".join(f"{p.name} to cluster {p.target} every "
                                                f"{p.interval_s:g}s"
                                                for p in config.heartbeat_pairs))
    return "\n".join(lines)


def _group_features(flow) -> list[str]:
    """Exactly-once, group offset sync and reverse checkpointing, when a flow has them on."""
    from shallowmirror.engine.config import exactly_once, resolve_settings

    s, extras = flow.settings, []
    if flow.shallow and exactly_once(resolve_settings(flow.engine_settings, context=flow.name)):
        extras.append("exactly-once (transactions on the target)")
    if s.get("sync.group.offsets.enabled"):
        extras.append(f"group offset sync every {s['sync.group.offsets.interval.seconds']:g}s")
    if s.get("reverse.checkpointing.enabled"):
        extras.append(f"reverse checkpoints of {flow.target}'s topics")
    return extras


def start(config, args: argparse.Namespace) -> int:
    """Shared tail of `mirror` and `legacy`: --check or run."""
    from shallowmirror.cli.stop_signals import python_sigint
    from shallowmirror.errors import ConfigError
    from shallowmirror.mirror import logs
    from shallowmirror.mirror.process import run_process

    logs.configure(args.log_format)
    if args.check:
        print(describe(config))
        print("configuration OK")
        return 0
    try:
        with python_sigint():    # asyncio's own Ctrl-C until the process's graceful stop is set
            return run_process(config, process_options(args))
    except ConfigError as err:  # found at start-up: a port in use, an unwritable metrics file
        return config_error(err)


def config_error(err: Exception) -> int:
    print(f"shallowmirror: {err}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    from shallowmirror.errors import ConfigError
    from shallowmirror.mirror.config import load_mm2

    problems = check_conflicts(args)
    try:
        if problems:
            raise ConfigError(problems)
        config = load_mm2(args.config, deep=args.deep,
                          allow_unknown_keys=args.allow_unknown_keys)
        if args.clusters:
            config = config.only_targets(a.strip() for a in args.clusters.split(",")
                                         if a.strip())
            if not config.flows:
                raise ConfigError(f"--clusters {args.clusters}: no enabled flow goes there")
    except ConfigError as err:
        return config_error(err)
    return start(config, args)
