# Empty compiler generated dependencies file for shmrefctl.
# This may be replaced when dependencies are built.
