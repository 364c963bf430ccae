"""The controller side of gangslice: the Kueue AdmissionCheck that holds a Workload until its
slice is reserved, the CRD models, leader election, and ``gangslice explain``."""
