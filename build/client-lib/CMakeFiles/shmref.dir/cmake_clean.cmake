file(REMOVE_RECURSE
  "../lib/libshmref.pdb"
  "../lib/libshmref.so"
  "../lib/libshmref.so.0"
  "../lib/libshmref.so.0.1.0"
  "CMakeFiles/shmref.dir/client.c.o"
  "CMakeFiles/shmref.dir/client.c.o.d"
  "CMakeFiles/shmref.dir/descriptor.c.o"
  "CMakeFiles/shmref.dir/descriptor.c.o.d"
  "CMakeFiles/shmref.dir/lease.c.o"
  "CMakeFiles/shmref.dir/lease.c.o.d"
  "CMakeFiles/shmref.dir/mapcache.c.o"
  "CMakeFiles/shmref.dir/mapcache.c.o.d"
  "CMakeFiles/shmref.dir/status.c.o"
  "CMakeFiles/shmref.dir/status.c.o.d"
)

# Per-language clean rules from dependency scanning.
foreach(lang C)
  include(CMakeFiles/shmref.dir/cmake_clean_${lang}.cmake OPTIONAL)
endforeach()
