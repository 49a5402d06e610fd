"""``adp-gateway``: the command line of the storage gateway.

    adp-gateway serve  [--config FILE] [--data-dir DIR] [--socket PATH] [--capacity SIZE]
                       [--metrics-address HOST:PORT]
    adp-gateway status [--config FILE] [--socket PATH] [--json]
    adp-gateway check  [--config FILE] [--data-dir DIR] [--fix]
    adp-gateway format [--config FILE] [--data-dir DIR] [--force]
    adp-gateway verify --lmcache tcp://HOST:PORT [--http http://HOST:PORT]

Errors in the config or the environment print one line naming what is wrong and exit with 2.
``serve`` and ``status`` take the socket from ``--socket``, else from ``$ADP_SOCKET`` (which the
container image sets), else from the config file, else the default.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from types import FrameType

from adp_gateway import config as config_module
from adp_gateway.errors import GatewayError


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return int(args.run(args))
    except GatewayError as exc:
        print(f"adp-gateway: error: {exc}", file=sys.stderr)
        return 2


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="adp-gateway",
        description="The storage gateway of lmcache-adp: a persistent NVMe tier for LMCache.",
    )
    commands = parser.add_subparsers(required=True, metavar="COMMAND")
    serve = commands.add_parser("serve", help="run the gateway until SIGTERM or Ctrl-C")
    serve.add_argument("--config", help="YAML file; see configs/gateway.yaml")
    serve.add_argument("--data-dir", help="directory for the database files (overrides data_dirs)")
    serve.add_argument("--socket", help="Unix socket path clients connect to (or $ADP_SOCKET)")
    serve.add_argument("--capacity", help="bytes of disk to use in all, such as 64GiB")
    serve.add_argument("--log-level", choices=("DEBUG", "INFO", "WARNING", "ERROR"))
    serve.add_argument(
        "--metrics-address", help="HOST:PORT for /metrics, /healthz and /readyz (default: off)"
    )
    serve.set_defaults(run=serve_until_stopped)
    status = commands.add_parser(
        "status", help="how a running gateway is doing; exit 1 when it is not ready, 2 when none"
    )
    status.add_argument("--config", help="YAML file; see configs/gateway.yaml")
    status.add_argument(
        "--socket", help="the gateway's Unix socket (default: $ADP_SOCKET, else its default)"
    )
    status.add_argument("--json", action="store_true", help="print JSON instead of lines")
    status.set_defaults(run=_status)
    verify = commands.add_parser(
        "verify",
        help="store a synthetic prompt through a running lmcache server, evict it from L1, "
        "restore it from L2 and compare every byte; exit 1 on a mismatch",
    )
    verify.add_argument("--lmcache", required=True, help="the server's tcp://HOST:PORT")
    verify.add_argument(
        "--http", help="the server's HTTP address (default: http://HOST:8080 of --lmcache)"
    )
    verify.add_argument("--tokens", type=int, default=2048, help="prompt length (default 2048)")
    verify.add_argument("--timeout", type=float, default=120.0, help="seconds for each step")
    verify.set_defaults(run=_verify)
    check = commands.add_parser(
        "check", help="verify every record on disk (the gateway must be stopped); exit 1 on damage"
    )
    check.add_argument("--config", help="YAML file; see configs/gateway.yaml")
    check.add_argument("--data-dir", help="directory of the database files (overrides data_dirs)")
    check.add_argument(
        "--fix", action="store_true", help="invalidate damaged records and rewrite their footers"
    )
    check.set_defaults(run=_check)
    formatting = commands.add_parser(
        "format",
        help="empty the databases (the gateway must be stopped): only those that hold nothing, "
        "unless --force; exit 1 when one was left as it was",
    )
    formatting.add_argument("--config", help="YAML file; see configs/gateway.yaml")
    formatting.add_argument(
        "--data-dir", help="directory of the database files (overrides data_dirs)"
    )
    formatting.add_argument(
        "--force", action="store_true", help="format every database, whatever it holds (lost)"
    )
    formatting.set_defaults(run=_format)
    return parser


def _socket(args: argparse.Namespace) -> str | None:
    """``--socket``, else ``$ADP_SOCKET``: in the container image, `docker exec ... adp-gateway
    status` then finds the socket the entrypoint gave the gateway."""
    return str(args.socket or os.environ.get("ADP_SOCKET") or "") or None


def _format(args: argparse.Namespace) -> int:
    from adp_gateway.card.loader import card_class

    config = config_module.load(args.config, {"data_dirs": args.data_dir})
    report = card_class(config.card).format(config, args.force)
    for line in report.lines:
        print(line)
    return 1 if report.failed else 0


def _check(args: argparse.Namespace) -> int:
    from adp_gateway.card.loader import card_class
    from adp_gateway.objects.census import ObjectCensus

    config = config_module.load(args.config, {"data_dirs": args.data_dir})
    census = ObjectCensus()
    report = card_class(config.card).check(config, args.fix, census)
    for line in report.lines:
        print(line)
    print(f"{report.summary}; {census.summary()}")
    return 1 if report.failed else 0


def _status(args: argparse.Namespace) -> int:
    import json

    from adp_gateway.observe.status import ask, describe

    config = config_module.load(args.config, {"socket": _socket(args)})
    status = ask(config.socket_path)
    print(json.dumps(status, indent=2) if args.json else describe(status))
    return 0 if status.get("ready") is True else 1


def _verify(args: argparse.Namespace) -> int:
    from adp_gateway.observe.verify import verify

    report = verify(args.lmcache, args.http, args.tokens, args.timeout)
    print(report.summary())
    return 0 if report.byte_exact else 1


def serve_until_stopped(args: argparse.Namespace) -> int:
    """``adp-gateway serve``: run until SIGTERM or SIGINT."""
    from adp_gateway.host import priority
    from adp_gateway.service import Gateway  # imported late: `--help` stays fast

    overrides = {
        "data_dirs": args.data_dir,
        "socket": _socket(args),
        "capacity": args.capacity,
        "log_level": args.log_level,
        "metrics_address": args.metrics_address,
    }
    config = config_module.load(args.config, overrides)
    logging.basicConfig(
        level=config.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        logging.getLogger("gateway").info("received %s, stopping", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    boost = priority.lower(config.cpu_nice)  # before any other thread starts: they inherit it
    gateway = Gateway(config, boost)
    gateway.start()
    try:
        while not stop.wait(1.0):
            pass
    finally:
        gateway.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
