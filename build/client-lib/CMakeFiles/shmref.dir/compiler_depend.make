# Empty compiler generated dependencies file for shmref.
# This may be replaced when dependencies are built.
