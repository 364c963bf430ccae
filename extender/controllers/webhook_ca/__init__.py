"""The DRA webhook's caBundle, kept equal to the serving certificate's CA (:mod:`.sync`)."""
