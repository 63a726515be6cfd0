file(REMOVE_RECURSE
  "../bin/shmrefd"
  "../bin/shmrefd.pdb"
  "CMakeFiles/shmrefd.dir/broker.c.o"
  "CMakeFiles/shmrefd.dir/broker.c.o.d"
  "CMakeFiles/shmrefd.dir/conn.c.o"
  "CMakeFiles/shmrefd.dir/conn.c.o.d"
  "CMakeFiles/shmrefd.dir/log.c.o"
  "CMakeFiles/shmrefd.dir/log.c.o.d"
  "CMakeFiles/shmrefd.dir/options.c.o"
  "CMakeFiles/shmrefd.dir/options.c.o.d"
  "CMakeFiles/shmrefd.dir/pool.c.o"
  "CMakeFiles/shmrefd.dir/pool.c.o.d"
  "CMakeFiles/shmrefd.dir/quota.c.o"
  "CMakeFiles/shmrefd.dir/quota.c.o.d"
  "CMakeFiles/shmrefd.dir/registry.c.o"
  "CMakeFiles/shmrefd.dir/registry.c.o.d"
  "CMakeFiles/shmrefd.dir/server.c.o"
  "CMakeFiles/shmrefd.dir/server.c.o.d"
  "CMakeFiles/shmrefd.dir/shmrefd.c.o"
  "CMakeFiles/shmrefd.dir/shmrefd.c.o.d"
  "CMakeFiles/shmrefd.dir/status.c.o"
  "CMakeFiles/shmrefd.dir/status.c.o.d"
)

# Per-language clean rules from dependency scanning.
foreach(lang C)
  include(CMakeFiles/shmrefd.dir/cmake_clean_${lang}.cmake OPTIONAL)
endforeach()
