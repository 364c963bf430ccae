"""gangslice: topology-aware gang scheduling for LLM inference on Kubernetes."""

__version__ = "0.1.0"
