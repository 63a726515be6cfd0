# Empty dependencies file for shmref_proto.
# This may be replaced when dependencies are built.
