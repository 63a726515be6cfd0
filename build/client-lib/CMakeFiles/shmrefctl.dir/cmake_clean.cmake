file(REMOVE_RECURSE
  "../bin/shmrefctl"
  "../bin/shmrefctl.pdb"
  "CMakeFiles/shmrefctl.dir/__/proto/units.c.o"
  "CMakeFiles/shmrefctl.dir/__/proto/units.c.o.d"
  "CMakeFiles/shmrefctl.dir/shmrefctl.c.o"
  "CMakeFiles/shmrefctl.dir/shmrefctl.c.o.d"
)

# Per-language clean rules from dependency scanning.
foreach(lang C)
  include(CMakeFiles/shmrefctl.dir/cmake_clean_${lang}.cmake OPTIONAL)
endforeach()
