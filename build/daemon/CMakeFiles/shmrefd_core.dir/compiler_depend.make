# Empty compiler generated dependencies file for shmrefd_core.
# This may be replaced when dependencies are built.
