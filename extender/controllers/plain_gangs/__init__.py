"""Plain gangs (``gangslice.io/gang`` pods): the reporter that tells a gang's pods it can never fit."""
