"""DRA: slots whose pinned devices someone else took are re-planned (:mod:`.sync`)."""
