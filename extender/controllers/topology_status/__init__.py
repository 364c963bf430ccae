"""The ``Accepted`` and ``DevicesMatched`` conditions of NodeTopologies, and the Node's Events
(:mod:`.reporter`)."""
