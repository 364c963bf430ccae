"""Trace-driven cluster simulation: gangslice and the peers' policies on the same trace, side by side."""
