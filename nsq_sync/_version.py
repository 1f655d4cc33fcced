"""Version of the nsq_sync distribution (single source for setup.cfg)."""

__version__ = "0.1.0"
