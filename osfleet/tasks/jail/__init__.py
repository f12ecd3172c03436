"""The evaluation jail: where whatever a guest wrote is parsed and scored, away from the host agent.

- ``sandbox``: the host agent's side, ``Sandbox.run``: one metric per evaluation, under limits, with its verdict;
- ``bubblewrap``: the jail around the sandbox's zygote: whom it runs as, what it sees, how bwrap is started;
- ``launch``: a root host agent's launcher (``python -I -m osfleet.tasks.jail.launch``), which stages the paths
  the jail's user cannot reach and drops to that user before bwrap;
- ``seccomp``: the system calls refused, to the zygote and more strictly to each evaluation;
- ``cgroups``: each evaluation's cgroup, which bounds its memory and its processes as a whole;
- ``zygote``: the other side, inside the jail (``python -I -m osfleet.tasks.jail.zygote``), which forks one
  namespace set per evaluation;
- ``numba_cache``: librosa's compiled code, made by the host and read-only in the jail.

The launcher runs as root before anything else is trusted, and imports this package first: so this file imports
nothing. See docs/explanation/evaluation-jail.md.
"""
