"""Where the RocketMQ 5.x protocol modules come from: the ones generated inside ``rocketmq-python-client``.

The gRPC front end is built on the generated ``apache.rocketmq.v2`` modules that the official 5.x client
ships as ``rocketmq.grpc_protocol`` (we do not regenerate or copy them). That package's top-level name,
``rocketmq``, is also the 4.x client's (PyPI ``rocketmq`` 0.4.4), and the two cannot share one virtualenv.
So there are two ways to get the modules:

1. the 5.x client is installed in this interpreter: plain ``import rocketmq.grpc_protocol``;
2. it is installed in *another* virtualenv (the usual case in this project, whose main venv keeps the 4.x
   client): set ``BROKER_SIM_RMQ5_PROTOCOL`` to that venv's ``site-packages`` directory (or to its
   ``rocketmq`` package directory). The three generated files are then loaded by path under their own
   module names (``rocketmq.grpc_protocol.*``) without importing either client's ``rocketmq/__init__.py``:
   the generated ``service_pb2`` imports ``rocketmq.grpc_protocol.definition_pb2`` by that absolute name, so
   a bare package module registered under ``rocketmq.grpc_protocol`` is all the import system needs.

Either way ``grpcio`` and ``protobuf`` must be importable here (extra ``reliable[rocketmq5-server]``).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from broker_sim.errors import BrokerSimError

#: environment variable naming a site-packages (or ``rocketmq`` package) directory of rocketmq-python-client
PROTOCOL_ENV = "BROKER_SIM_RMQ5_PROTOCOL"
_PACKAGE = "rocketmq.grpc_protocol"
_HINT = (
    f"install rocketmq-python-client in this venv, or point {PROTOCOL_ENV} at the site-packages of a venv "
    "that has it (it cannot share a venv with the 4.x 'rocketmq' client)"
)


class ProtocolUnavailableError(BrokerSimError):
    """The generated RocketMQ 5.x modules (or grpcio/protobuf) cannot be imported."""


@dataclass(frozen=True)
class Protocol:
    """The generated modules: ``definition`` (messages, enums), ``service`` (requests), ``grpc`` (service)."""

    definition: Any
    service: Any
    grpc: Any


_loaded: Protocol | None = None


def _package_dir(root: Path) -> Path | None:
    for candidate in (root / "grpc_protocol", root / "rocketmq" / "grpc_protocol"):
        if (candidate / "service_pb2_grpc.py").is_file():
            return candidate
    return None


def _installed_dir() -> Path | None:
    """The ``grpc_protocol`` directory of a 5.x client installed here, found without importing it."""
    spec = importlib.util.find_spec("rocketmq")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        found = _package_dir(Path(location))
        if found is not None:
            return found
    return None


def _import_from(directory: Path) -> Protocol:
    package = sys.modules.get(_PACKAGE)
    if package is None:
        package = types.ModuleType(_PACKAGE)
        package.__path__ = [str(directory)]
        package.__package__ = _PACKAGE
        sys.modules[_PACKAGE] = package
    modules = [importlib.import_module(f"{_PACKAGE}.{name}") for name in ("definition_pb2", "service_pb2")]
    grpc_module = importlib.import_module(f"{_PACKAGE}.service_pb2_grpc")
    return Protocol(modules[0], modules[1], grpc_module)


def load_protocol() -> Protocol:
    """The generated modules, loaded once; :class:`ProtocolUnavailableError` (one line, with a hint)."""
    global _loaded
    if _loaded is not None:
        return _loaded
    try:
        import google.protobuf  # noqa: F401
        import grpc  # noqa: F401
    except ImportError as exc:
        raise ProtocolUnavailableError(
            f"the gRPC front end needs grpcio and protobuf ({exc}); install reliable[rocketmq5-server]"
        ) from exc
    configured = os.environ.get(PROTOCOL_ENV)
    directory = _package_dir(Path(configured)) if configured else _installed_dir()
    if directory is None:
        where = f"{PROTOCOL_ENV}={configured}" if configured else "this interpreter"
        raise ProtocolUnavailableError(f"no rocketmq.grpc_protocol found in {where}: {_HINT}")
    try:
        _loaded = _import_from(directory)
    except ImportError as exc:
        raise ProtocolUnavailableError(f"cannot import the 5.x protocol from {directory}: {exc}") from exc
    return _loaded
