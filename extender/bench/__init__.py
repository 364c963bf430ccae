"""Benchmarks that run real upstream components: a throwaway control plane on loopback
(:mod:`extender.bench.controlplane`) with fake GPU nodes (:mod:`extender.bench.fake_nodes`),
``gangslice bench scheduler``, and the same machinery as ``gangslice playground``."""
