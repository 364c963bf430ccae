"""Moving restartable replicas to drain a domain for a waiting gang (report only)."""
