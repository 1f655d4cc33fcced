"""gunicorn config for gevent workers: ``gunicorn -c gunicorn_gevent.py --preload shop_site.wsgi``.

Django keeps its database connections in thread-locals created when it loads. With --preload it
loads in the master, before gunicorn's gevent worker patches: greenlets would then share one
connection. Patching the master first (here, as gunicorn reads its config) avoids that.
nsq_sync needs no such care: its producer picks gevent in each worker either way.
"""

from gevent import monkey

monkey.patch_all()

worker_class = "gevent"
