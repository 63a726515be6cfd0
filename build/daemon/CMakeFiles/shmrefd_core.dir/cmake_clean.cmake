file(REMOVE_RECURSE
  "../lib/libshmrefd_core.a"
  "../lib/libshmrefd_core.pdb"
  "CMakeFiles/shmrefd_core.dir/broker.c.o"
  "CMakeFiles/shmrefd_core.dir/broker.c.o.d"
  "CMakeFiles/shmrefd_core.dir/conn.c.o"
  "CMakeFiles/shmrefd_core.dir/conn.c.o.d"
  "CMakeFiles/shmrefd_core.dir/log.c.o"
  "CMakeFiles/shmrefd_core.dir/log.c.o.d"
  "CMakeFiles/shmrefd_core.dir/options.c.o"
  "CMakeFiles/shmrefd_core.dir/options.c.o.d"
  "CMakeFiles/shmrefd_core.dir/pool.c.o"
  "CMakeFiles/shmrefd_core.dir/pool.c.o.d"
  "CMakeFiles/shmrefd_core.dir/quota.c.o"
  "CMakeFiles/shmrefd_core.dir/quota.c.o.d"
  "CMakeFiles/shmrefd_core.dir/registry.c.o"
  "CMakeFiles/shmrefd_core.dir/registry.c.o.d"
  "CMakeFiles/shmrefd_core.dir/server.c.o"
  "CMakeFiles/shmrefd_core.dir/server.c.o.d"
  "CMakeFiles/shmrefd_core.dir/status.c.o"
  "CMakeFiles/shmrefd_core.dir/status.c.o.d"
)

# Per-language clean rules from dependency scanning.
foreach(lang C)
  include(CMakeFiles/shmrefd_core.dir/cmake_clean_${lang}.cmake OPTIONAL)
endforeach()
