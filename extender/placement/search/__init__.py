"""The gangslice solver's search, as named phases over one explicit per-decision context.

Modules, from the bottom layer up (``pyproject.toml``'s import contract keeps each from
importing those above it):

- ``memory``: what outlives one decision (:class:`~.memory.SolverMemory`: per-class tables,
  fits on the emptied cluster), owned by the caller (carried by the snapshot it builds);
- ``context``: one decision's context (:class:`~.context.Decision`: snapshot, gang, each
  pod set's rules, work budget, this decision's memo tables) and a branch's GPUs taken;
- ``capacity``: how many pods of a pod set each node holds, grouped by node class;
  ``rank``: every ranking key, with its parts named;
- ``option``: one placement of one pod set, a refusal as data, and what the generators share;
- ``one_node`` and ``across_nodes``: the candidate generators;
- ``pod_set`` (one pod set's ranked candidates) and ``finish`` (a gang's slice and its rank);
- ``beam`` (pod set orders and the beam over them) and ``explain`` (a refusal in words);
- ``decide``: the driver that runs the phases for one gang.

:mod:`extender.placement.solver` is the public entry (``place``, ``Solver``). This package
imports nothing here, so the snapshot can import ``memory`` without importing the search.
"""
