"""Benchmarks that run real upstream components: a throwaway control plane on loopback
(:mod:`extender.bench.controlplane`) and ``gangslice bench scheduler``."""
