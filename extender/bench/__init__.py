"""Benchmarks and load generators, kept out of the components they measure:
``gangslice bench placement`` (:mod:`extender.bench.placement`), ``gangslice bench extender``
(:mod:`extender.bench.extender`, the HTTP app in-process) and its ``--hostile`` load
(:mod:`extender.bench.hostile`), and those that run real upstream components: a throwaway
control plane on loopback (:mod:`extender.bench.controlplane`) with fake GPU nodes
(:mod:`extender.bench.fake_nodes`), ``gangslice bench scheduler``, and the same machinery as
``gangslice playground``."""
