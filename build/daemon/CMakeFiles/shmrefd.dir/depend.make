# Empty dependencies file for shmrefd.
# This may be replaced when dependencies are built.
