file(REMOVE_RECURSE
  "../lib/libshmref_proto.a"
  "../lib/libshmref_proto.pdb"
  "CMakeFiles/shmref_proto.dir/desc.c.o"
  "CMakeFiles/shmref_proto.dir/desc.c.o.d"
  "CMakeFiles/shmref_proto.dir/paths.c.o"
  "CMakeFiles/shmref_proto.dir/paths.c.o.d"
  "CMakeFiles/shmref_proto.dir/proto.c.o"
  "CMakeFiles/shmref_proto.dir/proto.c.o.d"
  "CMakeFiles/shmref_proto.dir/units.c.o"
  "CMakeFiles/shmref_proto.dir/units.c.o.d"
)

# Per-language clean rules from dependency scanning.
foreach(lang C)
  include(CMakeFiles/shmref_proto.dir/cmake_clean_${lang}.cmake OPTIONAL)
endforeach()
