"""Pods the kubelet gave other GPUs than promised: told, or evicted (:mod:`.reporter`)."""
