"""OSWorld's task format run by osfleet itself: task files converted, getters and metrics written for osfleet.

A task written for OSWorld (``examples/<app>/<id>.json``, or a bundle of them with its assets) runs on a replica
with none of OSWorld's code: ``convert`` turns the file into osfleet's task model (its parts typed in ``spec``),
``importer`` says which files of a folder run on this host and what the others lack, ``getters`` fetch each
metric's values from the guest (asking the running desktop with ``guest_query``, whose script is in ``guest/``;
paths and placeholders in ``guest_paths``; set-up files written by ``guest_writes``), and ``metrics`` score
them in the evaluation jail (``osfleet.tasks.jail``). ``osfleet.tasks.runner`` runs the converted task. The
split follows OSWorld's own ``desktop_env/evaluators/{getters,metrics}``, so a function is found by its name.

Not to be confused with ``osfleet.osworld``, which goes the other way: OSWorld's own harness (desktop-env, with
its own getters and metrics) on a client, driving an osfleet fleet as its VM provider. That package needs no host
agent, this one no desktop-env. It imports ``guest_query`` alone from here, which imports nothing of the host's;
so this file imports nothing at all.
"""
