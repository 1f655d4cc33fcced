"""The client :class:`ssl.SSLContext` of a Config (certificates verified by default)."""

from __future__ import annotations

import ssl

from nsq_sync.config import Config
from nsq_sync.errors import ConfigError

_VERSIONS = {"TLSv1.2": ssl.TLSVersion.TLSv1_2, "TLSv1.3": ssl.TLSVersion.TLSv1_3}


def build_ssl_context(config: Config) -> ssl.SSLContext:
    """``config.ssl_context`` if given, else a verifying client context (``tls_root_ca_file``
    replaces the system CA store). Raises ConfigError when a CA, certificate or key file cannot
    be loaded."""
    if config.ssl_context is not None:
        return config.ssl_context
    try:
        if config.tls_root_ca_file:
            ctx = ssl.create_default_context(cafile=config.tls_root_ca_file)
        else:
            ctx = ssl.create_default_context()
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"tls_root_ca_file {config.tls_root_ca_file!r}: {exc}") from exc
    ctx.minimum_version = _VERSIONS[config.tls_min_version]
    if config.tls_insecure_skip_verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if config.tls_cert and config.tls_key:
        try:
            ctx.load_cert_chain(config.tls_cert, config.tls_key)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"tls_cert/tls_key {config.tls_cert!r}: {exc}") from exc
    return ctx
