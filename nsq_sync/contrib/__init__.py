"""Framework integrations (Django, Flask): each imports its framework only when imported itself."""
