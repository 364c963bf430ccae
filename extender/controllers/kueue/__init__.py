"""The Kueue AdmissionCheck: the contract as plain functions (:mod:`.contract`), the gang a
Workload asks for (:mod:`.workload_gang`), where Kueue lets its pods run (:mod:`.assignment`)
and the controller that holds each Workload until its slice is reserved (:mod:`.controller`)."""
