"""Framework integrations: :mod:`nsq_sync.contrib.django` and :mod:`nsq_sync.contrib.flask`.

Each imports its framework only when imported itself (``import nsq_sync`` imports neither).
"""
