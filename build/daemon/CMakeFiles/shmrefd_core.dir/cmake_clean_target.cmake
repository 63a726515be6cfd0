file(REMOVE_RECURSE
  "../lib/libshmrefd_core.a"
)
