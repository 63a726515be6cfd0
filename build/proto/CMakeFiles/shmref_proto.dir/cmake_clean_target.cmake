file(REMOVE_RECURSE
  "../lib/libshmref_proto.a"
)
