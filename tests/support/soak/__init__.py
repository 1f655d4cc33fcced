"""The soak (issue 40): the whole stack on loopback under a seeded schedule of faults, every id
accounted for. ``scripts/soak`` runs it; ``tests/reliability/test_stack_soak.py`` runs a short one
in CI. One concept per module:

- ``deployment``: the servers and processes (nsqds, nsqlookupd, proxies, uWSGI, gunicorn, the
  consumer process) and how each is started, stopped, killed and restarted;
- ``flask_soak``, ``django_soak``: the examples as the soak serves them (loaded in the master,
  which publishes once; Django gets one more view, publishing outside a transaction);
- ``consumer_app``: the long-running consumer process and its record of every handler call;
- ``load``: the load generators, one unique id per request, resent after an unknown outcome;
- ``drains``: the cron-style ``nsq-sync drain`` runs on their own channel;
- ``faults``: the seeded schedule and the fault injectors;
- ``probes``: RSS and file descriptors of every process, sampled;
- ``accounting``: what was acknowledged, consumed, lost, duplicated and why;
- ``report``: the table;
- ``main``: the command line (``scripts/soak``);
- ``sigkill_window``: a measurement of what an nsqd SIGKILL loses under each consumer setting;
- ``respawn_burst``: a search for the Django 500 once seen under uWSGI threads.
"""
