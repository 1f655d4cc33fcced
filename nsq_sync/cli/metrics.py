"""``--metrics-port`` of ``nsq-sync tail`` and ``drain``: Prometheus metrics served while the
command runs (nsq_sync.metrics; needs the ``prometheus`` extra)."""

from __future__ import annotations

import argparse
import sys

from nsq_sync.cli.arguments import PROG, UsageError

__all__ = ["add_metrics_options", "serve_metrics"]


def add_metrics_options(parser: argparse.ArgumentParser) -> None:
    """Add ``--metrics-port`` and ``--metrics-address`` to a consuming subcommand."""
    group = parser.add_argument_group("metrics")
    group.add_argument(
        "--metrics-port",
        type=_port,
        metavar="PORT",
        help="serve Prometheus metrics at http://ADDRESS:PORT/metrics while this runs (0: a "
        "free port, printed on stderr); needs nsq_sync[prometheus]",
    )
    group.add_argument(
        "--metrics-address",
        default="0.0.0.0",
        metavar="ADDRESS",
        help="the address --metrics-port listens on (default: all interfaces)",
    )


def _port(text: str) -> int:
    """argparse type: a TCP port, 0-65535 (0: any free port). Raises ArgumentTypeError."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"not a port (0-65535): {text!r}")
    return port


def serve_metrics(args: argparse.Namespace) -> None:
    """With ``--metrics-port``: enable Prometheus metrics and serve them from a daemon thread
    for as long as the command runs; the URL goes to stderr.

    Raises:
        UsageError: prometheus_client is missing, or the port cannot be bound.
    """
    if args.metrics_port is None:
        return
    from nsq_sync import metrics

    try:
        metrics.enable_prometheus()
        port = metrics.serve_prometheus(args.metrics_port, args.metrics_address)
    except ImportError as exc:
        raise UsageError(f"--metrics-port: {exc}") from None
    except OSError as exc:
        raise UsageError(
            f"--metrics-port: cannot listen on {args.metrics_address}:{args.metrics_port}: "
            f"{exc.strerror or exc}"
        ) from None
    print(
        f"{PROG} {args.command}: serving metrics on http://{args.metrics_address}:{port}/metrics",
        file=sys.stderr,
        flush=True,
    )
