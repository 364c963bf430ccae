"""Volcano PodGroups as gangs: the rules (:mod:`.groups`), the controller that reserves a slice
for each group (:mod:`.controller`), and ``gangslice hypernodes`` (:mod:`.hypernodes`)."""
