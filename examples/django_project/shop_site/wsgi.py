"""WSGI entry point: ``gunicorn shop_site.wsgi`` (run from examples/django_project)."""

from __future__ import annotations

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "shop_site.settings")

application = get_wsgi_application()
